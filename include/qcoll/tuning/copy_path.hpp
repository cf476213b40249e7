#pragma once
/// @file
/// How a single-copy step offers a block that lies in ordinary memory, chosen by
/// measurement: copied by its owner into the shm transport's staging buffer, which the
/// peer maps and reads with plain loads (`staged`), or left in place for the peer to
/// copy through the kernel (process_vm_readv: `peer_read`). Which is faster depends on
/// the host and on the moment — how fast its cores hand cache lines to each other
/// (benchmarks/core_to_core: 51–131 ns on a near host, ~250–340 ns on far ones, ~500 ns
/// in slow windows) against what pinning pages costs the kernel — and by size: on one
/// far host staging won at 1 MiB and lost at 4 and 64 MiB (docs/transports-performance.md).
///
/// So each communicator measures, per size class (step bytes by powers of two), the
/// calls it makes anyway. A class starts staged (the path that wins on near hosts); its
/// calls 16 to 18 are a trial round of the other path — late enough that a benchmark's
/// warm-up and a short timed run meet none or few of them, early in a job's thousands
/// of calls. A round's first call pays for the switch (on an Intel Xeon host a lone
/// kernel-copy call between staged ones took 1.3–1.8× what the same call takes in a
/// run of them: docs/transports-performance.md), so a round is a run of calls on the
/// other path, and its best call is compared with the best of the current path's two
/// calls just before it. When the trial is faster by `margin`, the class switches.
/// Trial rounds then come after 16 calls, the interval doubling (quadrupling when the
/// trial was over twice as slow) up to 1,024 while the current path keeps winning; one
/// comes early when 3 calls in a row of the current path are slower than the other path
/// was at its last round (a slow window, a new neighbour; on a noisy host some calls
/// are slow, not three in a row), at most once per 16 calls. What that costs, bounded: 3 trial calls in a class's
/// first 20, at most 12 in its first 100 (6 on a steady host), 3 per 1,024 later — each
/// at most the slower path's time.
///
/// A rank decides alone: whether a block is staged is the owner's choice, invisible to
/// the reader but for its speed, so no agreement is needed and ranks may differ. Every
/// rank makes the same calls in the same order, so their trials fall on the same calls
/// and measure the job with every rank on the other path. On by default where the ranks
/// that read each other's memory do not outnumber the host's cores (tuning::from_environment),
/// always with QCOLL_SINGLE_COPY_KERNEL_BYTES=auto (or tuning::measure_copy_path). Not
/// where they do: with 4 ranks on 2 cores it lost at 1–8 MiB on two hosts, a round's
/// few calls deciding amid the scheduler's noise (docs/transports-performance.md, "The
/// copy path by measurement").

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace qcoll::tuning_copy {  // not `qcoll::tuning`: that is the values' struct

enum class copy_path : std::uint8_t { staged, peer_read };

inline const char* to_string(copy_path p) noexcept { return p == copy_path::staged ? "staged" : "peer_read"; }

/// One call's path and what the chooser needs back when it ends.
struct copy_decision {
  copy_path path = copy_path::staged;
  bool trial = false;           ///< a trial of the path the class does not use
  std::uint8_t size_class = 0;  ///< std::bit_width(step bytes)
  std::uint64_t call = 0;       ///< the class's call number
  std::size_t step_bytes = 0;
};

class copy_path_chooser {
 public:
  /// A trial must beat the current path by this fraction to replace it.
  static constexpr double margin = 0.1;
  /// A class's first trial round (after any benchmark's warm-up, so that a short timed
  /// run meets few trials), then the calls between rounds: first, and at most (doubling
  /// while nothing changes).
  static constexpr std::uint64_t first_round = 16, first_interval = 16, longest_interval = 1024;
  /// A round's calls in a row on the other path: the first pays for the switch, the best counts.
  static constexpr std::uint64_t trial_calls = 3;
  /// The current path slower than the other's last measured rate (by `margin`) for
  /// `slow_calls` calls in a row brings the next round forward (no sooner than
  /// first_interval after the last).
  static constexpr unsigned slow_calls = 3;
  /// A trial this many times slower than the current path makes the next round come
  /// after 4 times the interval instead of 2.
  static constexpr double far_slower = 2.0;

  /// The path of a single-copy call whose largest step moves `step_bytes`.
  copy_decision choose(std::size_t step_bytes) noexcept {
    const auto index = static_cast<std::uint8_t>(std::bit_width(step_bytes));
    size_class& c = classes_[index];
    const std::uint64_t call = c.calls++;
    if (call > last_trial(c)) {  // the round's last trial failed, so it never ended: the next one later
      c.round_start = call + c.interval;
      c.round_best = c.trial_best = infinity;
    }
    const bool trial = call >= c.round_start && call <= last_trial(c);
    return {trial ? other(c.current) : c.current, trial, index, call, step_bytes};
  }

  /// The call of `made` ended after `took` (calls that failed are not recorded).
  void record(const copy_decision& made, std::chrono::nanoseconds took) noexcept {
    if (made.call == 0 || made.step_bytes == 0) return;  // the first call pays for fresh memory
    size_class& c = classes_[made.size_class];
    const double rate = static_cast<double>(took.count()) / static_cast<double>(made.step_bytes);
    if (made.trial) {
      c.trial_best = std::min(c.trial_best, rate);
      if (made.call == last_trial(c)) end_round(c, made.call);
      return;
    }
    // The round compares its trials with the current path's two calls just before it.
    if (made.call + 2 == c.round_start || made.call + 1 == c.round_start) c.round_best = std::min(c.round_best, rate);
    // A round comes early only when this path's last calls, all of them, are slower than
    // the other path was at the last round: noise on a busy host slows some calls, not
    // every one, and a path still faster than the other's last rate needs no trial.
    const bool slower_than_other = c.rounds > 0 && (1.0 - margin) * rate > c.last_rate[index(other(c.current))];
    c.slow_streak = slower_than_other ? c.slow_streak + 1 : 0;
    const bool in_round = made.call + 2 >= c.round_start && made.call <= last_trial(c);
    if (c.slow_streak >= slow_calls && !in_round && made.call >= c.last_round_end + first_interval) {
      c.round_start = made.call + 1;  // a round now: this path's speed changed
      c.round_best = rate;
      c.slow_streak = 0;
    }
  }

  /// The path the class of `step_bytes` uses now (trials aside).
  copy_path current(std::size_t step_bytes) const noexcept {
    return classes_[std::bit_width(step_bytes)].current;
  }

  /// For QCOLL_DEBUG=INFO: what `made` was and why.
  std::string describe(const copy_decision& made) const {
    const size_class& c = classes_[made.size_class];
    if (made.trial) return detail::format("outgoing blocks {}: a trial (call {} of its size class)", to_string(made.path), made.call);
    if (c.switches == 0 && c.rounds == 0) return detail::format("outgoing blocks {}: not yet measured", to_string(made.path));
    return detail::format("outgoing blocks {}: measured (last round: {} {:.3f} ns/B, {} {:.3f}; {} round(s), {} switch(es))",
                          to_string(made.path), to_string(c.last_trial_path), c.last_rate[index(c.last_trial_path)],
                          to_string(other(c.last_trial_path)), c.last_rate[index(other(c.last_trial_path))], c.rounds,
                          c.switches);
  }

 private:
  struct size_class {
    std::uint64_t calls = 0;
    std::uint64_t round_start = first_round;  ///< a round: trials at round_start … + trial_calls - 1
    std::uint64_t interval = first_interval;
    std::uint64_t last_round_end = 0;
    copy_path current = copy_path::staged;
    double round_best = infinity;  ///< the current path's best of the two calls before the round
    double trial_best = infinity;
    std::array<double, 2> last_rate{};  ///< each path's rate at the last round (0: none yet)
    copy_path last_trial_path = copy_path::peer_read;
    unsigned slow_streak = 0, rounds = 0, switches = 0;
  };
  static constexpr double infinity = std::numeric_limits<double>::infinity();

  static copy_path other(copy_path p) noexcept { return p == copy_path::staged ? copy_path::peer_read : copy_path::staged; }
  static std::size_t index(copy_path p) noexcept { return static_cast<std::size_t>(p); }
  static std::uint64_t last_trial(const size_class& c) noexcept { return c.round_start + trial_calls - 1; }

  void end_round(size_class& c, std::uint64_t call) noexcept {
    // The round's best against the two calls just before it: a longer history of the
    // current path would favour it.
    const double current_best = c.round_best;
    c.last_trial_path = other(c.current);
    c.last_rate[index(c.last_trial_path)] = c.trial_best;
    c.last_rate[index(c.current)] = current_best;
    ++c.rounds;
    if (current_best < infinity && c.trial_best < (1.0 - margin) * current_best) {
      c.current = other(c.current);
      ++c.switches;
      c.interval = first_interval;  // confirm the new path soon
    } else {  // the trial lost: check less often, much less when it lost by far
      const std::uint64_t growth = c.trial_best > far_slower * current_best ? 4 : 2;
      c.interval = std::min(c.interval * growth, longest_interval);
    }
    c.last_round_end = call;
    c.round_start = call + c.interval;
    c.round_best = c.trial_best = infinity;
    c.slow_streak = 0;
  }

  std::array<size_class, std::numeric_limits<std::size_t>::digits + 1> classes_{};
};

}  // namespace qcoll::tuning_copy
