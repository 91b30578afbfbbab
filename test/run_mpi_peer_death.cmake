# SPDX-License-Identifier: Apache-2.0
# cmake "-DLAUNCH=mpiexec;-n;3;..." -DEXE=test_comm_mpi_peer_death -DMODE=error|abort
#       [-DPOSTFLAGS=..] -P run_mpi_peer_death.cmake
# Runs test_comm_mpi_peer_death, in which the last of 3 ranks kills itself,
# under a launcher that keeps the job alive, and judges the survivors by
# their output (mpirun's status only says that a rank died):
#   error: each of the 2 survivors prints 5 PASS lines and no FAIL line;
#   abort: a survivor prints the timeout message and "calling MPI_Abort",
#          and no FAIL line (nothing after the call ran).
# The run is bounded here too (60 s), below the CTest TIMEOUT.
execute_process(COMMAND ${LAUNCH} ${EXE} ${POSTFLAGS} ${MODE}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
message("${out}")
message("${err}")
message("mpirun exit status: ${rc}")
set(all "${out}\n${err}")
if(rc MATCHES "timeout")
  message(FATAL_ERROR "the job did not end within 60 s")
endif()
if(all MATCHES "FAIL")
  message(FATAL_ERROR "a survivor reported a failure")
endif()
if(MODE STREQUAL "error")
  foreach(rank 0 1)
    string(REGEX MATCHALL "rank ${rank}: PASS" passes "${all}")
    list(LENGTH passes n)
    if(NOT n EQUAL 5)
      message(FATAL_ERROR "rank ${rank} printed ${n} PASS lines, expected 5")
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
  message(FATAL_ERROR "MODE must be error or abort, got '${MODE}'")
endif()
