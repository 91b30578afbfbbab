# SPDX-License-Identifier: Apache-2.0
# cmake "-DCOMMAND=exe;args" -DEXPECT=fail|pass "-DMATCH=regex;regex..." -P expect_demo_output.cmake
#       [-DDIFFERENT=regex;regex]
# Runs the demo once and requires its exit status to be non-zero (fail) or
# zero (pass), and its output (stdout and stderr together) to match every
# regular expression in MATCH. The demo's command-line checks use it: a bad
# value must stop the demo with a message naming the option. DIFFERENT: two
# regular expressions with one group each (a row's held-out loss, say); both
# must match, and what their groups capture must differ.
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(EXPECT STREQUAL "fail")
  if(rc EQUAL 0)
    message(FATAL_ERROR "expected a non-zero exit from ${COMMAND}, got 0:\n${text}")
  endif()
elseif(EXPECT STREQUAL "pass")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected exit 0 from ${COMMAND}, got ${rc}:\n${text}")
  endif()
else()
  message(FATAL_ERROR "EXPECT must be fail or pass, not '${EXPECT}'")
endif()
foreach(re IN LISTS MATCH)
  if(NOT text MATCHES "${re}")
    message(FATAL_ERROR "the output of ${COMMAND} does not match '${re}':\n${text}")
  endif()
endforeach()
if(DEFINED DIFFERENT)
  list(LENGTH DIFFERENT n)
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "DIFFERENT takes two regular expressions, got ${n}")
  endif()
  set(captured "")
  foreach(re IN LISTS DIFFERENT)
    if(NOT text MATCHES "${re}")
      message(FATAL_ERROR "the output of ${COMMAND} does not match '${re}':\n${text}")
    endif()
    list(APPEND captured "${CMAKE_MATCH_1}")
  endforeach()
  list(GET captured 0 first)
  list(GET captured 1 second)
  if(first STREQUAL second)
    message(FATAL_ERROR "'${first}' and '${second}' should differ (${DIFFERENT}):\n${text}")
  endif()
endif()
message(STATUS "exit ${rc}, output:\n${text}")
