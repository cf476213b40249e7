#pragma once
/// @file
/// one_bit kernels over xsimd batches. They walk each group in blocks of 16 values
/// (the summation lanes of lanes.hpp, in 16/W registers of W lanes) and leave the
/// last partial block to the same scalar code as the reference, so the results
/// match the reference bit for bit.

#include <qcoll/kernels/cpu/simd/masks.hpp>
#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/kernels/group/one_bit.hpp>

#include <xsimd/xsimd.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>

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

  static void encode_group(const quantizers::one_bit_options& options, const float* x, const float* residual_in,
                           float* residual_out, std::size_t g, std::byte* record) noexcept {
    using namespace one_bit_detail;
    const std::size_t body = g / summation_lanes * summation_lanes;
    float threshold = 0;
    if (options.threshold == quantizers::threshold::group_mean) {
      accumulators sums;
      sums.fill(batch(0.0f));
      for (std::size_t i = 0; i < body; i += summation_lanes)
        for (std::size_t k = 0; k < registers; ++k) sums[k] += fed(x, residual_in, i + k * width);
      lane_sums lanes = spill(sums);
      for (std::size_t i = body; i < g; ++i) lanes[i % summation_lanes] += one_bit_detail::fed(x, residual_in, i);
      const float total = fold_lanes(lanes);
      if (!is_finite(total) && has_nonfinite(x, residual_in, g)) {
        keep_residual(residual_in, residual_out, g);
        return store_nonfinite(record, g);
      }
      threshold = is_finite(total) ? total / static_cast<float>(g) : mean_in_double(x, residual_in, g);
    }

    std::byte* bits = record + 2 * sizeof(float);
    const batch threshold_lanes(threshold), zero(0.0f);
    accumulators sum0, sum1, low, high;
    sum0.fill(zero);
    sum1.fill(zero);
    low.fill(batch(std::numeric_limits<float>::infinity()));
    high.fill(batch(-std::numeric_limits<float>::infinity()));
    const bool min_max = options.reconstruction == quantizers::reconstruction::min_max;
    bin_statistics stats;
    for (std::size_t i = 0; i < body; i += summation_lanes) {
      std::uint32_t block_bits = 0;
      for (std::size_t k = 0; k < registers; ++k) {
        const batch v = fed(x, residual_in, i + k * width);
        const auto in_one = v >= threshold_lanes;
        block_bits |= movemask(in_one) << (k * width);
        sum1[k] += xsimd::select(in_one, v, zero);
        sum0[k] += xsimd::select(in_one, zero, v);
        if (min_max) {
          low[k] = xsimd::min(low[k], v);
          high[k] = xsimd::max(high[k], v);
        }
      }
      store(bits + i / 8, static_cast<std::uint16_t>(block_bits));
      stats.count1 += static_cast<std::size_t>(__builtin_popcount(block_bits));
    }
    lane_sums lanes0 = spill(sum0), lanes1 = spill(sum1);
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
      std::memset(bits + body / 8, 0, layout(g).codes_bytes(g) - body / 8);
      classify(x, residual_in, body, g, threshold, bits, lanes0, lanes1, stats);
    }
    const table values = store_table(options, stats, lanes0, lanes1, threshold, x, residual_in, g, record);
    if (values.nonfinite) return keep_residual(residual_in, residual_out, g);
    if (!residual_out) return;
    const batch one_lanes(values.one), zero_lanes(values.zero);
    for (std::size_t i = 0; i < body; i += width) {
      const batch v = fed(x, residual_in, i);
      (v - xsimd::select(v >= threshold_lanes, one_lanes, zero_lanes)).store_unaligned(residual_out + i);
    }
    update_residual(x, residual_in, residual_out, body, g, threshold, values);
  }

  static void encode(const quantizers::one_bit_options& options, std::span<const float> in,
                     std::span<const float> residual_in, std::span<float> residual_out, std::byte* records) noexcept {
    one_bit_detail::encode_groups(options, in, residual_in, residual_out, records,
                                  [&](const float* x, const float* r_in, float* r_out, std::size_t g,
                                      std::byte* record) { encode_group(options, x, r_in, r_out, g, record); });
  }

  static void decode(const quantizers::one_bit_options& options, const std::byte* records, std::span<float> out,
                     bool accumulate) noexcept {
    const auto records_layout = one_bit_detail::layout(options.group_size);
    for_each_group(records_layout, out.size(), records, [&](std::size_t first, std::size_t g, auto* records) {
      const float zero = load<float>(records);
      const float one = load<float>(records + sizeof(float));
      const std::byte* bits = records + 2 * sizeof(float);
      float* y = out.data() + first;
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
      for (std::size_t i = body; i < g; ++i) {
        const float value = ((bits[i / 8] >> (i % 8)) & std::byte{1}) != std::byte{0} ? one : zero;
        y[i] = accumulate ? y[i] + value : value;
      }
    });
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
