#pragma once
/// @file
/// Between xsimd lane masks and packed bits (lane j = bit j), which xsimd 8.1 does
/// not offer. The most specific architecture wins; others fall back to memory.

#include <qcoll/kernels/group/abi.hpp>
#include <xsimd/xsimd.hpp>

#include <array>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

template <class Arch>
inline std::uint32_t movemask(xsimd::batch_bool<float, Arch> mask) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    return static_cast<std::uint32_t>(static_cast<__mmask16>(mask));
  } else if constexpr (std::is_base_of_v<xsimd::avx, Arch>) {
    return static_cast<std::uint32_t>(_mm256_movemask_ps(mask));
  } else if constexpr (std::is_base_of_v<xsimd::sse2, Arch>) {
    return static_cast<std::uint32_t>(_mm_movemask_ps(mask));
  } else
#endif
  {
    constexpr std::size_t width = xsimd::batch<float, Arch>::size;
    alignas(64) std::array<float, width> lanes;
    xsimd::select(mask, xsimd::batch<float, Arch>(1.0f), xsimd::batch<float, Arch>(0.0f)).store_aligned(lanes.data());
    std::uint32_t bits = 0;
    for (std::size_t j = 0; j < width; ++j) bits |= static_cast<std::uint32_t>(lanes[j] != 0.0f) << j;
    return bits;
  }
}

/// Lane j is `high` where bit j of `bits` is set, else `low`.
template <class Arch>
inline xsimd::batch<float, Arch> select_bits(std::uint32_t bits, xsimd::batch<float, Arch> high,
                                             xsimd::batch<float, Arch> low) noexcept {
  using batch = xsimd::batch<float, Arch>;
  using mask = xsimd::batch_bool<float, Arch>;
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    return xsimd::select(mask(static_cast<__mmask16>(bits)), high, low);
  } else if constexpr (std::is_base_of_v<xsimd::avx2, Arch>) {
    const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lane_bits);
    return xsimd::select(mask(_mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane_bits))), high, low);
  } else if constexpr (std::is_base_of_v<xsimd::sse2, Arch> && !std::is_base_of_v<xsimd::avx, Arch>) {
    const __m128i lane_bits = _mm_setr_epi32(1, 2, 4, 8);
    const __m128i set = _mm_and_si128(_mm_set1_epi32(static_cast<int>(bits)), lane_bits);
    return xsimd::select(mask(_mm_castsi128_ps(_mm_cmpeq_epi32(set, lane_bits))), high, low);
  } else
#endif
  {
    constexpr std::size_t width = batch::size;
    alignas(64) std::array<float, width> chosen, high_lanes, low_lanes;
    high.store_aligned(high_lanes.data());
    low.store_aligned(low_lanes.data());
    for (std::size_t j = 0; j < width; ++j) chosen[j] = (bits >> j) & 1u ? high_lanes[j] : low_lanes[j];
    return batch::load_aligned(chosen.data());
  }
}

}  // namespace simd
QCOLL_CPU_KERNELS_END
