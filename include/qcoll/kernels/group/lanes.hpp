#pragma once
/// @file
/// The summation order every backend shares. A group's sum is taken over 16 lanes
/// (element i goes to lane i mod 16), each adding its elements in order from 0,
/// then folded pairwise (lane j += lane j+8, then +4, +2, +1). SSE keeps the lanes
/// in four registers, AVX2 in two, AVX-512 in one, the reference in an array, the
/// GPU in the 16 threads of a tile (kernels/simt/tile.hpp): all add the same numbers
/// in the same order, so sums — and everything computed from them — are
/// bit-identical across backends.

#include <qcoll/kernels/group/abi.hpp>

#include <cstddef>

QCOLL_KERNELS_BEGIN

inline constexpr std::size_t summation_lanes = 16;

/// One running sum per lane (a plain array, so device code may hold one).
struct lane_sums {
  float lane[summation_lanes];

  QCOLL_HOST_DEVICE float& operator[](std::size_t j) noexcept { return lane[j]; }
  QCOLL_HOST_DEVICE const float& operator[](std::size_t j) const noexcept { return lane[j]; }
  QCOLL_HOST_DEVICE float* data() noexcept { return lane; }
};

QCOLL_HOST_DEVICE inline float fold_lanes(lane_sums lanes) noexcept {
  for (std::size_t width = summation_lanes / 2; width > 0; width /= 2)
    for (std::size_t j = 0; j < width; ++j) lanes[j] = add(lanes[j], lanes[j + width]);
  return lanes[0];
}

QCOLL_KERNELS_END
