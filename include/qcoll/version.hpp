#pragma once
/// @file
/// The library version, defined once: CMake parses these three lines.

#define QCOLL_VERSION_MAJOR 0
#define QCOLL_VERSION_MINOR 2
#define QCOLL_VERSION_PATCH 0

namespace qcoll {
inline constexpr int version_major = QCOLL_VERSION_MAJOR;
inline constexpr int version_minor = QCOLL_VERSION_MINOR;
inline constexpr int version_patch = QCOLL_VERSION_PATCH;
}  // namespace qcoll
