// The k_level quantizer: every SIMD backend bit for bit against the reference, the
// rounding error and bias, reproducible stochastic rounding, non-finite groups,
// malformed frames and error feedback. Part of the quantizer_tests executable.

#include <boost/test/unit_test.hpp>

#include "support/quantizer_inputs.hpp"

#include <qcoll/quantizers/k_level.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

using namespace qcoll;
using quantizers::k_level;
using quantizers::k_level_options;
using quantizers::rounding;

namespace {

constexpr unsigned all_levels[] = {2, 3, 16, 200, 256};
constexpr rounding both_roundings[] = {rounding::nearest, rounding::stochastic};
constexpr std::uint64_t near_a_key_change = (std::uint64_t{1} << 32) - 5;  // the key changes inside a vector

std::vector<std::byte> encode(const k_level& q, std::span<const float> in, std::span<float> residual = {},
                              quantizers::encode_position position = {}) {
  std::vector<std::byte> frame(q.encoded_size(in.size()));
  q.encode(in, residual, frame, position);
  return frame;
}

quantizers::wire::record_layout layout_of(const k_level& q) {
  return quantizers::wire::k_level_layout(q.group_size(), static_cast<unsigned>(q.bits_per_value()));
}

struct group_table {
  float min, step;
};

/// The table of group k of a frame (all groups before it are full).
group_table table_of(const k_level& q, std::span<const std::byte> frame, std::size_t k) {
  const std::byte* record = frame.data() + quantizers::wire::header_size + k * layout_of(q).full_record_bytes();
  group_table table;
  std::memcpy(&table.min, record, sizeof(float));
  std::memcpy(&table.step, record + sizeof(float), sizeof(float));
  return table;
}

using test::split_matches_in_place;
using test::starting_residuals;
using test::unwritten;

}  // namespace

BOOST_AUTO_TEST_SUITE(k_level_quantizer)

BOOST_AUTO_TEST_CASE(every_simd_backend_matches_the_reference_bit_for_bit) {
  std::vector<std::string> skipped;
  const auto backends = test::simd_backends(&skipped);
  for (const auto& name : skipped) BOOST_TEST_MESSAGE("not run on this CPU: " << name);
  BOOST_TEST_REQUIRE(!backends.empty());
  const auto& reference = test::reference_kernels();
  std::size_t compared = 0;
  for (std::size_t group : {8u, 64u, 2048u}) {
    const auto counts = test::boundary_counts(group);
    for (std::size_t c = 0; c < counts.size(); ++c) {
      const std::size_t n = counts[c];
      const auto inputs = test::edge_case_inputs(n, static_cast<unsigned>(n + group));
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        const auto& input = inputs[k];
        // 5 levels × 2 roundings × with/without residual. At G = 2048 (95% of the
        // values: the full product takes half a minute in a Debug build) each count and
        // input takes one of the 20 in turn, so every combination still meets dozens.
        for (std::size_t combination = 0; combination < 20; ++combination) {
          if (group == 2048 && combination != (c + k) % 20) continue;
          const unsigned levels = all_levels[combination % 5];
          const rounding mode = both_roundings[combination / 5 % 2];
          const bool feedback = combination / 10 == 1;
          const k_level_options options{.levels = levels, .group_size = group, .rounding = mode, .seed = 99};
          // Every other count starts just before a change of the random key.
          const quantizers::encode_position position{.sequence = c, .offset = c % 2 ? near_a_key_change : 0};
          const auto bits = static_cast<unsigned>(k_level(options).bits_per_value());
          const auto layout = quantizers::wire::k_level_layout(group, bits);
          std::vector<float> residual0(feedback ? n : 0);
          for (std::size_t i = 0; i < residual0.size(); ++i) residual0[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
          std::vector<float> expected_residual = residual0;
          std::vector<std::byte> expected(layout.payload_bytes(n));
          reference.k_level_encode(options, input.values, expected_residual, expected_residual, position,
                                   expected.data());
          std::vector<float> base(n, 0.5f), expected_decoded(n), expected_accumulated = base;
          reference.k_level_decode(options, expected.data(), expected_decoded, false);
          reference.k_level_decode(options, expected.data(), expected_accumulated, true);
          for (const auto* backend : backends) {
            std::vector<float> residual = residual0;
            std::vector<std::byte> records(expected.size());
            backend->k_level_encode(options, input.values, residual, residual, position, records.data());
            std::vector<float> decoded(n), accumulated = base;
            backend->k_level_decode(options, expected.data(), decoded, false);
            backend->k_level_decode(options, expected.data(), accumulated, true);
            const bool same = test::same_bytes(records, expected) && test::same_bits(residual, expected_residual) &&
                              test::same_bits(decoded, expected_decoded) &&
                              test::same_bits(accumulated, expected_accumulated);
            BOOST_TEST_REQUIRE(same, backend->name << " differs: " << input.name << ", n = " << n << ", group = "
                                                   << group << ", levels = " << levels << ", stochastic = "
                                                   << int(mode) << ", feedback = " << feedback
                                                   << ", offset = " << position.offset);
            ++compared;
          }
        }
      }
    }
  }
  BOOST_TEST_MESSAGE(compared << " encodings compared");
}

