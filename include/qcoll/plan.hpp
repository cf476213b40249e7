#pragma once
/// @file
/// Plans: the caller-owned objects a communicator runs a quantized collective with.
/// A plan is made once per buffer; it owns the residuals (error feedback), the frame
/// buffers, its requests and its compiled schedule, and it is the handle of a call
/// started without waiting.
///
/// - `allreduce_plan<P, Transport>` is the contract: what communicator::allreduce(plan, …)
///   and start_allreduce need of a plan. A communicator runs any model of it without
///   knowing its type, so a new plan touches no line of communicator.hpp.
/// - `plan_handle<Q>` is what both of qcoll's plans share, and what a new quantized
///   plan derives from: it runs the plan's quantized_schedule, commits or rolls back
///   the residuals, and is the handle users wait on. A derived plan compiles its
///   schedule, checks it against a communicator and says what its header carries.

#include <qcoll/algorithms/device_schedule.hpp>
#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/quantized_schedule.hpp>
#include <qcoll/core/archetypes.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/call_handle.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/progress_thread.hpp>
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
#include <string>
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

/// The element types a plan over quantizer Q takes: Q's own, or a 16-bit type when
/// Q works in float (the plan widens, reduces through Q in float, rounds once).
template <class T, class Q>
concept plan_element =
    std::same_as<T, typename Q::value_type> || (half_element<T> && std::same_as<typename Q::value_type, float>);

/// The part every quantized plan shares: its state (quantizer, schedule, residuals,
/// frame buffers), its requests, the commit and roll-back of residuals, and the
/// handle of a call started with communicator::start_allreduce.
///
/// T is the element type of the buffers a call takes. For bfloat16 and float16 the
/// call widens `in` (exactly) into a float buffer the plan keeps, runs the float
/// schedule on it in place, and rounds the result into `out` once, after it
/// succeeded: the result is the float plan's on the widened input, rounded once,
/// residuals stay float, and a failed call leaves `out` untouched.
///
/// Space is where the plan keeps its state and takes its buffers: host memory, or
/// device memory (execution::device_space: a plan made with a device_stream, whose
/// calls take a device_stream and buffers on the same device; algorithms/
/// device_schedule.hpp). A plan on device memory always works in a device buffer of
/// its own, so a failed call leaves `out` untouched whatever T is.
template <quantizer Q, plan_element<Q> T = typename Q::value_type,
          execution::memory_space_tag Space = execution::host_space>
class plan_handle : public detail::call_handle {
 public:
  using quantizer_type = Q;
  using value_type = T;
  /// The type the quantizer computes in and residuals are kept in.
  using residual_type = typename Q::value_type;
  /// Where the state lives and the buffers a call takes.
  static constexpr execution::memory_space memory = Space::value;
  static constexpr bool on_device = memory == execution::memory_space::device;

  plan_handle(const plan_handle&) = delete;
  plan_handle& operator=(const plan_handle&) = delete;

  /// Plans move (so one per layer fits in a std::vector) while no call is in flight.
  /// @throws qcoll::error (invalid_argument) when one is.
  plan_handle(plan_handle&& other)
      : call_handle((other.require_idle("move"), std::move(other))),
        state_(std::move(other.state_)),
        tensor_sizes_(std::move(other.tensor_sizes_)),
        tensor_starts_(std::move(other.tensor_starts_)),
        by_address_(std::move(other.by_address_)),
        widened_(std::move(other.widened_)),
        requests_(std::move(other.requests_)),
        can_roll_back_(other.can_roll_back_) {}
  plan_handle& operator=(plan_handle&& other) {
    require_idle("move");
    other.require_idle("move");
    state_ = std::move(other.state_);
    tensor_sizes_ = std::move(other.tensor_sizes_);
    tensor_starts_ = std::move(other.tensor_starts_);
    by_address_ = std::move(other.by_address_);
    widened_ = std::move(other.widened_);
    requests_ = std::move(other.requests_);
    can_roll_back_ = other.can_roll_back_;
    return *this;
  }

