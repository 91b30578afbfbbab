# SPDX-License-Identifier: Apache-2.0
# cmake -P run_checked.cmake -- <command> [args...]
# Runs the command with its output passed through; on a non-zero exit (or a
# command that could not start) prints diloco_checked_test.cmake's marker
# line and exits non-zero. The marker's text is DILOCO_CHECKED_MARKER there.
set(command "")
set(after_separator OFF)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  if(after_separator)
    list(APPEND command "${CMAKE_ARGV${i}}")
  elseif(CMAKE_ARGV${i} STREQUAL "--")
    set(after_separator ON)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "run_checked.cmake: no command after --")
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE status)
if(NOT status STREQUAL "0")
  string(REPLACE ";" " " shown "${command}")
  # The marker on a line of its own (FATAL_ERROR's text is re-wrapped).
  message("diloco-checked: the command exited with status ${status}")
  message(FATAL_ERROR "the command that failed: ${shown}")
endif()
