// The reproducible sum's float kernels (kernels/group/grid.hpp): the reference against an
// independent oracle (std::ilogb, std::nearbyint and std::ldexp in double), then every
// SIMD backend against the reference, bit for bit, at every length around the registers
// and the blocks, with nothing outside the spans written.

#include <boost/test/unit_test.hpp>

#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/kernels/group/grid.hpp>

#include "support/grid_inputs.hpp"
#include "support/quantizer_inputs.hpp"

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace qcoll;

namespace grid_kernel_test {

namespace grid = kernels::grid_detail;
constexpr std::size_t block = grid::block;

double oracle_cover(std::span<const float> values, double exponent) {
  int e = static_cast<int>(exponent);
  for (float x : values)
    if (std::isfinite(x) && x != 0) e = std::max(e, std::ilogb(x) + 1);
  return e;
}

double oracle_on_grid(float x, double exponent) {
  if (!std::isfinite(x) || exponent == grid::empty_block) return x;
  return std::copysign(std::nearbyint(std::ldexp(static_cast<double>(x), grid::bits - static_cast<int>(exponent))), x);
}

float oracle_rounded(double sum, double exponent, double divide) {
  double value = exponent == grid::empty_block ? sum : std::ldexp(sum, static_cast<int>(exponent) - grid::bits);
  if (std::isnan(value)) value = std::numeric_limits<double>::quiet_NaN();
  return static_cast<float>(value / divide);
}

bool same_bits(std::span<const double> a, std::span<const double> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/// The exponents the reference gives `values`, each block starting from `start`.
std::vector<double> reference_exponents(std::span<const float> values, double start = grid::empty_block) {
  std::vector<double> exponents((values.size() + block - 1) / block, start);
  test::reference_kernels().grid_cover(values, exponents);
  return exponents;
}

}  // namespace grid_kernel_test

using namespace grid_kernel_test;

BOOST_AUTO_TEST_SUITE(grid_kernels)

BOOST_AUTO_TEST_CASE(the_reference_follows_the_rules) {
  BOOST_TEST_REQUIRE(std::fegetround() == FE_TONEAREST);
  const std::vector<float> values = test::grid_inputs();
  const std::vector<double> exponents = reference_exponents(values);
  std::size_t empty = 0;
  for (std::size_t b = 0; b < exponents.size(); ++b) {
    const auto mine = std::span<const float>(values).subspan(b * block, block);
    BOOST_TEST(exponents[b] == oracle_cover(mine, grid::empty_block), "block " << b);
    empty += exponents[b] == grid::empty_block;
  }
  BOOST_TEST(empty >= 5u);
  // Raising: a block's exponent never goes down, and goes up to the values' own.
  const std::vector<double> from_high = reference_exponents(values, 100.0);
  for (std::size_t b = 0; b < exponents.size(); ++b) BOOST_TEST(from_high[b] == std::max(100.0, exponents[b]));

  std::vector<double> sums(values.size(), 12345.0);
  test::reference_kernels().grid_add(values, exponents, sums, true);
  std::vector<double> expected(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) expected[i] = oracle_on_grid(values[i], exponents[i / block]);
  BOOST_TEST(same_bits(sums, expected));
  test::reference_kernels().grid_add(values, exponents, sums, false);  // twice: every finite value doubled
  for (std::size_t i = 0; i < values.size(); ++i) expected[i] += expected[i];
  BOOST_TEST(same_bits(sums, expected));
  // Ties go to even: 1.5 · 2^(e−1) with odd multiples of 2^(e−31) beside it give even integers.
  for (std::size_t b = 4; b < exponents.size(); b += 6)
    for (std::size_t i = b * block + 1; i < (b + 1) * block; ++i)
      BOOST_TEST(std::fmod(std::fabs(expected[i] / 2), 2.0) == 0.0, "value " << i);

  for (const double divide : {1.0, 3.0}) {
    std::vector<float> out(values.size());
    test::reference_kernels().grid_round(sums, exponents, divide, out, 0);
    for (std::size_t i = 0; i < values.size(); ++i)
      BOOST_TEST(std::bit_cast<std::uint32_t>(out[i]) ==
                     std::bit_cast<std::uint32_t>(oracle_rounded(sums[i], exponents[i / block], divide)),
                 "value " << i << " divided by " << divide);
  }
}

BOOST_AUTO_TEST_CASE(every_backend_matches_the_reference) {
  const auto& reference = test::reference_kernels();
  const std::vector<float> values = test::grid_inputs();
  const std::vector<double> exponents = reference_exponents(values);
  std::vector<double> expected_sums(values.size());
  reference.grid_add(values, exponents, expected_sums, true);
  reference.grid_add(values, exponents, expected_sums, false);
  std::vector<float> expected_out(values.size());
  reference.grid_round(expected_sums, exponents, 7.0, expected_out, 0);

  const double sentinel = std::bit_cast<double>(std::uint64_t{0x7ff8a5a5a5a5a5a5});
  std::vector<std::string> skipped;
  for (const auto* backend : test::simd_backends(&skipped)) {
    BOOST_TEST_CONTEXT("backend " << backend->name) {
      std::vector<double> got_exponents(exponents.size(), grid::empty_block);
      backend->grid_cover(values, got_exponents);
      BOOST_TEST(same_bits(got_exponents, exponents));
      std::vector<double> sums(values.size());
      backend->grid_add(values, exponents, sums, true);
      backend->grid_add(values, exponents, sums, false);
      BOOST_TEST(same_bits(sums, expected_sums));
      std::vector<float> out(values.size());
      backend->grid_round(expected_sums, exponents, 7.0, out, 0);
      BOOST_TEST(test::same_bits(out, expected_out));
      for (std::size_t i = 0, shown = 0; i < out.size() && shown < 3; ++i)
        if (std::bit_cast<std::uint32_t>(out[i]) != std::bit_cast<std::uint32_t>(expected_out[i]) && ++shown)
          BOOST_ERROR("value " << i << ": " << std::hexfloat << out[i] << " for " << expected_out[i] << " (sum "
                               << expected_sums[i] << ", exponent " << std::defaultfloat << exponents[i / block] << ")");

      // Windows: every length to past a block and a half from the start of each kind of
      // block (cover and add start at a block), and rounds starting anywhere; the
      // elements either side untouched.
      for (std::size_t b = 0; b < 6; ++b)
        for (std::size_t n = 0; n <= block + 140; n += (n < 40 ? 1 : 7)) {
          const auto window = std::span<const float>(values).subspan(b * block, n);
          const std::size_t blocks = (n + block - 1) / block;
          std::vector<double> e_ref(blocks + 2, sentinel), e_got(blocks + 2, sentinel);
          for (std::size_t k = 1; k <= blocks; ++k) e_ref[k] = e_got[k] = -5.0;
          reference.grid_cover(window, std::span(e_ref).subspan(1, blocks));
          backend->grid_cover(window, std::span(e_got).subspan(1, blocks));
          BOOST_TEST(same_bits(e_got, e_ref), "cover: block " << b << ", " << n << " values");
          const auto grid_of = std::span<const double>(exponents).subspan(b);
          for (const bool first : {true, false}) {
            std::vector<double> s_ref(n + 2, sentinel), s_got(n + 2, sentinel);
            for (std::size_t i = 0; i < n; ++i) s_ref[i + 1] = s_got[i + 1] = expected_sums[b * block + i];
            reference.grid_add(window, grid_of, std::span(s_ref).subspan(1, n), first);
            backend->grid_add(window, grid_of, std::span(s_got).subspan(1, n), first);
            BOOST_TEST(same_bits(s_got, s_ref), "add: block " << b << ", " << n << " values, first " << first);
          }
          const std::size_t at = b * block + (n * 37) % block;  // anywhere in a block
          for (const double divide : {1.0, 3.0}) {
            std::vector<float> o_ref(n + 2, test::unwritten), o_got(n + 2, test::unwritten);
            const auto sums_at = std::span<const double>(expected_sums).subspan(at, n);
            reference.grid_round(sums_at, exponents, divide, std::span(o_ref).subspan(1, n), at);
            backend->grid_round(sums_at, exponents, divide, std::span(o_got).subspan(1, n), at);
            BOOST_TEST(test::same_bits(o_got, o_ref), "round: from " << at << ", " << n << " values, / " << divide);
          }
        }
    }
  }
  for (const auto& name : skipped) BOOST_TEST_MESSAGE("backend " << name << " is built but this CPU cannot run it");
}

BOOST_AUTO_TEST_SUITE_END()
