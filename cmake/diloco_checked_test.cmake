# SPDX-License-Identifier: Apache-2.0
# Tests that look for a line in a program's output AND require it to exit 0.
#
# CTest's PASS_REGULAR_EXPRESSION replaces the exit-status check: a test
# whose rank 0 printed the expected line passes even when another rank (or
# the launcher, or the program after printing) failed. A test made with
# these helpers runs its command through run_checked.cmake, which passes the
# output through unchanged and, on a non-zero exit, prints a marker line
# that FAIL_REGULAR_EXPRESSION catches (a FAIL match fails the test whatever
# PASS matched). mpirun and scripts/launch_gloo.sh exit non-zero when any
# rank does, so every rank's exit status counts.

set(DILOCO_CHECKED_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/run_checked.cmake)
set(DILOCO_CHECKED_MARKER "diloco-checked: the command exited with status")

# diloco_checked_command(<out-var> <command> [args...]): the command wrapped.
# A target named first becomes its file, as add_test would resolve it (an
# argument of cmake -P is not resolved).
function(diloco_checked_command out)
  set(command ${ARGN})
  list(GET command 0 program)
  if(TARGET ${program})
    list(POP_FRONT command)
    list(PREPEND command $<TARGET_FILE:${program}>)
  endif()
  set(${out} ${CMAKE_COMMAND} -P ${DILOCO_CHECKED_SCRIPT} -- ${command} PARENT_SCOPE)
endfunction()

# diloco_expect_output(<test> <regex>): the test passes only if its output
# matches <regex> and its (wrapped) command exited 0.
function(diloco_expect_output name regex)
  set_tests_properties(${name} PROPERTIES PASS_REGULAR_EXPRESSION "${regex}"
                                          FAIL_REGULAR_EXPRESSION "${DILOCO_CHECKED_MARKER}")
endfunction()

# diloco_add_checked_test(NAME <name> COMMAND <command> [args...] PASS <regex>
#                         [WORKING_DIRECTORY <dir>]): add_test with both checks.
function(diloco_add_checked_test)
  cmake_parse_arguments(T "" "NAME;PASS;WORKING_DIRECTORY" "COMMAND" ${ARGN})
  diloco_checked_command(cmd ${T_COMMAND})
  if(T_WORKING_DIRECTORY)
    add_test(NAME ${T_NAME} COMMAND ${cmd} WORKING_DIRECTORY ${T_WORKING_DIRECTORY})
  else()
    add_test(NAME ${T_NAME} COMMAND ${cmd})
  endif()
  diloco_expect_output(${T_NAME} "${T_PASS}")
endfunction()
