#pragma once
/// @file
/// k_level kernels over xsimd batches. Each value goes through the same IEEE
/// operations as in the reference (kernels/group/k_level.hpp), W lanes at a time; the last
/// partial vector of a group, and a vector whose values straddle a change of the
/// random key, take the shared scalar code. Codes are computed into a stack buffer
/// and packed by the one packer every backend uses, so the results match the
/// reference bit for bit.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/kernels/group/k_level.hpp>

#include <xsimd/xsimd.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
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
    return xsimd::batch_cast<float>(xsimd::bitwise_cast<int_batch>(bits >> 8)) * batch(0x1p-24f);
  }

  /// The group's extremes and whether every value is finite.
  static bool extremes(const float* x, const float* residual_in, std::size_t g, float& low, float& high) noexcept {
    using namespace k_level_detail;
    const std::size_t body = g / width * width;
    batch lows(std::numeric_limits<float>::infinity()), highs(-std::numeric_limits<float>::infinity());
    // Exponent all ones (Inf, NaN) carries into the sign bit: (bits & 0x7f800000) + 0x00800000.
    uint_batch flags(0u);
    const uint_batch exponent(0x7f800000u), carry(0x00800000u);
    for (std::size_t i = 0; i < body; i += width) {
      const batch v = fed(x, residual_in, i);
      lows = xsimd::min(lows, v);  // min(a, b) = a < b ? a : b, as lower()
      highs = xsimd::max(highs, v);
      flags |= (xsimd::bitwise_cast<uint_batch>(v) & exponent) + carry;
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
    for (std::size_t i = body; i < g; ++i) {
      const float v = k_level_detail::fed(x, residual_in, i);
      finite = finite && is_finite(v);
      low = lower(v, low);
      high = higher(v, high);
    }
    return finite;
  }

  template <bool stochastic>
  static void encode_group(const quantizers::k_level_options& options, const float* x, const float* residual_in,
                           float* residual_out, std::size_t g, const k_level_detail::group_stream& stream,
                           std::byte* record) noexcept {
    using namespace k_level_detail;
    const unsigned bits = code_bits(options.levels);
    float low, high;
    if (!extremes(x, residual_in, g, low, high)) {
      keep_residual(residual_in, residual_out, g);
      store_nonfinite(options, record, g);
      return;
    }
    const table t = make_table(low, high, options.levels);
    store_table(record, t.min, t.step);
    const batch min(t.min), step(t.step), scale(t.scale), inverse(t.inverse), top(t.top);
    const batch zero(0.0f), one(1.0f), half(0.5f);
    alignas(64) std::array<std::uint32_t, chunk> buffer;
    for (std::size_t first = 0; first < g; first += chunk) {
      const std::size_t count = g - first < chunk ? g - first : chunk;
      const std::size_t body = count / width * width;
      for (std::size_t j = 0; j < body; j += width) {
        const std::size_t i = first + j;
        if (stochastic && i < stream.split && i + width > stream.split) {  // the key changes mid-vector
          encode_values<stochastic>(x, residual_in, residual_out, i, i + width, t, stream, buffer.data() + j);
          continue;
        }
        const batch v = fed(x, residual_in, i);
        // position(): t in [0, top]; min(a, b) = a < b ? a : b.
        const batch place = xsimd::min(((v - min) * scale) * inverse, top);
        batch code = xsimd::batch_cast<float>(xsimd::batch_cast<std::int32_t>(place));
        const batch fraction = place - code;
        if constexpr (stochastic) code = code + xsimd::select(uniform(stream, i) < fraction, one, zero);
        else code = code + xsimd::select(fraction >= half, one, zero);
        xsimd::bitwise_cast<uint_batch>(xsimd::batch_cast<std::int32_t>(code)).store_aligned(buffer.data() + j);
        if (residual_out) (v - (min + code * step)).store_unaligned(residual_out + i);
      }
      encode_values<stochastic>(x, residual_in, residual_out, first + body, first + count, t, stream,
                                buffer.data() + body);
      pack_codes(std::span<const std::uint32_t>(buffer.data(), count), bits, codes_of(record) + first * bits / 8);
    }
  }

  static void encode(const quantizers::k_level_options& options, std::span<const float> in,
                     std::span<const float> residual_in, std::span<float> residual_out,
                     quantizers::encode_position position, std::byte* records) noexcept {
    k_level_detail::encode_groups(options, in, residual_in, residual_out, position, records,
                                  [&](auto stochastic, const float* x, const float* r_in, float* r_out, std::size_t g,
                                      auto stream, std::byte* record) {
                                    encode_group<decltype(stochastic)::value>(options, x, r_in, r_out, g, stream,
                                                                              record);
                                  });
  }

  static void decode(const quantizers::k_level_options& options, const std::byte* records, std::span<float> out,
                     bool accumulate) noexcept {
    using namespace k_level_detail;
    const auto records_layout = layout(options);
    const unsigned bits = records_layout.code_bits;
    alignas(64) std::array<std::uint32_t, chunk> buffer;
    for_each_group(records_layout, out.size(), records, [&](std::size_t start, std::size_t g, auto* records) {
      const float min = load<float>(records);
      const float step = load<float>(records + sizeof(float));
      const batch min_lanes(min), step_lanes(step);
      float* y = out.data() + start;
      for (std::size_t first = 0; first < g; first += chunk) {
        const std::size_t count = g - first < chunk ? g - first : chunk;
        unpack_codes(codes_of(records) + first * bits / 8, bits, std::span<std::uint32_t>(buffer.data(), count));
        const std::size_t body = count / width * width;
        for (std::size_t j = 0; j < body; j += width) {
          // Codes are at most 255: the signed conversion is exact.
          const int_batch codes = xsimd::bitwise_cast<int_batch>(uint_batch::load_aligned(buffer.data() + j));
          const batch code = xsimd::batch_cast<float>(codes);
          const batch value = min_lanes + code * step_lanes;
          float* at = y + first + j;
          (accumulate ? batch::load_unaligned(at) + value : value).store_unaligned(at);
        }
        decode_values(min, step, buffer.data() + body, count - body, y + first + body, accumulate);
      }
    });
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
