# SPDX-License-Identifier: Apache-2.0
# cmake -DDILOCO_SOURCE_DIR=.. -DWORK_DIR=.. -DCXX=.. -DGENERATOR=.. -DFEATURES=core,mpi,...
#       [-DNVCC=..] -P run_vcpkg_port.cmake
# ports/diloco checked as far as it can be without the vcpkg tool: its
# portfile runs here against stand-ins for the vcpkg_* helpers it calls
# (each doing what vcpkg's documentation says, with plain CMake), then a
# consumer is built against what it installed, following the port's usage.
# The stand-ins also check what vcpkg would refuse: a feature the portfile
# maps that vcpkg.json does not declare, a debug build of a header-only port,
# a config fixup that would have to move files.
cmake_minimum_required(VERSION 3.21)  # IN_LIST, string(JSON)
include(${CMAKE_CURRENT_LIST_DIR}/run_common.cmake)
string(REPLACE "," ";" FEATURES "${FEATURES}")
set(port_dir ${DILOCO_SOURCE_DIR}/ports/diloco)
file(REMOVE_RECURSE ${WORK_DIR})

# ---------------------------------------------------------- the manifest
file(READ ${port_dir}/vcpkg.json manifest)
string(JSON port_name GET "${manifest}" name)
string(JSON port_version GET "${manifest}" version-semver)
file(STRINGS ${DILOCO_SOURCE_DIR}/include/diloco/version.hpp version_lines REGEX "^#define DILOCO_VERSION_[A-Z]+ [0-9]+$")
string(REGEX REPLACE "[^;]*MAJOR ([0-9]+);[^;]*MINOR ([0-9]+);[^;]*PATCH ([0-9]+)" "\\1.\\2.\\3" header_version
       "${version_lines}")
if(NOT port_version STREQUAL header_version)
  message(FATAL_ERROR "vcpkg.json has version ${port_version}; include/diloco/version.hpp says ${header_version}")
endif()
# What vcpkg shows a user and where it lets the port build (a port without
# "supports" claims every platform).
string(JSON homepage ERROR_VARIABLE no_homepage GET "${manifest}" homepage)
if(no_homepage OR NOT homepage MATCHES "^https://")
  message(FATAL_ERROR "vcpkg.json has no https homepage (${no_homepage})")
endif()
string(JSON supports ERROR_VARIABLE no_supports GET "${manifest}" supports)
if(no_supports OR supports STREQUAL "")
  message(FATAL_ERROR "vcpkg.json says nothing of the platforms it supports (${no_supports})")
endif()
string(JSON feature_count LENGTH "${manifest}" features)
set(declared_features "")
math(EXPR last "${feature_count} - 1")
foreach(i RANGE ${last})
  string(JSON feature MEMBER "${manifest}" features ${i})
  list(APPEND declared_features ${feature})
endforeach()
foreach(feature IN LISTS FEATURES)
  if(NOT feature STREQUAL "core" AND NOT feature IN_LIST declared_features)
    message(FATAL_ERROR "feature '${feature}' is not in vcpkg.json (${declared_features})")
  endif()
endforeach()

# ------------------------------------------- what vcpkg sets for a portfile
set(PORT ${port_name})
set(VERSION ${port_version})
set(TARGET_TRIPLET x64-linux)
set(CURRENT_PACKAGES_DIR ${WORK_DIR}/packages/${PORT}_${TARGET_TRIPLET})
set(CURRENT_BUILDTREES_DIR ${WORK_DIR}/buildtrees/${PORT})

# ------------------------------------------ stand-ins for vcpkg's helpers
# vcpkg_check_features: -D<option>=ON for each requested feature, OFF else.
function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS" "FEATURES")
  set(options "")
  while(arg_FEATURES)
    list(POP_FRONT arg_FEATURES feature option)
    if(NOT feature IN_LIST declared_features)
      message(FATAL_ERROR "the portfile maps feature '${feature}', which vcpkg.json does not declare")
    endif()
    if(feature IN_LIST FEATURES)
      list(APPEND options -D${option}=ON)
    else()
      list(APPEND options -D${option}=OFF)
    endif()
  endwhile()
  set(${arg_OUT_FEATURE_OPTIONS} ${options} PARENT_SCOPE)
endfunction()

# vcpkg_find_cuda (from the cuda port): the toolkit's root, and NVCC.
function(vcpkg_find_cuda)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_CUDA_TOOLKIT_ROOT;OUT_CUDA_VERSION" "")
  if(NOT NVCC)
    message(FATAL_ERROR "the cuda feature needs -DNVCC=<nvcc>")
  endif()
  get_filename_component(bin ${NVCC} DIRECTORY)
  get_filename_component(root ${bin} DIRECTORY)
  set(${arg_OUT_CUDA_TOOLKIT_ROOT} ${root} PARENT_SCOPE)
  set(NVCC ${NVCC} PARENT_SCOPE)
endfunction()

