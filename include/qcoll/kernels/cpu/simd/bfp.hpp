#pragma once
/// @file
/// bfp kernels over xsimd batches, the arithmetic that the shared driver
/// (bfp_detail::encode, decode in kernels/group/bfp.hpp) runs per block: the largest
/// magnitude as an integer max over the values' bits (exact, order-free), then the
/// mantissas W at a time into the driver's chunk buffer. Each operation is the
/// reference's IEEE operation in the same order, and values past the last whole
/// register go through the reference's scalar code, so the results match the
/// reference bit for bit.

#include <qcoll/kernels/cpu/simd/lane_ops.hpp>
#include <qcoll/kernels/cpu/simd/xsimd_compat.hpp>
#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/bfp.hpp>

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>

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

  QCOLL_KERNEL_INLINE static std::uint32_t max_magnitude(const float* x, const float* residual_in,
                                                         std::size_t g) noexcept {
    const std::size_t body = g / width * width;
    const int_batch magnitude_mask(0x7fffffff);
    int_batch largest(0);
    // Non-negative int32 compare in the float's bit order; NaN and Inf sort on top.
    // (An integer max, unlike a float one, is the same in every xsimd version.)
    for (std::size_t i = 0; i < body; i += width)
      largest = xsimd::max(largest, bit_cast<std::int32_t>(fed(x, residual_in, i)) & magnitude_mask);
    // Every lane is ≥ 0, so the signed maximum is the unsigned one.
    return bfp_detail::largest_magnitude(x, residual_in, body, g, static_cast<std::uint32_t>(max_lane(largest)));
  }

  QCOLL_KERNEL_INLINE static void encode_chunk(const bfp_detail::block_scale& block, unsigned bits, const float* x,
                                               const float* residual_in, float* residual_out, std::size_t first,
                                               std::size_t count, std::uint32_t* mantissas) noexcept {
    // int32 and uint32 may alias: the buffer holds the two's complement bits.
    encode_lanes(block, bits, x, residual_in, residual_out, first, count, mantissas,
                 [&](int_batch q, std::size_t j) { q.store_aligned(reinterpret_cast<std::int32_t*>(mantissas) + j); });
  }

  QCOLL_KERNEL_INLINE static void encode_bytes(const bfp_detail::block_scale& block, const float* x,
                                               const float* residual_in, float* residual_out, std::size_t first,
                                               std::size_t count, std::int8_t* codes) noexcept {
    encode_lanes(block, 8, x, residual_in, residual_out, first, count, codes,
                 [&](int_batch q, std::size_t j) { store_narrowed(q, codes + j); });
  }

  /// The mantissas of a chunk, W at a time, handed to store(q, j) for values
  /// [first + j, first + j + W); the tail through the reference's scalar code into out.
  template <class Code, class Store>
  QCOLL_KERNEL_INLINE static void encode_lanes(const bfp_detail::block_scale& block, unsigned bits, const float* x,
                                               const float* residual_in, float* residual_out, std::size_t first,
                                               std::size_t count, Code* out, Store&& store) noexcept {
    using namespace bfp_detail;
    const batch scale(block.scale), unit(block.unit), half(0.5f), minus_half(-0.5f), one(1.0f), minus_one(-1.0f),
        zero(0.0f);
    const batch limit(saturation_limit(bits)), minus_limit(-saturation_limit(bits));
    // Saturated mantissas, as float lanes holding the int32 bits (a select moves bits unchanged).
    const batch largest = bit_cast<float>(int_batch(max_mantissa(bits)));
    const batch smallest = bit_cast<float>(int_batch(-max_mantissa(bits)));
    const std::size_t body = count / width * width;
    for (std::size_t j = 0; j < body; j += width) {
      const std::size_t i = first + j;
      const batch v = fed(x, residual_in, i);
      const batch y = v * scale;
      const batch t = xsimd::trunc(y);
      const batch d = y - t;
      const batch rounded = t + xsimd::select(d >= half, one, xsimd::select(d <= minus_half, minus_one, zero));
      // The conversion is exact below 2^31 in magnitude; ±2^(b−1) lanes are replaced.
      batch q_bits = bit_cast<float>(xsimd::batch_cast<std::int32_t>(rounded));
      q_bits = xsimd::select(rounded >= limit, largest, q_bits);
      q_bits = xsimd::select(rounded <= minus_limit, smallest, q_bits);
      const int_batch q = bit_cast<std::int32_t>(q_bits);
      store(q, j);
      if (residual_out) (v - xsimd::batch_cast<float>(q) * unit).store_unaligned(residual_out + i);
    }
    encode_values(block, bits, x, residual_in, residual_out, first + body, first + count, out + body);
  }

  QCOLL_KERNEL_INLINE static void fill_nan(float* y, std::size_t g) noexcept {
    const std::size_t body = g / width * width;
    const batch nan_lanes(kernels::quiet_nan());
    for (std::size_t i = 0; i < body; i += width) nan_lanes.store_unaligned(y + i);
    for (std::size_t i = body; i < g; ++i) y[i] = kernels::quiet_nan();
  }

  QCOLL_KERNEL_INLINE static void decode_chunk(const std::uint32_t* fields, std::size_t count, unsigned bits,
                                               float unit, float* y, bool accumulate) noexcept {
    const auto unused = static_cast<std::int32_t>(32 - bits);
    const batch unit_lanes(unit);
    const std::size_t body = count / width * width;
    for (std::size_t j = 0; j < body; j += width) {
      const int_batch field = int_batch::load_aligned(reinterpret_cast<const std::int32_t*>(fields + j));
      const int_batch q = (field << unused) >> unused;  // sign-extend the b-bit field
      const batch value = xsimd::batch_cast<float>(q) * unit_lanes;
      float* at = y + j;
      (accumulate ? batch::load_unaligned(at) + value : value).store_unaligned(at);
    }
    bfp_detail::decode_values(fields + body, count - body, bits, unit, y + body, accumulate);
  }

  QCOLL_KERNEL_INLINE static void decode_bytes(const std::int8_t* codes, std::size_t count, float unit, float* y,
                                               bool accumulate) noexcept {
    const batch unit_lanes(unit);
    const std::size_t body = count / width * width;
    for (std::size_t j = 0; j < body; j += width) {
      const batch value = xsimd::batch_cast<float>(load_widened<Arch>(codes + j)) * unit_lanes;
      float* at = y + j;
      (accumulate ? batch::load_unaligned(at) + value : value).store_unaligned(at);
    }
    bfp_detail::decode_byte_values(codes + body, count - body, unit, y + body, accumulate);
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
