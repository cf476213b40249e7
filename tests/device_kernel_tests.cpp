// The device kernels against the CPU, bit for bit, through the device runtime that
// QCOLL_DEVICE names — CUDA on a GPU (tools/gpu-check), the emulated device in every
// CI run (whose kernels are the CPU's: there this proves the device calls' plumbing —
// headers, sizes, statuses, streams, memory spaces — not the CUDA kernels):
// - the reduce kernel (NaN payloads aside: the GPU canonicalises them) and the
//   16-bit conversions (NaNs included: both run core/half.hpp's rule);
// - the reproducible sum's grid kernels (cover, add, round; every element type);
// - every quantizer's encode, decode and decode_accumulate through the public API
//   on device memory (a device_stream first argument), against the same calls on
//   host memory: frames byte for byte, residuals and memories bit for bit, over the
//   quantizer suites' inputs (sizes 0, 1, not a multiple of the group, 2^26 values;
//   NaN and Inf; residuals carried over many steps), 16-bit inputs, frames decoded
//   on the other side;
// - bad input: a host pointer to a device call, a device pointer to a host call, a
//   corrupted frame (an error, `out` untouched), device memory given to a collective
//   (invalid_argument on every rank).
// Without a device runtime (QCOLL_DEVICE=cuda without a GPU) it reports itself skipped
// (exit 77, which ctest shows as skipped). tools/gpu-check runs it, also under
// compute-sanitizer.

#include <qcoll/communicator.hpp>
#include <qcoll/core/half.hpp>
#include <qcoll/device/emulated/runtime.hpp>  // QCOLL_DEVICE=emulated: CI runs this on the emulated device
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/kernels/cpu/grid.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/transports/inproc.hpp>

#include "support/device_values.hpp"
#include "support/grid_inputs.hpp"
#include "support/half_inputs.hpp"
#include "support/quantizer_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using qcoll::execution::device_memory;
using qcoll::execution::device_stream;

int passed = 0, failed = 0;
/// QCOLL_DEVICE_TESTS_SMALL: the run under compute-sanitizer, which slows kernels a
/// hundredfold, and on the emulated device: fewer inputs per size, no 2^20 or 2^26 values.
const bool small_run = std::getenv("QCOLL_DEVICE_TESTS_SMALL") != nullptr;

void check(bool ok, const std::string& what) {
  ++(ok ? passed : failed);
  if (!ok) std::printf("FAILED: %s\n", what.c_str());
}

template <class T>
bool same_bits_or_both_nan(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return false;
  }
  return true;
}

using qcoll::test::on_device;
using qcoll::test::to_host;

// ---- the reduce kernel and the 16-bit conversions

template <class T>
void compare_with_reference(std::size_t n, qcoll::reduce_op op) {
  std::mt19937_64 gen(n * 31 + static_cast<unsigned>(op));
  std::uniform_real_distribution<T> value(-1e3, 1e3);
  std::vector<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = value(gen);
    b[i] = value(gen);
  }
  // Edge cases the operators must agree on: NaN either side, infinities, ±0 ties, denormals.
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), T(0), T(-0.0), std::numeric_limits<T>::denorm_min()};
  for (std::size_t i = 0; i < n && i < 36; ++i) {
    a[i] = specials[i % 6];
    b[i] = specials[(i / 6) % 6];
  }
  std::vector<T> expected(n);
  qcoll::kernels::cpu::reduce<T>(op, a, b, expected);
  const auto da = on_device(a), db = on_device(b);
  // In place, as the ring does, through the execution layer.
  qcoll::execution::reduce<T>(device_stream{}, op, da.span(), db.span(), da.span());
  check(same_bits_or_both_nan(to_host(da), expected),
        std::string("reduce ") + (sizeof(T) == 4 ? "float" : "double") + " n=" + std::to_string(n) + " op=" +
            qcoll::to_string(op));
}

