// The 16-bit float conversions (core/half.hpp): the reference rule against an
// independent oracle (exact arithmetic in double, and x86's F16C instructions where
// the CPU has them), then every SIMD backend against the reference, bit for bit.

#include <boost/test/unit_test.hpp>

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>

#include "support/half_inputs.hpp"
#include "support/quantizer_inputs.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define QCOLL_TEST_F16C 1
#endif

using namespace qcoll;

namespace {

using test::f16_value;
using test::narrowing_inputs;

/// Round to nearest, ties to even, among the non-negative 16-bit patterns 0 … `top`
/// (`top` = the Inf pattern, standing for the first power of two past the range,
/// which is how IEEE rounding decides overflow).
template <class Value>
std::uint16_t nearest(double magnitude, std::uint16_t top, Value value_of) {
  std::uint16_t low = 0, high = top;  // value_of(low) <= magnitude
  if (magnitude >= value_of(top)) return top;
  while (high - low > 1) {
    const auto middle = static_cast<std::uint16_t>((low + high) / 2);
    (value_of(middle) <= magnitude ? low : high) = middle;
  }
  const double below = magnitude - value_of(low), above = value_of(high) - magnitude;
  if (below < above) return low;
  if (above < below) return high;
  return (low & 1) ? high : low;
}

std::uint16_t oracle_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  if (std::isnan(x)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  if (std::isinf(x)) return sign | 0x7f80;
  auto value_of = [](std::uint16_t b) {
    return b == 0x7f80 ? std::ldexp(1.0, 128) : double(std::bit_cast<float>(std::uint32_t{b} << 16));
  };
  return sign | nearest(std::fabs(double(x)), 0x7f80, value_of);
}

std::uint16_t oracle_f16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  if (std::isnan(x)) return sign | 0x7e00 | ((bits >> 13) & 0x3ff);
  if (std::isinf(x)) return sign | 0x7c00;
  auto value_of = [](std::uint16_t b) { return b == 0x7c00 ? 65536.0 : f16_value(b); };
  return sign | nearest(std::fabs(double(x)), 0x7c00, value_of);
}

template <class Half>
std::vector<Half> every_pattern() {
  std::vector<Half> all(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) all[h] = Half::from_bits(static_cast<std::uint16_t>(h));
  return all;
}

template <class Half>
std::vector<std::uint16_t> bits_of(const std::vector<Half>& values) {
  std::vector<std::uint16_t> bits;
  for (const Half& v : values) bits.push_back(v.bits);
  return bits;
}

/// Converts n values from `first` into the middle of a larger buffer: the result
/// matches `expected` and the values either side are untouched (the kernels' tails).
template <class Half>
void check_narrow_window(void (*narrow)(std::span<const float>, std::span<Half>) noexcept,
                         const std::vector<float>& in, const std::vector<Half>& expected, std::size_t first,
                         std::size_t n) {
  std::vector<Half> out(n + 2, Half::from_bits(0xabcd));
  narrow(std::span(in).subspan(first, n), std::span(out).subspan(1, n));
  BOOST_TEST((out.front().bits == 0xabcd && out.back().bits == 0xabcd));
  for (std::size_t i = 0; i < n; ++i) BOOST_TEST(out[i + 1].bits == expected[first + i].bits);
}

template <class Half>
void check_widen_window(void (*widen)(std::span<const Half>, std::span<float>) noexcept,
                        const std::vector<Half>& in, const std::vector<float>& expected, std::size_t first,
                        std::size_t n) {
  std::vector<float> out(n + 2, test::unwritten);
  widen(std::span(in).subspan(first, n), std::span(out).subspan(1, n));
  BOOST_TEST(test::same_bits(std::span(out).subspan(1, n), std::span(expected).subspan(first, n)));
  BOOST_TEST(test::same_bits(std::span(out).first(1), std::span(&test::unwritten, 1)));
  BOOST_TEST(test::same_bits(std::span(out).last(1), std::span(&test::unwritten, 1)));
}

