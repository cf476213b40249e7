// The GPU's quantizer kernels run on the CPU: kernels/simt/'s code — the code
// kernels/cuda/ runs on half warps — executed by 16 threads in lockstep
// (support/threaded_tile.hpp), with its frames, residuals, memories and decodes
// compared bit for bit with the CPU reference, and its checks of received frames
// with the quantizers'. What this cannot test — the CUDA intrinsics behind a tile,
// launches, device memory — cuda_tests.cu tests on a GPU.
// A binary of its own, apart from quantizer_tests: it is the one suite of the quantizers
// that runs threads, so the tsan preset builds it and not the single-threaded rest.

#define BOOST_TEST_MODULE qcoll GPU kernels on the CPU
#include <boost/test/unit_test.hpp>

#include "support/half_inputs.hpp"
#include "support/quantizer_inputs.hpp"
#include "support/threaded_tile.hpp"

#include <qcoll/core/half.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/kernels/simt/bfp.hpp>
#include <qcoll/kernels/simt/k_level.hpp>
#include <qcoll/kernels/simt/one_bit.hpp>
#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

using namespace qcoll;
namespace simt = qcoll::kernels::simt;
namespace wire = qcoll::quantizers::wire;

namespace {

/// Counts around the boundaries a tile cares about: its 16 lanes, bytes of codes,
/// and groups of `group` values. Large groups get only the counts around them (the
/// small counts are one short group, as with the small groups): a threaded tile takes
/// a barrier per 16 values, and the suite runs in every CI configuration.
std::vector<std::size_t> tile_counts(std::size_t group) {
  std::vector<std::size_t> counts{group - 1, group + 1, 2 * group + 17};
  if (group <= 64)
    for (std::size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 100}) counts.push_back(n);
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  return counts;
}

