#pragma once
// The nccl-tests style table of ../shared/peers (src/common.hpp): the same sweep, the
// same iteration counts, the same statistics and the same columns and number formats,
// so ../shared/peers/summarize.py reads our tables next to Open MPI's and Gloo's.
//
//   size(B)   message size in bytes (float32 elements · 4)
//   time(us)  median over timed iterations of the per-iteration time, which is the
//             slowest rank's time of that iteration
//   algbw     size / time (GB/s, 1 GB = 1e9 B); busbw = algbw · the collective's factor
//   #wrong    wrong elements summed over all checked iterations (max over ranks)
//   tmin(us)  the smallest per-iteration time
//   link%     (optional) busbw as a percentage of the link rate, for shaped networks
//
// compressed_table (collective_bench --compressed) adds, per size, a row per compressed
// variant after the exact allreduce's row; its columns are in benchmarks/README.md.

#include "bench_args.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/utsname.h>
#include <unistd.h>

namespace bench {

/// -b, -b·f, -b·f², … ≤ -e, each rounded down to whole float32 elements (so to whole
/// 16-bit elements too).
inline std::vector<std::size_t> sweep_sizes(const collective_options& o) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) sizes.push_back(s / 4 * 4);
  return sizes;
}

/// clamp(budget / size, -m, -n).
inline int iterations_for(std::size_t bytes, const collective_options& o) {
  const std::size_t n = o.budget_bytes / std::max<std::size_t>(bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(n, std::size_t(o.min_iters), std::size_t(o.max_iters)));
}