BOOST_AUTO_TEST_CASE(split_residuals_give_the_in_place_frame_and_residual_on_every_backend) {
  auto backends = test::simd_backends();
  backends.push_back(&test::reference_kernels());
  std::size_t compared = 0;
  for (std::size_t group : {8u, 64u})
    for (unsigned levels : {2u, 3u, 16u, 256u})
      for (rounding mode : both_roundings)
        for (std::size_t n : {1u, 17u, 63u, 64u, 65u, 200u})
          for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(n + group + levels)))
            for (const auto& residual0 : starting_residuals(input.values)) {
              const k_level_options options{.levels = levels, .group_size = group, .rounding = mode, .seed = 7};
              const quantizers::encode_position position{.sequence = 3, .offset = near_a_key_change};
              const k_level q(options);
              const std::size_t payload = q.encoded_size(n) - quantizers::wire::header_size;
              for (const auto* backend : backends) {
                const bool same = split_matches_in_place(
                    residual0, payload,
                    [&](std::span<float> residual, std::span<std::byte> records) {
                      backend->k_level_encode(options, input.values, residual, residual, position, records.data());
                    },
                    [&](std::span<const float> residual_in, std::span<float> residual_out,
                        std::span<std::byte> records) {
                      backend->k_level_encode(options, input.values, residual_in, residual_out, position,
                                              records.data());
                    });
                BOOST_TEST_REQUIRE(same, backend->name << ": " << input.name << ", n = " << n << ", group = " << group
                                                       << ", levels = " << levels << ", stochastic = " << int(mode));
                ++compared;
              }
              BOOST_TEST_REQUIRE(split_matches_in_place(  // the quantizer's two overloads, on the active backend
                  residual0, q.encoded_size(n),
                  [&](std::span<float> residual, std::span<std::byte> frame) {
                    q.encode(input.values, residual, frame, position);
                  },
                  [&](std::span<const float> residual_in, std::span<float> residual_out, std::span<std::byte> frame) {
                    q.encode(input.values, residual_in, residual_out, frame, position);
                  }));
            }
  BOOST_TEST_MESSAGE(compared << " split encodings compared");
}

BOOST_AUTO_TEST_CASE(a_non_finite_group_copies_its_residual_when_the_residuals_are_split) {
  for (rounding mode : both_roundings) {
    const k_level q({.levels = 16, .group_size = 64, .rounding = mode});
    std::vector<float> in(200), residual_in(200, 0.25f), residual_out(200, unwritten);
    for (std::size_t i = 0; i < in.size(); ++i)
      in[i] = static_cast<float>(i % 5) - 2.0f + 0.1f * static_cast<float>(i % 3);
    in[70] = std::numeric_limits<float>::infinity();  // group 1 of [0,64) [64,128) [128,192) [192,200)
    std::vector<std::byte> frame(q.encoded_size(in.size()));
    q.encode(in, residual_in, residual_out, frame);
    BOOST_TEST(test::same_bits(std::span(residual_out).subspan(64, 64), std::span(residual_in).subspan(64, 64)));
    BOOST_TEST(std::all_of(residual_in.begin(), residual_in.end(), [](float r) { return r == 0.25f; }));
    BOOST_TEST(residual_out[0] != 0.25f);  // the healthy groups fed back their error
    BOOST_TEST(!std::isnan(residual_out[199]));
  }
}

