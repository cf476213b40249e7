#pragma once
/// @file
/// started_calls<Transport>: the forms of communicator<Transport>'s calls that start
/// the call on the communicator's progress thread and return at once — an allreduce
/// through a plan, and the exact collectives with a collective_handle — and wait_all().
/// The progress thread (detail/progress_thread.hpp) runs the blocking form of each
/// call, one after another in start order; the plan or the handle keeps the
/// arguments, and the outcome for its wait(). The communicator derives from this class
/// (CRTP) and names these overloads with using-declarations, so they are its members
/// like the blocking forms.

#include <qcoll/collective_handle.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/outcome.hpp>
#include <qcoll/detail/progress_thread.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/plan_base.hpp>
#include <qcoll/transports/subgroup.hpp>

#include <span>
#include <string>
#include <system_error>

namespace qcoll {

template <transport Transport>
class communicator;

template <transport Transport>
class started_calls {
  using derived = communicator<Transport>;
  using channel_type = transports::subgroup<Transport>;

 public:
  /// Starts allreduce(plan, …) on the communicator's progress thread and returns at
  /// once; plan.test() and plan.wait() finish it. `in` and `out` must stay valid and
  /// untouched until then. Several plans may be in flight; they run one after
  /// another in start order, which must be the same on every rank.
  /// @par Errors
  /// invalid_argument at once for a plan already in flight; everything else is
  /// reported by plan.wait().
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(Plan& plan, std::span<const typename Plan::value_type> in,
                       std::span<typename Plan::value_type> out, reduce_op op) {
    plan.require_idle("start_allreduce");
    submit(plan.queue_call({.in = in, .out = out, .op = op}), &run_plan<Plan>, &plan);
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op) {
    start_allreduce(plan, std::span<const typename Plan::value_type>(data), data, op);
  }
  template <allreduce_plan<channel_type> Plan>
  void start_allreduce(Plan& plan, std::span<const std::span<typename Plan::value_type>> tensors, reduce_op op) {
    plan.require_idle("start_allreduce");
    submit(plan.queue_call({.tensors = tensors, .op = op}), &run_plan<Plan>, &plan);
  }