template <class Half>
void conversions_match_the_cpu(const char* name) {
  const std::vector<float> floats = test::narrowing_inputs();
  const auto in = on_device(floats);
  device_memory<Half> narrowed(floats.size());
  qcoll::execution::narrow<Half>(device_stream{}, in.span(), narrowed.span());
  const std::vector<Half> got = to_host(narrowed);
  bool ok = true;
  for (std::size_t i = 0; ok && i < floats.size(); ++i) ok = got[i].bits == Half(floats[i]).bits;
  check(ok, std::string(name) + " narrowing");

  std::vector<Half> every(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) every[h] = Half::from_bits(static_cast<std::uint16_t>(h));
  const auto halves = on_device(every);
  device_memory<float> widened(every.size());
  qcoll::execution::widen<Half>(device_stream{}, halves.span(), widened.span());
  const std::vector<float> wide = to_host(widened);
  ok = true;
  for (std::size_t i = 0; ok && i < every.size(); ++i) {
    const float expected = float(every[i]);
    ok = std::memcmp(&wide[i], &expected, sizeof expected) == 0;
  }
  check(ok, std::string(name) + " widening");
}

// ---- the reproducible sum's grid kernels: device against the CPU's, each element type

template <class T>
void grid_kernels_match_the_cpu(const char* name) {
  namespace grid = qcoll::kernels::grid_detail;
  const std::vector<float> floats = test::grid_inputs();
  std::vector<T> values(floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i) values[i] = static_cast<T>(floats[i]);
  const std::size_t n = values.size(), blocks = (n + grid::block - 1) / grid::block;
  const std::size_t carriers = std::is_same_v<T, double> ? 2 : 1;  // doubles: high, then low carriers
  std::vector<double> exponents(blocks, grid::empty_block);
  qcoll::kernels::cpu::grid_cover(std::span<const T>(values), std::span(exponents));
  std::vector<double> sums(carriers * n);
  qcoll::kernels::cpu::grid_add(std::span<const T>(values), std::span<const double>(exponents), std::span(sums), true);
  qcoll::kernels::cpu::grid_add(std::span<const T>(values), std::span<const double>(exponents), std::span(sums), false);

  const auto d_values = on_device(values);
  auto d_exponents = on_device(std::vector<double>(blocks, grid::empty_block));
  qcoll::execution::queue_grid_cover(device_stream{}, std::span<const T>(d_values.span()), d_exponents.span());
  check(to_host(d_exponents) == exponents, std::string(name) + " grid_cover");
  device_memory<double> d_sums(carriers * n);
  for (const bool first : {true, false})
    qcoll::execution::queue_grid_add(device_stream{}, std::span<const T>(d_values.span()),
                                     std::span<const double>(d_exponents.span()), d_sums.span(), first);
  // (A GPU's NaN sums carry its canonical NaN: the rounding below makes every NaN one.)
  check(same_bits_or_both_nan(to_host(d_sums), sums), std::string(name) + " grid_add");
  const auto d_sums_from_cpu = on_device(sums);
  for (const std::size_t first_index : {std::size_t{0}, std::size_t{77}})
    for (const double divide : {1.0, 3.0}) {
      const std::size_t m = n - first_index;
      std::vector<T> expected(m);
      const auto low = [&](std::span<const double> all) {
        return carriers == 2 ? all.subspan(n + first_index, m) : std::span<const double>();
      };
      qcoll::kernels::cpu::grid_round(std::span<const double>(sums).subspan(first_index, m), low(sums),
                                      std::span<const double>(exponents), divide, std::span(expected), first_index);
      device_memory<T> d_out(m);
      const std::span<const double> on_device_sums(d_sums_from_cpu.span());
      qcoll::execution::queue_grid_round(device_stream{}, on_device_sums.subspan(first_index, m), low(on_device_sums),
                                         std::span<const double>(d_exponents.span()), divide, d_out.span(), first_index);
      const std::vector<T> got = to_host(d_out);
      check(std::memcmp(got.data(), expected.data(), m * sizeof(T)) == 0,
            std::string(name) + " grid_round from " + std::to_string(first_index) + " / " + std::to_string(divide));
    }
}