BOOST_AUTO_TEST_CASE(the_header_names_the_levels_and_rounding_and_codes_pack_lsb_first) {
  for (unsigned levels = 2; levels <= 256; ++levels) {
    const double bits = k_level({.levels = levels}).bits_per_value();
    BOOST_TEST_REQUIRE(bits == std::ceil(std::log2(double(levels))), levels << " levels");
  }
  const k_level q({.levels = 8, .group_size = 8, .rounding = rounding::stochastic});
  BOOST_TEST(q.encoded_size(2048) == 24u + 256u * (8u + 3u));
  const std::vector<float> in{0, 1, 2, 3, 4, 5, 6, 7};  // min 0, step 1: codes 0…7, exactly
  const auto frame = encode(q, in);
  const std::vector<unsigned> header{0x51, 1, 3, 1, 7, 1, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < header.size(); ++i)
    BOOST_TEST(std::to_integer<unsigned>(frame[i]) == header[i], "byte " << i);
  BOOST_TEST(table_of(q, frame, 0).min == 0.0f);
  BOOST_TEST(table_of(q, frame, 0).step == 1.0f);
  // Σ i << 3i for i < 8 = 0xfac688, little-endian.
  BOOST_TEST(std::to_integer<unsigned>(frame[32]) == 0x88u);
  BOOST_TEST(std::to_integer<unsigned>(frame[33]) == 0xc6u);
  BOOST_TEST(std::to_integer<unsigned>(frame[34]) == 0xfau);
  BOOST_TEST(frame.size() == 35u);
}

BOOST_AUTO_TEST_CASE(nearest_rounding_is_within_half_a_step_and_ties_go_up) {
  const k_level three({.levels = 3, .group_size = 8});
  const std::vector<float> ties{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 0.49f, 1.51f, 0.0f};
  std::vector<float> out(8);
  BOOST_TEST_REQUIRE(!three.decode(encode(three, ties), out));
  const std::vector<float> expected{0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 0.0f, 2.0f, 0.0f};
  BOOST_TEST(out == expected, boost::test_tools::per_element());

  constexpr double u = 0x1p-24;
  std::size_t checked = 0;
  for (std::size_t group : {8u, 64u, 2048u})
    for (unsigned levels : all_levels) {
      const k_level q({.levels = levels, .group_size = group});
      const std::size_t n = 2 * group + 5;
      for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(levels + group))) {
        const auto frame = encode(q, input.values);
        std::vector<float> decoded(n);
        BOOST_TEST_REQUIRE(!q.decode(frame, decoded));
        for (std::size_t first = 0; first < n; first += group) {
          const std::size_t g = std::min(group, n - first);
          const std::span<const float> v(input.values.data() + first, g);
          if (!std::all_of(v.begin(), v.end(), [](float value) { return std::isfinite(value); })) continue;
          const auto [min, step] = table_of(q, frame, first / group);
          const float top = min + static_cast<float>(levels - 1) * step;
          BOOST_TEST_REQUIRE(std::isfinite(top), input.name);
          // Only a range wider than FLT_MAX is not covered: values above the top level clamp to it.
          const bool too_wide =
              double(*std::max_element(v.begin(), v.end())) - double(min) > double(std::numeric_limits<float>::max());
          for (std::size_t i = 0; i < g; ++i) {
            const double value = v[i], got = decoded[first + i];
            if (too_wide && value > double(top)) {
              BOOST_TEST_REQUIRE(got == double(top), input.name);
              continue;
            }
            // Half a step, plus the rounding of t (a few ulps of t <= 255) and of the level,
            // plus (levels - 1) times the rounding of a subnormal step to a multiple of 2^-149.
            const double bound = double(step) * (0.5 + 1e-4) +
                                 4 * u * (std::abs(double(min)) + std::abs(value) + double(step) * (levels - 1)) +
                                 double(std::numeric_limits<float>::denorm_min()) * levels / 2;
            BOOST_TEST_REQUIRE(std::abs(got - value) <= bound, input.name << ", levels = " << levels << ", group = "
                                                                          << group << ", value " << first + i << ": "
                                                                          << value << " -> " << got);
            BOOST_TEST_REQUIRE(got >= double(min));
            ++checked;
          }
        }
      }
    }
  BOOST_TEST_MESSAGE(checked << " values within half a step");
}

