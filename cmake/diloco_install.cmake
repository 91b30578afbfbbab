# SPDX-License-Identifier: Apache-2.0
# Install the headers, an exported CMake package and the launcher:
#   find_package(diloco CONFIG REQUIRED [COMPONENTS openmp mpi gloo cuda nccl torch json])
# The components are listed once here (DILOCO_COMPONENTS); README, the Conan
# recipe and the vcpkg port list the same ones, which
# test/packaging/check_component_lists.cmake checks.
include(CMakePackageConfigHelpers)

set(DILOCO_COMPONENTS openmp mpi gloo cuda nccl torch json)
set(_targets diloco)
foreach(comp IN LISTS DILOCO_COMPONENTS)
  if(TARGET diloco_${comp})
    list(APPEND _targets diloco_${comp})
    list(APPEND DILOCO_INSTALLED_COMPONENTS ${comp})
  endif()
endforeach()

install(TARGETS ${_targets} EXPORT dilocoTargets)
install(DIRECTORY include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# scripts/launch_gloo.sh, the launcher every doc uses, as bin/diloco-launch.
install(PROGRAMS scripts/launch_gloo.sh DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME diloco-launch)

# Where the CMake package goes (vcpkg's port puts it in share/diloco).
set(DILOCO_INSTALL_CMAKEDIR ${CMAKE_INSTALL_DATADIR}/cmake/diloco CACHE STRING
    "Where to install diloco's CMake package files, relative to the prefix")
set(DILOCO_CMAKE_DIR ${DILOCO_INSTALL_CMAKEDIR})
install(EXPORT dilocoTargets NAMESPACE diloco:: DESTINATION ${DILOCO_CMAKE_DIR})
configure_package_config_file(cmake/dilocoConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/dilocoConfig.cmake
  INSTALL_DESTINATION ${DILOCO_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/dilocoConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/dilocoConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/dilocoConfigVersion.cmake
  cmake/dilocoCudaStandard.cmake
  DESTINATION ${DILOCO_CMAKE_DIR})
unset(_targets)