// ---- quantizers: device calls against host calls

/// Encodes `in` (with a residual carried over `steps` encodes when feedback is on)
/// on the device and on the host, and compares frames and residuals after each
/// step, then the decodes of the last frame both ways (GPU frame decoded on the
/// device, CPU frame decoded on the device, into outs that hold other values).
template <class Q>
void device_matches_host(const Q& q, const std::vector<float>& in, bool feedback, int steps, const std::string& what) {
  const std::size_t n = in.size();
  std::vector<float> residual(feedback ? n : 0);
  for (std::size_t i = 0; i < residual.size(); ++i) residual[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  const auto d_in = on_device(in);
  auto d_residual = on_device(residual);
  std::vector<std::byte> frame(q.encoded_size(n));
  device_memory<std::byte> d_frame(frame.size());
  bool ok = true;
  for (int step = 0; ok && step < steps; ++step) {
    const qcoll::quantizers::encode_position position{.sequence = static_cast<std::uint64_t>(step), .offset = 11};
    q.encode(in, std::span<const float>(residual), std::span<float>(residual), frame, position);
    q.encode(device_stream{}, std::span<const float>(d_in.span()), std::span<const float>(d_residual.span()),
             d_residual.span(), d_frame.span(), position);
    ok = test::same_bytes(to_host(d_frame), frame) && test::same_bits(to_host(d_residual), residual);
  }
  check(ok, what + ": encode");

  std::vector<float> base(n, 0.5f), expected(n, 2.0f), expected_sum = base;
  q.decode(frame, expected);
  q.decode_accumulate(frame, expected_sum);
  const auto d_cpu_frame = on_device(frame);
  const device_memory<std::byte>* const frames[] = {&d_frame, &d_cpu_frame};
  for (const device_memory<std::byte>* source : frames) {
    auto d_out = on_device(std::vector<float>(n, 2.0f));
    auto d_sum = on_device(base);
    const bool decoded = !q.decode(device_stream{}, source->span(), d_out.span()) &&
                         !q.decode_accumulate(device_stream{}, source->span(), d_sum.span());
    check(decoded && test::same_bits(to_host(d_out), expected) && test::same_bits(to_host(d_sum), expected_sum),
          what + (source == &d_frame ? ": GPU frame decoded on the GPU" : ": CPU frame decoded on the GPU"));
  }
}

/// Sizes around a group of `group` values, and one large one.
std::vector<std::size_t> sizes(std::size_t group, bool large) {
  std::vector<std::size_t> all{0, 1, 7, 100, group - 1, group + 1, 3 * group + 17};
  if (large && !small_run) all.push_back((std::size_t{1} << 20) + 3);
  return all;
}

/// The quantizer suites' inputs of n values (four kinds in a small run).
std::vector<test::named_input> inputs(std::size_t n, unsigned seed) {
  std::vector<test::named_input> all = test::edge_case_inputs(n, seed);
  if (small_run)
    std::erase_if(all, [](const test::named_input& input) {
      return input.name != "normal" && input.name != "huge" && input.name != "one NaN" && input.name != "-Inf and +Inf";
    });
  return all;
}

void quantizers_match_the_cpu() {
  using namespace qcoll::quantizers;
  // 8 to 2048: the staged encoders (a group fits a tile's stage); 4096: in place.
  for (std::size_t group : {8u, 64u, 2048u, 4096u})
    for (auto threshold : {threshold::zero, threshold::group_mean})
      for (auto reconstruction : {reconstruction::bin_means, reconstruction::min_max})
        for (std::size_t n : sizes(group, group == 2048))
          for (const auto& input : inputs(n, static_cast<unsigned>(n + group)))
            device_matches_host(one_bit({.group_size = group, .threshold = threshold, .reconstruction = reconstruction}),
                                input.values, n % 2 == 0 || group == 8, 3,
                                "one_bit G=" + std::to_string(group) + " n=" + std::to_string(n) + " " + input.name);
  for (unsigned levels : {2u, 5u, 16u, 256u})
    for (auto rounding : {rounding::nearest, rounding::stochastic})
      for (std::size_t n : sizes(64, levels == 16))
        for (const auto& input : inputs(n, static_cast<unsigned>(n + levels)))
          device_matches_host(k_level({.levels = levels, .group_size = 64, .rounding = rounding, .seed = 77}),
                              input.values, true, 3,
                              "k_level L=" + std::to_string(levels) + " n=" + std::to_string(n) + " " + input.name);
  for (unsigned bits : {2u, 3u, 8u, 16u, 32u})
    for (std::size_t block : {std::size_t{8}, std::size_t{32}, bfp_options::whole_tensor})
      for (std::size_t n : sizes(32, bits == 8 && block == 32))
        for (const auto& input : inputs(n, static_cast<unsigned>(n + bits)))
          device_matches_host(bfp({.mantissa_bits = bits, .block_size = block}), input.values, true, 3,
                              "bfp b=" + std::to_string(bits) + " block=" + std::to_string(block) + " n=" +
                                  std::to_string(n) + " " + input.name);
  for (std::size_t n : {0u, 1u, 1000u}) {
    std::vector<float> values(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = std::sin(static_cast<float>(i));
    device_matches_host(identity<float>(), values, false, 1, "identity<float> n=" + std::to_string(n));
  }
}

/// Error feedback over many steps, where residuals grow into every group's range.
void residuals_carried_over_many_steps() {
  std::vector<float> in(5000);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = std::cos(0.37f * static_cast<float>(i)) * (1.0f + float(i % 13));
  using namespace qcoll::quantizers;
  device_matches_host(one_bit({.group_size = 256, .threshold = threshold::group_mean}), in, true, 50, "one_bit, 50 steps");
  device_matches_host(k_level({.levels = 4, .group_size = 256, .rounding = rounding::stochastic, .seed = 5}), in, true,
                      50, "k_level, 50 steps");
  device_matches_host(bfp({.mantissa_bits = 4, .block_size = 32}), in, true, 50, "bfp, 50 steps");
  // One block of 5000 values: larger than a stage, encoded in place.
  device_matches_host(bfp({.mantissa_bits = 8, .block_size = bfp_options::whole_tensor}), in, true, 5,
                      "bfp whole tensor, 5 steps");
}

/// Buffers that start one element into their allocations: the kernels' vector loads
/// and stores give way to scalar ones, with the same bits (frames too: one byte in).
template <class Q>
void unaligned_buffers_give_the_same_bits(const Q& q, const std::string& what) {
  const std::size_t n = 3 * 2048 + 101;
  std::vector<float> in(n), residual(n);
  for (std::size_t i = 0; i < n; ++i) {
    in[i] = std::sin(0.01f * static_cast<float>(i)) * 3.0f;
    residual[i] = 0.001f * static_cast<float>(i % 17);
  }
  const auto shifted = [](const std::vector<float>& values) {
    std::vector<float> with_one_before{-1.0f};
    with_one_before.insert(with_one_before.end(), values.begin(), values.end());
    return on_device(with_one_before);
  };
  const auto d_in = shifted(in);
  auto d_residual = shifted(residual);
  auto d_out = shifted(std::vector<float>(n, 0.25f));
  std::vector<std::byte> frame(q.encoded_size(n));
  device_memory<std::byte> d_frame(frame.size() + 1);
  q.encode(in, std::span<const float>(residual), std::span<float>(residual), frame);
  q.encode(device_stream{}, std::span<const float>(d_in.span().subspan(1)),
           std::span<const float>(d_residual.span().subspan(1)), d_residual.span().subspan(1),
           d_frame.span().subspan(1));
  const auto got_frame = to_host(d_frame);
  const auto got_residual = to_host(d_residual);
  check(std::equal(frame.begin(), frame.end(), got_frame.begin() + 1) &&
            test::same_bits(std::vector<float>(got_residual.begin() + 1, got_residual.end()), residual),
        what + " unaligned: encode");
  std::vector<float> sum(n, 0.25f);
  q.decode_accumulate(frame, sum);
  const bool decoded = !q.decode_accumulate(device_stream{}, std::span<const std::byte>(d_frame.span().subspan(1)),
                                           d_out.span().subspan(1));
  const auto got_sum = to_host(d_out);
  check(decoded && test::same_bits(std::vector<float>(got_sum.begin() + 1, got_sum.end()), sum),
        what + " unaligned: decode_accumulate");
}

/// 2^26 values (256 MiB of float), each quantizer once.
void sixty_four_mebi_values() {
  const std::size_t n = std::size_t{1} << 26;
  std::vector<float> in(n);
  std::mt19937 generator(64);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : in) v = normal(generator);
  using namespace qcoll::quantizers;
  device_matches_host(one_bit(), in, true, 1, "one_bit, 2^26 values");
  device_matches_host(k_level({.levels = 16, .rounding = rounding::stochastic}), in, true, 1, "k_level, 2^26 values");
  device_matches_host(bfp(), in, true, 1, "bfp, 2^26 values");
}

/// A 16-bit input gives the frame of its float values.
template <class Half>
void sixteen_bit_inputs(const char* name) {
  std::vector<float> floats(3000);
  for (std::size_t i = 0; i < floats.size(); ++i) floats[i] = float(Half(std::sin(0.1f * float(i)) * 7.0f));
  std::vector<Half> halves(floats.size());
  for (std::size_t i = 0; i < floats.size(); ++i) halves[i] = Half(floats[i]);
  const auto d_halves = on_device(halves);
  const auto compare = [&](const auto& q, const std::string& what) {
    std::vector<std::byte> frame(q.encoded_size(floats.size()));
    q.encode(floats, std::span<float>(), frame);
    device_memory<std::byte> d_frame(frame.size());
    q.encode(device_stream{}, std::span<const Half>(d_halves.span()), std::span<const float>(), std::span<float>(),
             d_frame.span());
    check(test::same_bytes(to_host(d_frame), frame), std::string(name) + " input: " + what);
  };
  using namespace qcoll::quantizers;
  compare(one_bit({.group_size = 64}), "one_bit");
  compare(k_level({.levels = 16, .group_size = 64, .rounding = rounding::stochastic}), "k_level");
  compare(bfp(), "bfp");
  compare(identity<float>(), "identity");
}

/// A host pointer given to a device call and a device pointer to a host call are
/// invalid_argument; a corrupted frame is an error on the device and leaves `out` alone.
void bad_input_is_refused() {
  const qcoll::quantizers::one_bit q({.group_size = 64});
  std::vector<float> host(100, 1.0f);
  std::vector<std::byte> frame(q.encoded_size(host.size()));
  const auto d_values = on_device(host);
  device_memory<std::byte> d_frame(frame.size());
  const auto throws_invalid_argument = [](auto&& call) {
    try {
      call();
    } catch (const qcoll::error& e) {
      return e.code() == qcoll::errc::invalid_argument;
    }
    return false;
  };
  check(throws_invalid_argument([&] {
          q.encode(device_stream{}, std::span<const float>(host), std::span<const float>(), std::span<float>(),
                   d_frame.span());
        }),
        "a host input given to a device encode is invalid_argument");
  check(throws_invalid_argument([&] { q.encode(std::span<const float>(d_values.span()), std::span<float>(), frame); }),
        "a device input given to a host encode is invalid_argument");
  check(q.decode(std::span<const std::byte>(d_frame.span()), std::span<float>(host)) == qcoll::errc::invalid_argument,
        "a device frame given to a host decode is invalid_argument");

  q.encode(host, std::span<float>(), frame);
  std::vector<std::byte> corrupted = frame;
  corrupted[16] ^= std::byte{1};  // the count
  const auto d_corrupted = on_device(corrupted);
  auto d_out = on_device(std::vector<float>(100, 3.0f));
  check(q.decode(device_stream{}, d_corrupted.span(), d_out.span()) == qcoll::errc::count_mismatch &&
            to_host(d_out) == std::vector<float>(100, 3.0f),
        "a frame for another count is count_mismatch on the device, out untouched");
  corrupted = frame;
  corrupted.back() |= std::byte{0x80};  // a padding bit of the last group (100 = 64 + 36 values)
  const auto d_padded = on_device(corrupted);
  check(q.decode_accumulate(device_stream{}, d_padded.span(), d_out.span()) == qcoll::errc::protocol_error &&
            to_host(d_out) == std::vector<float>(100, 3.0f),
        "a padding bit set is protocol_error on the device, out untouched");
}

/// An exact collective's host form given device memory on one rank fails on every rank
/// with invalid_argument (its device_stream form takes device memory).
void collectives_refuse_device_buffers() {
  const qcoll::rank_t ranks = 2;
  qcoll::transports::inproc::world world(ranks);
  const auto device_values = on_device(std::vector<float>(64, 1.0f));
  std::error_code codes[ranks];
  {
    std::vector<std::jthread> threads;
    for (qcoll::rank_t r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        qcoll::communicator comm(world.endpoint(r));
        std::vector<float> host(64, 1.0f);
        comm.allreduce(r == 0 ? device_values.span() : std::span<float>(host), qcoll::reduce_op::sum, codes[r]);
      });
  }
  check(codes[0] == qcoll::errc::invalid_argument && codes[1] == qcoll::errc::invalid_argument,
        "an allreduce given device memory on rank 0 fails with invalid_argument on both ranks");
}

}  // namespace

