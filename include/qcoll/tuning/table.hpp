#pragma once
/// @file
/// The tuning table: every threshold between the exact collectives' algorithms, the
/// pipelined ring's slice and the transports' poll time, each with the measurement
/// that chose it (as CUB's tuning headers name theirs). `qcoll::tuning` holds the
/// values a communicator uses: the table's, each overridable by an environment
/// variable (docs/algorithms.md, "Choosing an algorithm"), or given whole in
/// communicator_options. Every rank of a job must use the same values: the algorithm
/// travels in every message header, so ranks that chose differently fail with
/// operation_mismatch instead of hanging.

#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/byte_count.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>

#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <thread>

namespace qcoll {

namespace tuning_table {

// Measured on the development host: a 2-vCPU KVM guest (Intel Xeon, 23 GiB, Linux 6.18),
// 2 and 4 ranks, with `benchmarks/collective_bench --job` under `qcoll-run`, each
// algorithm forced through its variable, two rounds in one session (2026-11-25); the
// tables are in docs/transports-performance.md, "Algorithm crossovers". Times are
// medians per call, busbw in GB/s; "a / b" reads "this algorithm / the other".

/// allreduce: recursive doubling up to this many bytes per rank, the ring above.
/// 32 KiB: shm 2 ranks 6.6–6.9 / 9.2–9.3 µs (ring), 4 ranks 70–81 / 83–86 µs; at 64 KiB
/// shm 2 ranks 11.3–11.7 / 11.3–11.6 µs, 4 ranks 152–184 / 125 µs, while tcp still
/// gains (2 ranks 25 / 33 µs, 4 ranks 159–201 / 208 µs). 4 KiB: shm 4 ranks 20–28 / 34–43
/// µs, tcp 4 ranks 62–79 / 130 µs.
inline constexpr std::size_t allreduce_small_bytes = std::size_t{32} << 10;

/// allreduce on 2^k ≥ 4 ranks: halving-doubling above allreduce_small_bytes up to this
/// many bytes per rank, where the ring would step through the transport (tcp, MPI, shm
/// steps below single_copy_bytes); the ring above, and wherever its steps are read from
/// the peers' memory (shared buffers reach further that way). Forced, µs per call, 4 ranks
/// (2026-11-26, avx512f host, two rounds, ring / halving-doubling): tcp 64 KiB 301–443 /
/// 174–199, 512 KiB 711–737 / 553–673, 2 MiB 3080–3305 / 2363–3153, 4 MiB 6141–7205 /
/// 5906–6825, 8 MiB 12299–13235 / 13369–13399, 16 MiB 1.10–1.13 / 1.00–1.04 GB/s busbw;
/// shm 64 KiB 75–90 / 45–73, 512 KiB 274–455 / 250–298. 8 ranks, one round: tcp 64 KiB
/// 1558 / 922, 512 KiB 2706 / 1824; shm 240 / 156, 1066 / 844. Worlds of other sizes are
/// mixed (3 ranks, tcp: 64 KiB 201 / 113, 512 KiB 515 / 518, 4 MiB 5142 / 5716; 6 ranks
/// 908 / 470, 1456 / 1286, 12583 / 12785): they keep the ring. Against recursive doubling
/// (4 ranks) it loses at 4–8 KiB (tcp 69–76 / 107–170 µs) and is mixed at 16 KiB.
inline constexpr std::size_t allreduce_halving_bytes = std::size_t{8} << 20;

/// broadcast: binomial tree up to this many bytes, ring scatter + all-gather above.
/// 1 MiB, 4 ranks: shm 752–832 / 945–1148 µs (ring), tcp 1200–1644 / 1105–1660 µs; at
/// 256 KiB shm 187–232 / 292–295 µs, tcp 223–274 / 340–497 µs. With 2 ranks the tree
/// (one message) wins at every size up to 4 MiB. On more ranks its log₂ n whole-buffer
/// sends from the root lose to the ring's 2 buffers sooner: measure before raising it.
inline constexpr std::size_t broadcast_small_bytes = std::size_t{1} << 20;

/// The pipelined ring cuts each step into slices of this many bytes, one message each,
/// and sends slice k of a step as soon as slice k of the previous step has arrived;
/// steps of fewer than two slices go whole. Also the single-copy reduction's slice, and
/// the slice a single-copy step stages and announces at a time (2 ranks, shm, 64 MiB,
/// 2026-11-27, Zen 3 host, six alternating rounds: 17.8–19.1 ms in 1 MiB slices against
/// 18.6–20.8 staged whole; 256 KiB and 128 KiB slices within the noise of 1 MiB).
/// With slices flowing across steps (HEAD), 1 MiB against unsliced, busbw, two rounds:
/// shm pipes (single copy off) 2 ranks 16 MiB 5.12–5.16 / 5.15–5.21, 64 MiB 3.55–3.81 /
/// 3.51–3.71; tcp 2 ranks 64 MiB 1.84–1.87 / 1.42–1.76, 4 ranks 0.78–0.85 / 0.78–0.87;
/// lab (4 ranks, 1 Gbit/s, 64 MiB) 82.2–85.2 / 81.8–82.6 % of the link. Differences
/// within this host's noise (the lab is CPU-bound: 2 % idle); kept for links where the
/// step boundaries, not the CPU, cost. Slicing within steps only (earlier): shm pipes
/// 2 ranks 64 MiB 2.96–3.16 unsliced, 3.35–3.52 at 1 MiB, 3.37–3.55 at 512 KiB.
inline constexpr std::size_t ring_slice_bytes = std::size_t{1} << 20;

/// How many slices of a step may be in flight at once. Not tuned: 4 keeps the 2 MiB
/// shm pipe full with 1 MiB slices.
inline constexpr std::size_t ring_slices_in_flight = 4;

/// The shm pipes publish a copy into or out of them in pieces of this many bytes, so the
/// other side works on one piece while this side copies the next, whatever the size of
/// the stream engine's writes and reads (its data records are up to 1 MiB, the pipe 2 MiB;
/// the record size is part of the wire format, with its measurement in
/// transports/stream/records.hpp). Publishing once per 1 MiB record made broadcast slower
/// (2026-11-26, 2-vCPU AMD EPYC, `collective_bench --job -o broadcast -c 0`, two or three
/// alternating rounds): 4 ranks 64 MiB 2.89–3.06 against 3.34–3.54 GB/s with 256 KiB
/// records, 2 ranks 1 MiB 13–32 against 47–51; in 256 KiB pieces 3.52–3.60 and 49–52.
inline constexpr std::size_t pipe_publish_bytes = std::size_t{256} << 10;

/// The shm transport reads a ring step straight from the peer's memory (cross-memory
/// attach) when the step moves at least this many bytes; smaller steps go through the
/// shared pipes. shm 2 ranks busbw, pipes / single copy: 256 KiB allreduce (128 KiB
/// steps) 7.1–7.3 / 6.7; 1 MiB (512 KiB steps) 6.3–6.5 / 6.8–7.3; 4 MiB 5.2–5.6 /
/// 7.5–8.7; 64 MiB 3.3–3.6 / 3.5–4.1. 4 ranks, 1 MiB (256 KiB steps) 1.43–1.59 / 1.46–1.65.
inline constexpr std::size_t single_copy_bytes = std::size_t{256} << 10;

/// A single-copy step whose block lies in ordinary memory is copied by its owner into a
/// shared staging buffer that the peer maps (the shm transport's shared buffers), so the
/// peer reads it with plain loads; steps of at least this many bytes are read through
/// the kernel (process_vm_readv) instead. `never`: every step is staged. The kernel's
/// copy pins every page it reads, and what that costs differs by host: on a 2-vCPU AMD
/// EPYC (Zen 3) KVM guest, Linux 6.18 (2026-11-27), process_vm_readv moved 1.1 GB/s in
/// 4 KiB calls and 2.1–2.3 GB/s in 64 KiB–4 MiB calls against memcpy's 14–28 GB/s (a
/// scratch program, docs/transports-performance.md). 2 ranks, shm, busbw, kernel copy /
/// staged, two rounds: 1 MiB 2.38–2.98 / 11.1–11.6, 4 MiB 2.91–3.35 / 13.4–13.9, 16 MiB
/// 2.40–2.45 / 4.34–4.36, 64 MiB 2.44–2.46 / 2.84–2.85. Staging costs a block of shared
/// memory per communicator (the largest step, kept for later calls, like scratch), two
/// with 3 or more ranks (reduce-scatter partials are reduced into the second).
inline constexpr std::size_t single_copy_kernel_bytes = std::numeric_limits<std::size_t>::max();

/// How long a wait polls before it sleeps when every local rank has a core: a reply
/// within this time costs no wakeup. Commit e37e18c (2 ms together with fewer
/// system calls per message): 2 ranks, 4 KiB allreduce, shm 17 → 3.9 µs, tcp 42 → 25 µs.
inline constexpr std::chrono::microseconds spin_when_cores_suffice{2000};
/// For how much of that poll time a wait pauses between polls (x86 `pause`, no system
/// call) before it yields its core between polls: all of it. A yield is a system call
/// that delays noticing the reply, and with another program busy on the core it hands
/// the core over for a whole scheduler tick. 2 ranks, shm, allreduce, yielding from
/// the start / pausing 20 µs / 200 µs / 2 ms (2026-11-26, 2-vCPU KVM guest, avx512f, two
/// rounds): 4 KiB 1.61–1.62 / 1.03–1.13 / 1.01–1.19 / 0.97–1.01 µs, 64 KiB 4.8–6.4 /
/// 3.7–3.8 / 4.6–4.7 / 4.0 µs, 1 MiB 94 / 95–96 / 94–95 / 91–93 µs; with a busy loop
/// on one core 3990–3998 µs at every size up to 256 KiB when yielding, 1.0–1.1 µs at
/// 4 KiB for every pause. Ranks that outnumber cores yield at once (0 µs): 4 ranks,
/// 4 KiB, shm 20 / 30–32 / 126–136 µs yielding / pausing 10 / 50 µs, tcp 55–73 /
/// 119–121 / 270–300 µs.
/// With the clock read every 16th poll instead of twice per poll (22c0cf9),
/// 2 ranks, shm, 4 KiB: 0.69–0.71 µs against 1.24–1.27 before both, and Open MPI's
/// 0.79 µs in the same run (three rounds).
inline constexpr std::chrono::microseconds pause_when_cores_suffice = spin_when_cores_suffice;
/// ... and when ranks outnumber cores, where polling takes the core a peer needs:
/// docs/transports-performance.md, finding 4: 4 ranks on 2 cores, 4 KiB allreduce,
/// 92–135 µs polling 50 µs, 288–463 µs sleeping at once; 1000 µs gave no consistent gain.
inline constexpr std::chrono::microseconds spin_when_oversubscribed{50};

}  // namespace tuning_table

/// Whether a job with `local_ranks` ranks on this host has fewer cores than ranks.
inline bool ranks_outnumber_cores(rank_t local_ranks) {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 || local_ranks > cores;
}

/// What a communicator's exact collectives use to choose; the defaults are the table's.
struct tuning {
  /// A forced algorithm per collective (QCOLL_ALLREDUCE_ALGO, QCOLL_BROADCAST_ALGO,
  /// QCOLL_BARRIER_ALGO); `unspecified` chooses by size and topology.
  algorithm allreduce = algorithm::unspecified;
  algorithm broadcast = algorithm::unspecified;
  algorithm barrier = algorithm::unspecified;
  /// QCOLL_ALLREDUCE_SMALL_BYTES, QCOLL_ALLREDUCE_HALVING_BYTES, QCOLL_BROADCAST_SMALL_BYTES, QCOLL_RING_SLICE_BYTES
  /// (0: unsliced), QCOLL_SINGLE_COPY_BYTES ("off": never), QCOLL_SINGLE_COPY_KERNEL_BYTES ("auto": measured; "off": never;
  /// unset: measured where the ranks fit the host's cores, see measure_copy_path).
  std::size_t allreduce_small_bytes = tuning_table::allreduce_small_bytes;
  std::size_t allreduce_halving_bytes = tuning_table::allreduce_halving_bytes;
  std::size_t broadcast_small_bytes = tuning_table::broadcast_small_bytes;
  std::size_t ring_slice_bytes = tuning_table::ring_slice_bytes;
  std::size_t single_copy_bytes = tuning_table::single_copy_bytes;
  std::size_t single_copy_kernel_bytes = tuning_table::single_copy_kernel_bytes;
  /// Whether single-copy steps choose between staging and the kernel's copy by measuring
  /// (tuning/copy_path.hpp; QCOLL_SINGLE_COPY_KERNEL_BYTES=auto), or stage below
  /// single_copy_kernel_bytes (QCOLL_SINGLE_COPY_KERNEL_BYTES=off or a size; off: every
  /// step staged). Unset, a communicator measures where the ranks that read each other's
  /// memory do not outnumber the host's cores, and stages every step where they do: with
  /// 4 ranks on 2 cores a round's few calls decide amid the scheduler's noise, and it
  /// lost at 1–8 MiB on two hosts (docs/transports-performance.md, "The copy path by
  /// measurement"). Unlike the other values, these two may differ between ranks: whether
  /// a block is staged is its owner's choice alone.
  bool measure_copy_path = false;

