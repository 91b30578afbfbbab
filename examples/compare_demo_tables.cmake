# cmake "-DTHREADS_COMMAND=exe;args" "-DMPI_COMMAND=mpirun;...;exe;args" -P compare_demo_tables.cmake
# Runs the demo both ways and requires the same rows (method, held-out loss,
# bytes per worker, rounds); only the seconds column may differ.
function(table_of out)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${text}\n${err}")
  endif()
  string(REGEX MATCHALL "(data parallel|diloco \\(H=[0-9]+\\)) +[0-9.]+ +[0-9.]+ [kM]B +[0-9]+" rows "${text}")
  list(LENGTH rows n)
  if(NOT n EQUAL 2)
    message(FATAL_ERROR "expected 2 table rows from ${ARGN}, found ${n}:\n${text}")
  endif()
  set(${out} "${rows}" PARENT_SCOPE)
endfunction()

table_of(threads ${THREADS_COMMAND})
table_of(mpi ${MPI_COMMAND})
message(STATUS "threads: ${threads}")
message(STATUS "mpi:     ${mpi}")
if(NOT threads STREQUAL mpi)
  message(FATAL_ERROR "the MPI demo's table differs from the threads demo's:\n  threads: ${threads}\n  mpi:     ${mpi}")
endif()
