# The demo's and the benchmarks' command lines are parsed with CLI11
# (header-only; Debian's libcli11-dev, installed by scripts/install-deps.sh),
# so a malformed or out-of-range value exits non-zero with a message naming
# the option. Its CMake package is used when there is one, else the header
# alone.
if(TARGET CLI11::CLI11)
  return()
endif()
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(DILOCO_CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(NOT DILOCO_CLI11_INCLUDE_DIR)
    message(FATAL_ERROR "The demo and the benchmarks need CLI11 (Debian: libcli11-dev; scripts/install-deps.sh "
                        "installs it), or configure with -DDILOCO_BUILD_EXAMPLES=OFF -DDILOCO_BUILD_BENCHMARKS=OFF")
  endif()
  add_library(CLI11::CLI11 INTERFACE IMPORTED GLOBAL)
  target_include_directories(CLI11::CLI11 SYSTEM INTERFACE ${DILOCO_CLI11_INCLUDE_DIR})
endif()
