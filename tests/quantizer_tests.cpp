// Quantizers: the wire format, the kernel dispatch, identity and one_bit here;
// k_level and bfp (with the lazy update) in their own files of this executable.
// Every SIMD backend this CPU runs is compared bit for bit with the reference.

#define BOOST_TEST_MODULE qcoll quantizers
#include <boost/test/unit_test.hpp>

#include "support/quantizer_inputs.hpp"

#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

using namespace qcoll;
using quantizers::one_bit;
using quantizers::one_bit_options;

namespace {

std::vector<std::byte> encode(const one_bit& q, std::span<const float> in, std::span<float> residual = {}) {
  std::vector<std::byte> frame(q.encoded_size(in.size()));
  q.encode(in, residual, frame);
  return frame;
}

std::vector<one_bit_options> all_one_bit_options(std::size_t group) {
  std::vector<one_bit_options> all;
  for (auto threshold : {quantizers::threshold::zero, quantizers::threshold::group_mean})
    for (auto reconstruction : {quantizers::reconstruction::bin_means, quantizers::reconstruction::min_max})
      all.push_back({.group_size = group, .threshold = threshold, .reconstruction = reconstruction});
  return all;
}

using test::split_matches_in_place;
using test::starting_residuals;
using test::unwritten;

float squared_error(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += double(a[i] - b[i]) * double(a[i] - b[i]);
  return static_cast<float>(sum);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(kernel_dispatch)

BOOST_AUTO_TEST_CASE(the_active_backend_is_the_best_this_cpu_runs_or_the_one_named_in_the_environment) {
  const auto& active = kernels::cpu::active_kernels();
  BOOST_TEST_MESSAGE("active kernels: " << active.name);
  std::string compiled;
  for (const auto& backend : kernels::cpu::compiled_backends())
    compiled += std::string(backend.kernels->name) + (backend.runs_here ? " " : " (not on this CPU) ");
  BOOST_TEST_MESSAGE("compiled backends: " << compiled);
  BOOST_TEST(kernels::cpu::compiled_backends().back().kernels->name == std::string("reference"));
  if (const char* requested = std::getenv("QCOLL_KERNELS"); requested && *requested) {
    BOOST_TEST(active.name == std::string(requested));
  } else {
    const auto& best = *std::find_if(kernels::cpu::compiled_backends().begin(), kernels::cpu::compiled_backends().end(),
                                     [](const auto& backend) { return backend.runs_here; });
    BOOST_TEST(active.name == std::string(best.kernels->name));
  }
}

BOOST_AUTO_TEST_CASE(an_x86_64_build_has_every_instruction_set) {
#if defined(QCOLL_KERNELS_COMPILED) && defined(__x86_64__)
  for (const char* name : {"avx512f", "avx2", "sse2", "reference"}) {
    const bool built = std::any_of(kernels::cpu::compiled_backends().begin(), kernels::cpu::compiled_backends().end(),
                                   [&](const auto& backend) { return backend.kernels->name == std::string(name); });
    BOOST_TEST(built, name);
  }
  std::vector<std::string> skipped;
  test::simd_backends(&skipped);
  for (const auto& name : skipped) BOOST_TEST_MESSAGE("built but not run on this CPU: " << name);
#else
  BOOST_TEST_MESSAGE("not an x86-64 build with compiled kernels");
#endif
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(wire_format)

BOOST_AUTO_TEST_CASE(the_header_is_little_endian_and_names_the_scheme_settings_and_count) {
  const one_bit q({.group_size = 64, .threshold = quantizers::threshold::group_mean});
  const std::vector<float> in(130, 1.0f);
  const auto frame = encode(q, in);
  const std::vector<unsigned> expected{0x51, 1, 2, 1, 1, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 130, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t i = 0; i < expected.size(); ++i) BOOST_TEST(std::to_integer<unsigned>(frame[i]) == expected[i], "byte " << i);
  // Two full groups of 8 + 64/8 bytes, then one of 2 values: 8 + 1 bytes.
  BOOST_TEST(frame.size() == 24u + 2 * (8 + 8) + (8 + 1));
}

BOOST_AUTO_TEST_CASE(codes_pack_lsb_first_and_unpack_to_the_same_values) {
  std::mt19937 generator(3);
  for (unsigned bits = 1; bits <= 32; ++bits) {
    if (bits > 16 && bits != 32) continue;
    for (std::size_t n : {1u, 7u, 8u, 9u, 33u, 1001u}) {
      std::vector<std::uint32_t> codes(n);
      const std::uint64_t limit = (std::uint64_t{1} << bits) - 1;
      for (auto& code : codes) code = static_cast<std::uint32_t>(generator() & limit);
      std::vector<std::byte> packed((n * bits + 7) / 8 + 1, std::byte{0xee});
      kernels::pack_codes(codes, bits, packed.data());
      BOOST_TEST(std::to_integer<unsigned>(packed.back()) == 0xeeu, "wrote past the codes");
      BOOST_TEST(quantizers::wire::padding_is_zero(packed.data(), n, bits));
      // Bit j of the string is bit j % 8 of byte j / 8.
      for (std::size_t i = 0; i < n; ++i)
        for (unsigned b = 0; b < bits; ++b) {
          const std::size_t j = i * bits + b;
          const unsigned bit = (std::to_integer<unsigned>(packed[j / 8]) >> (j % 8)) & 1u;
          BOOST_TEST_REQUIRE(bit == ((codes[i] >> b) & 1u));
        }
      std::vector<std::uint32_t> unpacked(n);
      kernels::unpack_codes(packed.data(), bits, unpacked);
      BOOST_TEST(unpacked == codes);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(identity_quantizer)

BOOST_AUTO_TEST_CASE(round_trips_and_accumulates_exactly_from_unaligned_frames) {
  const quantizers::identity<double> q;
  const std::vector<double> in{1.5, -2.25, 1e300, 0.0};
  BOOST_TEST(q.encoded_size(in.size()) == 24u + 32u);
  std::vector<std::byte> wire(q.encoded_size(in.size()) + 1);
  const auto frame = std::span<std::byte>(wire).subspan(1);  // any address will do
  q.encode(in, {}, frame);
  std::vector<double> out(4, 0.0);
  BOOST_TEST(!q.decode(frame, out));
  BOOST_TEST(out == in);
  BOOST_TEST(!q.decode_accumulate(frame, out));
  BOOST_TEST(out[0] == 3.0);
  BOOST_TEST(q.decode(std::span<const std::byte>(wire), out) == make_error_code(errc::protocol_error));
  BOOST_TEST(q.decode_accumulate(frame.first(8), out) == make_error_code(errc::protocol_error));
  std::vector<double> three(3);
  BOOST_TEST(q.decode(frame, three) == make_error_code(errc::count_mismatch));
  std::vector<float> as_float(4);
  BOOST_TEST(quantizers::identity<float>().decode(frame, as_float) == make_error_code(errc::type_mismatch));
}

BOOST_AUTO_TEST_CASE(split_residuals_pass_through_like_the_in_place_residual) {
  const quantizers::identity<float> q;
  const std::vector<float> in{1.5f, -2.25f, 0.0f, 3.0f, -0.0f};
  const std::vector<float> residual0{0.5f, -1.0f, 2.0f, 0.0f, -0.0f};
  BOOST_TEST(split_matches_in_place(
      residual0, q.encoded_size(in.size()),
      [&](std::span<float> residual, std::span<std::byte> frame) { q.encode(in, residual, frame); },
      [&](std::span<const float> residual_in, std::span<float> residual_out, std::span<std::byte> frame) {
        q.encode(in, residual_in, residual_out, frame);
      }));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(one_bit_quantizer)

BOOST_AUTO_TEST_CASE(every_simd_backend_matches_the_reference_bit_for_bit) {
  std::vector<std::string> skipped;
  const auto backends = test::simd_backends(&skipped);
  for (const auto& name : skipped) BOOST_TEST_MESSAGE("not run on this CPU: " << name);
  BOOST_TEST_REQUIRE(!backends.empty());
  const auto& reference = test::reference_kernels();
  std::size_t compared = 0;
  for (std::size_t group : {8u, 64u, 2048u})
    for (const auto& options : all_one_bit_options(group))
      for (std::size_t n : test::boundary_counts(group))
        for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(n + group)))
          for (int feedback_and_memory : {0, 1, 2, 3}) {
            // 0: no feedback; 1: feedback; 2: and a fresh memory (NaN: none yet); 3: and a
            // memory of previous tables, one of them NaN (that group uses its own).
            const bool feedback = feedback_and_memory >= 1;
            const auto layout = quantizers::wire::one_bit_layout(group);
            std::vector<float> residual0(feedback ? n : 0);
            for (std::size_t i = 0; i < residual0.size(); ++i) residual0[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
            const std::size_t groups = (n + group - 1) / group;
            std::vector<float> memory0(feedback_and_memory >= 2 ? 2 * groups : 0,
                                       std::numeric_limits<float>::quiet_NaN());
            for (std::size_t k = 0; feedback_and_memory == 3 && k < groups; ++k)
              if (k % 3 != 1) {
                memory0[2 * k] = -0.5f + 0.1f * static_cast<float>(k);
                memory0[2 * k + 1] = 0.7f - 0.05f * static_cast<float>(k);
              }
            std::vector<float> expected_residual = residual0, expected_memory = memory0;
            std::vector<std::byte> expected(layout.payload_bytes(n));
            reference.one_bit_encode(options, input.values, expected_residual, expected_residual, expected_memory,
                                     expected_memory, expected.data());
            std::vector<float> base(n, 0.5f), expected_decoded(n), expected_accumulated = base;
            reference.one_bit_decode(options, expected.data(), expected_decoded, false);
            reference.one_bit_decode(options, expected.data(), expected_accumulated, true);
            for (const auto* backend : backends) {
              std::vector<float> residual = residual0, memory = memory0;
              std::vector<std::byte> records(expected.size());
              backend->one_bit_encode(options, input.values, residual, residual, memory, memory, records.data());
              std::vector<float> decoded(n), accumulated = base;
              backend->one_bit_decode(options, expected.data(), decoded, false);
              backend->one_bit_decode(options, expected.data(), accumulated, true);
              const bool same = test::same_bytes(records, expected) && test::same_bits(residual, expected_residual) &&
                                test::same_bits(memory, expected_memory) &&
                                test::same_bits(decoded, expected_decoded) &&
                                test::same_bits(accumulated, expected_accumulated);
              BOOST_TEST_REQUIRE(same, backend->name << " differs: " << input.name << ", n = " << n << ", group = "
                                                     << group << ", mean threshold = "
                                                     << int(options.threshold) << ", min_max = "
                                                     << int(options.reconstruction)
                                                     << ", feedback and memory = " << feedback_and_memory);
              ++compared;
            }
          }
  BOOST_TEST_MESSAGE(compared << " encodings compared");
}

BOOST_AUTO_TEST_CASE(split_residuals_give_the_in_place_frame_and_residual_on_every_backend) {
  auto backends = test::simd_backends();
  backends.push_back(&test::reference_kernels());
  std::size_t compared = 0;
  for (std::size_t group : {8u, 64u})
    for (const auto& options : all_one_bit_options(group))
      for (std::size_t n : {1u, 17u, 63u, 64u, 65u, 200u})
        for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(n + group)))
          for (const auto& residual0 : starting_residuals(input.values)) {
            const std::size_t payload = quantizers::wire::one_bit_layout(group).payload_bytes(n);
            for (const auto* backend : backends) {
              const bool same = split_matches_in_place(
                  residual0, payload,
                  [&](std::span<float> residual, std::span<std::byte> records) {
                    backend->one_bit_encode(options, input.values, residual, residual, {}, {}, records.data());
                  },
                  [&](std::span<const float> residual_in, std::span<float> residual_out, std::span<std::byte> records) {
                    backend->one_bit_encode(options, input.values, residual_in, residual_out, {}, {}, records.data());
                  });
              BOOST_TEST_REQUIRE(same, backend->name << ": " << input.name << ", n = " << n << ", group = " << group
                                                     << ", mean threshold = " << int(options.threshold)
                                                     << ", min_max = " << int(options.reconstruction));
              ++compared;
            }
            const one_bit q(options);  // the quantizer's two overloads, on the active backend
            BOOST_TEST_REQUIRE(split_matches_in_place(
                residual0, q.encoded_size(n),
                [&](std::span<float> residual, std::span<std::byte> frame) { q.encode(input.values, residual, frame); },
                [&](std::span<const float> residual_in, std::span<float> residual_out, std::span<std::byte> frame) {
                  q.encode(input.values, residual_in, residual_out, frame);
                }));
          }
  BOOST_TEST_MESSAGE(compared << " split encodings compared");
}

BOOST_AUTO_TEST_CASE(a_non_finite_group_copies_its_residual_when_the_residuals_are_split) {
  for (const auto& options : all_one_bit_options(64)) {
    const one_bit q(options);
    std::vector<float> in(200), residual_in(200, 0.25f), residual_out(200, unwritten);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 5) - 2.0f;
    in[70] = std::numeric_limits<float>::quiet_NaN();  // group 1 of [0,64) [64,128) [128,192) [192,200)
    std::vector<std::byte> frame(q.encoded_size(in.size()));
    q.encode(in, residual_in, residual_out, frame);
    BOOST_TEST(test::same_bits(std::span(residual_out).subspan(64, 64), std::span(residual_in).subspan(64, 64)));
    BOOST_TEST(std::all_of(residual_in.begin(), residual_in.end(), [](float r) { return r == 0.25f; }));
    BOOST_TEST(residual_out[0] != 0.25f);  // the healthy groups fed back their error
  }
}

BOOST_AUTO_TEST_CASE(residuals_that_partly_overlap_or_differ_in_size_are_rejected) {
  const one_bit q({.group_size = 8});
  const std::vector<float> in(10, 1.0f);
  std::vector<float> buffer(20, 0.0f);
  const std::span<float> all(buffer);
  std::vector<std::byte> frame(q.encoded_size(10));
  const auto invalid = [](const qcoll::error& e) { return e.code() == errc::invalid_argument; };
  BOOST_CHECK_EXCEPTION(q.encode(in, all.first(10), all.subspan(1, 10), frame), qcoll::error, invalid);
  BOOST_CHECK_EXCEPTION(q.encode(in, all.subspan(9, 10), all.first(10), frame), qcoll::error, invalid);
  BOOST_CHECK_EXCEPTION(q.encode(in, all.first(10), std::span<float>(), frame), qcoll::error, invalid);
  BOOST_CHECK_EXCEPTION(q.encode(in, std::span<const float>(), all.first(10), frame), qcoll::error, invalid);
  BOOST_CHECK_EXCEPTION(q.encode(in, all.first(9), all.subspan(10, 9), frame), qcoll::error, invalid);
  BOOST_CHECK_NO_THROW(q.encode(in, all.first(10), all.subspan(10), frame));  // adjacent, disjoint
  BOOST_CHECK_NO_THROW(q.encode(in, all.first(10), all.first(10), frame));    // the same range: in place
  BOOST_CHECK_NO_THROW(q.encode(in, std::span<const float>(), std::span<float>(), frame));
}

BOOST_AUTO_TEST_CASE(a_value_at_the_threshold_goes_to_bin_one_and_an_empty_bin_decodes_to_zero) {
  const one_bit q({.group_size = 8});
  const std::vector<float> in{0.0f, -0.0f, 2.0f, 4.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<float> out(8);
  BOOST_TEST(!q.decode(encode(q, in), out));
  // All values >= 0 are in bin 1, whose mean is 6/8; bin 0 is empty.
  for (float v : out) BOOST_TEST(v == 0.75f);
  const one_bit mean({.group_size = 8, .threshold = quantizers::threshold::group_mean});
  const std::vector<float> equal(8, -3.0f);
  const auto frame = encode(mean, equal);
  float table[2];
  std::memcpy(table, frame.data() + 24, sizeof table);
  BOOST_TEST(table[0] == 0.0f);  // empty bin 0
  BOOST_TEST(table[1] == -3.0f);
  BOOST_TEST(std::to_integer<unsigned>(frame[24 + 8]) == 0xffu);  // all at the mean: bin 1
}

// reconstruction_from = previous (the seed's eqs. 13–15): a group goes out with the
// table its values had at the previous encode; the first encode (memory of NaN) and
// the encodes without a memory use the current table; the memory then holds this
// encode's table; the residual is what was fed minus what the sent table decodes to.
BOOST_AUTO_TEST_CASE(reconstruction_from_the_previous_encode) {
  for (auto rule : {quantizers::reconstruction::bin_means, quantizers::reconstruction::min_max}) {
    BOOST_TEST_CONTEXT("min_max = " << int(rule)) {
      const one_bit q({.group_size = 8, .reconstruction = rule,
                       .reconstruction_from = quantizers::reconstruction_source::previous});
      const one_bit now({.group_size = 8, .reconstruction = rule});
      BOOST_TEST(q.memory_size(12) == 4u);  // two groups (the second partial), two values each
      BOOST_TEST(now.memory_size(12) == 0u);
      // The table a group's values give: bin means, or the minimum and maximum.
      auto table_of = [&](std::span<const float> v) {
        float s0 = 0, s1 = 0, lo = v[0], hi = v[0];
        std::size_t n0 = 0, n1 = 0;
        for (float x : v) {
          (x >= 0 ? s1 : s0) += x;
          ++(x >= 0 ? n1 : n0);
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
        if (rule == quantizers::reconstruction::min_max) return std::pair{n0 ? lo : 0.0f, n1 ? hi : 0.0f};
        return std::pair{n0 ? s0 / float(n0) : 0.0f, n1 ? s1 / float(n1) : 0.0f};
      };
      const std::vector<float> first{-1, -3, 2, 4, -2, 6, 0.5f, -0.5f, 1, -1, 3, -3};
      const std::vector<float> second{-0.25f, 0.75f, -1.75f, 2.5f, 0.5f, -0.5f, 1.5f, -2.5f, 0.25f, -0.75f, 1, -1};
      std::vector<float> memory(4, std::numeric_limits<float>::quiet_NaN()), residual(12, 0.0f);
      std::vector<std::byte> frame(q.encoded_size(12));
      std::vector<float> out(12);
      q.encode(first, residual, residual, memory, memory, frame);
      BOOST_TEST(!q.decode(frame, out));
      std::vector<float> expected_out(12), expected_memory;
      for (std::size_t k = 0; k < 2; ++k) {
        const auto group = std::span(first).subspan(8 * k, k == 0 ? 8 : 4);
        const auto [zero, one] = table_of(group);
        expected_memory.insert(expected_memory.end(), {zero, one});
        for (std::size_t i = 0; i < group.size(); ++i) expected_out[8 * k + i] = group[i] >= 0 ? one : zero;
      }
      BOOST_TEST(out == expected_out, boost::test_tools::per_element());  // the first encode: its own table
      BOOST_TEST(memory == expected_memory, boost::test_tools::per_element());
      std::vector<float> fed(12);
      for (std::size_t i = 0; i < 12; ++i) fed[i] = second[i] + residual[i];
      const std::vector<float> kept = memory, residual_before = residual;
      q.encode(second, residual, residual, memory, memory, frame);
      BOOST_TEST(!q.decode(frame, out));
      for (std::size_t i = 0; i < 12; ++i) {
        const std::size_t k = i / 8;
        const float sent = fed[i] >= 0 ? kept[2 * k + 1] : kept[2 * k];  // the first encode's table
        BOOST_TEST(out[i] == sent, "value " << i);
        BOOST_TEST(residual[i] == fed[i] - sent, "value " << i);
      }
      for (std::size_t k = 0; k < 2; ++k) {
        const auto [zero, one] = table_of(std::span<const float>(fed).subspan(8 * k, k == 0 ? 8 : 4));
        BOOST_TEST(memory[2 * k] == zero);  // now the second encode's own table
        BOOST_TEST(memory[2 * k + 1] == one);
      }
      // Without a memory: the current table, the frame of reconstruction_from = current.
      std::vector<float> r1 = residual_before, r2 = residual_before;
      std::vector<std::byte> a(q.encoded_size(12)), b(now.encoded_size(12));
      q.encode(second, r1, a);
      now.encode(second, r2, b);
      BOOST_TEST(test::same_bytes(a, b));
      BOOST_TEST(test::same_bits(r1, r2));
      // Memories of the wrong size are refused.
      std::vector<float> short_memory(2);
      BOOST_CHECK_THROW(q.encode(second, residual, residual, short_memory, short_memory, frame), qcoll::error);
    }
  }
}

BOOST_AUTO_TEST_CASE(encodes_2048_values_31_times_smaller_than_float32) {
  const one_bit q;
  BOOST_TEST(q.encoded_size(2048) == 24u + 8u + 256u);
  const std::size_t n = 2048 * 1024;
  const double ratio = double(n * sizeof(float)) / double(q.encoded_size(n));
  BOOST_TEST_MESSAGE("compression at G = 2048, 8 MiB: " << ratio);
  BOOST_TEST(ratio >= 31.0);
  BOOST_TEST(ratio < 65536.0 / 2112.0);  // the limit: X + 64 bits per X values
}

BOOST_AUTO_TEST_CASE(bin_means_give_the_least_squared_error_for_the_bits) {
  std::mt19937 generator(11);
  std::normal_distribution<float> normal(0.3f, 2.0f);
  std::uniform_real_distribution<float> nudge(-0.5f, 0.5f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> in(256);
    for (float& v : in) v = normal(generator);
    for (auto threshold : {quantizers::threshold::zero, quantizers::threshold::group_mean}) {
      const one_bit means({.group_size = 256, .threshold = threshold});
      const one_bit extremes({.group_size = 256, .threshold = threshold,
                              .reconstruction = quantizers::reconstruction::min_max});
      std::vector<float> decoded(256), decoded_extremes(256);
      const auto frame = encode(means, in);
      BOOST_TEST_REQUIRE(!means.decode(frame, decoded));
      BOOST_TEST_REQUIRE(!extremes.decode(encode(extremes, in), decoded_extremes));
      const float best = squared_error(in, decoded);
      BOOST_TEST(best <= squared_error(in, decoded_extremes));
      // Any other pair of values for the same bits does no better.
      float table[2];
      std::memcpy(table, frame.data() + 24, sizeof table);
      for (int other = 0; other < 20; ++other) {
        const float zero = table[0] + nudge(generator), one = table[1] + nudge(generator);
        std::vector<float> alternative(256);
        for (std::size_t i = 0; i < 256; ++i) alternative[i] = decoded[i] == table[1] ? one : zero;
        BOOST_TEST(best <= squared_error(in, alternative) * (1 + 1e-6f));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(error_feedback_keeps_the_accumulated_error_bounded_and_equal_to_the_residual) {
  for (const auto& options : all_one_bit_options(512)) {
    const one_bit q(options);
    const std::size_t n = 1000;
    std::mt19937 generator(5);
    std::normal_distribution<float> normal(0.01f, 1.0f);
    std::vector<float> residual(n, 0.0f), decoded(n);
    std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
    std::vector<std::byte> frame(q.encoded_size(n));
    double drift_at_100 = 0, drift_at_1000 = 0;
    for (int step = 1; step <= 1000; ++step) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(generator);
      q.encode(x, residual, frame);
      BOOST_TEST_REQUIRE(!q.decode(frame, decoded));
      double drift = 0, residual_gap = 0;
      for (std::size_t i = 0; i < n; ++i) {
        sum_in[i] += x[i];
        sum_out[i] += decoded[i];
        drift = std::max(drift, std::abs(sum_out[i] - sum_in[i]));
        // Σ decoded = Σ x − final residual, up to float rounding of each step.
        residual_gap = std::max(residual_gap, std::abs(sum_out[i] - sum_in[i] + residual[i]));
      }
      BOOST_TEST_REQUIRE(residual_gap < 1e-3 * step);
      if (step == 100) drift_at_100 = drift;
      if (step == 1000) drift_at_1000 = drift;
    }
    BOOST_TEST_MESSAGE("max |Σ decoded − Σ x| after 100 and 1000 steps: " << drift_at_100 << ", " << drift_at_1000
                       << (options.reconstruction == quantizers::reconstruction::min_max ? " (min_max)" : ""));
    // With bin means the drift stays the size of one residual; without feedback it
    // would grow like sqrt(T). min/max reconstruction is biased (bin 1's residuals are
    // all <= 0), so its residual — and the drift — grows: docs/quantizers.md says so.
    if (options.reconstruction == quantizers::reconstruction::bin_means) {
      BOOST_TEST(drift_at_1000 < 2.0 * drift_at_100 + 1.0);
      BOOST_TEST(drift_at_1000 < 10.0);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_group_with_nan_or_inf_decodes_to_nan_and_keeps_its_residual) {
  for (const auto& options : all_one_bit_options(64)) {
    const one_bit q(options);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> in(200, 1.5f), residual(200, 0.25f);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 5) - 2.0f;
      in[70] = bad;  // group 1 of [0,64) [64,128) [128,192) [192,200)
      const std::vector<float> before = residual;
      std::vector<float> out(200, 0.0f);
      BOOST_TEST_REQUIRE(!q.decode(encode(q, in, residual), out));
      for (std::size_t i = 0; i < 200; ++i) {
        const bool poisoned = i >= 64 && i < 128;
        BOOST_TEST_REQUIRE(std::isnan(out[i]) == poisoned, "value " << i);
        if (poisoned) BOOST_TEST_REQUIRE(residual[i] == before[i]);
      }
      BOOST_TEST(residual[0] != before[0]);  // the healthy groups fed back their error
    }
  }
}

BOOST_AUTO_TEST_CASE(huge_values_whose_sum_overflows_float_still_reconstruct_finite_means) {
  const one_bit q({.group_size = 64});
  std::vector<float> in(64, std::numeric_limits<float>::max());
  in[3] = -std::numeric_limits<float>::max();
  std::vector<float> out(64), residual(64, 0.0f);
  BOOST_TEST_REQUIRE(!q.decode(encode(q, in, residual), out));
  BOOST_TEST(out[0] == std::numeric_limits<float>::max());
  BOOST_TEST(out[3] == -std::numeric_limits<float>::max());
  for (float r : residual) BOOST_TEST(r == 0.0f);
}

BOOST_AUTO_TEST_CASE(a_malformed_frame_is_an_error_and_leaves_the_output_untouched) {
  const one_bit q({.group_size = 64});
  std::vector<float> in(100);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = std::sin(static_cast<float>(i));
  const auto frame = encode(q, in);
  const std::vector<float> sentinel(100, 42.0f);
  const auto check = [&](std::span<const std::byte> bad, std::size_t count, errc expected, const char* what) {
    std::vector<float> out(count, 42.0f);
    BOOST_TEST(q.decode_accumulate(bad, out) == make_error_code(expected), what);
    BOOST_TEST(std::all_of(out.begin(), out.end(), [](float v) { return v == 42.0f; }), what);
  };
  check(std::span(frame).first(frame.size() - 1), 100, errc::protocol_error, "truncated");
  check(std::span(frame).first(10), 100, errc::protocol_error, "shorter than a header");
  auto longer = frame;
  longer.push_back(std::byte{0});
  check(longer, 100, errc::protocol_error, "oversize");
  check(frame, 99, errc::count_mismatch, "another count");
  const auto corrupt = [&](std::size_t at, std::byte value, const char* what) {
    auto bad = frame;
    bad[at] = value;
    check(bad, 100, errc::protocol_error, what);
  };
  corrupt(0, std::byte{0x52}, "magic");
  corrupt(1, std::byte{2}, "version");
  corrupt(2, std::byte{3}, "scheme");
  corrupt(4, std::byte{1}, "threshold");
  corrupt(5, std::byte{1}, "reconstruction");
  corrupt(6, std::byte{1}, "reserved");
  corrupt(8, std::byte{32}, "group size");
  corrupt(frame.size() - 1, std::byte{0x80}, "padding bits after the last value");
  std::vector<float> out(100);
  BOOST_TEST(one_bit({.group_size = 2048}).decode(frame, out) == make_error_code(errc::protocol_error));
  BOOST_TEST(!q.decode(frame, out));  // the frame itself is fine
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_rejected_with_a_clear_error) {
  for (std::size_t group : {0u, 4u, 12u, (1u << 24) + 8u})
    BOOST_CHECK_EXCEPTION(one_bit({.group_size = group}), qcoll::error, [](const qcoll::error& e) {
      return e.code() == errc::invalid_argument && std::string(e.what()).find("group size") != std::string::npos;
    });
  const one_bit q;
  std::vector<float> in(10), short_residual(9);
  std::vector<std::byte> frame(q.encoded_size(10));
  BOOST_CHECK_EXCEPTION(q.encode(in, short_residual, frame), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
  BOOST_CHECK_EXCEPTION(q.encode(in, {}, std::span(frame).first(frame.size() - 1)), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
}

BOOST_AUTO_TEST_SUITE_END()
