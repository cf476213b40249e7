// Exact collectives over the in-process transport, in the nccl-tests table format of
// ../shared/peers (same columns, data pattern and timing method), so runs can be put
// side by side with Open MPI and Gloo:
//
//   collective_bench NRANKS [-o allreduce|reduce_scatter|all_gather] [-b 4K] [-e 64M] [-f 2]
//                    [-n max_iters] [-m min_iters] [-w warmup] [-c 0|1]
//
// Per size: reset the buffer (not timed), barrier, time one call on every rank, check
// (not timed). time = median over iterations of the slowest rank's time; tmin = the
// smallest of those. algbw = size / time; busbw = algbw · 2(n−1)/n for allreduce and
// algbw · (n−1)/n for reduce_scatter and all_gather, as nccl-tests defines them.
// Rank r holds (r + 1) · ((i mod 1021) + 1), so every sum is an exact small integer.

#include "bench_args.hpp"

#include <qcoll/qcoll.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

enum class operation { allreduce, reduce_scatter, all_gather };

struct options {
  qcoll::rank_t ranks = 2;
  operation op = operation::allreduce;
  std::string op_name = "allreduce";
  std::size_t min_bytes = 4096, max_bytes = std::size_t{64} << 20;
  double factor = 2;
  int max_iters = 50, min_iters = 5, warmup = -1;
  bool check = true;
};

options parse(int argc, char** argv) {
  if (argc < 2) throw std::invalid_argument("usage: collective_bench NRANKS [-o op] [-b min] [-e max] [-f factor] ...");
  options o;
  o.ranks = std::strtoull(argv[1], nullptr, 10);
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i], value = argv[i + 1];
    if (flag == "-o") o.op_name = value;
    else if (flag == "-b") o.min_bytes = bench::parse_bytes(value);
    else if (flag == "-e") o.max_bytes = bench::parse_bytes(value);
    else if (flag == "-f") o.factor = std::strtod(argv[i + 1], nullptr);
    else if (flag == "-n") o.max_iters = std::atoi(argv[i + 1]);
    else if (flag == "-m") o.min_iters = std::atoi(argv[i + 1]);
    else if (flag == "-w") o.warmup = std::atoi(argv[i + 1]);
    else if (flag == "-c") o.check = std::atoi(argv[i + 1]) != 0;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  if (o.op_name == "reduce_scatter") o.op = operation::reduce_scatter;
  else if (o.op_name == "all_gather") o.op = operation::all_gather;
  else if (o.op_name != "allreduce") o.ranks = 0;  // reported below
  if (o.ranks == 0 || o.factor <= 1)
    throw std::invalid_argument("NRANKS must be ≥ 1, -f > 1, and -o one of allreduce, reduce_scatter, all_gather");
  return o;
}

float pattern(std::size_t i, qcoll::rank_t rank) { return float((rank + 1) * ((i % 1021) + 1)); }

struct measurement {
  std::vector<double> seconds;  // per timed iteration: the slowest rank's time
  std::size_t wrong = 0;
};

/// Runs `iterations` timed calls (after `warmup` untimed ones) of the chosen collective on every rank.
measurement measure(const options& o, std::size_t count, int warmup, int iterations) {
  const qcoll::rank_t n = o.ranks;
  std::vector<std::vector<double>> seconds(n, std::vector<double>(iterations));
  std::vector<std::size_t> wrong(n);
  const auto errors = qcoll::transports::inproc::run_ranks(n, [&](qcoll::transports::inproc::transport endpoint) {
    qcoll::communicator comm(std::move(endpoint));
    const qcoll::rank_t r = comm.rank();
    const qcoll::block_range mine = qcoll::block_of(count, n, r);
    std::vector<float> pristine(count), data(count), block(mine.size);
    // all_gather starts with only this rank's block right, so the check sees what arrived.
    const auto in_mine = [&](std::size_t i) { return i >= mine.offset && i < mine.offset + mine.size; };
    for (std::size_t i = 0; i < count; ++i)
      pristine[i] = o.op != operation::all_gather ? pattern(i, r) : in_mine(i) ? pattern(i, 0) : -1.0f;
    const float ranks_sum = float(n * (n + 1) / 2);
    for (int it = -warmup; it < iterations; ++it) {
      std::copy(pristine.begin(), pristine.end(), data.begin());
      comm.barrier();
      const auto start = std::chrono::steady_clock::now();
      switch (o.op) {
        case operation::allreduce: comm.allreduce(std::span<float>(data), qcoll::reduce_op::sum); break;
        case operation::reduce_scatter:
          comm.reduce_scatter(std::span<const float>(data), std::span<float>(block), qcoll::reduce_op::sum);
          break;
        case operation::all_gather:
          comm.all_gather(std::span<const float>(mine.of(std::span<float>(data))), std::span<float>(data));
          break;
      }
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (it >= 0) seconds[r][it] = took.count();
      if (!o.check) continue;
      switch (o.op) {
        case operation::allreduce:
          for (std::size_t i = 0; i < count; ++i) wrong[r] += data[i] != ranks_sum * pattern(i, 0);
          break;
        case operation::reduce_scatter:
          for (std::size_t i = 0; i < mine.size; ++i) wrong[r] += block[i] != ranks_sum * pattern(mine.offset + i, 0);
          break;
        case operation::all_gather:
          for (std::size_t i = 0; i < count; ++i) wrong[r] += data[i] != pattern(i, 0);
          break;
      }
    }
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  measurement m{std::vector<double>(iterations), *std::max_element(wrong.begin(), wrong.end())};
  for (int it = 0; it < iterations; ++it)
    for (qcoll::rank_t r = 0; r < n; ++r) m.seconds[it] = std::max(m.seconds[it], seconds[r][it]);
  return m;
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  const qcoll::rank_t n = o.ranks;
  const double bus_factor = o.op == operation::allreduce ? 2.0 * double(n - 1) / double(n) : double(n - 1) / double(n);
  fmt::print("#\n# qcoll {} (exact, in-process transport, ring), nranks: {}\n", o.op_name, n);
  fmt::print("# {:>12} {:>12} {:>6} {:>12} {:>12} {:>12} {:>8} {:>6} {:>12}\n", "size(B)", "count", "type", "time(us)",
             "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters", "tmin(us)");
  bool all_right = true;
  for (double size = double(o.min_bytes); size <= double(o.max_bytes) * 1.0001; size *= o.factor) {
    const std::size_t count = std::size_t(size) / sizeof(float);
    const std::size_t bytes = count * sizeof(float);
    const int iterations = int(std::clamp<std::size_t>((std::size_t{128} << 20) / std::max<std::size_t>(bytes, 1),
                                                       std::size_t(o.min_iters), std::size_t(o.max_iters)));
    const int warmup = o.warmup >= 0 ? o.warmup : std::clamp(iterations / 5, 2, 10);
    measurement m = measure(o, count, warmup, iterations);
    std::sort(m.seconds.begin(), m.seconds.end());
    const double median = m.seconds[m.seconds.size() / 2];
    const double algbw = double(bytes) / median / 1e9;
    fmt::print("  {:>12} {:>12} {:>6} {:>12.2f} {:>12.3f} {:>12.3f} {:>8} {:>6} {:>12.2f}\n", bytes, count, "float",
               median * 1e6, algbw, algbw * bus_factor, m.wrong, iterations, m.seconds.front() * 1e6);
    std::fflush(stdout);
    all_right &= m.wrong == 0;
  }
  return all_right ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "collective_bench: {}\n", e.what());
  return 2;
}