BOOST_AUTO_TEST_CASE(stochastic_rounding_is_unbiased) {
  // No residual: the table is the same every time, only the rounding is random.
  constexpr std::size_t n = 64, trials = 2000;
  std::mt19937 generator(17);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = uniform(generator);
  for (unsigned levels : {3u, 16u}) {
    const k_level q({.levels = levels, .group_size = n, .rounding = rounding::stochastic, .seed = 5});
    const k_level seeded({.levels = levels, .group_size = n, .rounding = rounding::stochastic, .seed = 6});
    const k_level nearest({.levels = levels, .group_size = n});
    std::vector<double> sum(n, 0.0);
    std::vector<float> decoded(n);
    float step = 0;
    for (std::size_t t = 0; t < trials; ++t) {
      // New sequences, offsets and seeds: each trial draws new numbers.
      const auto frame = encode(t % 2 ? q : seeded, x, {}, {.sequence = t, .offset = 1000 * (t % 3)});
      step = table_of(q, frame, 0).step;
      BOOST_TEST_REQUIRE(!q.decode(frame, decoded));
      for (std::size_t i = 0; i < n; ++i) sum[i] += decoded[i];
    }
    // A decoded value is one of two levels a step apart: its standard deviation is
    // at most step / 2, so the mean of `trials` is within 5σ = 2.5 step / sqrt(trials).
    const double tolerance = 2.5 * step / std::sqrt(double(trials));
    double worst = 0, bias = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double error = sum[i] / trials - x[i];
      worst = std::max(worst, std::abs(error));
      bias += error / n;
    }
    BOOST_TEST_MESSAGE(levels << " levels, step " << step << ": largest |mean - x| " << worst / step
                              << " steps, mean error " << bias / step << " steps, tolerance " << tolerance / step);
    BOOST_TEST(worst <= tolerance);
    BOOST_TEST(std::abs(bias) <= tolerance / std::sqrt(double(n)));
    // Nearest rounding is biased per value, far beyond that tolerance: the test can tell.
    BOOST_TEST_REQUIRE(!nearest.decode(encode(nearest, x), decoded));
    double nearest_worst = 0;
    for (std::size_t i = 0; i < n; ++i) nearest_worst = std::max(nearest_worst, std::abs(double(decoded[i]) - x[i]));
    BOOST_TEST(nearest_worst > 4 * tolerance);
  }
}

BOOST_AUTO_TEST_CASE(stochastic_rounding_depends_on_seed_sequence_and_index_only) {
  constexpr std::size_t group = 64, n = 4 * group;
  std::mt19937 generator(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n), residual0(n);
  for (float& v : x) v = normal(generator);
  for (float& r : residual0) r = 0.05f * normal(generator);
  auto all_backends = test::simd_backends();
  all_backends.push_back(&test::reference_kernels());
  for (unsigned levels : {3u, 16u}) {
    const k_level_options options{.levels = levels, .group_size = group, .rounding = rounding::stochastic, .seed = 42};
    const k_level q(options);
    for (std::uint64_t offset : {std::uint64_t{0}, std::uint64_t{12345}, (std::uint64_t{1} << 32) - group - 5,
                                 ~std::uint64_t{0} - 100}) {
      const quantizers::encode_position position{.sequence = 9, .offset = offset};
      std::vector<float> whole_residual = residual0;
      const auto whole = encode(q, x, whole_residual, position);
      // The same (seed, sequence, offset) again: the same frame.
      std::vector<float> again_residual = residual0;
      BOOST_TEST(test::same_bytes(encode(q, x, again_residual, position), whole));
      BOOST_TEST(test::same_bits(again_residual, whole_residual));
      // Cut at a group boundary into two calls at offsets offset and offset + n/2.
      std::vector<float> halves_residual = residual0;
      const std::span<float> residual_span(halves_residual);
      const auto first = encode(q, std::span(x).first(n / 2), residual_span.first(n / 2), position);
      const auto second = encode(q, std::span(x).subspan(n / 2), residual_span.subspan(n / 2),
                                 {.sequence = 9, .offset = offset + n / 2});
      constexpr std::size_t header = quantizers::wire::header_size;
      const std::size_t half = first.size() - header;
      BOOST_TEST_REQUIRE(whole.size() == header + 2 * half);
      const auto payload = std::span(whole).subspan(header);
      BOOST_TEST(test::same_bytes(payload.first(half), std::span(first).subspan(header)), "offset " << offset);
      BOOST_TEST(test::same_bytes(payload.subspan(half), std::span(second).subspan(header)), "offset " << offset);
      BOOST_TEST(test::same_bits(halves_residual, whole_residual));
      // Every backend draws the same numbers.
      for (const auto* backend : all_backends) {
        std::vector<float> residual = residual0;
        std::vector<std::byte> records(payload.size());
        backend->k_level_encode(options, x, residual, residual, position, records.data());
        BOOST_TEST(test::same_bytes(records, payload), backend->name << ", offset " << offset);
      }
      // Another sequence or seed: other numbers, so other codes.
      std::vector<float> other_residual = residual0;
      BOOST_TEST(!test::same_bytes(encode(q, x, other_residual, {.sequence = 10, .offset = offset}), whole));
      other_residual = residual0;
      const k_level reseeded({.levels = levels, .group_size = group, .rounding = rounding::stochastic, .seed = 43});
      BOOST_TEST(!test::same_bytes(encode(reseeded, x, other_residual, position), whole));
    }
  }
}

