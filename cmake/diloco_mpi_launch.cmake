# SPDX-License-Identifier: Apache-2.0
# How diloco's own tests and examples start MPI programs: through the
# launcher FindMPI found, as CMake documents it
#   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N ${MPIEXEC_PREFLAGS} exe ${MPIEXEC_POSTFLAGS} args
# plus, for Open MPI, --oversubscribe (CI machines have fewer cores than the
# tests have ranks) and the variables that let it run as root in containers.

set(DILOCO_MPIEXEC_EXTRA_FLAGS "")
set(DILOCO_MPIEXEC_ENVIRONMENT "")
if(MPIEXEC_EXECUTABLE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _diloco_mpiexec_version
                  ERROR_VARIABLE _diloco_mpiexec_version RESULT_VARIABLE _diloco_rc)
  if(_diloco_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(DILOCO_MPIEXEC_EXTRA_FLAGS --oversubscribe)
    set(DILOCO_MPIEXEC_ENVIRONMENT OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  endif()
  unset(_diloco_mpiexec_version)
  unset(_diloco_rc)
endif()
# Open MPI leaves allocations of its own (many in plugins it has unloaded by
# exit, so their frames cannot be suppressed by name) to the OS at exit:
# under AddressSanitizer the MPI tests keep every check but leak detection.
if(DILOCO_SANITIZE MATCHES "address")
  list(APPEND DILOCO_MPIEXEC_ENVIRONMENT ASAN_OPTIONS=detect_leaks=0)
endif()

# diloco_mpi_command(<out-var> <ranks> <executable> [args...]): the command
# line that runs <executable> on <ranks> MPI processes.
function(diloco_mpi_command out ranks exe)
  set(${out} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${DILOCO_MPIEXEC_EXTRA_FLAGS}
      ${MPIEXEC_PREFLAGS} ${exe} ${MPIEXEC_POSTFLAGS} ${ARGN} PARENT_SCOPE)
endfunction()

# diloco_add_mpi_test(<name> RANKS <n> COMMAND <exe> [args...] [LABELS ...]
#                     [TIMEOUT <s>] [ENVIRONMENT ...] [PASS <regex>]): a CTest
# test running <exe> on <n> ranks. A failure on any rank fails mpirun and so
# the test; the timeout turns a hang into a failure. PASS: the output must
# also match <regex> (diloco_checked_test.cmake keeps the exit status
# checked, which PASS_REGULAR_EXPRESSION alone would not).
function(diloco_add_mpi_test name)
  cmake_parse_arguments(T "" "RANKS;TIMEOUT;PASS" "COMMAND;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  list(POP_FRONT T_COMMAND exe)
  diloco_mpi_command(cmd ${T_RANKS} $<TARGET_FILE:${exe}> ${T_COMMAND})
  if(DEFINED T_PASS)
    diloco_checked_command(cmd ${cmd})
  endif()
  add_test(NAME ${name} COMMAND ${cmd})
  if(DEFINED T_PASS)
    diloco_expect_output(${name} "${T_PASS}")
  endif()
  set(env ${DILOCO_MPIEXEC_ENVIRONMENT} ${T_ENVIRONMENT})
  set_tests_properties(${name} PROPERTIES LABELS "mpi;${T_LABELS}" TIMEOUT ${T_TIMEOUT})
  if(env)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}")
  endif()
  set_tests_properties(${name} PROPERTIES
    # Ranks spin while they wait for each other: running two MPI jobs at
    # once on a small machine only slows both.
    RESOURCE_LOCK mpi_job)
endfunction()
