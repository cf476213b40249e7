#pragma once
/// @file
/// The summation order every CPU backend shares. A group's sum is taken over 16
/// lanes (element i goes to lane i mod 16) folded pairwise (lane j += lane j+8,
/// then +4, +2, +1). SSE keeps the lanes in four registers, AVX2 in two, AVX-512 in
/// one, the reference in an array: all add the same numbers in the same order, so
/// sums — and everything computed from them — are bit-identical across backends.

#include <qcoll/kernels/group/abi.hpp>
#include <array>
#include <cstddef>

QCOLL_CPU_KERNELS_BEGIN

inline constexpr std::size_t summation_lanes = 16;
using lane_sums = std::array<float, summation_lanes>;

inline float fold_lanes(lane_sums lanes) noexcept {
  for (std::size_t width = summation_lanes / 2; width > 0; width /= 2)
    for (std::size_t j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  return lanes[0];
}

QCOLL_CPU_KERNELS_END
