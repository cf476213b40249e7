#pragma once
/// @file
/// adaptive_allreduce: exact or compressed, chosen per bucket from measurements (seed
/// 000's claim 7 sizes the job from measured compute and communication times; this
/// chooses the exchange the same way). Its first calls are probes: they run the exact
/// allreduce and the compressed plan at each candidate chunk size, in turn, each timed
/// after a barrier; then every rank takes the slowest rank's time of each candidate
/// (an allreduce of the times, so all ranks choose alike) and keeps the fastest —
/// but a lossy exchange must earn its loss: compressed is chosen only when it is at
/// least `required_speedup` times faster than exact (default 1.2).
///
/// @code
/// qcoll::adaptive_allreduce bucket(comm, gradients.size(), qcoll::quantizers::one_bit{});
/// for (step …) bucket.allreduce(std::span(gradients), qcoll::reduce_op::avg);
/// bucket.explanation();  // "4194304 bytes: compressed (one_bit, chunk 256K): 23.9 ms against exact 233.5 ms …"
/// @endcode
///
/// It measures the candidates themselves, end to end, rather than a model of them (link
/// rate, encode and decode rates): on a real job those interact — a CPU-bound encode
/// slows the transport's progress, a loaded link hides the encode — and the end-to-end
/// time is what the choice is for. The rates it implies are in the explanation.
///
/// No gradient mass is lost to the probing: when the compressed plans that lose (or
/// all of them, when exact wins) still hold residuals, their mass (add_residual_mass)
/// is added to this rank's next contribution, once. Overrides: options.choice, or
/// QCOLL_COMPRESSION=exact|compressed|auto in the environment (it wins over the
/// options). QCOLL_DEBUG=INFO writes the explanation once, when the choice is made.
/// docs/compressed-allreduce.md, "Exact or compressed".

#include <qcoll/collective_handle.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/log.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qcoll {

/// What an adaptive_allreduce runs.
enum class compression_choice : std::uint8_t {
  automatic,   ///< measure the candidates over the first calls, then keep the fastest
  exact,       ///< always the exact allreduce
  compressed,  ///< always the compressed plan (the first chunk candidate)
};

struct adaptive_allreduce_options {
  compression_choice choice = compression_choice::automatic;
  /// Timed calls of each candidate before choosing (the best of them counts).
  std::size_t probe_rounds = 2;
  /// The compressed plan's chunk sizes to try (values); empty: the library's default.
  std::vector<std::size_t> chunk_candidates{};
  /// How many times faster than exact the best compressed candidate must be to be
  /// chosen: compression costs accuracy, so a tie goes to exact. 1.2, because single
  /// small-bucket timings on a busy 2-core host move by 10–30 % (4 KiB on shm: 18 µs
  /// compressed against 20 µs exact in one run, examples/compression_choice).
  double required_speedup = 1.2;
};

/// The choice QCOLL_COMPRESSION names (exact, compressed, auto), or none when unset.
/// @throws qcoll::error (invalid_argument) for another value, naming the variable.
inline std::optional<compression_choice> compression_choice_from_environment() {
  const char* value = std::getenv("QCOLL_COMPRESSION");
  if (value == nullptr || *value == '\0') return std::nullopt;
  if (std::strcmp(value, "exact") == 0) return compression_choice::exact;
  if (std::strcmp(value, "compressed") == 0) return compression_choice::compressed;
  if (std::strcmp(value, "auto") == 0) return compression_choice::automatic;
  detail::throw_error(errc::invalid_argument, "QCOLL_COMPRESSION is exact, compressed or auto, not '{}'", value);
}

/// An allreduce of `count` values of Q's type on one rank of `comm` that is exact or
/// compressed (through Q), whichever measured faster. Every rank must make the same
/// calls in the same order (as with any collective); the choice is the same on every
/// rank. Calls may be started without waiting once the choice is made (the probes
/// themselves block: they are timed). The communicator must outlive it.
template <class Communicator, quantizer Q>
class adaptive_allreduce {
 public:
  using value_type = typename Q::value_type;
  using clock = std::chrono::steady_clock;