inline int warmup_for(int iterations, const collective_options& o) {
  return o.warmup >= 0 ? o.warmup : std::clamp(iterations / 5, 2, 10);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

/// Caps the iterations so a size takes about -T seconds, judged from the median of the
/// (max-over-ranks) warm-up times; never fewer than min(iterations, 3). Every rank gets
/// the same reduced warm-up times, so every rank picks the same count.
inline int capped_iterations(int iterations, const std::vector<double>& warmup_us, const collective_options& o) {
  if (o.time_cap_s <= 0 || warmup_us.empty()) return iterations;
  const double t = median(warmup_us);
  if (t <= 0) return iterations;
  const int by_time = static_cast<int>(o.time_cap_s * 1e6 / t);
  return std::max(std::min(iterations, by_time), std::min(iterations, 3));
}

/// nccl-tests' bus bandwidth factor: 2(n−1)/n for allreduce, 1 for broadcast, (n−1)/n for the others.
inline double bus_factor(operation op, std::size_t nranks) {
  const double n = static_cast<double>(nranks);
  if (op == operation::broadcast) return 1.0;
  return op == operation::allreduce ? 2.0 * (n - 1) / n : (n - 1) / n;
}

inline std::string host_line() {
  utsname u{};
  ::uname(&u);
  return fmt::format("{} {} {}, {} online cpus", u.nodename, u.sysname, u.release, ::sysconf(_SC_NPROCESSORS_ONLN));
}

/// BENCH_DUMP_TIMES=1: every timed iteration's time to stderr, as the peers print them.
inline void dump_times(std::size_t bytes, const std::string& variant, const std::vector<double>& times_us) {
  if (const char* dump = std::getenv("BENCH_DUMP_TIMES"); dump && *dump && *dump != '0') {
    std::fprintf(stderr, "times %zu%s%s:", bytes, variant.empty() ? "" : " ", variant.c_str());
    for (const double t : times_us) std::fprintf(stderr, " %.0f", t);
    std::fprintf(stderr, "\n");
  }
}

/// The table: header on construction, one row per size, the average at the end.
class table {
 public:
  /// `link_bytes_per_s` > 0 adds the link% column.
  /// `type` and `element_bytes` name the element type (nccl-tests' names: float, half, bfloat16).
  table(std::string title, std::size_t nranks, operation op, double link_bytes_per_s, std::string type = "float",
        std::size_t element_bytes = sizeof(float))
      : nranks_(nranks), op_(op), link_bytes_per_s_(link_bytes_per_s), type_(std::move(type)),
        element_bytes_(element_bytes) {
    // The title must be the last '#' line before the column names: summarize.py takes it from there.
    std::printf("#\n# %s\n", title.c_str());
    std::printf("# %12s %12s %6s %12s %12s %12s %8s %6s %12s%s\n", "size(B)", "count", "type", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters", "tmin(us)", link_bytes_per_s_ > 0 ? "    link%" : "");
    std::fflush(stdout);
  }

  void row(std::size_t bytes, const std::vector<double>& times_us, double wrong) {
    dump_times(bytes, "", times_us);
    const double time_us = median(times_us);
    const double min_us = times_us.empty() ? 0.0 : *std::min_element(times_us.begin(), times_us.end());
    const double algbw = static_cast<double>(bytes) / (time_us * 1e-6) / 1e9;
    const double busbw = algbw * bus_factor(op_, nranks_);
    std::printf("  %12zu %12zu %6s %12.2f %12.3f %12.3f %8.0f %6d %12.2f", bytes, bytes / element_bytes_, type_.c_str(),
                time_us, algbw, busbw, wrong, static_cast<int>(times_us.size()), min_us);
    if (link_bytes_per_s_ > 0) std::printf(" %8.1f", busbw * 1e9 / link_bytes_per_s_ * 100.0);
    std::printf("\n");
    std::fflush(stdout);
    busbw_sum_ += busbw;
    ++rows_;
  }

  void finish() {
    if (rows_ > 0) std::printf("# Avg bus bandwidth: %.3f GB/s\n", busbw_sum_ / static_cast<double>(rows_));
    std::fflush(stdout);
  }

 private:
  std::size_t nranks_;
  operation op_;
  double link_bytes_per_s_;
  std::string type_;
  std::size_t element_bytes_;
  double busbw_sum_ = 0;
  int rows_ = 0;
};

/// collective_bench --compressed: per size, the exact allreduce's row first, then one
/// row per compressed variant, each compared with that exact row (same run, same size).
///   variant   "exact", or the --compressed name (one_bit, k_level4, bfp8, …)
///   chunk     the plan's chunk_values() after rounding to whole groups ("-" for exact)
///   algbw     uncompressed size / time: for a compressed variant, the effective algbw
///   busbw     algbw · 2(n−1)/n (effective, for a compressed variant)
///   wire(B)   payload bytes rank 0 sent in one call: plan.last_call().bytes_sent, or
///             2(n−1)/n · size for the exact ring
///   wire/ex   wire(B) / the exact allreduce's 2(n−1)/n · size
///   bw/ex     algbw / the exact allreduce's algbw in the row above it
///   #wrong    exact and identity: wrong elements summed over iterations; lossy
///             variants: iterations whose result differed between ranks, plus
///             non-finite result elements
///   relerr    max over iterations of max|result − exact sum| / max|exact sum|
class compressed_table {
 public:
  struct row_data {
    std::string variant;
    std::string chunk;
    std::vector<double> times_us;
    double wire_bytes = 0;
    double wrong = 0;
    double relerr = -1;  // negative: not checked (-c 0)
  };

  compressed_table(std::string title, std::size_t nranks, double link_bytes_per_s)
      : nranks_(nranks), link_bytes_per_s_(link_bytes_per_s) {
    std::printf("#\n# %s\n", title.c_str());
    std::printf("# %12s %12s %6s %12s %7s %12s %12s %12s %12s %8s %7s %8s %9s %6s %12s%s\n", "size(B)", "count", "type",
                "variant", "chunk", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "wire(B)", "wire/ex", "bw/ex", "#wrong",
                "relerr", "iters", "tmin(us)", link_bytes_per_s_ > 0 ? "    link%" : "");
    std::fflush(stdout);
  }

  /// The exact allreduce's row of a size; the compressed rows after it compare with it.
  void exact_row(std::size_t bytes, row_data r) {
    exact_wire_ = bus_factor(operation::allreduce, nranks_) * static_cast<double>(bytes);
    r.wire_bytes = exact_wire_;
    exact_algbw_ = 0;
    exact_algbw_ = print(bytes, r);
    exact_busbw_sum_ += exact_algbw_ * bus_factor(operation::allreduce, nranks_);
    ++exact_rows_;
  }

  void compressed_row(std::size_t bytes, const row_data& r) { print(bytes, r); }

  void finish() {
    if (exact_rows_ > 0)
      std::printf("# Avg bus bandwidth: %.3f GB/s (exact rows)\n", exact_busbw_sum_ / static_cast<double>(exact_rows_));
    std::fflush(stdout);
  }

 private:
  /// Prints a row; returns its algbw.
  double print(std::size_t bytes, const row_data& r) {
    dump_times(bytes, r.variant, r.times_us);
    const double time_us = median(r.times_us);
    const double min_us = r.times_us.empty() ? 0.0 : *std::min_element(r.times_us.begin(), r.times_us.end());
    const double algbw = static_cast<double>(bytes) / (time_us * 1e-6) / 1e9;
    const double busbw = algbw * bus_factor(operation::allreduce, nranks_);
    const std::string wire_ratio = exact_wire_ > 0 ? fmt::format("{:.4f}", r.wire_bytes / exact_wire_) : "-";
    const std::string bw_ratio = exact_algbw_ > 0 ? fmt::format("{:.2f}", algbw / exact_algbw_) : "1.00";
    const std::string relerr = r.relerr < 0 ? "-" : fmt::format("{:.2e}", r.relerr);
    std::printf("  %12zu %12zu %6s %12s %7s %12.2f %12.3f %12.3f %12.0f %8s %7s %8.0f %9s %6d %12.2f", bytes,
                bytes / sizeof(float), "float", r.variant.c_str(), r.chunk.c_str(), time_us, algbw, busbw,
                r.wire_bytes, wire_ratio.c_str(), bw_ratio.c_str(), r.wrong, relerr.c_str(),
                static_cast<int>(r.times_us.size()), min_us);
    if (link_bytes_per_s_ > 0) std::printf(" %8.1f", busbw * 1e9 / link_bytes_per_s_ * 100.0);
    std::printf("\n");
    std::fflush(stdout);
    return algbw;
  }

  std::size_t nranks_;
  double link_bytes_per_s_;
  double exact_wire_ = 0;
  double exact_algbw_ = 0;
  double exact_busbw_sum_ = 0;
  int exact_rows_ = 0;
};

}  // namespace bench
