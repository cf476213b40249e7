#pragma once
/// @file
/// k_level kernels over xsimd batches, the arithmetic that the shared driver
/// (k_level_detail::encode, decode in kernels/group/k_level.hpp) runs per group.
/// Each value goes through the same IEEE operations as in the reference, W lanes at
/// a time; the last partial vector of a chunk, and a vector whose values straddle a
/// change of the random key, take the shared scalar code. Codes go into the
/// driver's chunk buffer and are packed by the one packer every backend uses, so
/// the results match the reference bit for bit.

#include <qcoll/kernels/cpu/simd/xsimd_compat.hpp>
#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/k_level.hpp>

#include <xsimd/xsimd.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

/// 32-bit lane-wise multiply modulo 2^32. SSE2 has no pmulld and xsimd 8.1 falls
/// back to scalar code there, so SSE2 gets the two-pmuludq form.
template <class Arch>
inline xsimd::batch<std::uint32_t, Arch> multiply_low(xsimd::batch<std::uint32_t, Arch> a,
                                                      std::uint32_t b) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::sse2, Arch> && !std::is_base_of_v<xsimd::sse4_1, Arch>) {
    const __m128i factor = _mm_set1_epi32(static_cast<int>(b));
    const __m128i even = _mm_mul_epu32(a, factor);                        // lanes 0, 2 as 64-bit products
    const __m128i odd = _mm_mul_epu32(_mm_srli_epi64(a, 32), factor);     // lanes 1, 3
    return _mm_unpacklo_epi32(_mm_shuffle_epi32(even, _MM_SHUFFLE(0, 0, 2, 0)),
                              _mm_shuffle_epi32(odd, _MM_SHUFFLE(0, 0, 2, 0)));
  } else
#endif
  {
    return a * xsimd::batch<std::uint32_t, Arch>(b);
  }
}

template <class Arch>
struct k_level_kernels {
  using batch = xsimd::batch<float, Arch>;
  using int_batch = xsimd::batch<std::int32_t, Arch>;
  using uint_batch = xsimd::batch<std::uint32_t, Arch>;
  static constexpr std::size_t width = batch::size;
  static_assert(k_level_detail::chunk % width == 0, "a chunk of codes must fill whole registers");
  static_assert(width <= 16, "iota below holds 16 lanes");

  static batch fed(const float* x, const float* residual_in, std::size_t i) noexcept {
    const batch value = batch::load_unaligned(x + i);
    return residual_in ? value + batch::load_unaligned(residual_in + i) : value;
  }

  static uint_batch lowbias32(uint_batch x) noexcept {
    x ^= x >> 16;
    x = multiply_low<Arch>(x, 0x7feb352du);
    x ^= x >> 15;
    x = multiply_low<Arch>(x, 0x846ca68bu);
    x ^= x >> 16;
    return x;
  }

  /// u for values [i, i + width) of the group, all under one key.
  static batch uniform(const k_level_detail::group_stream& stream, std::size_t i) noexcept {
    alignas(64) static constexpr std::uint32_t iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const k_level_detail::random_key& key = stream.key_at(i);
    const uint_batch index = uint_batch(stream.index_low(i)) + uint_batch::load_aligned(iota);
    const uint_batch bits = lowbias32(lowbias32(index ^ uint_batch(key.low)) ^ uint_batch(key.high));
    return xsimd::batch_cast<float>(bit_cast<std::int32_t>(bits >> 8)) * batch(0x1p-24f);
  }

  /// The group's extremes and whether every value is finite.
  QCOLL_KERNEL_INLINE static bool extremes(const float* x, const float* residual_in, std::size_t g, float& low,
                                           float& high) noexcept {
    using namespace k_level_detail;
    const std::size_t body = g / width * width;
    batch lows(std::numeric_limits<float>::infinity()), highs(-std::numeric_limits<float>::infinity());
    // Exponent all ones (Inf, NaN) carries into the sign bit: (bits & 0x7f800000) + 0x00800000.
    uint_batch flags(0u);
    const uint_batch exponent(0x7f800000u), carry(0x00800000u);
    for (std::size_t i = 0; i < body; i += width) {
      const batch v = fed(x, residual_in, i);
      lows = lane_min(v, lows);  // as lower(v, low)
      highs = lane_max(v, highs);  // as higher(v, high)
      flags |= (bit_cast<std::uint32_t>(v) & exponent) + carry;
    }
    alignas(64) std::array<float, width> low_lanes, high_lanes;
    alignas(64) std::array<std::uint32_t, width> flag_lanes;
    lows.store_aligned(low_lanes.data());
    highs.store_aligned(high_lanes.data());
    flags.store_aligned(flag_lanes.data());
    bool finite = true;
    low = std::numeric_limits<float>::infinity();
    high = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < width; ++j) {
      finite = finite && (flag_lanes[j] & 0x80000000u) == 0;
      low = lower(low_lanes[j], low);
      high = higher(high_lanes[j], high);
    }
    return widen_extremes(x, residual_in, body, g, low, high) && finite;
  }

  template <bool stochastic>
  QCOLL_KERNEL_INLINE static void encode_chunk(const float* x, const float* residual_in, float* residual_out,
                                               std::size_t first, std::size_t count, const k_level_detail::table& t,
                                               const k_level_detail::group_stream& stream,
                                               std::uint32_t* codes) noexcept {
    using namespace k_level_detail;
    const batch min(t.min), step(t.step), scale(t.scale), inverse(t.inverse), top(t.top);
    const batch zero(0.0f), one(1.0f), half(0.5f);
    const std::size_t body = count / width * width;
    for (std::size_t j = 0; j < body; j += width) {
      const std::size_t i = first + j;
      if (stochastic && i < stream.split && i + width > stream.split) {  // the key changes mid-vector
        encode_values<stochastic>(x, residual_in, residual_out, i, i + width, t, stream, codes + j);
        continue;
      }
      const batch v = fed(x, residual_in, i);
      // position(): t in [0, top].
      const batch place = lane_min(((v - min) * scale) * inverse, top);
      batch code = xsimd::batch_cast<float>(xsimd::batch_cast<std::int32_t>(place));
      const batch fraction = place - code;
      if constexpr (stochastic) code = code + xsimd::select(uniform(stream, i) < fraction, one, zero);
      else code = code + xsimd::select(fraction >= half, one, zero);
      bit_cast<std::uint32_t>(xsimd::batch_cast<std::int32_t>(code)).store_aligned(codes + j);
      if (residual_out) (v - (min + code * step)).store_unaligned(residual_out + i);
    }
    encode_values<stochastic>(x, residual_in, residual_out, first + body, first + count, t, stream, codes + body);
  }

  QCOLL_KERNEL_INLINE static void decode_chunk(float min, float step, const std::uint32_t* codes, std::size_t count,
                                               float* y, bool accumulate) noexcept {
    const batch min_lanes(min), step_lanes(step);
    const std::size_t body = count / width * width;
    for (std::size_t j = 0; j < body; j += width) {
      // Codes are at most 255: the signed conversion is exact.
      const batch code = xsimd::batch_cast<float>(bit_cast<std::int32_t>(uint_batch::load_aligned(codes + j)));
      const batch value = min_lanes + code * step_lanes;
      float* at = y + j;
      (accumulate ? batch::load_unaligned(at) + value : value).store_unaligned(at);
    }
    k_level_detail::decode_values(min, step, codes + body, count - body, y + body, accumulate);
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
