#pragma once
/// @file
/// collective_handle: the caller-owned handle of an exact collective started without
/// waiting (communicator::start_allreduce, start_reduce_scatter, start_all_gather,
/// start_broadcast, and collectives composed of those, such as
/// start_reproducible_allreduce). It keeps the call's arguments until the progress thread runs it,
/// so starting a call allocates nothing; one handle per call in flight, reusable once
/// the call has finished. A call on device buffers also keeps an event, recorded on
/// the caller's stream when the call starts: the call runs after the work queued there
/// before it (made at the first such start, reused).

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/call_handle.hpp>
#include <qcoll/detail/outcome.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <utility>

namespace qcoll {

template <transport Transport>
class started_calls;

class collective_handle : public detail::call_handle {
 public:
  collective_handle() noexcept : call_handle("collective_handle") {}
  /// Handles move (so several fit in a std::vector) while no call is in flight.
  /// @throws qcoll::error (invalid_argument) when one is.
  collective_handle(collective_handle&& other)
      : call_handle((other.require_idle("move"), std::move(other))), call_(other.call_), ready_(std::move(other.ready_)),
        ready_ordinal_(other.ready_ordinal_) {}
  collective_handle& operator=(collective_handle&& other) {
    require_idle("move");
    other.require_idle("move");
    call_ = other.call_;
    ready_ = std::move(other.ready_);
    ready_ordinal_ = other.ready_ordinal_;
    return *this;
  }
  ~collective_handle() = default;  // call_handle's waits for a call in flight

 private:
  template <transport Transport>
  friend class started_calls;

  /// The started call, type-erased; run() reads it back.
  struct arguments {
    collective kind = collective::barrier;
    const void* in = nullptr;
    std::size_t in_count = 0;
    void* out = nullptr;
    std::size_t out_count = 0;
    reduce_op op = reduce_op::sum;
    rank_t root = 0;
    bool on_device = false;
    execution::device_entry device{};
    void (*composed)() = nullptr;  // a composed call's function (started_calls::start_composed), type-erased
  };

  template <element T>
  detail::pending_operation& queue(collective kind, std::span<const T> in, std::span<T> out, reduce_op op,
                                   rank_t root) {
    require_idle("start");
    call_ = {kind, in.data(), in.size(), out.data(), out.size(), op, root};
    return operation();
  }
  /// The same for a call composed of the communicator's own calls: `composed` is the
  /// function run_composed calls, cast back to its type.
  template <element T>
  detail::pending_operation& queue_composed(void (*composed)(), std::span<const T> in, std::span<T> out, reduce_op op) {
    require_idle("start");
    call_ = {.kind = collective::allreduce, .in = in.data(), .in_count = in.size(), .out = out.data(),
             .out_count = out.size(), .op = op, .composed = composed};
    return operation();
  }
  /// The same for a call on device buffers: records the start's event on where.stream.
  /// @throws qcoll::error (the call is not started): invalid_argument without a device
  /// runtime or for a stream not of it; device_error when the event cannot be recorded.
  template <element T>
  detail::pending_operation& queue_on_device(collective kind, execution::device_stream where, std::span<const T> in,
                                             std::span<T> out, reduce_op op, rank_t root) {
    require_idle("start");
    const device::runtime& runtime = execution::device_runtime("start");
    int ordinal = -1;
    if (runtime.stream_device(where.stream, &ordinal) != 0)
      detail::throw_error(errc::invalid_argument, "start: the stream is not a stream of the {} device runtime",
                          runtime.name);
    if (!ready_ || ready_ordinal_ != ordinal) {  // an event of the stream's device
      ready_ = {};
      execution::with_current_device(runtime, ordinal, [&] { ready_ = execution::device_event("start"); });
      ready_ordinal_ = ordinal;
    }
    execution::check_device(runtime, runtime.event_record(ready_.get(), where.stream), "start: recording its event");
    call_ = {kind, in.data(), in.size(), out.data(), out.size(), op, root, true, {where, ready_.get(), ordinal}};
    return operation();
  }
  template <element T>
  std::span<const T> in() const noexcept {
    return {static_cast<const T*>(call_.in), call_.in_count};
  }
  template <element T>
  std::span<T> out() const noexcept {
    return {static_cast<T*>(call_.out), call_.out_count};
  }

  /// The progress thread's side of a started call (a detail::pending_operation::runner):
  /// the blocking form of the call on `context`, the Communicator that queued it.
  template <class Communicator, element T, collective Kind>
  static std::error_code run(void* context, void* subject, std::string& message) noexcept {
    return detail::report(message, [&] {
      auto& comm = *static_cast<Communicator*>(context);
      const auto& handle = *static_cast<const collective_handle*>(subject);
      const std::span<const T> in = handle.in<T>();
      const std::span<T> out = handle.out<T>();
      const reduce_op op = handle.call_.op;
      if (handle.call_.on_device) {
        const execution::device_entry& entry = handle.call_.device;
        if constexpr (Kind == collective::allreduce) comm.allreduce_on_device(entry, in, out, op);
        else if constexpr (Kind == collective::reduce_scatter) comm.reduce_scatter_on_device(entry, in, out, op);
        else if constexpr (Kind == collective::all_gather) comm.all_gather_on_device(entry, in, out);
        else {
          static_assert(Kind == collective::broadcast, "collective_handle::run: a started collective needs its call here");
          comm.broadcast_on_device(entry, out, handle.call_.root);
        }
        return;
      }
      if constexpr (Kind == collective::allreduce) comm.allreduce(in, out, op);
      else if constexpr (Kind == collective::reduce_scatter) comm.reduce_scatter(in, out, op);
      else if constexpr (Kind == collective::all_gather) comm.all_gather(in, out);
      else {
        static_assert(Kind == collective::broadcast, "collective_handle::run: a started collective needs its call here");
        comm.broadcast(out, handle.call_.root);
      }
    });
  }

  /// The progress thread's side of a composed call: its function on `context`.
  template <class Communicator, element T>
  static std::error_code run_composed(void* context, void* subject, std::string& message) noexcept {
    return detail::report(message, [&] {
      const auto& handle = *static_cast<const collective_handle*>(subject);
      using function = void (*)(Communicator&, std::span<const T>, std::span<T>, reduce_op);
      reinterpret_cast<function>(handle.call_.composed)(*static_cast<Communicator*>(context), handle.in<T>(),
                                                         handle.out<T>(), handle.call_.op);
    });
  }

  arguments call_{};  // read by the progress thread
  execution::device_event ready_;  // device calls: recorded on the caller's stream at the start
  int ready_ordinal_ = -1;         // the device it belongs to
};

}  // namespace qcoll
