// SPDX-License-Identifier: Apache-2.0
#pragma once

// The library's version, defined here once: CMake's project(VERSION), the
// Conan recipe and the vcpkg port read these three lines.
#define DILOCO_VERSION_MAJOR 0
#define DILOCO_VERSION_MINOR 1
#define DILOCO_VERSION_PATCH 0

// One comparable number, major * 10000 + minor * 100 + patch (0.1.0 is 100):
//   #if DILOCO_VERSION >= 200   // 0.2.0 or later
#define DILOCO_VERSION (DILOCO_VERSION_MAJOR * 10000 + DILOCO_VERSION_MINOR * 100 + DILOCO_VERSION_PATCH)

namespace diloco {
///@{
/// The version as numbers (major, minor, patch), and as one comparable number: major * 10000
/// + minor * 100 + patch (DILOCO_VERSION).
inline constexpr int version_major = DILOCO_VERSION_MAJOR;
inline constexpr int version_minor = DILOCO_VERSION_MINOR;
inline constexpr int version_patch = DILOCO_VERSION_PATCH;
inline constexpr int version = DILOCO_VERSION;
///@}
}  // namespace diloco