int main() {
  if (qcoll::execution::gpu_count() == 0) {
    std::printf("device_kernel_tests: no device here (%s), skipped\n", qcoll::execution::device_refusal());
    return 77;
  }
  std::printf("device_kernel_tests on the %s device runtime\n", qcoll::execution::active_device()->name);
  try {
    for (std::size_t n : {0ul, 1ul, 37ul, 1000ul, (1ul << 20) + 3})
      for (auto op : {qcoll::reduce_op::sum, qcoll::reduce_op::avg, qcoll::reduce_op::min, qcoll::reduce_op::max,
                      qcoll::reduce_op::product}) {
        compare_with_reference<float>(n, op);
        compare_with_reference<double>(n, op);
      }
    conversions_match_the_cpu<qcoll::bfloat16>("bfloat16");
    conversions_match_the_cpu<qcoll::float16>("float16");
    grid_kernels_match_the_cpu<float>("float");
    grid_kernels_match_the_cpu<qcoll::bfloat16>("bfloat16");
    grid_kernels_match_the_cpu<qcoll::float16>("float16");
    grid_kernels_match_the_cpu<double>("double");
    quantizers_match_the_cpu();
    residuals_carried_over_many_steps();
    unaligned_buffers_give_the_same_bits(qcoll::quantizers::one_bit(), "one_bit");
    unaligned_buffers_give_the_same_bits(qcoll::quantizers::k_level({.levels = 5, .group_size = 64}), "k_level");
    unaligned_buffers_give_the_same_bits(qcoll::quantizers::bfp(), "bfp");
    sixteen_bit_inputs<qcoll::bfloat16>("bfloat16");
    sixteen_bit_inputs<qcoll::float16>("float16");
    bad_input_is_refused();
    collectives_refuse_device_buffers();
    if (!small_run) sixty_four_mebi_values();
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    ++failed;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
