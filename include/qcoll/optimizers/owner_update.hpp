#pragma once
/// @file
/// The stripe owner's optional step between the two phases of the compressed
/// allreduce (spec one-bit-exchange.md §7, step 3): the owner of a stripe applies an
/// update rule to the summed (or averaged) gradient of its stripe before re-encoding
/// it, so the rule's state — a momentum buffer, AdaGrad's sums of squares — is kept
/// for that stripe only: sharded, 1/n of it per rank, as the seed describes.
///
/// @code
/// qcoll::compressed_allreduce_plan plan(comm, count, qcoll::quantizers::one_bit{}, {},
///                                       qcoll::optimizers::momentum{.momentum = 0.9});
/// comm.allreduce(plan, std::span(gradients), qcoll::reduce_op::avg);
/// // gradients now holds the velocity: every rank steps parameters -= lr * gradients
/// @endcode
///
/// A rule is any copyable callable taking owner_update_args<T> with a member
/// `state_per_value()`. Its state is double-buffered like the residuals: a rule reads
/// the state after the last successful call and writes the next one in full, so a
/// failed call (or roll_back_last_call) leaves it as it was.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>

namespace qcoll {

/// What an update rule sees of one piece of the owner's stripe.
template <std::floating_point T>
struct owner_update_args {
  std::span<T> values;         ///< the summed (avg: averaged) gradient; replace it by what every rank gets
  std::span<const T> state;    ///< state_per_value() values per value, interleaved, after the last successful call
  std::span<T> next_state;     ///< the same layout: write every value
  std::size_t offset = 0;      ///< index of values[0] in the whole buffer (a fused plan: its tensors end to end)
  std::uint64_t call = 0;      ///< successful calls of the plan before this one
};

template <class Rule, class T>
concept owner_update_rule = std::floating_point<T> && std::copy_constructible<Rule> &&
                            requires(const Rule& rule, const owner_update_args<T>& args) {
                              { rule.state_per_value() } -> std::convertible_to<std::size_t>;
                              rule(args);
                            };

/// An update rule, or none (the default: the owner re-encodes the sum as it is).
template <std::floating_point T>
class owner_update {
 public:
  owner_update() = default;
  // Not for owner_update itself (checked first: asking whether it is a rule while
  // deciding how to copy it would recurse).
  template <class Rule>
    requires(!std::same_as<std::remove_cvref_t<Rule>, owner_update> && owner_update_rule<Rule, T>)
  owner_update(Rule rule)  // NOLINT: implicit, so a rule can be passed where an owner_update is expected
      : state_per_value_(rule.state_per_value()), rule_(std::move(rule)) {}

  explicit operator bool() const noexcept { return static_cast<bool>(rule_); }
  std::size_t state_per_value() const noexcept { return state_per_value_; }
  void operator()(const owner_update_args<T>& args) const { rule_(args); }

 private:
  std::size_t state_per_value_ = 0;
  std::function<void(const owner_update_args<T>&)> rule_;
};

}  // namespace qcoll

namespace qcoll::optimizers {

/// Momentum SGD's velocity: v ← μ·v + g; every rank gets v and steps by −lr·v.
struct momentum {
  double momentum = 0.9;

  static constexpr std::size_t state_per_value() noexcept { return 1; }
  template <std::floating_point T>
  void operator()(const owner_update_args<T>& a) const {
    const T mu = static_cast<T>(momentum);
    for (std::size_t i = 0; i < a.values.size(); ++i) {
      const T v = mu * a.state[i] + a.values[i];
      a.next_state[i] = v;
      a.values[i] = v;
    }
  }
};

/// AdaGrad's normalised gradient: s ← s + g², every rank gets g / (√s + ε) and
/// steps by −lr times it.
struct adagrad {
  double epsilon = 1e-8;

  static constexpr std::size_t state_per_value() noexcept { return 1; }
  template <std::floating_point T>
  void operator()(const owner_update_args<T>& a) const {
    const T eps = static_cast<T>(epsilon);
    for (std::size_t i = 0; i < a.values.size(); ++i) {
      const T g = a.values[i];
      const T s = a.state[i] + g * g;
      a.next_state[i] = s;
      a.values[i] = g / (std::sqrt(s) + eps);
    }
  }
};

}  // namespace qcoll::optimizers
