#pragma once
/// @file
/// bfp kernels over xsimd batches. Per block: the largest magnitude as an integer
/// max over the values' bits (exact, order-free), the shared decisions of
/// kernels/group/bfp.hpp, then the mantissas W at a time into a stack buffer that
/// pack_codes packs. Each operation is the reference's IEEE operation in the same
/// order, and values past the last whole register go through the reference's
/// scalar code, so the results match the reference bit for bit.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/bfp.hpp>
#include <qcoll/kernels/group/codes.hpp>

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

template <class Arch>
struct bfp_kernels {
  using batch = xsimd::batch<float, Arch>;
  using int_batch = xsimd::batch<std::int32_t, Arch>;
  static constexpr std::size_t width = batch::size;
  static_assert(bfp_detail::chunk % width == 0, "a chunk must fill whole registers");

  static batch fed(const float* x, const float* residual_in, std::size_t i) noexcept {
    const batch value = batch::load_unaligned(x + i);
    return residual_in ? value + batch::load_unaligned(residual_in + i) : value;
  }

  static std::uint32_t max_magnitude(const float* x, const float* residual_in, std::size_t g) noexcept {
    const std::size_t body = g / width * width;
    const int_batch magnitude_mask(0x7fffffff);
    int_batch largest(0);
    // Non-negative int32 compare in the float's bit order; NaN and Inf sort on top.
    for (std::size_t i = 0; i < body; i += width)
      largest = xsimd::max(largest, xsimd::bitwise_cast<int_batch>(fed(x, residual_in, i)) & magnitude_mask);
    alignas(64) std::int32_t lanes[width];
    largest.store_aligned(lanes);
    std::uint32_t result = 0;
    for (std::size_t j = 0; j < width; ++j) {
      const auto lane = static_cast<std::uint32_t>(lanes[j]);
      result = lane > result ? lane : result;
    }
    for (std::size_t i = body; i < g; ++i) {
      const std::uint32_t magnitude = bfp_detail::magnitude_bits(bfp_detail::fed(x, residual_in, i));
      result = magnitude > result ? magnitude : result;
    }
    return result;
  }

  static void encode_block(unsigned bits, const float* x, const float* residual_in, float* residual_out,
                           std::size_t g, std::byte* record) noexcept {
    using namespace bfp_detail;
    const block_scale block = decide(max_magnitude(x, residual_in, g), bits);
    store<std::int8_t>(record, static_cast<std::int8_t>(block.exponent));
    std::byte* codes = record + layout(g, bits).table_bytes;
    if (block.nonfinite) {
      keep_residual(residual_in, residual_out, g);
      __builtin_memset(codes, 0, layout(g, bits).codes_bytes(g));
      return;
    }
    const batch scale(block.scale), unit(block.unit), half(0.5f), minus_half(-0.5f), one(1.0f), minus_one(-1.0f),
        zero(0.0f);
    const batch limit(saturation_limit(bits)), minus_limit(-saturation_limit(bits));
    // Saturated mantissas, as float lanes holding the int32 bits (a select moves bits unchanged).
    const batch largest = xsimd::bitwise_cast<batch>(int_batch(max_mantissa(bits)));
    const batch smallest = xsimd::bitwise_cast<batch>(int_batch(-max_mantissa(bits)));
    alignas(64) std::int32_t mantissas[chunk];
    for (std::size_t first = 0; first < g; first += chunk) {
      const std::size_t c = g - first < chunk ? g - first : chunk;
      const std::size_t body = c / width * width;
      for (std::size_t j = 0; j < body; j += width) {
        const std::size_t i = first + j;
        const batch v = fed(x, residual_in, i);
        const batch y = v * scale;
        const batch t = xsimd::trunc(y);
        const batch d = y - t;
        const batch rounded = t + xsimd::select(d >= half, one, xsimd::select(d <= minus_half, minus_one, zero));
        // The conversion is exact below 2^31 in magnitude; ±2^(b−1) lanes are replaced.
        batch q_bits = xsimd::bitwise_cast<batch>(xsimd::batch_cast<std::int32_t>(rounded));
        q_bits = xsimd::select(rounded >= limit, largest, q_bits);
        q_bits = xsimd::select(rounded <= minus_limit, smallest, q_bits);
        const int_batch q = xsimd::bitwise_cast<int_batch>(q_bits);
        q.store_aligned(mantissas + j);
        if (residual_out) (v - xsimd::batch_cast<float>(q) * unit).store_unaligned(residual_out + i);
      }
      for (std::size_t j = body; j < c; ++j) {
        const std::size_t i = first + j;
        const float v = bfp_detail::fed(x, residual_in, i);
        const std::int32_t q = mantissa(v, block.scale, bits);
        mantissas[j] = q;
        if (residual_out) residual_out[i] = v - decoded(q, block.unit);
      }
      // int32 and uint32 may alias: the buffer is packed as the two's complement bits.
      pack_codes(std::span<const std::uint32_t>(reinterpret_cast<const std::uint32_t*>(mantissas), c), bits,
                 codes + first * bits / 8);
    }
  }

