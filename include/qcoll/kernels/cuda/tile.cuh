#pragma once
/// @file
/// A tile (kernels/simt/tile.hpp) on the GPU: the 16 lanes of half a warp. Each
/// half runs its own group, so every collective names only its half's lanes in its
/// mask; the two halves of a warp need not agree on anything.

#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/kernels/simt/tile.hpp>

#include <cstdint>

namespace qcoll::kernels::cuda {

class half_warp {
 public:
  __device__ half_warp() noexcept
      : lane_(threadIdx.x % simt::tile_lanes), shift_((threadIdx.x % 32) / simt::tile_lanes * simt::tile_lanes),
        mask_(0xffffu << shift_) {}

  __device__ unsigned lane() const noexcept { return lane_; }

  /// fold_lanes' order: lane j adds lane j + width, width 8, 4, 2, 1. Only lanes below
  /// the width keep meaningful sums, as in the reference; lane 0's is the result.
  __device__ float fold(float v) const noexcept {
    for (unsigned width = simt::tile_lanes / 2; width > 0; width /= 2)
      v = add(v, __shfl_down_sync(mask_, v, width, simt::tile_lanes));
    return shuffle(v, 0);
  }
  __device__ float lowest(float v) const noexcept {
    for (unsigned width = simt::tile_lanes / 2; width > 0; width /= 2) {
      const float other = __shfl_xor_sync(mask_, v, width, simt::tile_lanes);
      v = other < v ? other : v;
    }
    return shuffle(v, 0);
  }
  __device__ float highest(float v) const noexcept {
    for (unsigned width = simt::tile_lanes / 2; width > 0; width /= 2) {
      const float other = __shfl_xor_sync(mask_, v, width, simt::tile_lanes);
      v = other > v ? other : v;
    }
    return shuffle(v, 0);
  }
  __device__ std::uint32_t highest(std::uint32_t v) const noexcept {
    for (unsigned width = simt::tile_lanes / 2; width > 0; width /= 2) {
      const std::uint32_t other = __shfl_xor_sync(mask_, v, width, simt::tile_lanes);
      v = other > v ? other : v;
    }
    return v;
  }
  __device__ std::uint32_t total(std::uint32_t v) const noexcept {
    for (unsigned width = simt::tile_lanes / 2; width > 0; width /= 2)
      v += __shfl_xor_sync(mask_, v, width, simt::tile_lanes);
    return v;
  }
  __device__ bool any(bool p) const noexcept { return (__ballot_sync(mask_, p) & mask_) != 0; }
  __device__ bool all(bool p) const noexcept { return (__ballot_sync(mask_, p) & mask_) == mask_; }
  __device__ std::uint32_t ballot(bool p) const noexcept { return (__ballot_sync(mask_, p) & mask_) >> shift_; }
  __device__ std::uint32_t shuffle(std::uint32_t v, unsigned from) const noexcept {
    return __shfl_sync(mask_, v, from, simt::tile_lanes);
  }
  __device__ float shuffle(float v, unsigned from) const noexcept {
    return __shfl_sync(mask_, v, from, simt::tile_lanes);
  }
  __device__ void sync() const noexcept { __syncwarp(mask_); }

 private:
  unsigned lane_;
  unsigned shift_;  // 0 or 16: where this half's lanes sit in the warp
  unsigned mask_;
};

}  // namespace qcoll::kernels::cuda
