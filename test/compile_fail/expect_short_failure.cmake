# SPDX-License-Identifier: Apache-2.0
# cmake "-DCOMMAND=<compiler;args...>" "-DHEADERS=<h1;h2...>" -DEXPECT=<regex>
#       -DMAX_ERRORS=<n> -P expect_short_failure.cmake
# For each header h: runs COMMAND -DHEADER=<h>, which must fail, print
# EXPECT, and print fewer than MAX_ERRORS lines containing "error".
foreach(header IN LISTS HEADERS)
  execute_process(COMMAND ${COMMAND} "-DHEADER=<${header}>"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(text "${out}${err}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "${header}: compiled, but it must not:\n${text}")
  endif()
  if(NOT text MATCHES "${EXPECT}")
    message(FATAL_ERROR "${header}: the output does not match '${EXPECT}':\n${text}")
  endif()
  string(REGEX MATCHALL "[^\n]*error[^\n]*" error_lines "${text}")
  list(LENGTH error_lines errors)
  if(NOT errors LESS MAX_ERRORS)
    message(FATAL_ERROR "${header}: ${errors} error lines, expected fewer than ${MAX_ERRORS}:\n${text}")
  endif()
  message(STATUS "${header}: stopped with ${errors} error lines")
endforeach()