  /// @throws qcoll::error (invalid_argument) for probe_rounds 0, a chunk candidate 0,
  /// or a bad QCOLL_COMPRESSION.
  adaptive_allreduce(Communicator& comm, std::size_t count, Q quantizer = Q{}, adaptive_allreduce_options options = {})
      : comm_(comm), count_(count) {
    choice_ = compression_choice_from_environment().value_or(options.choice);
    if (options.probe_rounds == 0)
      detail::throw_error(errc::invalid_argument, "adaptive_allreduce: probe_rounds must be positive");
    if (!(options.required_speedup > 0))
      detail::throw_error(errc::invalid_argument, "adaptive_allreduce: required_speedup must be positive");
    required_speedup_ = options.required_speedup;
    std::vector<std::size_t> chunks = options.chunk_candidates;
    if (chunks.empty()) chunks.push_back(compressed_allreduce_options::host_chunk_values);
    if (choice_ == compression_choice::compressed) chunks.resize(1);
    if (choice_ == compression_choice::exact) chunks.clear();
    for (const std::size_t chunk : chunks) {
      if (chunk == 0) detail::throw_error(errc::invalid_argument, "adaptive_allreduce: a chunk candidate of 0 values");
      plans_.emplace_back(comm, count, quantizer, compressed_allreduce_options{.chunk_values = chunk});
    }
    rounds_ = options.probe_rounds;
    if (choice_ == compression_choice::automatic) {
      seconds_.assign(candidates() * rounds_, std::numeric_limits<double>::infinity());
    } else {
      chosen_ = choice_ == compression_choice::exact ? exact_candidate : 0;
      explanation_ = qcoll::detail::format("{} bytes: {} (set by {})", count_ * sizeof(value_type), describe(*chosen_),
                                 compression_choice_from_environment() ? "QCOLL_COMPRESSION" : "the options");
    }
  }

  adaptive_allreduce(const adaptive_allreduce&) = delete;
  adaptive_allreduce& operator=(const adaptive_allreduce&) = delete;

  std::size_t count() const noexcept { return count_; }
  /// Whether the choice is made (after the probes, or at once when not automatic).
  bool decided() const noexcept { return chosen_.has_value(); }
  /// Whether calls now run compressed (false until decided).
  bool compressed() const noexcept { return chosen_ && *chosen_ != exact_candidate; }
  /// The chosen compressed plan's chunk size in values (0: exact, or not decided).
  std::size_t chunk_values() const noexcept { return compressed() ? plans_[*chosen_].chunk_values() : 0; }
  /// One line: the bucket, the choice, and the measurements behind it (empty before).
  const std::string& explanation() const noexcept { return explanation_; }

  /// Adds to `into` (count() values) the gradient mass this rank still owes: the
  /// compressed plans' residuals (compressed_allreduce_plan::add_residual_mass) and
  /// the probes' leftover not yet added to a call. What a new bucket on a new
  /// communicator needs to take this one over (docs/recovery.md).
  void add_residual_mass(std::span<value_type> into, reduce_op op = reduce_op::sum) const {
    if (into.size() != count_)
      detail::throw_error(errc::invalid_argument, "adaptive_allreduce::add_residual_mass: {} values for {}",
                          into.size(), count_);
    for (const auto& plan : plans_) plan.add_residual_mass(into, op);
    for (std::size_t i = 0; i < carry_.size(); ++i) into[i] += carry_[i];
  }

  /// out = the sum (or average) over all ranks, exactly or through Q (then with error
  /// feedback, bitwise identical on every rank). `in` and `out` have count() values
  /// and are the same range or disjoint.
  /// @par Errors
  /// As communicator::allreduce and the compressed plan's allreduce.
  void allreduce(std::span<const value_type> in, std::span<value_type> out, reduce_op op) {
    check_call("allreduce", in, out);
    if (!chosen_) return probe(in, out, op);
    run(*chosen_, with_carry(in, out), out, op);
  }
  void allreduce(std::span<value_type> data, reduce_op op) {
    allreduce(std::span<const value_type>(data), data, op);
  }

