// write_cost — what a single-copy ring step's memory time goes by on this host.
//
//   write_cost [MiB = 32] [repetitions = 7]
//
// One thread, buffers of MiB each, faulted in first; best of the repetitions, ms:
//   reduce in place  b = a + b (qcoll's reduce kernel): what a ring step does to its own
//                    block, reading 2 blocks and writing 1 it has just read
//   reduce into      c = a + b: the same written into a third buffer, as a result
//                    reduced straight into the staging buffer
//   memcpy           c = a: a staging copy
//   in place + copy  b = a + b, each 16 KiB of b then copied into c while in cache: a
//                    reduction and a staging copy of its result
// docs/algorithms.md ("Single-copy ring") uses these to choose what a step stages.
#include <qcoll/kernels/cpu/reduce.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace {

template <class Body>
double best_ms(int repetitions, Body&& body) {
  double best = 1e300;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    body();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 32;
  const int repetitions = argc > 2 ? std::atoi(argv[2]) : 7;
  if (mib == 0 || repetitions <= 0) {
    std::fprintf(stderr, "usage: write_cost [MiB > 0] [repetitions > 0]\n");
    return 2;
  }
  const std::size_t count = mib * (std::size_t{1} << 20) / sizeof(float);
  std::vector<float> a(count, 1.0f), b(count, 2.0f), c(count, 0.0f);
  constexpr std::size_t chunk = 16 * 1024 / sizeof(float);
  const auto sum = qcoll::reduce_op::sum;

  const auto reduce = [&](std::size_t at, std::size_t n, std::span<float> into) {
    qcoll::kernels::cpu::reduce<float>(sum, std::span<const float>(a).subspan(at, n),
                                       std::span<const float>(b).subspan(at, n), into.subspan(at, n));
  };
  const double in_place = best_ms(repetitions, [&] { reduce(0, count, b); });
  const double into = best_ms(repetitions, [&] { reduce(0, count, c); });
  const double copied = best_ms(repetitions, [&] { std::memcpy(c.data(), a.data(), count * sizeof(float)); });
  const double both = best_ms(repetitions, [&] {
    for (std::size_t at = 0; at < count; at += chunk) {
      const std::size_t n = std::min(chunk, count - at);
      reduce(at, n, b);
      std::memcpy(c.data() + at, b.data() + at, n * sizeof(float));
    }
  });
  std::printf("# write_cost: %zu MiB per buffer, one thread, best of %d\n", mib, repetitions);
  std::printf("%-16s %9s\n", "# what", "ms");
  std::printf("%-16s %9.2f\n", "reduce in place", in_place);
  std::printf("%-16s %9.2f\n", "reduce into", into);
  std::printf("%-16s %9.2f\n", "memcpy", copied);
  std::printf("%-16s %9.2f\n", "in place + copy", both);
  return 0;
}
