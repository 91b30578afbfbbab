# SPDX-License-Identifier: Apache-2.0
# diloco as a vcpkg overlay port, built from the checkout this file lives in
# (ports/diloco/ of the diloco source tree):
#   vcpkg install "diloco[mpi,cuda]" --overlay-ports=<diloco checkout>/ports
# or, in manifest mode, "overlay-ports" in vcpkg-configuration.json. The
# library is header-only: one release configuration installs the headers,
# diloco's CMake package (share/diloco) and the launcher, diloco-launch
# (tools/diloco, where vcpkg keeps a port's programs).
set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../..")
if(NOT EXISTS "${SOURCE_PATH}/include/diloco/version.hpp")
  message(FATAL_ERROR "ports/diloco is used from a diloco checkout (its portfile builds the tree it is in); "
                      "${SOURCE_PATH} is not one")
endif()
set(VCPKG_BUILD_TYPE release)

# A feature ON makes its component required (a missing dependency stops the
# configure, naming it); OFF leaves it out.
vcpkg_check_features(OUT_FEATURE_OPTIONS feature_options
  FEATURES
    openmp DILOCO_ENABLE_OPENMP
    mpi    DILOCO_ENABLE_MPI
    gloo   DILOCO_ENABLE_GLOO
    cuda   DILOCO_ENABLE_CUDA
    nccl   DILOCO_ENABLE_NCCL
    torch  DILOCO_ENABLE_TORCH
    json   DILOCO_ENABLE_JSON)
if("cuda" IN_LIST FEATURES)
  vcpkg_find_cuda(OUT_CUDA_TOOLKIT_ROOT cuda_toolkit_root)
  list(APPEND feature_options "-DCMAKE_CUDA_COMPILER=${NVCC}" "-DCUDAToolkit_ROOT=${cuda_toolkit_root}")
endif()

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DDILOCO_BUILD_TESTS=OFF
    -DDILOCO_BUILD_EXAMPLES=OFF
    -DDILOCO_BUILD_BENCHMARKS=OFF
    -DDILOCO_BUILD_DOCS=OFF
    -DDILOCO_INSTALL=ON
    -DDILOCO_INSTALL_CMAKEDIR=share/diloco
    ${feature_options})
vcpkg_cmake_install()
vcpkg_cmake_config_fixup()
# The install puts the launcher in bin/, which vcpkg's checks refuse in a
# static triplet: programs go to tools/<port>.
file(INSTALL "${CURRENT_PACKAGES_DIR}/bin/diloco-launch" DESTINATION "${CURRENT_PACKAGES_DIR}/tools/${PORT}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/bin")

vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
