#pragma once
/// @file
/// Lane operations xsimd 8.1 lacks or does slowly: for the bfp kernels, int32 lanes to
/// and from signed bytes in unaligned memory (8-bit mantissas, read and written in the
/// record itself) and the largest lane; for the grid kernels, floats to and from double
/// lanes. xsimd's converting load and store go through a
/// stack buffer, which measured slower than the scalar reference on AVX-512 and SSE2.
/// The most specific architecture wins; others fall back to memory.

#include <qcoll/kernels/group/abi.hpp>
#include <xsimd/xsimd.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

/// bytes[0, width) as int32 lanes.
template <class Arch>
inline xsimd::batch<std::int32_t, Arch> load_widened(const std::int8_t* bytes) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  } else if constexpr (std::is_base_of_v<xsimd::avx2, Arch>) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  } else if constexpr (std::is_base_of_v<xsimd::sse2, Arch> && !std::is_base_of_v<xsimd::avx, Arch>) {
    std::int32_t four;
    std::memcpy(&four, bytes, sizeof four);
    __m128i lanes = _mm_cvtsi32_si128(four);
    lanes = _mm_unpacklo_epi8(lanes, lanes);     // each byte twice
    lanes = _mm_unpacklo_epi16(lanes, lanes);    // each byte four times: b b b b
    return _mm_srai_epi32(lanes, 24);            // the top copy, sign-extended
  } else
#endif
  {
    return xsimd::batch<std::int32_t, Arch>::load_unaligned(bytes);
  }
}

/// The lanes of `lanes`, each in [−128, 127], to bytes[0, width).
template <class Arch>
inline void store_narrowed(xsimd::batch<std::int32_t, Arch> lanes, std::int8_t* bytes) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes), _mm512_cvtepi32_epi8(lanes));
    return;
  } else if constexpr (std::is_base_of_v<xsimd::avx2, Arch>) {
    const __m256i all = lanes;
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(bytes), _mm_packs_epi16(words, words));  // in range: no saturation
    return;
  } else if constexpr (std::is_base_of_v<xsimd::sse2, Arch> && !std::is_base_of_v<xsimd::avx, Arch>) {
    const __m128i words = _mm_packs_epi32(lanes, lanes);
    const std::int32_t four = _mm_cvtsi128_si32(_mm_packs_epi16(words, words));
    std::memcpy(bytes, &four, sizeof four);
    return;
  }
#endif
  lanes.store_unaligned(bytes);
}

/// The largest of the int32 lanes.
template <class Arch>
inline std::int32_t max_lane(xsimd::batch<std::int32_t, Arch> lanes) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    return _mm512_reduce_max_epi32(lanes);
  } else if constexpr (std::is_base_of_v<xsimd::avx2, Arch>) {
    const __m256i all = lanes;
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));  // swap the halves
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));  // swap neighbours
    return _mm_cvtsi128_si32(m);
  }
#endif
  constexpr std::size_t width = xsimd::batch<std::int32_t, Arch>::size;
  alignas(64) std::int32_t each[width];
  lanes.store_aligned(each);
  std::int32_t largest = each[0];
  for (std::size_t j = 1; j < width; ++j) largest = each[j] > largest ? each[j] : largest;
  return largest;
}

/// floats[0, width) widened (exactly) into double lanes, width = batch<double>'s.
template <class Arch>
inline xsimd::batch<double, Arch> load_as_doubles(const float* floats) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    return _mm512_cvtps_pd(_mm256_loadu_ps(floats));
  } else if constexpr (std::is_base_of_v<xsimd::avx, Arch>) {
    return _mm256_cvtps_pd(_mm_loadu_ps(floats));
  } else if constexpr (std::is_base_of_v<xsimd::sse2, Arch>) {
    return _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(floats))));  // unaligned
  } else
#endif
  {
    constexpr std::size_t width = xsimd::batch<double, Arch>::size;
    alignas(64) double each[width];
    for (std::size_t j = 0; j < width; ++j) each[j] = static_cast<double>(floats[j]);
    return xsimd::batch<double, Arch>::load_aligned(each);
  }
}

/// The double lanes rounded to float (to nearest, as a static_cast) into floats[0, width).
template <class Arch>
inline void store_as_floats(xsimd::batch<double, Arch> lanes, float* floats) noexcept {
#if defined(__x86_64__) || defined(__i386__)
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) {
    _mm256_storeu_ps(floats, _mm512_cvtpd_ps(lanes));
    return;
  } else if constexpr (std::is_base_of_v<xsimd::avx, Arch>) {
    _mm_storeu_ps(floats, _mm256_cvtpd_ps(lanes));
    return;
  } else if constexpr (std::is_base_of_v<xsimd::sse2, Arch>) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(floats), _mm_castps_si128(_mm_cvtpd_ps(lanes)));  // unaligned
    return;
  }
#endif
  constexpr std::size_t width = xsimd::batch<double, Arch>::size;
  alignas(64) double each[width];
  lanes.store_aligned(each);
  for (std::size_t j = 0; j < width; ++j) floats[j] = static_cast<float>(each[j]);
}

}  // namespace simd
QCOLL_CPU_KERNELS_END
