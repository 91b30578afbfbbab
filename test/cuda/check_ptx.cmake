# SPDX-License-Identifier: Apache-2.0
# cmake -DNVCC=... -DSOURCE=... -DINCLUDE=... -DOUT=... -DARCH=sm_90 [-DLOAD_ONLY=regex] -P check_ptx.cmake
# Compiles SOURCE to PTX and checks that every kernel entry in it uses
# 128-bit global loads and stores (st.global.v4, or its streaming form
# st.global.cs.v4): the fused passes are bandwidth-bound and must move 16
# bytes per access where alignment allows. Kernels whose name matches
# LOAD_ONLY write no arrays (the payload checksum) and need only the loads.
if(NOT DEFINED LOAD_ONLY OR LOAD_ONLY STREQUAL "")
  set(LOAD_ONLY "^$")
endif()
execute_process(
  COMMAND ${NVCC} -std=c++20 -arch=${ARCH} -ptx -I${INCLUDE} ${SOURCE} -o ${OUT}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvcc -ptx failed (${rc}):\n${err}")
endif()
file(READ ${OUT} rest)

# Walk the kernel entries with string(FIND): PTX is full of ';' and '[',
# which CMake lists would split on or group by.
set(marker ".entry ")
set(kernels 0)
set(failures "")
string(FIND "${rest}" "${marker}" pos)
while(NOT pos EQUAL -1)
  string(SUBSTRING "${rest}" ${pos} -1 rest)
  string(SUBSTRING "${rest}" 7 -1 after)
  string(FIND "${after}" "${marker}" next)
  if(next EQUAL -1)
    set(body "${rest}")
  else()
    math(EXPR length "${next} + 7")
    string(SUBSTRING "${rest}" 0 ${length} body)
  endif()
  string(REGEX MATCH "^\\.entry ([A-Za-z0-9_]+)" _ "${body}")
  set(name "${CMAKE_MATCH_1}")
  # Only diloco's kernels (thrust brings an empty kernel of its own).
  if(NOT name MATCHES "^_ZN6diloco")
    set(body "")
  else()
    math(EXPR kernels "${kernels} + 1")
  endif()
  if(body AND NOT body MATCHES "ld\\.global(\\.nc)?\\.v4\\.(f32|b32|u32)")
    string(APPEND failures "  ${name}: no ld.global.v4 / ld.global.nc.v4\n")
  endif()
  if(body AND NOT name MATCHES "${LOAD_ONLY}" AND NOT body MATCHES "st\\.global(\\.cs)?\\.v4\\.(f32|b32|u32)")
    string(APPEND failures "  ${name}: no st.global.v4\n")
  endif()
  if(body)
    message(STATUS "checked ${name}")
  endif()
  if(next EQUAL -1)
    set(pos -1)
  else()
    string(SUBSTRING "${rest}" ${length} -1 rest)
    set(pos 0)
  endif()
endwhile()

if(kernels LESS EXPECTED)
  message(FATAL_ERROR "expected ${EXPECTED} kernel entries in ${OUT}, found ${kernels}")
endif()
if(failures)
  message(FATAL_ERROR "kernels without 128-bit global accesses:\n${failures}")
endif()
message(STATUS "all ${kernels} kernels use ld.global(.nc).v4 and st.global.v4")
