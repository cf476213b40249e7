#pragma once
/// @file
/// The one_bit reference kernels: plain loops that define the results every other
/// backend must reproduce bit for bit. The driver around them
/// (one_bit_detail::encode, decode) is the one every backend runs.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/kernels/group/one_bit.hpp>

#include <cstddef>
#include <limits>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

/// The arithmetic one_bit_detail::encode and decode run on (see there).
struct one_bit_kernels {
  QCOLL_KERNEL_INLINE static lane_sums sum(const float* x, const float* residual_in, std::size_t g) noexcept {
    lane_sums lanes{};
    for (std::size_t i = 0; i < g; ++i) lanes[i % summation_lanes] += kernels::fed(x, residual_in, i);
    return lanes;
  }

  QCOLL_KERNEL_INLINE static void classify(const quantizers::one_bit_options&, const float* x,
                                           const float* residual_in, std::size_t g, float threshold, std::byte* bits,
                                           lane_sums& sum0, lane_sums& sum1,
                                           one_bit_detail::bin_statistics& stats) noexcept {
    __builtin_memset(bits, 0, one_bit_detail::layout(g).codes_bytes(g));
    stats.low = std::numeric_limits<float>::infinity();
    stats.high = -std::numeric_limits<float>::infinity();
    one_bit_detail::classify(x, residual_in, 0, g, threshold, bits, sum0, sum1, stats);
  }

  QCOLL_KERNEL_INLINE static void update_residual(const float* x, const float* residual_in, float* residual_out,
                                                  std::size_t g, float threshold,
                                                  const one_bit_detail::table& values) noexcept {
    one_bit_detail::update_residual(x, residual_in, residual_out, 0, g, threshold, values);
  }

  QCOLL_KERNEL_INLINE static void decode_group(const std::byte* bits, std::size_t g, float zero, float one, float* y,
                                               bool accumulate) noexcept {
    one_bit_detail::decode_values(bits, 0, g, zero, one, y, accumulate);
  }
};

}  // namespace reference
QCOLL_CPU_KERNELS_END
