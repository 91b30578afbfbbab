# SPDX-License-Identifier: Apache-2.0
# Shared by the packaging scripts.
# run_matching(<regex> <command>...): executes the command and stops the
# script with its output when it fails or when its output (stdout and
# stderr together) does not match <regex> (empty: anything).
function(run_matching regex)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  if(NOT regex STREQUAL "" AND NOT "${out}${err}" MATCHES "${regex}")
    message(FATAL_ERROR "the output of ${ARGN} does not match '${regex}':\n${out}\n${err}")
  endif()
  message(STATUS "${out}${err}")
endfunction()

# run(<command>...): the same, whatever the output.
function(run)
  run_matching("" ${ARGN})
endfunction()