/// Residuals to start from, or none.
std::vector<float> residual_for(std::size_t n, bool feedback) {
  std::vector<float> residual(feedback ? n : 0);
  for (std::size_t i = 0; i < residual.size(); ++i) residual[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  return residual;
}

template <class Half>
std::vector<Half> narrowed(std::span<const float> values) {
  std::vector<Half> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = Half(values[i]);
  return out;
}
template <class Half>
std::vector<float> widened(std::span<const Half> values) {
  std::vector<float> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = float(values[i]);
  return out;
}

/// Out buffers for decode_accumulate: ordinary values, and an Inf whose sum with a
/// non-finite group's NaN must be that NaN. (A NaN out plus a NaN decoded value
/// keeps either payload: compilers commute the addition, so even the CPU backends
/// do not promise which.)
std::vector<float> accumulate_base(std::size_t n) {
  std::vector<float> base(n, 0.5f);
  for (std::size_t i = 0; i < n; i += 5) base[i] = -1.25f * static_cast<float>(i % 11);
  if (n > 3) base[2] = std::numeric_limits<float>::infinity();
  return base;
}

/// A tile's stage (simt::encode_groups) for every other encode, so each setting meets
/// both paths over its inputs: the staged one the CUDA kernels take for groups of up
/// to stage_capacity values, and the in-place one they take for larger groups.
float* stage_if(bool staged) {
  static std::vector<float> stage(simt::stage_capacity);
  return staged ? stage.data() : nullptr;
}

/// The simt decode of `records` (both modes) against the reference table's.
template <class Value, class Reference>
bool decodes_match(const std::byte* records, std::size_t n, const Value& value_of, Reference&& reference) {
  std::vector<float> expected(n, 9.0f), got(n, 9.0f);
  reference(std::span<float>(expected), false);
  simt::decode_values(0, 1, records, n, got.data(), false, value_of);
  std::vector<float> expected_sum = accumulate_base(n), got_sum = expected_sum;
  reference(std::span<float>(expected_sum), true);
  simt::decode_values(0, 1, records, n, got_sum.data(), true, value_of);
  return test::same_bits(got, expected) && test::same_bits(got_sum, expected_sum);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gpu_kernels_on_the_cpu)

BOOST_AUTO_TEST_CASE(one_bit_tiles_write_the_references_records_residuals_and_memories) {
  const auto& reference = test::reference_kernels();
  std::size_t compared = 0;
  for (std::size_t group : {8u, 64u, 2048u})
    for (auto threshold : {quantizers::threshold::zero, quantizers::threshold::group_mean})
      for (auto reconstruction : {quantizers::reconstruction::bin_means, quantizers::reconstruction::min_max})
        for (std::size_t n : tile_counts(group))
          for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(n + group)))
            for (int mode : {0, 1, 2, 3}) {
              // 0: no feedback; 1: feedback, in place; 2: split residuals and a memory
              // of previous tables (every third group without one yet); 3: feedback in
              // place with a fresh memory.
              if (group == 2048 && (mode == 0 || mode == 3)) continue;  // modes 1 and 2 cover the paths
              const quantizers::one_bit_options options{
                  .group_size = group, .threshold = threshold, .reconstruction = reconstruction};
              const auto layout = wire::one_bit_layout(group);
              const std::vector<float> residual0 = residual_for(n, mode >= 1);
              const std::size_t groups = (n + group - 1) / group;
              std::vector<float> memory0(mode >= 2 ? 2 * groups : 0, std::numeric_limits<float>::quiet_NaN());
              for (std::size_t k = 0; mode == 2 && k < groups; ++k)
                if (k % 3 != 1) {
                  memory0[2 * k] = -0.5f + 0.1f * static_cast<float>(k);
                  memory0[2 * k + 1] = 0.7f - 0.05f * static_cast<float>(k);
                }
              std::vector<float> expected_residual = residual0, expected_memory = memory0;
              std::vector<std::byte> expected(layout.payload_bytes(n), std::byte{0xa5});
              reference.one_bit_encode(options, input.values, expected_residual, expected_residual, expected_memory,
                                       expected_memory, expected.data());

              const bool split = mode == 2;
              std::vector<float> residual_in = residual0, residual_out(split ? n : 0, test::unwritten);
              std::vector<float> memory_in = memory0, memory_out(split ? memory0.size() : 0, test::unwritten);
              float* r_out = split ? residual_out.data() : (residual_in.empty() ? nullptr : residual_in.data());
              float* m_out = split ? memory_out.data() : (memory_in.empty() ? nullptr : memory_in.data());
              std::vector<std::byte> records(expected.size(), std::byte{0x5a});
              test::run_on_tile([&](const test::threaded_tile& tile) {
                simt::one_bit_encode(tile, 0, 1, options, input.values.data(), n,
                                     residual_in.empty() ? nullptr : residual_in.data(), r_out,
                                     memory_in.empty() ? nullptr : memory_in.data(), m_out, records.data(),
                                     stage_if(compared % 2 == 1));
              });
              const bool same_residual =
                  split ? test::same_bits(residual_out, expected_residual) && test::same_bits(residual_in, residual0)
                        : test::same_bits(residual_in, expected_residual);
              const bool same_memory =
                  split ? test::same_bits(memory_out, expected_memory) : test::same_bits(memory_in, expected_memory);
              BOOST_TEST_REQUIRE((test::same_bytes(records, expected) && same_residual && same_memory),
                                 input.name << ", n = " << n << ", group = " << group << ", mean threshold = "
                                            << int(threshold) << ", min_max = " << int(reconstruction)
                                            << ", mode = " << mode << ", staged = " << compared % 2);
              BOOST_TEST_REQUIRE(decodes_match(expected.data(), n, simt::one_bit_value{layout},
                                               [&](std::span<float> out, bool accumulate) {
                                                 reference.one_bit_decode(options, expected.data(), out, accumulate);
                                               }),
                                 "decode: " << input.name << ", n = " << n << ", group = " << group);
              ++compared;
            }
  BOOST_TEST_MESSAGE(compared << " one_bit encodes compared");
}

