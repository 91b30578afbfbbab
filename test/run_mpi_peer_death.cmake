# SPDX-License-Identifier: Apache-2.0
# cmake "-DLAUNCH=mpiexec;-n;3;..." -DEXE=test_comm_mpi_peer_death -DMODE=error|abort|default
#       [-DPOSTFLAGS=..] -P run_mpi_peer_death.cmake
# Runs test_comm_mpi_peer_death, in which the last of 3 ranks kills itself,
# under a launcher that keeps the job alive, and judges the survivors by
# their output (mpirun's status only says that a rank died):
#   error: each of the 2 survivors prints 5 PASS lines and no FAIL line;
#   abort: a survivor prints the timeout message and "calling MPI_Abort",
#          and no FAIL line (nothing after the call ran);
#   default: with no timeout set, each survivor prints 3 PASS lines, its
#          all-reduce raising comm_error at the default timeout (30 s).
# The run is bounded here too (60 s, 90 s for default), below the CTest
# TIMEOUT.
set(bound 60)
if(MODE STREQUAL "default")
  set(bound 90)
endif()
execute_process(COMMAND ${LAUNCH} ${EXE} ${POSTFLAGS} ${MODE}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT ${bound})
message("${out}")
message("${err}")
message("mpirun exit status: ${rc}")
set(all "${out}\n${err}")
if(rc MATCHES "timeout")
  message(FATAL_ERROR "the job did not end within ${bound} s")
endif()
if(all MATCHES "FAIL")
  message(FATAL_ERROR "a survivor reported a failure")
endif()
if(MODE STREQUAL "error" OR MODE STREQUAL "default")
  if(MODE STREQUAL "error")
    set(want 5)
  else()
    set(want 3)
    if(NOT all MATCHES "mpi all_reduce on rank [01]: MPI_Iallreduce \\(argument check\\) did not complete within the timeout of 30000 ms")
      message(FATAL_ERROR "no survivor printed the default timeout's comm_error")
    endif()
  endif()
  foreach(rank 0 1)
    string(REGEX MATCHALL "rank ${rank}: PASS" passes "${all}")
    list(LENGTH passes n)
    if(NOT n EQUAL want)
      message(FATAL_ERROR "rank ${rank} printed ${n} PASS lines, expected ${want}")
    endif()
  endforeach()
elseif(MODE STREQUAL "abort")
  if(NOT all MATCHES "diloco: mpi all_reduce on rank [01]: MPI_Iallreduce \\(argument check\\) did not complete within the timeout of 1000 ms; a peer rank may have died[^\n]*calling MPI_Abort \\(abort_on_timeout is set\\)")
    message(FATAL_ERROR "no survivor printed the timeout message before MPI_Abort")
  endif()
  if(rc EQUAL 0)
    message(FATAL_ERROR "mpirun exited 0 after MPI_Abort")
  endif()
else()
  message(FATAL_ERROR "MODE must be error, abort or default, got '${MODE}'")
endif()
