// The main example: N ranks (threads over the in-process transport) allreduce
// their buffers; the demo shows what each rank contributed, what every rank got,
// how fast it went for a range of sizes, and what the 1-bit compressed allreduce
// sends and costs next to the exact one.
//
//   allreduce_demo [--ranks N] [--max-bytes BYTES]

#include <qcoll/qcoll.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

namespace {

struct settings {
  qcoll::rank_t ranks = 4;
  std::size_t max_bytes = std::size_t{64} << 20;
};

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const auto value = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--ranks") s.ranks = value;
    else if (flag == "--max-bytes") s.max_bytes = value;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  if (s.ranks == 0) throw std::invalid_argument("--ranks must be at least 1");
  return s;
}

/// Runs fn(comm) on every rank's thread; rethrows the first failure.
template <class Fn>
void on_every_rank(qcoll::rank_t ranks, Fn fn) {
  const auto errors = qcoll::transports::inproc::run_ranks(ranks, [&](qcoll::transports::inproc::transport endpoint) {
    qcoll::communicator comm(std::move(endpoint));
    fn(comm);
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv);
  const qcoll::rank_t n = s.ranks;
  fmt::print("qcoll {}.{}.{} allreduce demo: {} ranks as threads, in-process transport, ring allreduce\n\n",
             qcoll::version_major, qcoll::version_minor, qcoll::version_patch, n);

  // 1. What is reduced, and by whom: rank r contributes (r + 1) · (i + 1) at index i.
  const std::size_t shown = 6;
  std::vector<std::vector<float>> results(n);
  on_every_rank(n, [&](auto& comm) {
    std::vector<float> v(shown);
    for (std::size_t i = 0; i < shown; ++i) v[i] = float((comm.rank() + 1) * (i + 1));
    results[comm.rank()] = v;
    comm.allreduce(std::span<float>(results[comm.rank()]), qcoll::reduce_op::sum);
  });
  for (qcoll::rank_t r = 0; r < n; ++r) {
    fmt::print("rank {} contributed [", r);
    for (std::size_t i = 0; i < shown; ++i) fmt::print("{}{:g}", i ? ", " : "", float((r + 1) * (i + 1)));
    fmt::print("]\n");
  }
  bool identical = true;
  for (const auto& result : results) identical &= std::memcmp(result.data(), results[0].data(), shown * 4) == 0;
  const float factor = float(n * (n + 1) / 2);
  bool correct = true;
  for (std::size_t i = 0; i < shown; ++i) correct &= results[0][i] == factor * float(i + 1);
  fmt::print("every rank got  [");
  for (std::size_t i = 0; i < shown; ++i) fmt::print("{}{:g}", i ? ", " : "", results[0][i]);
  fmt::print("]  = (1 + … + {}) · (i + 1): {}, bitwise identical on all ranks: {}\n\n", n, correct ? "correct" : "WRONG",
             identical ? "yes" : "NO");

  // 2. How fast: nccl-tests columns; time is the median over iterations of the slowest rank.
  fmt::print("{:>12} {:>10} {:>6} {:>10} {:>12} {:>12}\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)",
             "busbw(GB/s)");
  for (std::size_t bytes = 4096; bytes <= s.max_bytes; bytes *= 4) {
    const std::size_t count = bytes / sizeof(float);
    const int iterations = int(std::clamp<std::size_t>((std::size_t{256} << 20) / bytes, 5, 50));
    std::vector<std::vector<double>> seconds(n, std::vector<double>(iterations));
    on_every_rank(n, [&](auto& comm) {
      std::vector<float> data(count, float(comm.rank() + 1));
      for (int it = -2; it < iterations; ++it) {  // two warm-up calls
        comm.barrier();
        const auto start = std::chrono::steady_clock::now();
        comm.allreduce(std::span<float>(data), qcoll::reduce_op::sum);
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        if (it >= 0) seconds[comm.rank()][it] = took.count();
      }
    });
    std::vector<double> slowest(iterations);
    for (int it = 0; it < iterations; ++it)
      for (qcoll::rank_t r = 0; r < n; ++r) slowest[it] = std::max(slowest[it], seconds[r][it]);
    std::nth_element(slowest.begin(), slowest.begin() + iterations / 2, slowest.end());
    const double t = slowest[iterations / 2];
    const double algbw = double(bytes) / t / 1e9;
    fmt::print("{:>12} {:>10} {:>6} {:>10.1f} {:>12.3f} {:>12.3f}\n", bytes, count, "float", t * 1e6, algbw,
               algbw * 2.0 * double(n - 1) / double(n));
  }

  // 3. Compressed: the same sum with 1 bit per value (one_bit, G = 2048) and error
  // feedback, through a plan that owns the residuals. Gradient-like data this time.
  const std::size_t count = std::min<std::size_t>(s.max_bytes, std::size_t{16} << 20) / sizeof(float);
  std::vector<std::vector<float>> compressed(n), exact(n);
  std::vector<std::size_t> sent(n);
  std::vector<double> compressed_seconds(n), exact_seconds(n);
  on_every_rank(n, [&](auto& comm) {
    const qcoll::rank_t r = comm.rank();
    std::vector<float> gradient(count);
    for (std::size_t i = 0; i < count; ++i) gradient[i] = std::sin(0.001f * float(i * (r + 1))) * 0.01f;
    qcoll::compressed_allreduce_plan plan(comm, count, qcoll::quantizers::one_bit{});
    auto timed = [&](auto&& call) {
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      call();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    exact[r] = gradient;
    exact_seconds[r] = timed([&] { comm.allreduce(std::span<float>(exact[r]), qcoll::reduce_op::sum); });
    compressed[r] = gradient;
    compressed_seconds[r] = timed([&] { comm.allreduce(plan, std::span<float>(compressed[r]), qcoll::reduce_op::sum); });
    sent[r] = plan.last_call().bytes_sent;
  });
  bool compressed_identical = true;
  double error = 0, largest = 0;
  for (const auto& result : compressed)
    compressed_identical &= std::memcmp(result.data(), compressed[0].data(), count * sizeof(float)) == 0;
  for (std::size_t i = 0; i < count; ++i) {
    error = std::max(error, double(std::abs(compressed[0][i] - exact[0][i])));
    largest = std::max(largest, double(std::abs(exact[0][i])));
  }
  const double exact_bytes = 2.0 * double(n - 1) / double(n) * double(count * sizeof(float));
  fmt::print("\ncompressed allreduce of {} floats, one call (error feedback makes later calls catch up):\n", count);
  fmt::print("  exact   : {:>11.0f} bytes sent per rank, {:>8.1f} ms\n", exact_bytes,
             *std::max_element(exact_seconds.begin(), exact_seconds.end()) * 1e3);
  fmt::print("  1-bit   : {:>11} bytes sent per rank, {:>8.1f} ms ({:.1f}x fewer bytes), max error {:.2g} of {:.2g},"
             " bitwise identical on all ranks: {}\n",
             sent[0], *std::max_element(compressed_seconds.begin(), compressed_seconds.end()) * 1e3,
             exact_bytes / double(std::max<std::size_t>(sent[0], 1)), error, largest, compressed_identical ? "yes" : "NO");
  return correct && identical && compressed_identical ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "allreduce_demo: {}\n", e.what());
  return 2;
}