BOOST_AUTO_TEST_CASE(k_level_tiles_write_the_references_records_and_residuals) {
  const auto& reference = test::reference_kernels();
  std::size_t compared = 0;
  // Offsets whose values cross a multiple of 2^32 inside a group switch the random key there.
  const quantizers::encode_position positions[] = {{.sequence = 3, .offset = 0},
                                                   {.sequence = 9, .offset = (std::uint64_t{1} << 32) - 5}};
  for (std::size_t group : {8u, 64u, 2048u})
    for (unsigned levels : {2u, 5u, 16u, 256u})
      for (auto rounding : {quantizers::rounding::nearest, quantizers::rounding::stochastic})
        for (std::size_t n : tile_counts(group))
          for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(3 * n + levels))) {
              if (group == 2048 && levels != 16) continue;
              // With and without feedback in turn: each input and setting meets both over the counts.
              const bool feedback = (n + input.name.size()) % 2 == 0;
              const quantizers::k_level_options options{
                  .levels = levels, .group_size = group, .rounding = rounding, .seed = 0x5eed + levels};
              const auto position = positions[(n + levels) % 2];
              const auto layout = kernels::k_level_detail::layout(options);
              std::vector<float> expected_residual = residual_for(n, feedback), residual = expected_residual;
              std::vector<std::byte> expected(layout.payload_bytes(n), std::byte{0xa5});
              reference.k_level_encode(options, input.values, expected_residual, expected_residual, position,
                                       expected.data());
              std::vector<std::byte> records(expected.size(), std::byte{0x5a});
              float* r = residual.empty() ? nullptr : residual.data();
              test::run_on_tile([&](const test::threaded_tile& tile) {
                simt::k_level_encode(tile, 0, 1, options, position, input.values.data(), n, r, r, records.data(),
                                     stage_if(compared % 2 == 1));
              });
              BOOST_TEST_REQUIRE((test::same_bytes(records, expected) && test::same_bits(residual, expected_residual)),
                                 input.name << ", n = " << n << ", group = " << group << ", levels = " << levels
                                            << ", stochastic = " << int(rounding) << ", feedback = " << feedback
                                            << ", staged = " << compared % 2);
              BOOST_TEST_REQUIRE(decodes_match(expected.data(), n, simt::k_level_value{layout},
                                               [&](std::span<float> out, bool accumulate) {
                                                 reference.k_level_decode(options, expected.data(), out, accumulate);
                                               }),
                                 "decode: " << input.name << ", n = " << n << ", levels = " << levels);
              ++compared;
            }
  BOOST_TEST_MESSAGE(compared << " k_level encodes compared");
}

BOOST_AUTO_TEST_CASE(bfp_tiles_write_the_references_records_and_residuals) {
  const auto& reference = test::reference_kernels();
  std::size_t compared = 0;
  for (std::size_t block : {std::size_t{8}, std::size_t{32}, quantizers::bfp_options::whole_tensor})
    for (unsigned bits : {2u, 3u, 7u, 8u, 16u, 32u})
      for (std::size_t n : tile_counts(block == 0 ? 64 : block))
        for (const auto& input : test::edge_case_inputs(n, static_cast<unsigned>(5 * n + bits))) {
            const bool feedback = (n + input.name.size()) % 2 == 1;
            const quantizers::bfp_options options{.mantissa_bits = bits, .block_size = block};
            const auto layout =
                kernels::bfp_detail::layout(kernels::bfp_detail::block_values(options, n), options.mantissa_bits);
            std::vector<float> expected_residual = residual_for(n, feedback), residual = expected_residual;
            std::vector<std::byte> expected(layout.payload_bytes(n), std::byte{0xa5});
            reference.bfp_encode(options, input.values, expected_residual, expected_residual, expected.data());
            std::vector<std::byte> records(expected.size(), std::byte{0x5a});
            float* r = residual.empty() ? nullptr : residual.data();
            test::run_on_tile([&](const test::threaded_tile& tile) {
              simt::bfp_encode(tile, 0, 1, options, input.values.data(), n, r, r, records.data(),
                               stage_if(compared % 2 == 1));
            });
            BOOST_TEST_REQUIRE((test::same_bytes(records, expected) && test::same_bits(residual, expected_residual)),
                               input.name << ", n = " << n << ", block = " << block << ", bits = " << bits
                                          << ", feedback = " << feedback << ", staged = " << compared % 2);
            BOOST_TEST_REQUIRE(decodes_match(expected.data(), n, simt::bfp_value{layout},
                                             [&](std::span<float> out, bool accumulate) {
                                               reference.bfp_decode(options, expected.data(), out, accumulate);
                                             }),
                               "decode: " << input.name << ", n = " << n << ", bits = " << bits);
            ++compared;
          }
  BOOST_TEST_MESSAGE(compared << " bfp encodes compared");
}