BOOST_AUTO_TEST_CASE(stochastic_rounding_draws_the_documented_random_numbers) {
  // The generator is part of the reproducibility contract (quantizers/k_level.hpp):
  // written out again here from the documentation, not from the kernels.
  const auto splitmix64 = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  };
  const auto lowbias32 = [](std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
  };
  constexpr std::uint64_t seed = 12345, sequence = 77;
  const auto u = [&](std::uint64_t index) {
    const std::uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ sequence) ^ (index >> 32));
    const std::uint32_t h = lowbias32(lowbias32(static_cast<std::uint32_t>(index) ^ static_cast<std::uint32_t>(key)) ^
                                      static_cast<std::uint32_t>(key >> 32));
    return static_cast<float>(h >> 8) * 0x1p-24f;
  };
  constexpr std::size_t group = 64, n = 3 * group;
  std::mt19937 generator(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(generator);
  for (unsigned levels : {2u, 16u, 200u})
    for (std::uint64_t offset : {std::uint64_t{0}, (std::uint64_t{1} << 32) - 70}) {
      const k_level q({.levels = levels, .group_size = group, .rounding = rounding::stochastic, .seed = seed});
      const auto frame = encode(q, x, {}, {.sequence = sequence, .offset = offset});
      std::vector<float> decoded(n);
      BOOST_TEST_REQUIRE(!q.decode(frame, decoded));
      std::size_t rounded_up = 0, mismatches = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto [min, step] = table_of(q, frame, i / group);
        const float top = static_cast<float>(levels - 1);
        const float t = std::min((x[i] - min) * 1.0f * (1.0f / step), top);
        const float code = std::trunc(t);
        const bool up = u(offset + i) < t - code;
        rounded_up += up;
        mismatches += decoded[i] != min + (code + (up ? 1.0f : 0.0f)) * step;
      }
      BOOST_TEST(mismatches == 0u, levels << " levels, offset " << offset);
      BOOST_TEST(rounded_up > 0u);
    }
}

BOOST_AUTO_TEST_CASE(a_group_with_nan_or_inf_decodes_to_nan_and_keeps_its_residual) {
  constexpr float huge = std::numeric_limits<float>::max();
  for (unsigned levels : all_levels)
    for (rounding mode : both_roundings) {
      const k_level q({.levels = levels, .group_size = 64, .rounding = mode});
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), huge}) {
        std::vector<float> in(200), residual(200);
        for (std::size_t i = 0; i < in.size(); ++i) {
          in[i] = static_cast<float>(i % 5) - 2.0f + 0.1f * static_cast<float>(i % 3);
          residual[i] = 0.01f * static_cast<float>(i % 11);
        }
        in[70] = bad;  // group 1 of [0,64) [64,128) [128,192) [192,200)
        if (bad == huge) residual[70] = huge;  // finite input and residual, an infinite sum
        const std::vector<float> before = residual;
        const auto frame = encode(q, in, residual);
        std::vector<float> out(200, 0.0f);
        BOOST_TEST_REQUIRE(!q.decode(frame, out));
        const auto [min, step] = table_of(q, frame, 1);
        BOOST_TEST(std::isnan(min));
        BOOST_TEST(std::isnan(step));
        bool nan_where_expected = true;
        for (std::size_t i = 0; i < 200; ++i)
          nan_where_expected = nan_where_expected && std::isnan(out[i]) == (i >= 64 && i < 128);
        BOOST_TEST(nan_where_expected);
        BOOST_TEST(test::same_bits(std::span(residual).subspan(64, 64), std::span(before).subspan(64, 64)));
        for (std::size_t healthy : {0u, 128u, 192u}) {
          const std::size_t g = std::min<std::size_t>(64, 200 - healthy);
          BOOST_TEST(!test::same_bits(std::span(residual).subspan(healthy, g), std::span(before).subspan(healthy, g)),
                     "group at " << healthy << " fed back its error");
        }
      }
    }
}