  /// The same call started on the communicator's progress thread: after the choice,
  /// it returns at once and wait() finishes it (`in` and `out` untouched until then);
  /// while probing, it runs the probe to completion before returning (a probe is
  /// timed), and wait() returns at once.
  /// @par Errors
  /// invalid_argument at once for a call still in flight; the call's own errors from
  /// wait() (a probe's from here).
  void start_allreduce(std::span<const value_type> in, std::span<value_type> out, reduce_op op) {
    check_call("start_allreduce", in, out);
    if (!chosen_) return probe(in, out, op);  // timed, so run to the end
    const std::span<const value_type> contribution = with_carry(in, out);
    if (*chosen_ == exact_candidate)
      comm_.start_allreduce(contribution, out, op, exact_call_);
    else
      comm_.start_allreduce(plans_[*chosen_], contribution, out, op);
    started_ = true;
  }
  void start_allreduce(std::span<value_type> data, reduce_op op) {
    start_allreduce(std::span<const value_type>(data), data, op);
  }
  /// Whether a started call is still running.
  bool in_flight() const noexcept {
    return exact_call_.in_flight() || (compressed() && plans_[*chosen_].in_flight());
  }
  /// Finishes the started call (returns at once when none was started since the
  /// last wait). @throws what the call failed with.
  void wait() {
    if (!started_) return;
    started_ = false;
    if (compressed())
      plans_[*chosen_].wait();
    else
      exact_call_.wait();
  }

 private:
  static constexpr std::size_t exact_candidate = std::numeric_limits<std::size_t>::max();

  /// The checks every call makes: sizes, and no call in flight.
  void check_call(const char* what, std::span<const value_type> in, std::span<value_type> out) const {
    if (in.size() != count_ || out.size() != count_)
      detail::throw_error(errc::invalid_argument, "adaptive_allreduce::{}: {} and {} values for a bucket of {}", what,
                          in.size(), out.size(), count_);
    if (in_flight()) detail::throw_error(errc::invalid_argument, "adaptive_allreduce::{}: a call is in flight", what);
  }

  /// This call's contribution: `in`, or, once after the choice, `in` plus the probes'
  /// leftover residual mass, written into `out` (the call then runs in place on it).
  std::span<const value_type> with_carry(std::span<const value_type> in, std::span<value_type> out) {
    if (carry_.empty()) return in;
    if (in.data() != out.data()) std::copy(in.begin(), in.end(), out.begin());
    for (std::size_t i = 0; i < count_; ++i) out[i] += carry_[i];
    carry_.clear();
    carry_.shrink_to_fit();
    return out;
  }

  /// Candidates: the compressed plans 0 … k − 1, then exact.
  std::size_t candidates() const noexcept { return plans_.size() + 1; }
  std::size_t candidate(std::size_t index) const noexcept {
    return index == plans_.size() ? exact_candidate : index;
  }

  void run(std::size_t which, std::span<const value_type> in, std::span<value_type> out, reduce_op op) {
    if (which == exact_candidate) return comm_.allreduce(in, out, op);
    comm_.allreduce(plans_[which], in, out, op);
  }

  /// Probe call k runs candidate k mod candidates() (exact last), timed after a barrier.
  void probe(std::span<const value_type> in, std::span<value_type> out, reduce_op op) {
    const std::size_t index = probes_ % candidates();
    const std::size_t round = probes_ / candidates();
    comm_.barrier();
    const auto start = clock::now();
    run(candidate(index), in, out, op);
    seconds_[index * rounds_ + round] = std::chrono::duration<double>(clock::now() - start).count();
    last_op_ = op;
    // Counted only once the choice is made: if deciding fails (the communicator did),
    // the next call repeats the last probe and decides again.
    if (probes_ + 1 == candidates() * rounds_) decide();
    ++probes_;
  }