// Staged encodes whose frames span several stages, split between tiles as a grid
// splits them (tile 0 of 2, then tile 1), with the stages the CUDA kernels give
// (stage_values_for), write the reference's frames: spans of whole small groups, the
// last span short, 16-bit inputs staged as floats.
BOOST_AUTO_TEST_CASE(staged_encodes_split_into_spans_write_the_references_frames) {
  const auto& reference = test::reference_kernels();
  const std::size_t n = 2 * simt::stage_capacity + 1000 + 17;
  const auto values = test::edge_case_inputs(n, 41).front().values;  // "normal"
  const auto bf16 = narrowed<bfloat16>(values);
  const auto bf16_values = widened<bfloat16>(bf16);
  const auto on_two_tiles = [](auto&& encode) {
    for (std::size_t index : {0, 1})
      test::run_on_tile([&](const test::threaded_tile& tile) { encode(tile, index, std::size_t{2}); });
  };
  const auto compare = [&](const char* what, const auto& expected, const auto& got, const auto& expected_residual,
                           const auto& residual) {
    BOOST_TEST((test::same_bytes(got, expected) && test::same_bits(residual, expected_residual)), what);
  };
  for (std::size_t group : {std::size_t{8}, std::size_t{24}, std::size_t{64}, std::size_t{2048}}) {
    const quantizers::one_bit_options options{.group_size = group, .threshold = quantizers::threshold::group_mean};
    std::vector<float> expected_residual = residual_for(n, true), residual = expected_residual;
    std::vector<std::byte> expected(wire::one_bit_layout(group).payload_bytes(n)), got(expected.size());
    reference.one_bit_encode(options, values, expected_residual, expected_residual, {}, {}, expected.data());
    on_two_tiles([&](const auto& tile, std::size_t index, std::size_t count) {
      simt::one_bit_encode(tile, index, count, options, values.data(), n, residual.data(), residual.data(), nullptr,
                           nullptr, got.data(), stage_if(true), simt::stage_values_for(group));
    });
    compare(("one_bit, group " + std::to_string(group)).c_str(), expected, got, expected_residual, residual);
  }
  {
    const quantizers::k_level_options options{
        .levels = 16, .group_size = 64, .rounding = quantizers::rounding::stochastic};
    std::vector<float> expected_residual = residual_for(n, true), residual = expected_residual;
    std::vector<std::byte> expected(kernels::k_level_detail::layout(options).payload_bytes(n)), got(expected.size());
    reference.k_level_encode(options, bf16_values, expected_residual, expected_residual, {.sequence = 2},
                             expected.data());
    on_two_tiles([&](const auto& tile, std::size_t index, std::size_t count) {
      simt::k_level_encode(tile, index, count, options, {.sequence = 2}, bf16.data(), n, residual.data(),
                           residual.data(), got.data(), stage_if(true), simt::stage_values_for(64));
    });
    compare("k_level, bfloat16 input", expected, got, expected_residual, residual);
  }
  {
    const quantizers::bfp_options options{.mantissa_bits = 8, .block_size = 32};
    std::vector<float> expected_residual = residual_for(n, true), residual = expected_residual;
    std::vector<std::byte> expected(wire::bfp_layout(32, 8).payload_bytes(n)), got(expected.size());
    std::vector<float> split_out(n, test::unwritten);
    reference.bfp_encode(options, values, expected_residual, expected_residual, expected.data());
    on_two_tiles([&](const auto& tile, std::size_t index, std::size_t count) {
      simt::bfp_encode(tile, index, count, options, values.data(), n, residual.data(), split_out.data(), got.data(),
                       stage_if(true), simt::stage_values_for(32));
    });
    compare("bfp, split residuals", expected, got, expected_residual, split_out);
  }
}

