// SPDX-License-Identifier: Apache-2.0
#pragma once

// diloco is C++20 (concepts, designated initializers, std::span): stop a
// compilation in an older mode at once, with one message, instead of
// hundreds of errors from the first concept onwards. Every header a user
// includes directly includes this one first.
//
// GCC and Clang go on after #error, so a missing include follows it: that
// is fatal everywhere, and its file name repeats the rule.

#if defined(_MSVC_LANG)
#define DILOCO_CPLUSPLUS _MSVC_LANG
#else
#define DILOCO_CPLUSPLUS __cplusplus
#endif

#if DILOCO_CPLUSPLUS <= 201703L
#error "diloco needs C++20: compile with -std=c++20 (CMake: link diloco::diloco, or set CMAKE_CXX_STANDARD / CMAKE_CUDA_STANDARD 20)"
#include <diloco_needs_cxx20__compile_with_std_cxx20>
#endif

#undef DILOCO_CPLUSPLUS
