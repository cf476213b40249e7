#pragma once
/// @file
/// one_bit kernels over xsimd batches, the arithmetic that the shared driver
/// (one_bit_detail::encode, decode in kernels/group/one_bit.hpp) runs per group.
/// They walk each group in blocks of 16 values (the summation lanes of lanes.hpp,
/// in 16/W registers of W lanes) and leave the last partial block to the same
/// scalar code as the reference, so the results match the reference bit for bit.

#include <qcoll/kernels/cpu/simd/masks.hpp>
#include <qcoll/kernels/cpu/simd/xsimd_compat.hpp>
#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/kernels/group/one_bit.hpp>

#include <xsimd/xsimd.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

template <class Arch>
struct one_bit_kernels {
  using batch = xsimd::batch<float, Arch>;
  static constexpr std::size_t width = batch::size;
  static constexpr std::size_t registers = summation_lanes / width;
  static_assert(summation_lanes % width == 0, "a block of 16 values must fill whole registers");
  using accumulators = std::array<batch, registers>;

  static batch fed(const float* x, const float* residual_in, std::size_t i) noexcept {
    const batch value = batch::load_unaligned(x + i);
    return residual_in ? value + batch::load_unaligned(residual_in + i) : value;
  }

  static lane_sums spill(const accumulators& registers_) noexcept {
    alignas(64) lane_sums lanes;
    for (std::size_t k = 0; k < registers; ++k) registers_[k].store_aligned(lanes.data() + k * width);
    return lanes;
  }

  QCOLL_KERNEL_INLINE static lane_sums sum(const float* x, const float* residual_in, std::size_t g) noexcept {
    const std::size_t body = g / summation_lanes * summation_lanes;
    accumulators sums;
    sums.fill(batch(0.0f));
    for (std::size_t i = 0; i < body; i += summation_lanes)
      for (std::size_t k = 0; k < registers; ++k) sums[k] += fed(x, residual_in, i + k * width);
    lane_sums lanes = spill(sums);
    for (std::size_t i = body; i < g; ++i) lanes[i % summation_lanes] += kernels::fed(x, residual_in, i);
    return lanes;
  }

  QCOLL_KERNEL_INLINE static void classify(const quantizers::one_bit_options& options, const float* x,
                                           const float* residual_in, std::size_t g, float threshold, std::byte* bits,
                                           lane_sums& lanes0, lane_sums& lanes1,
                                           one_bit_detail::bin_statistics& stats) noexcept {
    using namespace one_bit_detail;
    const std::size_t body = g / summation_lanes * summation_lanes;
    const batch threshold_lanes(threshold), zero(0.0f);
    accumulators sum0, sum1, low, high;
    sum0.fill(zero);
    sum1.fill(zero);
    low.fill(batch(std::numeric_limits<float>::infinity()));
    high.fill(batch(-std::numeric_limits<float>::infinity()));
    const bool min_max = options.reconstruction == quantizers::reconstruction::min_max;
    for (std::size_t i = 0; i < body; i += summation_lanes) {
      std::uint32_t block_bits = 0;
      for (std::size_t k = 0; k < registers; ++k) {
        const batch v = fed(x, residual_in, i + k * width);
        const auto in_one = v >= threshold_lanes;
        block_bits |= movemask(in_one) << (k * width);
        sum1[k] += xsimd::select(in_one, v, zero);
        sum0[k] += xsimd::select(in_one, zero, v);
        if (min_max) {
          low[k] = lane_min(v, low[k]);  // as classify()'s v < low ? v : low
          high[k] = lane_max(v, high[k]);
        }
      }
      store(bits + i / 8, static_cast<std::uint16_t>(block_bits));
      stats.count1 += static_cast<std::size_t>(__builtin_popcount(block_bits));
    }
    lanes0 = spill(sum0);
    lanes1 = spill(sum1);
    if (min_max) {
      const lane_sums lows = spill(low), highs = spill(high);
      stats.low = lows[0];
      stats.high = highs[0];
      for (std::size_t j = 1; j < summation_lanes; ++j) {
        stats.low = lows[j] < stats.low ? lows[j] : stats.low;
        stats.high = highs[j] > stats.high ? highs[j] : stats.high;
      }
    }
    if (body < g) {
      __builtin_memset(bits + body / 8, 0, layout(g).codes_bytes(g) - body / 8);
      one_bit_detail::classify(x, residual_in, body, g, threshold, bits, lanes0, lanes1, stats);
    }
  }

  QCOLL_KERNEL_INLINE static void update_residual(const float* x, const float* residual_in, float* residual_out,
                                                  std::size_t g, float threshold,
                                                  const one_bit_detail::table& values) noexcept {
    const std::size_t body = g / summation_lanes * summation_lanes;
    const batch threshold_lanes(threshold), one_lanes(values.one), zero_lanes(values.zero);
    for (std::size_t i = 0; i < body; i += width) {
      const batch v = fed(x, residual_in, i);
      (v - xsimd::select(v >= threshold_lanes, one_lanes, zero_lanes)).store_unaligned(residual_out + i);
    }
    one_bit_detail::update_residual(x, residual_in, residual_out, body, g, threshold, values);
  }

  QCOLL_KERNEL_INLINE static void decode_group(const std::byte* bits, std::size_t g, float zero, float one, float* y,
                                               bool accumulate) noexcept {
    const batch zero_lanes(zero), one_lanes(one);
    const std::size_t body = g / summation_lanes * summation_lanes;
    constexpr std::uint32_t lane_mask = width >= 32 ? ~0u : (1u << width) - 1;
    for (std::size_t i = 0; i < body; i += summation_lanes) {
      const std::uint32_t block_bits = load<std::uint16_t>(bits + i / 8);
      for (std::size_t k = 0; k < registers; ++k) {
        const batch value = select_bits<Arch>((block_bits >> (k * width)) & lane_mask, one_lanes, zero_lanes);
        float* at = y + i + k * width;
        (accumulate ? batch::load_unaligned(at) + value : value).store_unaligned(at);
      }
    }
    one_bit_detail::decode_values(bits, body, g, zero, one, y, accumulate);
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