  static constexpr std::size_t never = qcoll::detail::bytes_never;

  /// The table's values with the environment's overrides, for a communicator whose
  /// ranks read each other's memory, `ranks_on_host` of them (0: they do not; they stage
  /// nothing then) — with QCOLL_SINGLE_COPY_KERNEL_BYTES unset, measure_copy_path where
  /// they do not outnumber the host's cores.
  /// @throws qcoll::error invalid_argument naming a variable that is set but malformed.
  static tuning from_environment(rank_t ranks_on_host = 0) {
    tuning t;
    t.allreduce = algorithm_variable("QCOLL_ALLREDUCE_ALGO", {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling});
    t.broadcast = algorithm_variable("QCOLL_BROADCAST_ALGO", {algorithm::ring, algorithm::binomial_tree});
    t.barrier = algorithm_variable("QCOLL_BARRIER_ALGO", {algorithm::ring, algorithm::dissemination});
    t.allreduce_small_bytes = bytes_variable("QCOLL_ALLREDUCE_SMALL_BYTES", t.allreduce_small_bytes);
    t.allreduce_halving_bytes = bytes_variable("QCOLL_ALLREDUCE_HALVING_BYTES", t.allreduce_halving_bytes);
    t.broadcast_small_bytes = bytes_variable("QCOLL_BROADCAST_SMALL_BYTES", t.broadcast_small_bytes);
    t.ring_slice_bytes = bytes_variable("QCOLL_RING_SLICE_BYTES", t.ring_slice_bytes);
    t.single_copy_bytes = bytes_variable("QCOLL_SINGLE_COPY_BYTES", t.single_copy_bytes);
    const char* kernel_bytes = std::getenv("QCOLL_SINGLE_COPY_KERNEL_BYTES");
    if (kernel_bytes == nullptr || *kernel_bytes == '\0')
      t.measure_copy_path = ranks_on_host > 0 && !ranks_outnumber_cores(ranks_on_host);
    else
      t.measure_copy_path = std::string_view(kernel_bytes) == "auto";
    if (!t.measure_copy_path)
      t.single_copy_kernel_bytes = bytes_variable("QCOLL_SINGLE_COPY_KERNEL_BYTES", t.single_copy_kernel_bytes);
    return t;
  }

