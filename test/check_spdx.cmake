# SPDX-License-Identifier: Apache-2.0
# cmake -DSOURCE_DIR=<repo> -P check_spdx.cmake
# Every source file of the project names its licence (Apache-2.0, LICENSE)
# in an SPDX line within its first three lines.
file(GLOB_RECURSE files RELATIVE ${SOURCE_DIR}
  ${SOURCE_DIR}/include/*.hpp ${SOURCE_DIR}/include/*.cuh
  ${SOURCE_DIR}/test/*.hpp ${SOURCE_DIR}/test/*.cpp ${SOURCE_DIR}/test/*.cu ${SOURCE_DIR}/test/*.cmake
  ${SOURCE_DIR}/bench/*.hpp ${SOURCE_DIR}/bench/*.cpp ${SOURCE_DIR}/bench/*.cu ${SOURCE_DIR}/bench/*.py ${SOURCE_DIR}/bench/*.sh
  ${SOURCE_DIR}/examples/*.hpp ${SOURCE_DIR}/examples/*.cpp ${SOURCE_DIR}/examples/*.cu
  ${SOURCE_DIR}/fuzz/*.cpp ${SOURCE_DIR}/fuzz/*.hpp ${SOURCE_DIR}/scripts/*.sh ${SOURCE_DIR}/cmake/*.cmake
  ${SOURCE_DIR}/*CMakeLists.txt)
set(missing "")
foreach(f IN LISTS files)
  file(STRINGS ${SOURCE_DIR}/${f} head LIMIT_COUNT 3)
  if(NOT head MATCHES "SPDX-License-Identifier: Apache-2.0")
    list(APPEND missing ${f})
  endif()
endforeach()
list(LENGTH files n)
if(n LESS 100)
  message(FATAL_ERROR "found only ${n} source files under ${SOURCE_DIR}: wrong directory?")
endif()
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "no SPDX-License-Identifier line in the first 3 lines of:\n  ${missing}")
endif()
message(STATUS "${n} source files carry the SPDX line")