// A 16-bit input is encoded as its float values: the GPU widens as it reads, the
// CPU path (plans) widens first; both give the same frame.
BOOST_AUTO_TEST_CASE(sixteen_bit_inputs_give_the_frames_of_their_float_values) {
  const auto& reference = test::reference_kernels();
  const std::size_t n = 300;
  std::vector<float> source = test::narrowing_inputs();
  source.resize(n, 0.25f);
  const auto check = [&](const char* what, std::span<const float> floats, auto&& encode_simt) {
    const quantizers::one_bit_options one_bit{.group_size = 64, .threshold = quantizers::threshold::group_mean};
    const quantizers::k_level_options k_level{.levels = 16, .group_size = 64, .rounding = quantizers::rounding::stochastic};
    const quantizers::bfp_options bfp{.mantissa_bits = 8, .block_size = 32};
    std::vector<std::byte> a(wire::one_bit_layout(64).payload_bytes(n)), b(a.size());
    std::vector<std::byte> c(kernels::k_level_detail::layout(k_level).payload_bytes(n)), d(c.size());
    std::vector<std::byte> e(wire::bfp_layout(32, 8).payload_bytes(n)), f(e.size());
    reference.one_bit_encode(one_bit, floats, {}, {}, {}, {}, a.data());
    reference.k_level_encode(k_level, floats, {}, {}, {.sequence = 1, .offset = 7}, c.data());
    reference.bfp_encode(bfp, floats, {}, {}, e.data());
    encode_simt(one_bit, k_level, bfp, b.data(), d.data(), f.data());
    BOOST_TEST(test::same_bytes(a, b), what << ": one_bit");
    BOOST_TEST(test::same_bytes(c, d), what << ": k_level");
    BOOST_TEST(test::same_bytes(e, f), what << ": bfp");
  };
  const auto run = [&](const auto* values) {
    return [values, n](const auto& one_bit, const auto& k_level, const auto& bfp, std::byte* a, std::byte* c,
                       std::byte* e) {
      test::run_on_tile([&](const test::threaded_tile& tile) {
        simt::one_bit_encode(tile, 0, 1, one_bit, values, n, nullptr, nullptr, nullptr, nullptr, a);
        simt::k_level_encode(tile, 0, 1, k_level, {.sequence = 1, .offset = 7}, values, n, nullptr, nullptr, c);
        simt::bfp_encode(tile, 0, 1, bfp, values, n, nullptr, nullptr, e);
      });
    };
  };
  const auto bf16 = narrowed<bfloat16>(source);
  const auto f16 = narrowed<float16>(source);
  check("bfloat16", widened<bfloat16>(bf16), run(bf16.data()));
  check("float16", widened<float16>(f16), run(f16.data()));
}

