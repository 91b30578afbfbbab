#pragma once

#define DILOCO_VERSION_MAJOR 0
#define DILOCO_VERSION_MINOR 1
#define DILOCO_VERSION_PATCH 0

namespace diloco {
inline constexpr int version_major = DILOCO_VERSION_MAJOR;
inline constexpr int version_minor = DILOCO_VERSION_MINOR;
inline constexpr int version_patch = DILOCO_VERSION_PATCH;
}  // namespace diloco