# vcpkg_cmake_configure: the release configuration only (header-only).
function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS;OPTIONS_RELEASE;MAYBE_UNUSED_VARIABLES")
  if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
    message(FATAL_ERROR "a header-only port sets VCPKG_BUILD_TYPE release before configuring")
  endif()
  set(build ${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel)
  run(${CMAKE_COMMAND} -S ${arg_SOURCE_PATH} -B ${build} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR} ${arg_OPTIONS} ${arg_OPTIONS_RELEASE})
  set_property(GLOBAL PROPERTY vcpkg_configure_options ${arg_OPTIONS})
endfunction()

# vcpkg_cmake_install: builds the install target of each configuration.
function(vcpkg_cmake_install)
  run(${CMAKE_COMMAND} --build ${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel --target install)
endfunction()

# vcpkg_cmake_config_fixup: the package's CMake files end in
# share/<PACKAGE_NAME> (default: the port's name). The port installs them
# there already, so nothing moves; moving them is vcpkg's business and not
# imitated here.
function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "PACKAGE_NAME;CONFIG_PATH" "")
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME ${PORT})
  endif()
  if(NOT arg_CONFIG_PATH)
    set(arg_CONFIG_PATH share/${arg_PACKAGE_NAME})
  endif()
  if(NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
    message(FATAL_ERROR "CONFIG_PATH ${arg_CONFIG_PATH}: this check expects the port to install to share/${arg_PACKAGE_NAME}")
  endif()
  if(NOT EXISTS ${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}/${arg_PACKAGE_NAME}Config.cmake)
    message(FATAL_ERROR "no ${arg_PACKAGE_NAME}Config.cmake in ${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}")
  endif()
  file(REMOVE_RECURSE ${CURRENT_PACKAGES_DIR}/debug/share)
endfunction()

# vcpkg_install_copyright: the files, concatenated, as share/<port>/copyright.
function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
  set(text "")
  foreach(f IN LISTS arg_FILE_LIST)
    file(READ ${f} part)
    string(APPEND text "${part}")
  endforeach()
  file(WRITE ${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright "${text}")
endfunction()

# ------------------------------------------------------------ the portfile
include(${port_dir}/portfile.cmake)

# ----------------------------------------------- what a package must hold
foreach(f share/diloco/dilocoConfig.cmake share/diloco/dilocoConfigVersion.cmake share/diloco/dilocoTargets.cmake
          share/diloco/copyright share/diloco/usage include/diloco/diloco.hpp include/diloco/version.hpp
          tools/diloco/diloco-launch)
  if(NOT EXISTS ${CURRENT_PACKAGES_DIR}/${f})
    message(FATAL_ERROR "the port did not install ${f}")
  endif()
endforeach()
foreach(d debug lib bin share/cmake)
  if(EXISTS ${CURRENT_PACKAGES_DIR}/${d})
    message(FATAL_ERROR "a header-only package has no ${d}/ (vcpkg's post-build checks refuse it)")
  endif()
endforeach()
file(READ ${CURRENT_PACKAGES_DIR}/share/diloco/copyright copyright)
if(NOT copyright MATCHES "Apache License")
  message(FATAL_ERROR "share/diloco/copyright is not the Apache-2.0 licence")
endif()
# Each requested feature is an installed component, and only those.
get_property(options GLOBAL PROPERTY vcpkg_configure_options)
file(READ ${CURRENT_PACKAGES_DIR}/share/diloco/dilocoTargets.cmake targets)
foreach(feature IN LISTS declared_features)
  string(TOUPPER ${feature} upper)
  if(feature IN_LIST FEATURES)
    set(state ON)
  else()
    set(state OFF)
  endif()
  if(NOT "-DDILOCO_ENABLE_${upper}=${state}" IN_LIST options)
    message(FATAL_ERROR "the portfile did not pass -DDILOCO_ENABLE_${upper}=${state}: ${options}")
  endif()
  if(feature IN_LIST FEATURES AND NOT targets MATCHES "add_library\\(diloco::${feature} ")
    message(FATAL_ERROR "feature ${feature} requested, but the package has no diloco::${feature}")
  endif()
  if(NOT feature IN_LIST FEATURES AND targets MATCHES "add_library\\(diloco::${feature} ")
    message(FATAL_ERROR "feature ${feature} not requested, but the package has diloco::${feature}")
  endif()
endforeach()
# The consumer follows the usage file: find_package(diloco CONFIG REQUIRED)
# and diloco::diloco.
file(READ ${CURRENT_PACKAGES_DIR}/share/diloco/usage usage)
if(NOT usage MATCHES "find_package\\(diloco CONFIG REQUIRED\\)" OR NOT usage MATCHES "diloco::diloco")
  message(FATAL_ERROR "the usage file does not say find_package(diloco CONFIG REQUIRED) / diloco::diloco:\n${usage}")
endif()

# ----------------------------------- a consumer of the installed package
# (run also as 2 ranks under the launcher, from tools/diloco)
set(MODE find_package)
set(INSTALLED_PREFIX ${CURRENT_PACKAGES_DIR})
set(LAUNCHER tools/diloco/diloco-launch)
set(WORK_DIR ${WORK_DIR}/consumer)
include(${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