#if defined(QCOLL_TEST_F16C)
__attribute__((target("f16c"))) std::uint16_t hardware_f16(float x) {
  return static_cast<std::uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(x), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float hardware_f32(std::uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#endif

}  // namespace

BOOST_AUTO_TEST_SUITE(half_conversions)

BOOST_AUTO_TEST_CASE(bf16_rounds_to_nearest_even) {
  std::size_t wrong = 0;
  for (float x : narrowing_inputs())
    if (bfloat16(x).bits != oracle_bf16(x) && ++wrong <= 5)
      BOOST_ERROR("bf16 of " << std::hexfloat << x << ": got " << std::hex << bfloat16(x).bits << ", expected "
                             << oracle_bf16(x));
  BOOST_TEST(wrong == 0u);
  BOOST_TEST(bfloat16(1.0f).bits == 0x3f80);
  BOOST_TEST(bfloat16(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80);  // tie to even
  BOOST_TEST(bfloat16(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82);  // tie to even, upwards
  BOOST_TEST(bfloat16(std::bit_cast<float>(0x7f7fffffu)).bits == 0x7f80);  // the largest float overflows
}

BOOST_AUTO_TEST_CASE(f16_rounds_to_nearest_even) {
  std::size_t wrong = 0;
  for (float x : narrowing_inputs())
    if (float16(x).bits != oracle_f16(x) && ++wrong <= 5)
      BOOST_ERROR("f16 of " << std::hexfloat << x << ": got " << std::hex << float16(x).bits << ", expected "
                            << oracle_f16(x));
  BOOST_TEST(wrong == 0u);
  BOOST_TEST(float16(65504.0f).bits == 0x7bff);
  BOOST_TEST(float16(65519.99f).bits == 0x7bff);
  BOOST_TEST(float16(65520.0f).bits == 0x7c00);          // half-way to 2^16: even is Inf
  BOOST_TEST(float16(0x1p-24f).bits == 0x0001);          // the smallest subnormal
  BOOST_TEST(float16(0x1p-25f).bits == 0x0000);          // half of it: tie to even, zero
  BOOST_TEST(float16(-0x1.8p-24f).bits == 0x8002);       // 1.5 units: tie to even, 2
  BOOST_TEST(float16(std::bit_cast<float>(0x7f800001u)).bits == 0x7e00);  // a signalling NaN is quieted
}

BOOST_AUTO_TEST_CASE(widening_is_exact_and_quiets_f16_nans) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    BOOST_TEST(std::bit_cast<std::uint32_t>(float(bfloat16::from_bits(bits))) == std::uint32_t{h} << 16);
    const float wide = float(float16::from_bits(bits));
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {  // NaN: sign and payload kept, quieted
      BOOST_TEST(std::bit_cast<std::uint32_t>(wide) ==
                 (((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13)));
    } else if ((h & 0x7fff) == 0x7c00) {
      BOOST_TEST(wide == ((h & 0x8000) ? -INFINITY : INFINITY));
    } else {
      BOOST_TEST(double(wide) == f16_value(bits));
      BOOST_TEST(std::signbit(wide) == bool(h & 0x8000));
      BOOST_TEST(float16(wide).bits == bits);  // and back
    }
    BOOST_TEST(bfloat16(float(bfloat16::from_bits(bits))).bits == (std::isnan(float(bfloat16::from_bits(bits)))
                                                                        ? (bits | 0x40)
                                                                        : bits));
  }
}

BOOST_AUTO_TEST_CASE(f16_matches_x86_f16c) {
#if defined(QCOLL_TEST_F16C)
  // F16C is VEX-encoded: it needs AVX (the OS saving YMM state) besides its own bit.
  // (clang++-14's __builtin_cpu_supports does not know "f16c".)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
  if (!f16c) {
    BOOST_TEST_MESSAGE("this CPU has no F16C; compared with the exact oracle only");
    return;
  }
  std::size_t wrong = 0;
  for (float x : narrowing_inputs())
    if (float16(x).bits != hardware_f16(x) && ++wrong <= 5)
      BOOST_ERROR("f16 of " << std::hexfloat << x << ": got " << std::hex << float16(x).bits << ", F16C gives "
                            << hardware_f16(x));
  BOOST_TEST(wrong == 0u);
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    BOOST_TEST(std::bit_cast<std::uint32_t>(float(float16::from_bits(bits))) ==
               std::bit_cast<std::uint32_t>(hardware_f32(bits)));
  }
#else
  BOOST_TEST_MESSAGE("not an x86-64 build; compared with the exact oracle only");
#endif
}

BOOST_AUTO_TEST_CASE(every_backend_matches_the_reference) {
  const auto& reference = test::reference_kernels();
  const std::vector<float> floats = narrowing_inputs();
  const auto all_bf16 = every_pattern<bfloat16>();
  const auto all_f16 = every_pattern<float16>();
  std::vector<bfloat16> expected_bf16(floats.size());
  std::vector<float16> expected_f16(floats.size());
  std::vector<float> expected_wide_bf16(all_bf16.size()), expected_wide_f16(all_f16.size());
  reference.narrow_bf16(floats, expected_bf16);
  reference.narrow_f16(floats, expected_f16);
  reference.widen_bf16(all_bf16, expected_wide_bf16);
  reference.widen_f16(all_f16, expected_wide_f16);
  for (std::size_t i = 0; i < floats.size(); i += 997) {  // the reference kernel is the per-value rule
    BOOST_TEST(expected_bf16[i].bits == bfloat16(floats[i]).bits);
    BOOST_TEST(expected_f16[i].bits == float16(floats[i]).bits);
  }

  std::vector<std::string> skipped;
  for (const auto* backend : test::simd_backends(&skipped)) {
    BOOST_TEST_CONTEXT("backend " << backend->name) {
      std::vector<bfloat16> got_bf16(floats.size());
      std::vector<float16> got_f16(floats.size());
      std::vector<float> wide(0x10000);
      backend->narrow_bf16(floats, got_bf16);
      backend->narrow_f16(floats, got_f16);
      BOOST_TEST(bits_of(got_bf16) == bits_of(expected_bf16));
      BOOST_TEST(bits_of(got_f16) == bits_of(expected_f16));
      backend->widen_bf16(all_bf16, wide);
      BOOST_TEST(test::same_bits(wide, expected_wide_bf16));
      backend->widen_f16(all_f16, wide);
      BOOST_TEST(test::same_bits(wide, expected_wide_f16));
      // Every length up to a few registers and every start, so the scalar tails run
      // and nothing outside the span is touched.
      for (std::size_t start = 0; start < 3; ++start)
        for (std::size_t n = 0; n <= 70; ++n) {
          check_narrow_window(backend->narrow_bf16, floats, expected_bf16, start * 1000, n);
          check_narrow_window(backend->narrow_f16, floats, expected_f16, start * 1000, n);
          check_widen_window(backend->widen_bf16, all_bf16, expected_wide_bf16, start * 7, n);
          check_widen_window(backend->widen_f16, all_f16, expected_wide_f16, 0x7bf0 + start * 7, n);  // Inf, NaNs
        }
    }
  }
  for (const auto& name : skipped) BOOST_TEST_MESSAGE("backend " << name << " is built but this CPU cannot run it");
}

BOOST_AUTO_TEST_SUITE_END()
