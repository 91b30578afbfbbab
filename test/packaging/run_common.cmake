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

# The build type of the consumers run_consumer.cmake and
# run_mpi_consumer.cmake configure: Release, with flags that say no -O (the
# compilers' -O0: -DNDEBUG alone). What they check is the package (its
# targets, components, flags and launcher) and the consumer's output, not
# optimised code, which the examples and benchmarks build; -O3 made their
# compiles about 1.6 times as long (consumer_torch: 27 s against 17 s).
set(consumer_build_type -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG
                        -DCMAKE_CUDA_FLAGS_RELEASE=-DNDEBUG)

# run(<command>...): the same, whatever the output.
function(run)
  run_matching("" ${ARGN})
endfunction()