  const Q& quantizer() const noexcept { return state_.quantizer; }
  /// What the last call moved, as counted while it ran (a failed one: until it failed).
  const call_statistics& last_call() const noexcept { return state_.last_call; }

  /// Puts the residuals back as they were before the last successful call, once.
  /// A failure can reach ranks at different points: a rank that already had every
  /// frame it needed completes while another fails. To repeat the step everywhere,
  /// the ranks whose call succeeded roll it back (the failed ones kept their
  /// residuals), then all call again on a new communicator.
  /// @par Errors
  /// qcoll::error (invalid_argument) when there is no call to roll back (none
  /// yet, already rolled back, or reset since) or the plan is in flight.
  void roll_back_last_call() {
    require_idle("roll_back_last_call");
    if (!can_roll_back_)
      detail::throw_error(errc::invalid_argument, "{}::roll_back_last_call: no successful call to roll back", name());
    // The previous residuals are intact in the staging buffers until the next call.
    state_.committed = 1 - state_.committed;
    --state_.calls;
    can_roll_back_ = false;
  }

  /// The owner's update-rule state for this rank's stripe after the last successful
  /// call (state_per_value() values per value, interleaved; empty without a rule).
  std::span<const residual_type> owner_state() const noexcept { return state_.owner_state[state_.committed]; }

  /// Forgets every residual (say, after the model was reloaded), and the quantizer's
  /// memory of previous encodes if it keeps one; the owner's update-rule state stays.
  void reset_residuals() {
    require_idle("reset_residuals");
    if constexpr (on_device) {
      for (auto& r : state_.residual) state_.fill(r.span(), residual_type{});
    } else {
      for (auto& r : state_.residual) std::fill(r.begin(), r.end(), residual_type{});
    }
    state_.forget_memory();
    can_roll_back_ = false;
  }

