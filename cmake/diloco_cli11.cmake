# SPDX-License-Identifier: Apache-2.0
# The demo's and the benchmarks' command lines are parsed with CLI11
# (header-only; Debian's libcli11-dev, installed by scripts/install-deps.sh),
# so a malformed or out-of-range value exits non-zero with a message naming
# the option. Its CMake package is used when there is one, else the header
# alone. Without it CLI11::CLI11 stays undefined and the caller leaves its
# programs out with a message (an install does not need them).
if(TARGET CLI11::CLI11)
  return()
endif()
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11 AND NOT CMAKE_DISABLE_FIND_PACKAGE_CLI11)
  find_path(DILOCO_CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(DILOCO_CLI11_INCLUDE_DIR)
    add_library(CLI11::CLI11 INTERFACE IMPORTED GLOBAL)
    target_include_directories(CLI11::CLI11 SYSTEM INTERFACE ${DILOCO_CLI11_INCLUDE_DIR})
  endif()
endif()