BOOST_AUTO_TEST_CASE(an_all_equal_group_decodes_exactly) {
  const std::vector<float> values{0.75f, -3.0f, 1e30f, -std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::denorm_min(), 0.0f};
  for (unsigned levels : all_levels)
    for (rounding mode : both_roundings) {
      const k_level q({.levels = levels, .group_size = 16, .rounding = mode});
      std::vector<float> in;
      for (float value : values) in.insert(in.end(), 16, value);
      in.resize(in.size() - 3);  // a short last group too
      std::vector<float> residual(in.size(), 0.0f), out(in.size());
      const auto frame = encode(q, in, residual);
      BOOST_TEST_REQUIRE(!q.decode(frame, out));
      BOOST_TEST(out == in, boost::test_tools::per_element());
      BOOST_TEST(std::all_of(residual.begin(), residual.end(), [](float r) { return r == 0.0f; }));
      for (std::size_t k = 0; k < values.size(); ++k) BOOST_TEST(table_of(q, frame, k).step == 0.0f);
    }
}

BOOST_AUTO_TEST_CASE(a_malformed_frame_is_an_error_and_leaves_the_output_untouched) {
  for (unsigned levels : {3u, 16u, 200u}) {
    const k_level q({.levels = levels, .group_size = 64});
    std::vector<float> in(101);  // groups of 64 and 37: 2 and 4-bit codes leave padding bits
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = std::sin(static_cast<float>(i));
    const auto frame = encode(q, in);
    const auto check = [&](std::span<const std::byte> bad, std::size_t count, errc expected, const std::string& what) {
      for (bool accumulate : {false, true}) {
        std::vector<float> out(count, 42.0f);
        const auto error = accumulate ? q.decode_accumulate(bad, out) : q.decode(bad, out);
        BOOST_TEST(error == make_error_code(expected), what << ", levels = " << levels);
        BOOST_TEST(std::all_of(out.begin(), out.end(), [](float v) { return v == 42.0f; }), what);
      }
    };
    check(std::span(frame).first(frame.size() - 1), 101, errc::protocol_error, "truncated");
    check(std::span(frame).first(10), 101, errc::protocol_error, "shorter than a header");
    auto longer = frame;
    longer.push_back(std::byte{0});
    check(longer, 101, errc::protocol_error, "oversize");
    check(frame, 100, errc::count_mismatch, "another count");
    const auto corrupt = [&](std::size_t at, std::byte value, const std::string& what) {
      auto bad = frame;
      bad[at] = value;
      check(bad, 101, errc::protocol_error, what);
    };
    corrupt(4, static_cast<std::byte>(levels), "levels");
    corrupt(5, std::byte{1}, "rounding");
    corrupt(8, std::byte{32}, "group size");
    if (levels != 200) corrupt(frame.size() - 1, std::byte{0x80}, "padding bits after the last code");
    if (levels != 16) {
      // 2 or 8 bits per code: the first code of group 1 set to 3 or 255.
      const std::size_t code = quantizers::wire::header_size + layout_of(q).full_record_bytes() + 8;
      auto bad = frame;
      bad[code] |= static_cast<std::byte>(levels == 3 ? 0x03 : 0xff);
      check(bad, 101, errc::protocol_error, "a code past the last level");
      bad[code] = static_cast<std::byte>(levels == 3 ? 0x02 : levels - 1);  // the top level is fine
      std::vector<float> out(101);
      BOOST_TEST(!q.decode(bad, out));
    }
    std::vector<float> out(101);
    const auto other = [&](k_level_options options) { return k_level(options).decode(frame, out); };
    BOOST_TEST(other({.levels = levels + 1, .group_size = 64}) == make_error_code(errc::protocol_error));
    BOOST_TEST(other({.levels = levels, .group_size = 64, .rounding = rounding::stochastic}) ==
               make_error_code(errc::protocol_error));
    BOOST_TEST(other({.levels = levels, .group_size = 128}) == make_error_code(errc::protocol_error));
    BOOST_TEST(other({.levels = levels, .group_size = 64, .seed = 8}) == std::error_code());  // the seed is not sent
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_rejected_with_a_clear_error) {
  for (unsigned levels : {0u, 1u, 257u})
    BOOST_CHECK_EXCEPTION(k_level({.levels = levels}), qcoll::error, [](const qcoll::error& e) {
      return e.code() == errc::invalid_argument && std::string(e.what()).find("levels") != std::string::npos;
    });
  BOOST_CHECK_EXCEPTION(k_level(k_level_options::with_bits(9)), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
  BOOST_CHECK_EXCEPTION(k_level({.levels = 16, .group_size = 12}), qcoll::error, [](const qcoll::error& e) {
    return e.code() == errc::invalid_argument && std::string(e.what()).find("group size") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(k_level({.rounding = static_cast<rounding>(2)}), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
  BOOST_TEST(k_level(k_level_options::with_bits(8)).levels() == 256u);
  const k_level q;
  std::vector<float> in(10), short_residual(9);
  std::vector<std::byte> frame(q.encoded_size(10));
  BOOST_CHECK_EXCEPTION(q.encode(in, short_residual, frame), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
  BOOST_CHECK_EXCEPTION(q.encode(in, {}, std::span(frame).first(frame.size() - 1)), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
}

BOOST_AUTO_TEST_CASE(error_feedback_keeps_the_accumulated_error_equal_to_the_residual_and_bounded) {
  constexpr std::size_t n = 1000;
  std::mt19937 generator(5);
  std::normal_distribution<float> normal(0.01f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(generator);  // the same gradient every step: the worst case for bias
  for (unsigned levels : {3u, 16u})
    for (rounding mode : both_roundings) {
      const k_level q({.levels = levels, .group_size = 256, .rounding = mode, .seed = 1});
      std::vector<float> residual(n, 0.0f), decoded(n);
      std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
      std::vector<std::byte> frame(q.encoded_size(n));
      double drift_at_100 = 0, drift_at_1000 = 0, largest_step = 0;
      for (std::size_t step = 1; step <= 1000; ++step) {
        q.encode(x, residual, frame, {.sequence = step});
        BOOST_TEST_REQUIRE(!q.decode(frame, decoded));
        for (std::size_t i = 0; i < n; ++i) {
          sum_in[i] += x[i];
          sum_out[i] += decoded[i];
        }
        if (step != 100 && step != 1000) continue;
        // Σ decoded = Σ x − final residual, up to the float rounding of each step.
        double drift = 0, largest_residual = 0, gap = 0;
        for (std::size_t i = 0; i < n; ++i) {
          drift = std::max(drift, std::abs(sum_out[i] - sum_in[i]));
          largest_residual = std::max(largest_residual, double(std::abs(residual[i])));
          gap = std::max(gap, std::abs(sum_out[i] - sum_in[i] + residual[i]));
        }
        BOOST_TEST(gap <= 1e-6 * double(step), "step " << step);
        BOOST_TEST(std::abs(drift - largest_residual) <= 1e-6 * double(step), "step " << step);
        (step == 100 ? drift_at_100 : drift_at_1000) = drift;
        for (std::size_t k = 0; k < 4; ++k) largest_step = std::max(largest_step, double(table_of(q, frame, k).step));
      }
      BOOST_TEST_MESSAGE(levels << " levels, " << (mode == rounding::stochastic ? "stochastic" : "nearest")
                                << ": max |Σ decoded − Σ x| after 100 and 1000 steps: " << drift_at_100 << ", "
                                << drift_at_1000 << " (step up to " << largest_step << ")");
      // Without feedback the error of a fixed x would grow 10× from step 100 to 1000;
      // with it, it stays below one step (the residual is < step, or <= step/2 for nearest).
      BOOST_TEST(drift_at_1000 <= 2 * drift_at_100 + 1e-3);
      BOOST_TEST(drift_at_1000 <= largest_step * (mode == rounding::nearest ? 0.5 : 1.0) * (1 + 1e-3));
    }
}

BOOST_AUTO_TEST_SUITE_END()
