# SPDX-License-Identifier: Apache-2.0
# Finds the optional backends according to DILOCO_ENABLE_<X> (ON/OFF/AUTO)
# and sets DILOCO_HAVE_<X>. A backend asked for with ON that is not found is
# a configure error; AUTO skips it with a status line.

function(_diloco_resolve name found)
  if(DILOCO_ENABLE_${name} STREQUAL "ON" AND NOT ${found})
    message(FATAL_ERROR "diloco: DILOCO_ENABLE_${name}=ON but ${name} was not found")
  endif()
  if(${found} AND NOT DILOCO_ENABLE_${name} STREQUAL "OFF")
    set(DILOCO_HAVE_${name} ON PARENT_SCOPE)
  else()
    set(DILOCO_HAVE_${name} OFF PARENT_SCOPE)
    if(NOT DILOCO_ENABLE_${name} STREQUAL "OFF")
      message(STATUS "diloco: ${name} not found, skipping it")
    endif()
  endif()
endfunction()

# OpenMP: the host executor's threads, for diloco's own targets and the
# diloco::openmp component (a consumer's choice; diloco::diloco does not
# carry it).
set(_found OFF)
if(NOT DILOCO_ENABLE_OPENMP STREQUAL "OFF")
  find_package(OpenMP COMPONENTS CXX QUIET)
  set(_found ${OpenMP_CXX_FOUND})
endif()
_diloco_resolve(OPENMP _found)

# CUDA: the device backend, its tests, example and benchmark.
set(_found OFF)
if(NOT DILOCO_ENABLE_CUDA STREQUAL "OFF")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # No GPU is needed to build: default to Hopper (sm_90) unless told.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit QUIET)
    set(_found ${CUDAToolkit_FOUND})
  endif()
endif()
_diloco_resolve(CUDA _found)

# MPI: the mpi communicator.
set(_found OFF)
if(NOT DILOCO_ENABLE_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
  set(_found ${MPI_CXX_FOUND})
endif()
_diloco_resolve(MPI _found)

# Gloo: the TCP communicator.
set(_found OFF)
if(NOT DILOCO_ENABLE_GLOO STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  set(_found ${Gloo_FOUND})
endif()
_diloco_resolve(GLOO _found)

# NCCL: the GPU communicator (needs CUDA).
set(_found OFF)
if(NOT DILOCO_ENABLE_NCCL STREQUAL "OFF" AND DILOCO_HAVE_CUDA)
  find_path(DILOCO_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(DILOCO_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(DILOCO_NCCL_INCLUDE_DIR AND DILOCO_NCCL_LIBRARY)
    set(_found ON)
    # A hint for the installed package's own search (dilocoConfig.cmake).
    get_filename_component(DILOCO_NCCL_LIBRARY_DIR "${DILOCO_NCCL_LIBRARY}" DIRECTORY)
  endif()
endif()
_diloco_resolve(NCCL _found)

# libtorch: the diloco::torch adapter (tensor/torch.hpp), its tests and the
# GPT example. Debian's libtorch-dev ships TorchConfig.cmake. AUTO leaves it
# out of sanitizer builds (libtorch and its OpenMP runtime are not
# instrumented: TSan reports their synchronization, ASan their allocations);
# ON there is honoured.
set(_found OFF)
if(DILOCO_ENABLE_TORCH STREQUAL "AUTO" AND DILOCO_SANITIZE)
  set(DILOCO_ENABLE_TORCH_EFFECTIVE OFF)
  message(STATUS "diloco: Torch skipped in a sanitizer build (DILOCO_SANITIZE=${DILOCO_SANITIZE})")
else()
  set(DILOCO_ENABLE_TORCH_EFFECTIVE ${DILOCO_ENABLE_TORCH})
endif()
if(NOT DILOCO_ENABLE_TORCH_EFFECTIVE STREQUAL "OFF")
  find_package(Torch QUIET)
  set(_found ${Torch_FOUND})
endif()
if(DILOCO_ENABLE_TORCH_EFFECTIVE STREQUAL "OFF")
  set(DILOCO_HAVE_TORCH OFF)
else()
  _diloco_resolve(TORCH _found)
endif()

# nlohmann-json: diloco::json (core/json.hpp) and diloco::experiment.
set(_found OFF)
if(NOT DILOCO_ENABLE_JSON STREQUAL "OFF")
  find_package(nlohmann_json 3 CONFIG QUIET)
  set(_found ${nlohmann_json_FOUND})
endif()
_diloco_resolve(JSON _found)
unset(_found)

# C++20 for nvcc, through the same function the installed package applies
# to diloco::cuda (cmake/dilocoCudaStandard.cmake). diloco_cuda_cxx20 is for
# diloco's own CUDA targets that do not link diloco::cuda.
include(dilocoCudaStandard)
function(diloco_cuda_cxx20 target)
  diloco_require_cuda_cxx20(${target} PRIVATE)
endfunction()

# Component targets: diloco::openmp, diloco::mpi, diloco::gloo, diloco::nccl,
# diloco::cuda, diloco::torch, diloco::json. Each is an INTERFACE target on top of diloco::diloco that
# brings its dependency; the communicator headers are usable only through
# them.
function(_diloco_add_component name)
  add_library(diloco_${name} INTERFACE)
  add_library(diloco::${name} ALIAS diloco_${name})
  set_target_properties(diloco_${name} PROPERTIES EXPORT_NAME ${name})
  target_link_libraries(diloco_${name} INTERFACE ${ARGN})
endfunction()

macro(diloco_add_backend_targets)
  if(DILOCO_HAVE_OPENMP)
    # The host executor runs its passes on OpenMP threads in translation
    # units compiled with OpenMP (it checks _OPENMP), serially otherwise.
    _diloco_add_component(openmp diloco OpenMP::OpenMP_CXX)
  endif()
  if(DILOCO_HAVE_MPI)
    _diloco_add_component(mpi diloco MPI::MPI_CXX)
  endif()
  if(DILOCO_HAVE_GLOO)
    _diloco_add_component(gloo diloco gloo)
  endif()
  if(DILOCO_HAVE_CUDA)
    _diloco_add_component(cuda diloco CUDA::cudart)
    # Host code (g++) may use the CUDA runtime too: device-buffer staging in
    # the communicators is compiled where this is defined.
    target_compile_definitions(diloco_cuda INTERFACE DILOCO_WITH_CUDA=1)
    # nvcc compiles the consumer's .cu files as C++20 (the installed config
    # applies the same function anew, in the consumer's CMake).
    diloco_require_cuda_cxx20(diloco_cuda INTERFACE BUILD_ONLY)
  endif()
  if(DILOCO_HAVE_NCCL)
    # In the build tree the library found above; installed, the imported
    # target diloco::nccl_library that dilocoConfig.cmake finds anew.
    _diloco_add_component(nccl diloco_cuda "$<BUILD_INTERFACE:${DILOCO_NCCL_LIBRARY}>"
                          "$<INSTALL_INTERFACE:diloco::nccl_library>")
    target_include_directories(diloco_nccl SYSTEM INTERFACE "$<BUILD_INTERFACE:${DILOCO_NCCL_INCLUDE_DIR}>")
  endif()
  if(DILOCO_HAVE_TORCH)
    # `torch` is the imported target of TorchConfig.cmake (it brings
    # libtorch_cpu, c10 and the ABI flag); installed, dilocoConfig.cmake
    # finds Torch again.
    _diloco_add_component(torch diloco torch)
  endif()
  if(DILOCO_HAVE_JSON)
    _diloco_add_component(json diloco nlohmann_json::nlohmann_json)
  endif()
endmacro()
