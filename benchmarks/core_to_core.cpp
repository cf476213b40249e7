// core_to_core — how fast two CPUs of this host hand data to each other, right now.
//
//   core_to_core [CPU_A = 0] [CPU_B = 1]
//
// Two threads, pinned to CPU_A and CPU_B, measure (no qcoll code involved):
//   round trip  one cache line written by each in turn, 20,000 times (ns per round trip,
//               median of 9 batches): what a small message's latency is made of
//   handoff     CPU_A copies 64 KiB chunks into a 2 MiB ring in memory both see, CPU_B
//               copies each out once it is flagged, 256 MiB in all (GB/s, best of 3): the
//               shm transport's pipe, without the transport
// One line on stdout, for logs next to a benchmark's table. A host whose two vCPUs sit on
// far apart physical cores (another L3, another socket) shows it in both numbers.
// docs/transports-performance.md ("The slow mode is the host's") uses it.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

struct alignas(64) line {
  std::atomic<std::uint64_t> value{0};
};

/// ns per round trip of one cache line between the two CPUs: median of batches.
double round_trip_ns(int cpu_a, int cpu_b) {
  constexpr int batches = 9, trips = 20'000;
  line ping, pong;
  std::thread echo([&] {
    pin_to(cpu_b);
    for (std::uint64_t i = 1; i <= std::uint64_t{batches} * trips; ++i) {
      while (ping.value.load(std::memory_order_acquire) != i) {
      }
      pong.value.store(i, std::memory_order_release);
    }
  });
  pin_to(cpu_a);
  std::array<double, batches> ns{};
  std::uint64_t i = 0;
  for (double& batch : ns) {
    const auto start = clock_type::now();
    for (int t = 0; t < trips; ++t) {
      ping.value.store(++i, std::memory_order_release);
      while (pong.value.load(std::memory_order_acquire) != i) {
      }
    }
    batch = std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / trips;
  }
  echo.join();
  std::sort(ns.begin(), ns.end());
  return ns[batches / 2];
}

/// GB/s through a ring of chunks from CPU_A's private buffer to CPU_B's: best of runs.
double handoff_gbs(int cpu_a, int cpu_b) {
  constexpr std::size_t chunk = std::size_t{64} << 10, slots = 32, total = std::size_t{256} << 20;
  constexpr std::size_t chunks = total / chunk;
  std::vector<std::byte> source(std::size_t{1} << 20, std::byte{1}), sink(std::size_t{1} << 20);
  std::vector<std::byte> ring(chunk * slots);
  std::memset(ring.data(), 0, ring.size());
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    line written, read;  // chunks handed over and taken out, counted from 0
    std::thread reader([&] {
      pin_to(cpu_b);
      for (std::uint64_t k = 0; k < chunks; ++k) {
        while (written.value.load(std::memory_order_acquire) <= k) {
        }
        std::memcpy(sink.data() + (k * chunk) % sink.size(), ring.data() + (k % slots) * chunk, chunk);
        read.value.store(k + 1, std::memory_order_release);
      }
    });
    pin_to(cpu_a);
    const auto start = clock_type::now();
    for (std::uint64_t k = 0; k < chunks; ++k) {
      while (k - read.value.load(std::memory_order_acquire) >= slots) {
      }
      std::memcpy(ring.data() + (k % slots) * chunk, source.data() + (k * chunk) % source.size(), chunk);
      written.value.store(k + 1, std::memory_order_release);
    }
    reader.join();
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    best = std::max(best, static_cast<double>(total) / seconds / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int cpu_a = argc > 1 ? std::atoi(argv[1]) : 0;
  const int cpu_b = argc > 2 ? std::atoi(argv[2]) : 1;
  if (!pin_to(cpu_a) || !pin_to(cpu_b)) {
    std::fprintf(stderr, "core_to_core: cannot run on CPUs %d and %d\n", cpu_a, cpu_b);
    return 2;
  }
  const double trip = round_trip_ns(cpu_a, cpu_b);
  const double gbs = handoff_gbs(cpu_a, cpu_b);
  std::printf("core_to_core: CPUs %d,%d: round trip %.0f ns, handoff of 64 KiB chunks %.1f GB/s\n", cpu_a, cpu_b, trip,
              gbs);
  return 0;
}
