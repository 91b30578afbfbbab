# SPDX-License-Identifier: Apache-2.0
# diloco_require_cuda_cxx20(<target> <INTERFACE|PUBLIC|PRIVATE> [BUILD_ONLY]):
# nvcc compiles <target>'s CUDA sources (or its consumers', for INTERFACE) as
# C++20, with exactly one -std flag whatever CMake version runs. BUILD_ONLY
# keeps the requirement out of the exported target (the installed config
# adds its own).
#
# CMake 3.25.2 and later know nvcc's C++20 flag (cuda_std_20): the compile
# feature asks for it, and it agrees with a CMAKE_CUDA_STANDARD of 20 set by
# the consumer (one flag). CMake up to 3.25.1 (Debian 12's) knows no such
# flag and adds none when no CUDA standard is set, so nvcc 12+ would compile
# at its default, C++17: the flag is passed as an option instead.
#
# Used by diloco's own build (cmake/diloco_backends.cmake) and installed next
# to dilocoConfig.cmake, which applies it to the imported diloco::cuda in the
# consumer's CMake: the choice is made by the CMake that compiles, not the
# one that installed.
function(diloco_require_cuda_cxx20 target scope)
  if(CMAKE_CUDA_COMPILER_LOADED)
    # CUDA is enabled: CMake says what it knows.
    set(knows_cuda20 OFF)
    if("cuda_std_20" IN_LIST CMAKE_CUDA_COMPILE_FEATURES)
      set(knows_cuda20 ON)
    endif()
  elseif(CMAKE_VERSION VERSION_LESS 3.25.2)
    set(knows_cuda20 OFF)
  else()
    set(knows_cuda20 ON)
  endif()
  if(knows_cuda20)
    set(requirement cuda_std_20)
  else()
    set(requirement $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  endif()
  if("BUILD_ONLY" IN_LIST ARGN)
    set(requirement $<BUILD_INTERFACE:${requirement}>)
  endif()
  if(knows_cuda20)
    target_compile_features(${target} ${scope} ${requirement})
  else()
    target_compile_options(${target} ${scope} ${requirement})
  endif()
endfunction()