 private:
  static algorithm algorithm_variable(const char* name, std::initializer_list<algorithm> allowed) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0' || std::string_view(value) == "auto") return algorithm::unspecified;
    for (const algorithm a : allowed)
      if (std::string_view(value) == to_string(a)) return a;
    std::string names;
    for (const algorithm a : allowed) names += qcoll::detail::format("{}, ", to_string(a));
    detail::throw_error(errc::invalid_argument, "qcoll: {}={} is not one of {}auto", name, value, names);
  }

  static std::size_t bytes_variable(const char* name, std::size_t fallback) {
    return qcoll::detail::byte_count_variable(name, fallback);
  }
};

/// How long a wait of a job with `local_ranks` ranks on this host polls before it starts
/// yielding its core between polls (QCOLL_PAUSE_US overrides it; capped by the poll time).
inline std::chrono::microseconds automatic_pause(rank_t local_ranks) {
  if (const char* given = std::getenv("QCOLL_PAUSE_US"); given && *given)
    return std::chrono::microseconds(std::strtoll(given, nullptr, 10));
  return ranks_outnumber_cores(local_ranks) ? std::chrono::microseconds(0) : tuning_table::pause_when_cores_suffice;
}

/// The poll time of a job with `local_ranks` ranks on this host (QCOLL_SPIN_US overrides it).
inline std::chrono::microseconds automatic_spin(rank_t local_ranks) {
  if (const char* given = std::getenv("QCOLL_SPIN_US"); given && *given)
    return std::chrono::microseconds(std::strtoll(given, nullptr, 10));
  return ranks_outnumber_cores(local_ranks) ? tuning_table::spin_when_oversubscribed
                                            : tuning_table::spin_when_cores_suffice;
}

}  // namespace qcoll
