#pragma once
/// @file
/// Plans: the caller-owned objects a communicator runs a collective with, made once per
/// buffer. A plan owns what its calls reuse (its state, its requests, its buffers) and
/// is the handle of a call started without waiting.
///
/// - `allreduce_plan<P, Transport>` is the contract: what communicator::allreduce(plan, …)
///   and start_allreduce need of a plan. A communicator runs any model of it without
///   knowing its type, so a new plan touches no line of communicator.hpp.
/// - `plan_base<T, Work>` is what any plan builds on, quantized or not (a low-rank or
///   sparse compressor, say): the handle of a started call, a fused call's tensors and
///   their checks, the requests, one call as a unit that commits or leaves the plan as
///   it was, the roll back of the last call, and 16-bit values widened into `Work`
///   before the plan's algorithm and rounded once after it succeeded. qcoll's quantized
///   plans build on it through plan_handle<Q> (plan.hpp).

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/value_view.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/call_handle.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/request_storage.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/execution/memory.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll {

/// What a plan is checked against when a communicator runs it.
struct group_view {
  rank_t rank = 0;
  rank_t size = 1;
  std::span<const rank_t> ring_order;  ///< the topology's ring
  bool fully_linked = true;            ///< every pair of ranks is linked
};

/// The arguments of one call: `in` and `out`, or (a fused call, in place) `tensors`
/// laid end to end, and for a plan on device memory the caller's stream. A call
/// started without waiting keeps them until it runs.
template <element T>
struct plan_call {
  std::span<const T> in{};
  std::span<T> out{};
  std::span<const std::span<T>> tensors{};  ///< non-empty: a fused call over these, in place
  reduce_op op = reduce_op::sum;
  execution::device_entry device{};  ///< a plan on device memory: where its call is ordered

  bool fused() const noexcept { return !tensors.empty(); }
  /// How many values the call reduces.
  std::size_t count() const noexcept {
    std::size_t values = in.size();
    for (const std::span<T>& t : tensors) values += t.size();
    return values;
  }
};

/// What a communicator needs of a plan. The communicator numbers the call (its
/// message header carries `header_root()`, so ranks running different plans
/// disagree on the first message), runs the checks every plan shares (sizes,
/// overlap, sum or avg, `count()`), then the plan's own: `refuse_if_excluded`
/// throws for a rank that takes no part, without aborting; `check` fails the call
/// (through the primitives, aborting) when the plan was made for another rank, size
/// or topology; `check_tensors` does the same for a fused call's tensors (their
/// sizes against `tensor_sizes()`, and no two overlapping). `run` is the call itself:
/// it leaves the plan as it was if it fails, and commits on success. `queue_call`
/// records a started call and hands the progress thread its queue entry;
/// `queued_call` gives the arguments back.
template <class P, class Transport>
concept allreduce_plan =
    transport<Transport> &&
    requires(P& plan, const P& cplan, const group_view& group, algorithms::primitives<Transport>& step,
             const plan_call<typename P::value_type>& call, const char* what) {
      requires element<typename P::value_type>;
      { P::collective_kind } -> std::convertible_to<collective>;
      { cplan.count() } -> std::same_as<std::size_t>;
      { cplan.tensor_sizes() } -> std::same_as<std::span<const std::size_t>>;
      { cplan.header_root() } -> std::same_as<std::uint32_t>;
      { cplan.refuse_if_excluded(group) } -> std::same_as<void>;
      { cplan.check(step, group) } -> std::same_as<void>;
      { cplan.check_tensors(step, call.tensors) } -> std::same_as<void>;
      { plan.run(step, call) } -> std::same_as<void>;
      { cplan.require_idle(what) } -> std::same_as<void>;
      { plan.queue_call(call) } -> std::same_as<detail::pending_operation&>;
      { cplan.queued_call() } -> std::same_as<plan_call<typename P::value_type>>;
    };

/// Where a plan keeps its state and takes its buffers: `P::memory` where it says
/// (plan_handle's plans), else host memory.
template <class P>
inline constexpr execution::memory_space plan_memory = [] {
  if constexpr (requires { P::memory; }) return P::memory;
  else return execution::memory_space::host;
}();

/// One call of `plan` on `step`, which the communicator began for it (numbered, with
/// header_root() in its header), on a rank of `group`: the plan refuses a rank it
/// excludes, then come the checks every plan shares, the plan's own, and the call. (A
/// plan on device memory checks where its buffers are in its run: they must be on
/// its own device.)
template <class Plan, class Transport>
  requires allreduce_plan<Plan, Transport>
void run_plan_call(Plan& plan, algorithms::primitives<Transport>& step, const group_view& group,
                   const plan_call<typename Plan::value_type>& call) {
  plan.refuse_if_excluded(group);  // after begin: the rank's later collectives stay numbered like everyone's
  constexpr bool on_host = plan_memory<Plan> == execution::memory_space::host;
  if (call.fused()) {
    plan.check_tensors(step, call.tensors);
    if constexpr (on_host)
      for (const auto& tensor : call.tensors) execution::require_host(step, {{"a tensor", tensor}});
  } else {
    detail::check_same_or_disjoint(step, call.in, call.out);
    if constexpr (on_host) execution::require_host(step, {{"the input", call.in}, {"the output", call.out}});
  }
  if (call.op != reduce_op::sum && call.op != reduce_op::avg)
    step.fail(errc::invalid_argument, "a quantized allreduce sums or averages; {} is not supported",
              to_string(call.op));
  if (call.count() != plan.count()) step.fail(errc::invalid_argument, "the plan was made for {} elements", plan.count());
  plan.check(step, group);
  plan.run(step, call);
}

/// The part of a plan that does not depend on how it compresses (see the file comment).
///
/// T is the element type of the buffers a call takes; Work the type the plan's
/// algorithm computes in: T, or float for bfloat16 and float16, which a call widens
/// (exactly) into a float buffer the plan keeps and rounds into `out` once, after the
/// algorithm succeeded — so a failed call leaves `out` untouched.
///
/// A derived plan provides the rest of allreduce_plan (collective_kind, count(),
/// header_root(), refuse_if_excluded, check) and a run() that calls run_call with its
/// algorithm and its commit; its roll back calls roll_back with the undo of that commit.
template <element T, element Work = T>
  requires std::same_as<T, Work> || (half_element<T> && std::same_as<Work, float>)
class plan_base : public detail::call_handle {
 public:
  using value_type = T;
  /// What the plan's algorithm sees the values as.
  using work_type = Work;
  /// Whether a call widens its values into Work first.
  static constexpr bool widens = !std::same_as<T, Work>;

  plan_base(const plan_base&) = delete;
  plan_base& operator=(const plan_base&) = delete;

  /// Plans move (so one per layer fits in a std::vector) while no call is in flight.
  /// @throws qcoll::error (invalid_argument) when one is.
  plan_base(plan_base&& other)
      : call_handle((other.require_idle("move"), std::move(other))),
        tensor_sizes_(std::move(other.tensor_sizes_)),
        tensor_starts_(std::move(other.tensor_starts_)),
        by_address_(std::move(other.by_address_)),
        widened_(std::move(other.widened_)),
        requests_(std::move(other.requests_)),
        can_roll_back_(other.can_roll_back_) {}
  plan_base& operator=(plan_base&& other) {
    require_idle("move");
    other.require_idle("move");
    tensor_sizes_ = std::move(other.tensor_sizes_);
    tensor_starts_ = std::move(other.tensor_starts_);
    by_address_ = std::move(other.by_address_);
    widened_ = std::move(other.widened_);
    requests_ = std::move(other.requests_);
    can_roll_back_ = other.can_roll_back_;
    return *this;
  }

  // ---- what a communicator uses (allreduce_plan) ----
  // (in_flight, test, wait and require_idle: call_handle's, the handle of a call
  // started with communicator::start_allreduce)

  /// The sizes of the tensors a fused call takes, laid end to end (one: count()).
  std::span<const std::size_t> tensor_sizes() const noexcept { return tensor_sizes_; }

  /// Fails a fused call whose tensors do not have the plan's sizes, or overlap.
  template <transport Transport>
  void check_tensors(algorithms::primitives<Transport>& step, std::span<const std::span<T>> tensors) const {
    if (tensors.size() != tensor_sizes_.size())
      step.fail(errc::invalid_argument, "{} tensors for a plan made for {}", tensors.size(), tensor_sizes_.size());
    for (std::size_t k = 0; k < tensors.size(); ++k)
      if (tensors[k].size() != tensor_sizes_[k])
        step.fail(errc::invalid_argument, "tensor {} has {} elements, the plan was made for {}", k, tensors[k].size(),
                  tensor_sizes_[k]);
    // Sorted by address, neighbours must not overlap (the scratch is sized at construction).
    std::pair<const T*, std::size_t>* first = by_address_.data();
    std::size_t listed = 0;
    for (const std::span<T>& t : tensors)
      if (!t.empty()) first[listed++] = {t.data(), t.size()};
    std::sort(first, first + listed, [](const auto& a, const auto& b) { return std::less<>()(a.first, b.first); });
    for (std::size_t k = 1; k < listed; ++k)
      if (!std::less<>()(first[k - 1].first + first[k - 1].second - 1, first[k].first))
        step.fail(errc::invalid_argument, "two of the {} tensors overlap", tensors.size());
  }

  /// Records a call started without waiting and hands the progress thread its entry.
  detail::pending_operation& queue_call(const plan_call<T>& call) {
    queued_ = call;
    return operation();
  }
  plan_call<T> queued_call() const noexcept { return queued_; }

 protected:
  /// A plan whose calls take tensors of these sizes, laid end to end (one: a plain
  /// call's count). `widen_here`: keep the float buffer a 16-bit call widens into (a
  /// plan that widens elsewhere, on a device, says false).
  plan_base(const char* name, std::span<const std::size_t> tensor_sizes, bool widen_here = true)
      : call_handle(name), tensor_sizes_(tensor_sizes.begin(), tensor_sizes.end()), by_address_(tensor_sizes.size()) {
    tensor_starts_.assign(1, 0);
    for (const std::size_t size : tensor_sizes_) tensor_starts_.push_back(tensor_starts_.back() + size);
    if constexpr (widens)
      if (widen_here) widened_.assign(tensor_starts_.back(), Work{});
  }
  /// Waits for a call still in flight (its buffers and the plan's state are in use).
  ~plan_base() { finish_in_flight(); }

  /// Where each tensor of a fused call starts, laid end to end, and the total last.
  std::span<const std::size_t> tensor_starts() const noexcept { return tensor_starts_; }

  /// `n` requests of the transport's type, kept between calls.
  template <transport Transport>
  std::span<typename Transport::request> requests(std::size_t n) {
    return requests_.template get<typename Transport::request>(n);
  }

  /// One call on host memory, as a unit: `algorithm(in, out)` runs on the call's
  /// values as Work (value_views; a 16-bit call's widened copy, in place); if it
  /// throws, the `posted` requests are taken back and nothing is committed (a 16-bit
  /// call's `out` untouched); once it returned, `commit()` makes the call's staged
  /// state the plan's, the call can be rolled back, and a 16-bit call's result is
  /// rounded into `out`.
  template <transport Transport, class Algorithm, class Commit>
  void run_call(algorithms::primitives<Transport>& step, const plan_call<T>& call,
                std::span<typename Transport::request> posted, Algorithm&& algorithm, Commit&& commit) {
    using algorithms::value_view;
    const std::size_t count = call.fused() ? tensor_starts_.back() : call.in.size();
    const std::span<const std::size_t> starts = std::span(tensor_starts_).first(call.tensors.size());
    run_as_unit(step, posted, [&] {
      if constexpr (widens) {
        if (widened_.size() < count)  // a derived plan that passed another count, or a moved-from plan
          step.fail(errc::invalid_argument, "the plan holds {} values, the call has {}", widened_.size(), count);
        const std::span<Work> widened = std::span<Work>(widened_).first(count);
        if (call.fused())
          for (std::size_t k = 0; k < call.tensors.size(); ++k)
            execution::widen(std::span<const T>(call.tensors[k]), widened.subspan(starts[k], call.tensors[k].size()));
        else
          execution::widen(call.in, widened);
        algorithm(value_view<const Work>(widened), value_view<Work>(widened));
      } else if (call.fused()) {
        algorithm(value_view<const T>(call.tensors, starts), value_view<T>(call.tensors, starts));
      } else {
        algorithm(value_view<const T>(call.in), value_view<T>(call.out));
      }
    }, commit);
    if constexpr (widens) {
      const std::span<const Work> widened = std::span<const Work>(widened_).first(count);
      if (call.fused())
        for (std::size_t k = 0; k < call.tensors.size(); ++k)
          execution::narrow(widened.subspan(starts[k], call.tensors[k].size()), call.tensors[k]);
      else
        execution::narrow(widened, call.out);
    }
  }

  /// The unit run_call makes of a call, for a plan that moves its values itself (on a
  /// device): `body()`; on failure the `posted` requests taken back, `on_failure()`,
  /// nothing committed; else `commit()`, and the call can be rolled back.
  template <transport Transport, class Body, class Commit, class OnFailure = void (*)()>
  void run_as_unit(algorithms::primitives<Transport>& step, std::span<typename Transport::request> posted,
                   Body&& body, Commit&& commit, OnFailure&& on_failure = [] {}) {
    can_roll_back_ = false;  // the state the last call left staged is about to be overwritten
    try {
      body();
    } catch (const std::system_error& e) {
      step.abandon(posted, e);
      on_failure();
      throw;
    }
    commit();
    can_roll_back_ = true;
  }

  /// Undoes the last successful call's commit with `undo()`, once.
  /// @throws qcoll::error (invalid_argument) when there is no call to roll back (none
  /// yet, already rolled back, or forgotten since) or the plan is in flight.
  template <class Undo>
  void roll_back(const char* what, Undo&& undo) {
    require_idle(what);
    if (!can_roll_back_) detail::throw_error(errc::invalid_argument, "{}::{}: no successful call to roll back", name(), what);
    undo();
    can_roll_back_ = false;
  }
  /// The last call can no longer be rolled back (the state it staged was reset).
  void forget_last_call() noexcept { can_roll_back_ = false; }

  /// The arguments of the started call, for a derived queue_call that adds to them.
  plan_call<T>& queued() noexcept { return queued_; }

 private:
  std::vector<std::size_t> tensor_sizes_;   // of a fused call; one, count(), otherwise
  std::vector<std::size_t> tensor_starts_;  // their starts laid end to end, and the total
  mutable std::vector<std::pair<const T*, std::size_t>> by_address_;  // check_tensors' scratch
  std::vector<Work> widened_;  // 16-bit calls: the call's values in Work
  detail::request_storage requests_;
  bool can_roll_back_ = false;
  plan_call<T> queued_{};  // read by the progress thread
};

}  // namespace qcoll