  /// start_allreduce through a plan on device memory: the call runs after the work
  /// queued on where.stream before the start; plan.wait() returns once the result is
  /// in place. invalid_argument or device_error at once (not started) when the start's
  /// event cannot be recorded on the stream.
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::device)
  void start_allreduce(execution::device_stream where, Plan& plan, std::span<const typename Plan::value_type> in,
                       std::span<typename Plan::value_type> out, reduce_op op) {
    plan.require_idle("start_allreduce");
    submit(plan.queue_call({.in = in, .out = out, .op = op, .device = {where}}), &run_plan<Plan>, &plan);
  }
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::device)
  void start_allreduce(execution::device_stream where, Plan& plan, std::span<typename Plan::value_type> data,
                       reduce_op op) {
    start_allreduce(where, plan, std::span<const typename Plan::value_type>(data), data, op);
  }
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::device)
  void start_allreduce(execution::device_stream where, Plan& plan,
                       std::span<const std::span<typename Plan::value_type>> tensors, reduce_op op) {
    plan.require_idle("start_allreduce");
    submit(plan.queue_call({.tensors = tensors, .op = op, .device = {where}}), &run_plan<Plan>, &plan);
  }

  /// The exact collectives, started on the progress thread: each returns at once and
  /// `handle` finishes it (handle.test(), handle.wait()). Arguments and results are
  /// those of the blocking call; `in`, `out` and `data` must stay valid and untouched
  /// until wait() returns, and are the caller's again after it. Started calls run one
  /// after another in start order, which must be the same on every rank, and before
  /// any later blocking call of this communicator (or one sharing its transport).
  /// @par Errors
  /// invalid_argument at once for a handle already in flight; everything else,
  /// argument checks included, is reported by handle.wait().
  template <element T>
  void start_allreduce(std::span<const T> in, std::span<T> out, reduce_op op, collective_handle& handle) {
    start<T, collective::allreduce>(handle, in, out, op, 0);
  }
  template <element T>
  void start_allreduce(std::span<T> data, reduce_op op, collective_handle& handle) {
    start<T, collective::allreduce>(handle, std::span<const T>(data), data, op, 0);
  }
  template <element T>
  void start_reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, collective_handle& handle) {
    start<T, collective::reduce_scatter>(handle, in, out, op, 0);
  }
  template <element T>
  void start_all_gather(std::span<const T> in, std::span<T> out, collective_handle& handle) {
    start<T, collective::all_gather>(handle, in, out, reduce_op::sum, 0);
  }
  template <element T>
  void start_broadcast(std::span<T> data, rank_t root, collective_handle& handle) {
    start<T, collective::broadcast>(handle, std::span<const T>(data), data, reduce_op::sum, root);
  }

  /// The same on device memory (the device forms of the blocking calls, docs/gpu.md):
  /// the call runs after the work queued on where.stream before the start, and
  /// `handle.wait()` returns once the result is in place; work the caller queues on the
  /// stream after wait() sees it.
  /// @par Errors
  /// As the host forms, and at once (the call not started): invalid_argument without
  /// a device runtime or for a stream not of it, device_error when the start's event
  /// cannot be recorded on the stream.
  template <element T>
  void start_allreduce(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op,
                       collective_handle& handle) {
    start_on_device<T, collective::allreduce>(handle, where, in, out, op, 0);
  }
  template <element T>
  void start_allreduce(execution::device_stream where, std::span<T> data, reduce_op op, collective_handle& handle) {
    start_on_device<T, collective::allreduce>(handle, where, std::span<const T>(data), data, op, 0);
  }
  template <element T>
  void start_reduce_scatter(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op,
                            collective_handle& handle) {
    start_on_device<T, collective::reduce_scatter>(handle, where, in, out, op, 0);
  }
  template <element T>
  void start_all_gather(execution::device_stream where, std::span<const T> in, std::span<T> out,
                        collective_handle& handle) {
    start_on_device<T, collective::all_gather>(handle, where, in, out, reduce_op::sum, 0);
  }
  template <element T>
  void start_broadcast(execution::device_stream where, std::span<T> data, rank_t root, collective_handle& handle) {
    start_on_device<T, collective::broadcast>(handle, where, std::span<const T>(data), data, reduce_op::sum, root);
  }

  /// Starts a collective composed of this communicator's own blocking calls —
  /// `composed(communicator, in, out, op)` — on the progress thread, like the calls above
  /// (in start order with them; `handle` finishes it; `in` and `out` stay the caller's
  /// to keep valid until then). How collectives built from others start without waiting
  /// (qcoll::start_reproducible_allreduce).
  /// @par Errors
  /// invalid_argument at once for a handle already in flight; whatever `composed`
  /// throws, by handle.wait().
  template <element T>
  void start_composed(void (*composed)(derived&, std::span<const T>, std::span<T>, reduce_op), std::span<const T> in,
                      std::span<T> out, reduce_op op, collective_handle& handle) {
    submit(handle.queue_composed(reinterpret_cast<void (*)()>(composed), in, out, op),
           &collective_handle::run_composed<derived, T>, &handle);
  }

  /// Blocks until every call started without waiting has run (their outcomes stay
  /// with their plans and handles).
  void wait_all() { self().quiesce(); }

 protected:
  started_calls() = default;

 private:
  template <element T, collective Kind>
  void start(collective_handle& handle, std::span<const T> in, std::span<T> out, reduce_op op, rank_t root) {
    submit(handle.queue(Kind, in, out, op, root), &collective_handle::run<derived, T, Kind>, &handle);
  }

  template <element T, collective Kind>
  void start_on_device(collective_handle& handle, execution::device_stream where, std::span<const T> in,
                       std::span<T> out, reduce_op op, rank_t root) {
    submit(handle.queue_on_device(Kind, where, in, out, op, root), &collective_handle::run<derived, T, Kind>, &handle);
  }

  /// Queues `operation` on the progress thread the communicator shares with those
  /// split from it: `run(communicator, subject, message)` runs it there.
  void submit(detail::pending_operation& operation, detail::pending_operation::runner run, void* subject) {
    self().shared_->progress().submit(operation, run, &self(), subject);
  }

  /// The progress thread's side of start_allreduce(plan, …).
  template <class Plan>
  static std::error_code run_plan(void* context, void* subject, std::string& message) noexcept {
    return detail::report(message, [&] {
      auto& plan = *static_cast<Plan*>(subject);
      static_cast<derived*>(context)->run_plan(plan, plan.queued_call());
    });
  }

  derived& self() noexcept { return static_cast<derived&>(*this); }
};

}  // namespace qcoll
