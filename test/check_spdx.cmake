# SPDX-License-Identifier: Apache-2.0
# cmake -DSOURCE_DIR=<repo> -P check_spdx.cmake
# Every source file of the project names its licence (Apache-2.0, LICENSE)
# in an SPDX line within its first three lines.
cmake_policy(SET CMP0009 NEW)  # do not follow symlinks
# The project's own folders only (never a build tree, wherever it lies).
set(files CMakeLists.txt)
foreach(dir include test bench examples fuzz scripts cmake test_package)
  file(GLOB_RECURSE found RELATIVE ${SOURCE_DIR}
    ${SOURCE_DIR}/${dir}/*.hpp ${SOURCE_DIR}/${dir}/*.cuh ${SOURCE_DIR}/${dir}/*.cpp ${SOURCE_DIR}/${dir}/*.cu
    ${SOURCE_DIR}/${dir}/*.cmake ${SOURCE_DIR}/${dir}/*.py ${SOURCE_DIR}/${dir}/*.sh ${SOURCE_DIR}/${dir}/CMakeLists.txt)
  list(APPEND files ${found})
endforeach()
list(FILTER files EXCLUDE REGEX "(^|/)build[^/]*/")
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
