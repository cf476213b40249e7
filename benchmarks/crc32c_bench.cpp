// CRC-32C throughput (include/qcoll/detail/crc32c.hpp): the implementation extend()
// uses on this CPU beside the crc32 instruction's streams and the scalar reference, GB/s, the best of `repetitions` passes
// over a buffer of each size (in cache up to a few MiB, from memory beyond).
//
//   crc32c_bench [repetitions]     (default 20)

#include <qcoll/detail/crc32c.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <span>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;
namespace crc = qcoll::detail::crc32c;

template <class Extend>
double best_gbps(Extend extend, std::span<const std::byte> bytes, int repetitions, std::uint32_t& sink) {
  double best = 0;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = clock_type::now();
    sink ^= extend(sink, bytes);
    const std::chrono::duration<double> took = clock_type::now() - start;
    best = std::max(best, static_cast<double>(bytes.size()) / took.count() / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  std::vector<std::byte> data(std::size_t{64} << 20);
  std::mt19937_64 rng(1);
  for (std::byte& b : data) b = static_cast<std::byte>(rng());
  std::uint32_t sink = 0;
  fmt::print("# crc32c: extend() uses {}; GB/s, best of {} passes\n", crc::implementation(), repetitions);
  fmt::print("# {:>12} {:>18} {:>12} {:>12}\n", "bytes", crc::implementation(), "sse4.2", "reference");
  for (std::size_t size = 4096; size <= data.size(); size *= 4) {
    const std::span<const std::byte> bytes = std::span(data).first(size);
    const double fast = best_gbps(&crc::extend, bytes, repetitions, sink);
    const double streams = best_gbps(&crc::extend_sse42, bytes, repetitions, sink);
    const double reference = best_gbps(&crc::extend_reference, bytes, repetitions, sink);
    fmt::print("  {:>12} {:>18.2f} {:>12.2f} {:>12.2f}\n", size, fast, streams, reference);
  }
  return sink == 0x5a5a5a5a ? 1 : 0;  // keeps the work; never 1 in practice
}
