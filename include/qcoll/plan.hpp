#pragma once
/// @file
/// plan_handle<Q>: the base of qcoll's quantized plans (compressed_allreduce.hpp,
/// grid_allreduce.hpp) and of any new one. It is plan_base (plan_base.hpp: the plan
/// contract, and what every plan shares) with a quantizer's state: it runs the plan's
/// quantized_schedule, commits or rolls back the double-buffered residuals, and keeps
/// them on the host or on a device. A derived plan compiles its schedule, checks it
/// against a communicator and says what its header carries.

#include <qcoll/algorithms/device_schedule.hpp>
#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/quantized_schedule.hpp>
#include <qcoll/core/archetypes.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/plan_base.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <system_error>
#include <utility>

namespace qcoll {

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
class plan_handle : public plan_base<T, typename Q::value_type> {
  using base = plan_base<T, typename Q::value_type>;

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
  plan_handle(plan_handle&& other) : base(std::move(other)), state_(std::move(other.state_)) {}
  plan_handle& operator=(plan_handle&& other) {
    base::operator=(std::move(other));  // checks both are idle first
    state_ = std::move(other.state_);
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
    // The previous residuals are intact in the staging buffers until the next call.
    this->roll_back("roll_back_last_call", [&] {
      state_.committed = 1 - state_.committed;
      --state_.calls;
    });
  }

  /// The owner's update-rule state for this rank's stripe after the last successful
  /// call (state_per_value() values per value, interleaved; empty without a rule).
  std::span<const residual_type> owner_state() const noexcept { return state_.owner_state[state_.committed]; }

  /// Forgets every residual (say, after the model was reloaded), and the quantizer's
  /// memory of previous encodes if it keeps one; the owner's update-rule state stays.
  void reset_residuals() {
    this->require_idle("reset_residuals");
    if constexpr (on_device) {
      for (auto& r : state_.residual) state_.fill(r.span(), residual_type{});
    } else {
      for (auto& r : state_.residual) std::fill(r.begin(), r.end(), residual_type{});
    }
    state_.forget_memory();
    this->forget_last_call();
  }

  /// Forgets the owner's update-rule state (a new optimizer).
  void reset_owner_state() {
    this->require_idle("reset_owner_state");
    for (auto& s : state_.owner_state) std::fill(s.begin(), s.end(), residual_type{});
    this->forget_last_call();
  }

  // ---- what a communicator uses (allreduce_plan): plan_base's, and run ----

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
    const std::span<typename Transport::request> requests =
        this->template requests<Transport>(state_.schedule.requests);
    this->run_call(
        step, call, requests,
        [&](auto in, auto out) { algorithms::run_schedule(step, state_, requests, in, out, call.op); },
        [&] { commit(); });
  }

  void commit() noexcept {
    state_.committed = 1 - state_.committed;
    ++state_.calls;
  }

  /// run() on device memory: checks the buffers once (on the plan's device), orders the
  /// plan's stream after the caller's, copies (widens) the input into the work buffer,
  /// runs the schedule there, and only once it succeeded copies (rounds) the result out
  /// and commits; the caller's stream then waits for the result, and so does the host.
  template <transport Transport>
  void run_on_device(algorithms::primitives<Transport>& step, const plan_call<value_type>& call) {
    const std::span<typename Transport::request> requests =
        this->template requests<Transport>(state_.schedule.requests);
    this->forget_last_call();  // the staging residuals are about to be overwritten
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
    const std::span<const std::size_t> starts = this->tensor_starts();
    this->run_as_unit(step, requests, [&] {
      if (call.device.ready) {
        queued(runtime.stream_wait(stream, call.device.ready), "ordering the call after its start");
      } else {
        queued(runtime.event_record(state_.entry.get(), call.device.where.stream), "ordering the call after the stream");
        queued(runtime.stream_wait(stream, state_.entry.get()), "ordering the call after the stream");
      }
      if (call.fused()) {
        for (std::size_t k = 0; k < call.tensors.size(); ++k)
          load(call.tensors[k].data(), starts[k], call.tensors[k].size());
      } else {
        load(call.in.data(), 0, call.in.size());
      }
      algorithms::run_schedule(step, state_, requests, call.op);
      if (call.fused()) {
        for (std::size_t k = 0; k < call.tensors.size(); ++k)
          store(call.tensors[k].data(), starts[k], call.tensors[k].size());
      } else {
        store(call.out.data(), 0, call.out.size());
      }
      queued(runtime.event_record(state_.exit.get(), stream), "copying the result");
      if (!call.device.ready)
        queued(runtime.stream_wait(call.device.where.stream, state_.exit.get()), "ordering the stream after the call");
      queued(runtime.event_synchronize(state_.exit.get()), "copying the result");
    }, [&] { commit(); }, [&] { runtime.synchronize(stream); });  // nothing of a failed call runs on after it
  }

 public:
  detail::pending_operation& queue_call(const plan_call<value_type>& call) {
    detail::pending_operation& entry = base::queue_call(call);
    if constexpr (on_device) {
      plan_call<value_type>& started = this->queued();
      // The call runs after the work queued on its stream before the start: an event
      // recorded there now. Refused here (not started) when it cannot be.
      const device::runtime& runtime = *state_.runtime;
      started.device.ordinal = -1;
      if (runtime.stream_device(call.device.where.stream, &started.device.ordinal) != 0)
        qcoll::detail::throw_error(errc::invalid_argument, "{}::start: the stream is not a stream of the {} device runtime",
                                   this->name(), runtime.name);
      if (started.device.ordinal != state_.ordinal)
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "{}::start: the stream is on device {}, the plan's state on device {}", this->name(),
                                   started.device.ordinal, state_.ordinal);
      execution::check_device(runtime, runtime.event_record(state_.ready.get(), call.device.where.stream),
                              "start: recording its event");
      started.device.ready = state_.ready.get();
    }
    return entry;
  }

 protected:
  /// `count`: the values a call takes (a 16-bit plan keeps a float buffer of them,
  /// allocated here so that calls allocate nothing).
  plan_handle(const char* name, std::size_t count) : plan_handle(name, std::span<const std::size_t>(&count, 1)) {}
  /// A fused plan: calls take tensors of these sizes, laid end to end.
  /// A plan on device memory (Space device_space) keeps its state on the device of
  /// `where`'s stream; a host plan ignores `where`.
  /// (A plan on device memory widens on the device, into its work buffer.)
  plan_handle(const char* name, std::span<const std::size_t> tensor_sizes, execution::device_stream where = {})
      : base(name, tensor_sizes, /*widen_here=*/!on_device) {
    if constexpr (on_device) state_.bind(where);
    (void)where;
  }
  /// Waits for a call still in flight (its buffers and this state are in use).
  ~plan_handle() { this->finish_in_flight(); }

  /// Derived plans install their schedule through this (a device plan also sizes its
  /// work buffer for every value a call takes).
  void install(algorithms::quantized_schedule schedule) {
    state_.install(std::move(schedule));
    if constexpr (on_device) state_.reserve_work(this->tensor_starts().back());
  }

  algorithms::quantized_state<Q, Space> state_;
};

}  // namespace qcoll
