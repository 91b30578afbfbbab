# CLI11 (header-only; Debian's libcli11-dev, installed by
# scripts/install-deps.sh) for the command lines of the demo and the
# slow-link benchmark: its CMake package where there is one, else the
# header alone. Defines the target CLI11::CLI11 in the including directory.
if(NOT TARGET CLI11::CLI11)
  find_package(CLI11 CONFIG QUIET)
endif()
if(NOT TARGET CLI11::CLI11)
  find_path(DILOCO_CLI11_INCLUDE_DIR CLI/CLI.hpp)
  if(NOT DILOCO_CLI11_INCLUDE_DIR)
    message(FATAL_ERROR "The demo and bench/wan need CLI11 (Debian: libcli11-dev; scripts/install-deps.sh installs it), "
                        "or configure with -DDILOCO_BUILD_EXAMPLES=OFF -DDILOCO_BUILD_BENCHMARKS=OFF")
  endif()
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 SYSTEM INTERFACE ${DILOCO_CLI11_INCLUDE_DIR})
endif()