  /// Forgets the owner's update-rule state (a new optimizer).
  void reset_owner_state() {
    require_idle("reset_owner_state");
    for (auto& s : state_.owner_state) std::fill(s.begin(), s.end(), residual_type{});
    can_roll_back_ = false;
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

  /// Runs one call of the schedule. On failure every rank hears of it (the
  /// communicator is aborted), the requests still posted are taken back, and the
  /// residuals stay as they were; on success the staged residuals become the
  /// committed ones.
  template <transport Transport>
  void run(algorithms::primitives<Transport>& step, const plan_call<value_type>& call) {
    if constexpr (on_device) run_on_device(step, call);
    else run_on_host(step, call);
  }

 private:
  template <transport Transport>
  void run_on_host(algorithms::primitives<Transport>& step, const plan_call<value_type>& call) {
    using algorithms::value_view;
    const std::span<typename Transport::request> requests =
        requests_.template get<typename Transport::request>(state_.schedule.requests);
    can_roll_back_ = false;  // the staging residuals are about to be overwritten
    const std::size_t count = call.fused() ? tensor_starts_.back() : call.in.size();
    try {
      if constexpr (half_element<T>) {
        if (widened_.size() < count)  // a derived plan that passed another count, or a moved-from plan
          step.fail(errc::invalid_argument, "the plan holds {} values, the call has {}", widened_.size(), count);
        const std::span<float> widened = std::span<float>(widened_).first(count);
        if (call.fused())
          for (std::size_t k = 0; k < call.tensors.size(); ++k)
            execution::widen(std::span<const T>(call.tensors[k]), widened.subspan(tensor_starts_[k], call.tensors[k].size()));
        else
          execution::widen(call.in, widened);
        algorithms::run_schedule(step, state_, requests, value_view<const float>(widened), value_view<float>(widened),
                                 call.op);
      } else if (call.fused()) {
        const std::span<const std::size_t> starts = std::span(tensor_starts_).first(call.tensors.size());
        algorithms::run_schedule(step, state_, requests, value_view<const T>(call.tensors, starts),
                                 value_view<T>(call.tensors, starts), call.op);
      } else {
        algorithms::run_schedule(step, state_, requests, value_view<const T>(call.in), value_view<T>(call.out),
                                 call.op);
      }
    } catch (const std::system_error& e) {
      step.abandon(requests, e);
      throw;
    }
    state_.committed = 1 - state_.committed;
    ++state_.calls;
    can_roll_back_ = true;
    if constexpr (half_element<T>) {
      const std::span<const float> widened = std::span<const float>(widened_).first(count);
      if (call.fused())
        for (std::size_t k = 0; k < call.tensors.size(); ++k)
          execution::narrow(widened.subspan(tensor_starts_[k], call.tensors[k].size()), call.tensors[k]);
      else
        execution::narrow(widened, call.out);
    }
  }

  /// run() on device memory: checks the buffers once (on the plan's device), orders the
  /// plan's stream after the caller's, copies (widens) the input into the work buffer,
  /// runs the schedule there, and only once it succeeded copies (rounds) the result out
  /// and commits; the caller's stream then waits for the result, and so does the host.
  template <transport Transport>
  void run_on_device(algorithms::primitives<Transport>& step, const plan_call<value_type>& call) {
    const std::span<typename Transport::request> requests =
        requests_.template get<typename Transport::request>(state_.schedule.requests);
    can_roll_back_ = false;  // the staging residuals are about to be overwritten
    const device::runtime& runtime = *state_.runtime;
    const device::stream_handle stream = state_.stream.get();
    int ordinal = call.device.ordinal;
    if (ordinal < 0 && runtime.stream_device(call.device.where.stream, &ordinal) != 0)
      step.fail(errc::invalid_argument, "the call's stream is not a stream of the {} device runtime", runtime.name);
    if (ordinal != state_.ordinal)
      step.fail(errc::invalid_argument, "the call's stream is on device {}, the plan's state on device {}", ordinal,
                state_.ordinal);
    if (call.fused()) {
      for (const std::span<T>& tensor : call.tensors) execution::require_device(step, runtime, ordinal, {{"a tensor", tensor}});
    } else {
      execution::require_device(step, runtime, ordinal, {{"the input", call.in}, {"the output", call.out}});
    }
    const auto queued = [&](int code, const char* what) {
      if (code != 0)
        step.fail(errc::device_error, "{}: {} error {}: {}", what, runtime.name, code, runtime.error_string(code));
    };
    // Values in T at `from` into the work buffer at `at` (widened), and back (rounded).
    const auto load = [&](const T* from, std::size_t at, std::size_t n) {
      if (n == 0) return;
      residual_type* into = state_.work.data() + at;
      if constexpr (half_element<T>) queued(runtime.widen(dtype_of<T>::value, from, into, n, stream), "widening the input");
      else queued(runtime.copy(into, from, n * sizeof(T), stream), "copying the input");
    };
    const auto store = [&](T* to, std::size_t at, std::size_t n) {
      if (n == 0) return;
      const residual_type* from = state_.work.data() + at;
      if constexpr (half_element<T>) queued(runtime.narrow(dtype_of<T>::value, from, to, n, stream), "rounding the result");
      else queued(runtime.copy(to, from, n * sizeof(T), stream), "copying the result");
    };
    try {
      if (call.device.ready) {
        queued(runtime.stream_wait(stream, call.device.ready), "ordering the call after its start");
      } else {
        queued(runtime.event_record(state_.entry.get(), call.device.where.stream), "ordering the call after the stream");
        queued(runtime.stream_wait(stream, state_.entry.get()), "ordering the call after the stream");
      }
      if (call.fused()) {
        for (std::size_t k = 0; k < call.tensors.size(); ++k)
          load(call.tensors[k].data(), tensor_starts_[k], call.tensors[k].size());
      } else {
        load(call.in.data(), 0, call.in.size());
      }
      algorithms::run_schedule(step, state_, requests, call.op);
      if (call.fused()) {
        for (std::size_t k = 0; k < call.tensors.size(); ++k)
          store(call.tensors[k].data(), tensor_starts_[k], call.tensors[k].size());
      } else {
        store(call.out.data(), 0, call.out.size());
      }
      queued(runtime.event_record(state_.exit.get(), stream), "copying the result");
      if (!call.device.ready)
        queued(runtime.stream_wait(call.device.where.stream, state_.exit.get()), "ordering the stream after the call");
      queued(runtime.event_synchronize(state_.exit.get()), "copying the result");
    } catch (const std::system_error& e) {
      step.abandon(requests, e);
      runtime.synchronize(stream);  // nothing of the call runs on after it failed
      throw;
    }
    state_.committed = 1 - state_.committed;
    ++state_.calls;
    can_roll_back_ = true;
  }

 public:
  detail::pending_operation& queue_call(const plan_call<value_type>& call) {
    queued_ = call;
    if constexpr (on_device) {
      // The call runs after the work queued on its stream before the start: an event
      // recorded there now. Refused here (not started) when it cannot be.
      const device::runtime& runtime = *state_.runtime;
      queued_.device.ordinal = -1;
      if (runtime.stream_device(call.device.where.stream, &queued_.device.ordinal) != 0)
        qcoll::detail::throw_error(errc::invalid_argument, "{}::start: the stream is not a stream of the {} device runtime",
                                   name(), runtime.name);
      if (queued_.device.ordinal != state_.ordinal)
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "{}::start: the stream is on device {}, the plan's state on device {}", name(),
                                   queued_.device.ordinal, state_.ordinal);
      execution::check_device(runtime, runtime.event_record(state_.ready.get(), call.device.where.stream),
                              "start: recording its event");
      queued_.device.ready = state_.ready.get();
    }
    return operation();
  }
  plan_call<value_type> queued_call() const noexcept { return queued_; }

