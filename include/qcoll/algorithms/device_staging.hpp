#pragma once
/// @file
/// device_staging: how an exact collective on device buffers runs over a transport
/// that moves host memory (in-process, shm, TCP, MPI) — the one place that moves a
/// call's bytes between memory spaces, so no collective has a branch for it (as
/// kokkos-comm's host_staging.hpp). A call
///   1. starts after the work its caller queued on its stream (an event recorded there,
///      which the communicator's own stream waits for: never a device-wide synchronize);
///   2. copies its input into a pinned host mirror chunk by chunk on that stream, in
///      the order the script reads it, an event after each chunk;
///   3. runs the host script on the mirror, in place — every read of a step waits for
///      its chunk's event (primitives::await_arrivals), so the copy of chunk k + 1
///      overlaps the transfer of chunk k, and the result is the host path's, bit for bit;
///   4. copies the result back on the same stream, and makes the caller's stream wait
///      for that copy; the blocking call returns once the result is in place.
/// Reductions run on the CPU, over the mirror: the transport lands every byte in host
/// memory anyway, so reducing there reads it once, where a GPU reduce would first copy
/// each received slice to the device (docs/gpu.md). The mirror, the stream and the
/// events are made at the first device call and reused by later ones (on another
/// device they are made anew).

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace qcoll::algorithms {

/// Whether a call on device buffers over `Transport` goes through device_staging: when
/// the transport moves host memory (core/concepts.hpp, moves_device_memory), as every
/// transport does today.
template <class Transport>
inline constexpr bool needs_staging = !moves_device_memory<Transport>;

class device_staging {
 public:
  /// Bytes per copied chunk: long enough that an event per chunk costs nothing beside
  /// the copy (1 MiB is ~19 µs at the 55 GB/s pinned copies measured on an H200), short
  /// enough that a step waits for little more than its own block. At most
  /// `max_chunks` chunks: larger calls take larger chunks. Not yet tuned on a GPU.
  static constexpr std::size_t chunk_bytes = std::size_t{1} << 20;
  static constexpr std::size_t max_chunks = 64;

  /// The device a call runs on: the runtime, and the ordinal of the caller's stream.
  struct target {
    const device::runtime* runtime = nullptr;
    int ordinal = 0;
  };

  /// Ready for a call of `bytes` bytes on `on`: a stream and events on that device, a
  /// pinned mirror of at least `bytes` (grown, never shrunk). Returns 0. `working`: the
  /// stream the call's work goes on instead of one of its own (a transport that moves
  /// device memory: its own stream, where its copies run; such a call stages nothing, and
  /// uses only the ordering with the caller's stream: start_after, finish).
  /// @throws qcoll::error (device_error) when the device refuses the stream or the memory.
  int prepare(target on, std::size_t bytes, device::stream_handle working = nullptr) {
    if (on.runtime != target_.runtime || on.ordinal != target_.ordinal) {
      *this = device_staging();  // another device: new stream, events and mirror
      target_ = on;
    }
    working_ = working;
    if (!working_ && !stream_)
      execution::with_current_device(runtime(), target_.ordinal,
                                     [&] { stream_ = execution::device_stream_owner("qcoll device collective"); });
    if (mirror_.size() < bytes) {
      mirror_ = {};
      mirror_ = execution::pinned_memory<std::byte>(bytes);
    }
    chunks_.clear();
    return 0;
  }

  /// The first `bytes` bytes of the mirror, where the script runs.
  std::span<std::byte> mirror(std::size_t bytes) const noexcept { return mirror_.span().first(bytes); }
  template <class T>
  std::span<T> mirror_of(std::size_t count) const noexcept {
    return {reinterpret_cast<T*>(mirror_.data()), count};
  }

  /// The call's work starts after what `caller` has queued: an event recorded on it
  /// now, which this stream waits for. (A started call passes `ready`, the event
  /// recorded when it was started, instead.)
  int start_after(device::stream_handle caller) {
    ready_ = nullptr;
    if (const int failed = ensure(entry_)) return failed;
    if (const int failed = runtime().event_record(entry_.get(), caller)) return failed;
    return runtime().stream_wait(stream(), entry_.get());
  }
  int start_after_event(device::event_handle ready) {
    ready_ = ready;
    return runtime().stream_wait(stream(), ready);
  }

  /// Queues copies of `from` (device memory) into the mirror at `offset`, piece by
  /// piece in `order` (byte ranges of `from`, together all of it), each cut into
  /// chunks with an event after each; await() then knows them.
  int download(const std::byte* from, std::size_t offset, std::span<const block_range> order) {
    const std::size_t total = [&] {
      std::size_t sum = 0;
      for (const block_range& piece : order) sum += piece.size;
      return sum;
    }();
    const std::size_t chunk = std::max(chunk_bytes, (total + max_chunks - 1) / max_chunks);
    for (const block_range& piece : order)
      for (std::size_t at = 0; at < piece.size; at += chunk) {
        const std::size_t bytes = std::min(chunk, piece.size - at);
        if (const int failed = runtime().copy(mirror_.data() + offset + piece.offset + at, from + piece.offset + at,
                                              bytes, stream()))
          return failed;
        const std::size_t index = chunks_.size();
        if (index == events_.size()) events_.emplace_back();
        if (const int failed = ensure(events_[index])) return failed;
        if (const int failed = runtime().event_record(events_[index].get(), stream())) return failed;
        chunks_.push_back({offset + piece.offset + at, bytes, index, false});
      }
    std::sort(chunks_.begin(), chunks_.end(), [](const chunk_state& a, const chunk_state& b) { return a.offset < b.offset; });
    return 0;
  }
  /// The whole of `from` (bytes of it) into the mirror at `offset`, in address order.
  int download(const std::byte* from, std::size_t offset, std::size_t bytes) {
    const block_range whole{0, bytes};
    return download(from, offset, std::span<const block_range>(&whole, 1));
  }

  /// Byte ranges for download(from, offset, order), reused from call to call (emptied here).
  std::vector<block_range>& order() noexcept {
    order_.clear();
    return order_;
  }

  /// Waits on the host for what the caller queued before the call (start_after's event).
  int wait_for_caller() { return runtime().event_synchronize(ready_ ? ready_ : entry_.get()); }

  /// The gate primitives wait at before reading the mirror (await_arrivals).
  arrival_gate arrivals() noexcept { return {this, &await_entry}; }

  /// Waits until [data, data + bytes) has arrived in the mirror (memory outside it
  /// needs no wait). Null, or the runtime's words for what stopped the copy.
  const char* await(const void* data, std::size_t bytes) {
    const auto* begin = static_cast<const std::byte*>(data);
    if (bytes == 0 || begin + bytes <= mirror_.data() || begin >= mirror_.data() + mirror_.size()) return nullptr;
    const std::size_t low = begin < mirror_.data() ? 0 : static_cast<std::size_t>(begin - mirror_.data());
    const std::size_t high = static_cast<std::size_t>(begin + bytes - mirror_.data());
    auto first = std::upper_bound(chunks_.begin(), chunks_.end(), low,
                                  [](std::size_t at, const chunk_state& c) { return at < c.offset + c.bytes; });
    for (auto c = first; c != chunks_.end() && c->offset < high; ++c) {
      if (c->arrived) continue;
      if (const int failed = runtime().event_synchronize(events_[c->event].get())) return runtime().error_string(failed);
      c->arrived = true;
    }
    return nullptr;
  }
  /// Waits for every chunk (scripts whose reads do not all go through the primitives).
  const char* await_all() { return mirror_.size() == 0 ? nullptr : await(mirror_.data(), mirror_.size()); }

  /// Queues the copy of `from` (a range of the mirror) to `to` (device memory).
  int upload(std::span<const std::byte> from, std::byte* to) {
    if (from.empty()) return 0;
    return runtime().copy(to, from.data(), from.size(), stream());
  }

  /// Ends the call: an event after its last copy, which `caller` waits for (null: no
  /// stream is told, a started call), and the host too, so the result is in place.
  int finish(device::stream_handle caller, bool order_caller) {
    if (const int failed = ensure(exit_)) return failed;
    if (const int failed = runtime().event_record(exit_.get(), stream())) return failed;
    if (order_caller)
      if (const int failed = runtime().stream_wait(caller, exit_.get())) return failed;
    return runtime().event_synchronize(exit_.get());
  }

  /// After a failure: waits until nothing of the call still runs on the device (its
  /// copies read the caller's input), ignoring what that reports.
  void abandon() noexcept {
    if (target_.runtime && stream()) target_.runtime->synchronize(stream());
    chunks_.clear();
  }

  const device::runtime& runtime() const noexcept { return *target_.runtime; }
  int ordinal() const noexcept { return target_.ordinal; }
  device::stream_handle stream() const noexcept { return working_ ? working_ : stream_.get(); }

 private:
  struct chunk_state {
    std::size_t offset = 0, bytes = 0;  ///< of the mirror
    std::size_t event = 0;
    bool arrived = false;
  };

  static const char* await_entry(void* self, const void* data, std::size_t bytes) {
    return static_cast<device_staging*>(self)->await(data, bytes);
  }

  int ensure(execution::device_event& event) {
    if (!event)
      execution::with_current_device(runtime(), target_.ordinal,
                                     [&] { event = execution::device_event("qcoll device collective"); });
    return 0;
  }

  target target_;
  execution::device_stream_owner stream_;
  device::stream_handle working_ = nullptr;  // the call's stream when it is not stream_
  execution::pinned_memory<std::byte> mirror_;
  execution::device_event entry_, exit_;
  device::event_handle ready_ = nullptr;  // a started call's entry event (the caller's)
  std::vector<execution::device_event> events_;  // one per chunk, reused
  std::vector<chunk_state> chunks_;              // this call's, by mirror offset
  std::vector<block_range> order_;
};

}  // namespace qcoll::algorithms
