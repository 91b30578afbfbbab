# SPDX-License-Identifier: Apache-2.0
# cmake "-DTHREADS_COMMAND=exe;args" "-DOTHER_COMMAND=mpirun;...;exe;args" -P compare_demo_tables.cmake
# (OTHER_COMMAND: the demo over MPI, or over Gloo through launch_gloo.sh)
# Runs the demo both ways and requires the same rows (method, held-out loss,
# bytes per worker, rounds); only the seconds and hidden columns may differ.
# -DROW_REGEX=... -DROW_COUNT=n: another program's rows (train_gpt's).
function(table_of out)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${text}\n${err}")
  endif()
  # Data parallel, blocking DiLoCo and the schedule rows (streaming, one-step
  # delay, eager: their numbers do not depend on when an exchange completes).
  if(NOT DEFINED ROW_REGEX)
    set(ROW_REGEX
        "(data parallel|diloco \\(H=[0-9]+\\)|diloco streaming P=[0-9]+ tau=[0-9]+|diloco one-step delay|diloco eager) +[0-9.]+ +[0-9.]+ [kM]B +[0-9]+")
    set(ROW_COUNT 5)
  endif()
  string(REGEX MATCHALL "${ROW_REGEX}" rows "${text}")
  list(LENGTH rows n)
  if(NOT n EQUAL ROW_COUNT)
    message(FATAL_ERROR "expected ${ROW_COUNT} table rows from ${ARGN}, found ${n}:\n${text}")
  endif()
  set(${out} "${rows}" PARENT_SCOPE)
endfunction()

table_of(threads ${THREADS_COMMAND})
table_of(other ${OTHER_COMMAND})
message(STATUS "threads: ${threads}")
message(STATUS "other:   ${other}")
if(NOT threads STREQUAL other)
  message(FATAL_ERROR "the demo's table differs from the threads demo's:\n  threads: ${threads}\n  other:   ${other}")
endif()