  void decide() {
    // The slowest rank's time of each probe, the same numbers on every rank.
    comm_.allreduce(std::span<double>(seconds_), reduce_op::max);
    std::vector<double> best(candidates(), std::numeric_limits<double>::infinity());
    for (std::size_t c = 0; c < candidates(); ++c)
      for (std::size_t r = 0; r < rounds_; ++r) best[c] = std::min(best[c], seconds_[c * rounds_ + r]);
    const std::size_t fastest_compressed =
        static_cast<std::size_t>(std::min_element(best.begin(), best.end() - 1) - best.begin());
    const bool compress = best.back() >= required_speedup_ * best[fastest_compressed];
    chosen_ = compress ? fastest_compressed : exact_candidate;
    for (std::size_t p = 0; p < plans_.size(); ++p) {
      if (p == *chosen_) continue;
      if (carry_.empty()) carry_.assign(count_, value_type{});
      plans_[p].add_residual_mass(std::span<value_type>(carry_), last_op_);
      plans_[p].reset_residuals();
    }
    explain(best);
    // Only the chosen plan is kept: the others' memory goes back.
    if (*chosen_ != exact_candidate) {
      std::vector<compressed_allreduce_plan<Q>> kept;
      kept.push_back(std::move(plans_[*chosen_]));
      plans_ = std::move(kept);
      chosen_ = 0;
    } else {
      plans_.clear();
    }
  }

  std::string describe(std::size_t which) const {
    if (which == exact_candidate) return "exact";
    return qcoll::detail::format("compressed ({}, chunk {})", Q::name, plans_[which].chunk_values());
  }

  void explain(const std::vector<double>& best) {
    const double bytes = static_cast<double>(count_ * sizeof(value_type));
    const double exact = best.back();
    std::string others;
    for (std::size_t c = 0; c < candidates(); ++c) {
      if (candidate(c) == *chosen_) continue;
      others += qcoll::detail::format("{}{} {:.3f} ms", others.empty() ? "" : ", ", describe(candidate(c)), best[c] * 1e3);
    }
    const double chosen_seconds = best[*chosen_ == exact_candidate ? plans_.size() : *chosen_];
    explanation_ = qcoll::detail::format(
        "{} bytes: {}: {:.3f} ms against {} (best of {} timed calls each; exact moves {:.2f} GB/s of the bucket; "
        "compressed must be {:.2f}x faster)",
        count_ * sizeof(value_type), describe(*chosen_), chosen_seconds * 1e3, others.empty() ? "nothing" : others,
        rounds_, exact > 0 ? bytes / exact / 1e9 : 0.0, required_speedup_);
    if (detail::debug_info_enabled())
      detail::log_info("qcoll: rank {} of {}: adaptive allreduce of {}", comm_.rank(), comm_.size(), explanation_);
  }

  Communicator& comm_;
  std::size_t count_;
  compression_choice choice_ = compression_choice::automatic;
  std::vector<compressed_allreduce_plan<Q>> plans_;  // the compressed candidates; after deciding, the chosen one
  std::size_t rounds_ = 1;
  double required_speedup_ = 1.2;
  std::size_t probes_ = 0;
  std::vector<double> seconds_;  // [candidate · rounds + round]
  std::optional<std::size_t> chosen_;
  reduce_op last_op_ = reduce_op::sum;
  std::vector<value_type> carry_;  // residual mass of the plans not chosen, for the next call
  std::string explanation_;
  collective_handle exact_call_;  // a started exact call
  bool started_ = false;          // a call was started and not waited for
};

template <class Communicator, class Q, class... Rest>
adaptive_allreduce(Communicator&, std::size_t, Q, Rest&&...) -> adaptive_allreduce<Communicator, Q>;

}  // namespace qcoll