  static void encode(const quantizers::bfp_options& options, std::span<const float> in,
                     std::span<const float> residual_in, std::span<float> residual_out, std::byte* records) noexcept {
    const std::size_t block = bfp_detail::block_values(options, in.size());
    const auto records_layout = bfp_detail::layout(block, options.mantissa_bits);
    const bool feedback = !residual_out.empty();
    for_each_group(records_layout, in.size(), records, [&](std::size_t first, std::size_t g, auto* records) {
      encode_block(options.mantissa_bits, in.data() + first, feedback ? residual_in.data() + first : nullptr,
                   feedback ? residual_out.data() + first : nullptr, g, records);
    });
  }

  static void decode(const quantizers::bfp_options& options, const std::byte* records, std::span<float> out,
                     bool accumulate) noexcept {
    using namespace bfp_detail;
    const unsigned bits = options.mantissa_bits;
    const auto unused = static_cast<std::int32_t>(32 - bits);
    const std::size_t block = block_values(options, out.size());
    const auto records_layout = layout(block, bits);
    for_each_group(records_layout, out.size(), records, [&](std::size_t first, std::size_t g, auto* records) {
      const int exponent = load<std::int8_t>(records);
      const std::byte* codes = records + records_layout.table_bytes;
      float* y = out.data() + first;
      if (exponent == nonfinite_exponent) {
        // out + NaN is NaN: both modes store one NaN, so no backend's NaN payload differs.
        const std::size_t body = g / width * width;
        const batch nan_lanes(quiet_nan());
        for (std::size_t i = 0; i < body; i += width) nan_lanes.store_unaligned(y + i);
        for (std::size_t i = body; i < g; ++i) y[i] = quiet_nan();
      } else {
        const float unit = pow2(exponent);
        const batch unit_lanes(unit);
        alignas(64) std::uint32_t mantissas[chunk];
        for (std::size_t start = 0; start < g; start += chunk) {
          const std::size_t c = g - start < chunk ? g - start : chunk;
          unpack_codes(codes + start * bits / 8, bits, std::span<std::uint32_t>(mantissas, c));
          const std::size_t chunk_body = c / width * width;
          for (std::size_t j = 0; j < chunk_body; j += width) {
            const int_batch fields = int_batch::load_aligned(reinterpret_cast<const std::int32_t*>(mantissas + j));
            const int_batch q = (fields << unused) >> unused;  // sign-extend the b-bit field
            const batch value = xsimd::batch_cast<float>(q) * unit_lanes;
            float* at = y + start + j;
            (accumulate ? batch::load_unaligned(at) + value : value).store_unaligned(at);
          }
          for (std::size_t j = chunk_body; j < c; ++j) {
            const float value = decoded(sign_extend(mantissas[j], bits), unit);
            float& at = y[start + j];
            at = accumulate ? at + value : value;
          }
        }
      }
    });
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