// The device decoders check a received frame first (its header, then every record)
// with the same rules as the quantizers' check_records: every frame a quantizer
// accepts, the simt checks accept, and every one it refuses, they refuse.
BOOST_AUTO_TEST_CASE(record_checks_agree_with_the_quantizers_on_corrupted_frames) {
  std::mt19937 generator(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::size_t refused = 0, accepted = 0;
  const auto agree = [&](const auto& q, std::size_t n, const auto& value_valid, const auto& group_valid,
                         const auto& layout) {
    std::vector<float> values(n);
    for (float& v : values) v = normal(generator);
    std::vector<std::byte> frame(q.encoded_size(n));
    q.encode(values, {}, frame);
    std::uniform_int_distribution<std::size_t> byte(wire::header_size, frame.size() - 1);
    std::uniform_int_distribution<int> bit(0, 7);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<std::byte> corrupted = frame;
      for (int flips = 0; flips <= trial % 3; ++flips) corrupted[byte(generator)] ^= std::byte{1} << bit(generator);
      std::vector<float> out(n);
      const bool cpu_accepts = !q.decode(corrupted, out);
      const bool simt_accepts =
          simt::records_valid(0, 1, layout, corrupted.data() + wire::header_size, n, value_valid, group_valid);
      BOOST_TEST_REQUIRE(cpu_accepts == simt_accepts, q.name << ", n = " << n << ", trial " << trial);
      ++(cpu_accepts ? accepted : refused);
    }
  };
  for (std::size_t n : {5u, 100u, 263u}) {
    const quantizers::one_bit one_bit({.group_size = 64});
    agree(one_bit, n, simt::always_valid{}, simt::always_valid{}, wire::one_bit_layout(64));
    for (unsigned levels : {5u, 16u}) {
      const quantizers::k_level_options options{.levels = levels, .group_size = 64};
      const auto layout = kernels::k_level_detail::layout(options);
      agree(quantizers::k_level(options), n, simt::k_level_code_valid{layout, levels}, simt::always_valid{}, layout);
    }
    for (unsigned bits : {3u, 8u, 16u})
      for (std::size_t block : {std::size_t{32}, quantizers::bfp_options::whole_tensor}) {
        const quantizers::bfp_options options{.mantissa_bits = bits, .block_size = block};
        const auto layout = kernels::bfp_detail::layout(kernels::bfp_detail::block_values(options, n), bits);
        agree(quantizers::bfp(options), n, simt::bfp_mantissa_valid{layout}, simt::bfp_exponent_valid{layout}, layout);
      }
  }
  BOOST_TEST_MESSAGE(accepted << " corrupted frames accepted by both, " << refused << " refused by both");
  BOOST_TEST(refused > 0);
  BOOST_TEST(accepted > 0);
}

// quantizer_tests links qcoll::qcoll without the CUDA backend: a call on device memory
// is a clear error naming what is missing, never a crash; host calls are unaffected.
BOOST_AUTO_TEST_CASE(a_device_call_without_the_cuda_backend_is_a_clear_error) {
  const quantizers::one_bit q;
  std::vector<float> values(100, 1.0f), out(100);
  std::vector<std::byte> frame(q.encoded_size(values.size()));
  const auto names_the_target = [](const qcoll::error& e) {
    return e.code() == errc::invalid_argument && std::string(e.what()).find("qcoll::cuda") != std::string::npos;
  };
  BOOST_CHECK_EXCEPTION(q.encode(execution::device_stream{}, std::span<const float>(values), std::span<const float>(),
                                 std::span<float>(), std::span<std::byte>(frame)),
                        qcoll::error, names_the_target);
  BOOST_CHECK_EXCEPTION((void)q.decode(execution::device_stream{}, frame, std::span<float>(out)), qcoll::error,
                        names_the_target);
  BOOST_CHECK_EXCEPTION(execution::device_memory<float>(16), qcoll::error, names_the_target);
  q.encode(values, std::span<float>(), frame);
  BOOST_TEST(!q.decode(frame, std::span<float>(out)));
  BOOST_TEST(out[0] == 1.0f);
}

BOOST_AUTO_TEST_SUITE_END()
