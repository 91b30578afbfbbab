# SPDX-License-Identifier: Apache-2.0
# cmake -DPLAIN=exe -DFMA=exe -DFMA_FLAGS="flags" -P compare.cmake
# Runs the probe built with the default flags and the one built with
# FMA_FLAGS (-O3 -mfma -ffp-contract=fast; -O3 -mfma with Clang); their
# outputs (a hash per training run) must be equal line for line. "SKIPPED"
# when the CPU lacks FMA. The plain probe runs with DILOCO_HOST_SIMD=0, the
# portable passes, and the FMA probe with the hand-vectorised host passes
# (kernels/host_simd.hpp) where the CPU has AVX2: the same bits both ways.
execute_process(COMMAND ${CMAKE_COMMAND} -E env DILOCO_HOST_SIMD=0 ${PLAIN} RESULT_VARIABLE rc_plain OUTPUT_VARIABLE plain ERROR_VARIABLE err_plain)
execute_process(COMMAND ${FMA} RESULT_VARIABLE rc_fma OUTPUT_VARIABLE fma ERROR_VARIABLE err_fma)
if(NOT rc_plain EQUAL 0 OR NOT rc_fma EQUAL 0)
  message(FATAL_ERROR "probe failed: plain exit ${rc_plain} (${err_plain}), fma exit ${rc_fma} (${err_fma})")
endif()
if(fma MATCHES "SKIPPED")
  message(STATUS "${fma}")
  return()
endif()
message(STATUS "default flags, portable passes:\n${plain}${FMA_FLAGS}, host SIMD passes:\n${fma}")
if(NOT plain STREQUAL fma)
  message(FATAL_ERROR "the bits depend on the contraction flags or on the host SIMD passes:\n"
                      "default flags, portable passes:\n${plain}\n${FMA_FLAGS}, host SIMD passes:\n${fma}")
endif()
string(REGEX MATCHALL "\n" lines "${plain}")
list(LENGTH lines n)
if(n LESS 9)
  message(FATAL_ERROR "expected 9 runs, got ${n} lines:\n${plain}")
endif()