 protected:
  /// `count`: the values a call takes (a 16-bit plan keeps a float buffer of them,
  /// allocated here so that calls allocate nothing).
  plan_handle(const char* name, std::size_t count) : plan_handle(name, std::span<const std::size_t>(&count, 1)) {}
  /// A fused plan: calls take tensors of these sizes, laid end to end.
  /// A plan on device memory (Space device_space) keeps its state on the device of
  /// `where`'s stream; a host plan ignores `where`.
  plan_handle(const char* name, std::span<const std::size_t> tensor_sizes, execution::device_stream where = {})
      : call_handle(name), tensor_sizes_(tensor_sizes.begin(), tensor_sizes.end()), by_address_(tensor_sizes.size()) {
    tensor_starts_.assign(1, 0);
    for (const std::size_t size : tensor_sizes_) tensor_starts_.push_back(tensor_starts_.back() + size);
    if constexpr (on_device) {
      state_.bind(where);
    } else if constexpr (half_element<T>) {
      widened_.assign(tensor_starts_.back(), 0.0f);
    }
    (void)where;
  }
  /// Waits for a call still in flight (its buffers and this state are in use).
  ~plan_handle() { finish_in_flight(); }

  /// Derived plans install their schedule through this (a device plan also sizes its
  /// work buffer for every value a call takes).
  void install(algorithms::quantized_schedule schedule) {
    state_.install(std::move(schedule));
    if constexpr (on_device) state_.reserve_work(tensor_starts_.back());
  }

  algorithms::quantized_state<Q, Space> state_;

 private:
  std::vector<std::size_t> tensor_sizes_;   // of a fused call; one, count(), otherwise
  std::vector<std::size_t> tensor_starts_;  // their starts laid end to end, and the total
  mutable std::vector<std::pair<const T*, std::size_t>> by_address_;  // check_tensors' scratch
  std::vector<float> widened_;  // 16-bit plans: the call's values in float
  detail::request_storage requests_;
  bool can_roll_back_ = false;
  plan_call<value_type> queued_{};  // read by the progress thread
};

}  // namespace qcoll
