#pragma once
/// @file
/// The emulated device: the device runtime (device/runtime.hpp) on any CPU, a test
/// double of CUDA's that lets every device path of qcoll run — and be checked under
/// AddressSanitizer and ThreadSanitizer — where there is no GPU. It is not a way to
/// compute on the CPU: the host path is faster at that.
///
/// - **Device memory** is host memory the emulation keeps a registry of: `locate`
///   tells it from any other memory, so a host pointer where device memory is due
///   (and the reverse) is refused exactly as on a GPU; a kernel or copy that reaches
///   past an allocation fails with an illegal-address error instead of reading it.
/// - **A stream** is an in-order queue run by a worker thread of its own, each piece
///   of work no sooner than `delay` after it was queued: work has not run when the call
///   that queued it returns, so a missing wait gives a wrong result here rather than a
///   race on a GPU. The default (null) stream of a device is an ordinary stream, not
///   CUDA's legacy stream that orders itself with every other: code that leans on that
///   implicit ordering fails here.
/// - **An event** is a completion mark a stream's worker sets when it reaches it.
/// - **Kernels** are the CPU backend's, so frames and residuals are the host call's bit
///   for bit; a decode checks its frame with the device's own checks (kernels/simt).
/// - **Process-shared handles** are memfds another process of the node fetches
///   (pidfd_getfd): device memory and interprocess events can be exported and opened;
///   a handle of a process that is gone, or of memory since freed, is refused.
/// - **Failures can be injected** (emulated_faults): an allocation, a copy, a kernel
///   launch, an IPC open, or a piece of work that fails when it runs.
///
/// A program that includes this header can choose it with QCOLL_DEVICE=emulated, or in
/// code with execution::use_device(device::emulated()) (execution/dispatch.hpp); one
/// that does not has no emulated device (and does not compile one). Options from the
/// environment (QCOLL_EMULATED_DEVICES, QCOLL_EMULATED_DELAY_US) or configure_emulated().
/// What it does not prove: that the CUDA kernels and the CUDA runtime behave alike
/// (tools/gpu-check runs the same tests with QCOLL_DEVICE=cuda), speed, and memory
/// ordering between a GPU and the host beyond what events give.

#include <qcoll/device/emulated/codes.hpp>
#include <qcoll/device/emulated/kernel_entries.hpp>
#include <qcoll/device/emulated/memory.hpp>
#include <qcoll/device/emulated/state.hpp>
#include <qcoll/device/emulated/stream.hpp>
#include <qcoll/device/runtime.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace qcoll::device {

namespace emulated_detail {

// ---- the table's entries (the kernels' are in kernel_entries.hpp)

inline int device_count(int* count) {
  *count = the_state().devices.load();
  return success;
}
inline int current_device(int* ordinal) {
  *ordinal = current_ordinal();
  return success;
}
inline int set_device(int ordinal) {
  if (ordinal < 0 || ordinal >= the_state().devices.load()) return invalid_device;
  current_ordinal() = ordinal;
  return success;
}
inline int locate(const void* pointer, pointer_facts* facts) {
  *facts = the_state().memory.locate(pointer);
  return success;
}
inline int allocate(std::size_t bytes, void** pointer) {
  *pointer = nullptr;
  if (fault_fires(emulated_fault::allocation)) return out_of_memory;
  return the_state().memory.allocate_device(bytes, current_ordinal(), pointer);
}

/// What cudaFree does first: waits for every stream, so no queued work touches freed memory.
inline void synchronize_everything() {
  state& s = the_state();
  std::vector<std::shared_ptr<stream_state>> streams;  // kept alive while waited on: another thread may destroy one
  std::vector<stream_state*> defaults;                  // never destroyed
  {
    std::lock_guard lock(s.mutex);
    for (const auto& [raw, owned] : s.streams) streams.push_back(owned);
    for (stream_state* fallback : s.default_streams)
      if (fallback) defaults.push_back(fallback);
  }
  for (const auto& stream : streams) stream->wait_idle();
  for (stream_state* stream : defaults) stream->wait_idle();
}

inline int release(void* pointer) {
  if (pointer == nullptr) return success;
  synchronize_everything();
  return the_state().memory.release(pointer, memory_kind::device);
}
inline int allocate_host(std::size_t bytes, void** pointer) {
  *pointer = nullptr;
  if (fault_fires(emulated_fault::allocation)) return out_of_memory;
  return the_state().memory.allocate_pinned(bytes, pointer);
}
inline int release_host(void* pointer) {
  if (pointer == nullptr) return success;
  synchronize_everything();
  return the_state().memory.release(pointer, memory_kind::pinned);
}

inline int copy(void* to, const void* from, std::size_t bytes, stream_handle handle) {
  stream_state* stream = stream_of(handle);
  if (!stream) return invalid_handle;
  if (bytes == 0) return success;
  const memory_registry& memory = the_state().memory;
  // Device memory must hold the whole range; other host memory is the caller's to vouch for.
  for (const void* end : {static_cast<const void*>(to), from})
    if (memory.touches_device(end, bytes) && !memory.reachable(end, bytes)) return illegal_address;
  if (fault_fires(emulated_fault::copy)) return injected;
  if (fault_fires(emulated_fault::failed_work)) {
    stream->push([] { return static_cast<int>(injected); });
    return success;
  }
  stream->push([=] {
    std::memcpy(to, from, bytes);
    return static_cast<int>(success);
  });
  return success;
}

inline int fill(void* to, int byte, std::size_t bytes, stream_handle stream) {
  if (fault_fires(emulated_fault::copy)) return injected;
  return queue(stream, emulated_fault::kernel, {{to, bytes}}, [=] {
    if (bytes != 0) std::memset(to, byte, bytes);
  });
}

inline int synchronize(stream_handle handle) {
  stream_state* stream = stream_of(handle);
  return stream ? stream->synchronize() : static_cast<int>(invalid_handle);
}

inline int stream_create(stream_handle* handle) {
  state& s = the_state();
  auto made = std::make_shared<stream_state>(current_ordinal(), delay());
  stream_state* raw = made.get();
  std::lock_guard lock(s.mutex);
  s.streams.emplace(raw, std::move(made));
  *handle = raw;
  return success;
}
inline int stream_destroy(stream_handle handle) {
  state& s = the_state();
  std::shared_ptr<stream_state> gone;
  {
    std::lock_guard lock(s.mutex);
    const auto found = s.streams.find(static_cast<stream_state*>(handle));
    if (found == s.streams.end()) return invalid_handle;
    gone = std::move(found->second);
    s.streams.erase(found);
  }
  gone.reset();  // runs what is queued, then stops its worker (unless a free is waiting on it: then after that)
  return success;
}
inline int stream_device(stream_handle handle, int* ordinal) {
  stream_state* stream = stream_of(handle);
  if (!stream) return invalid_handle;
  *ordinal = stream->ordinal();
  return success;
}

inline int event_create(event_handle* handle, bool interprocess) {
  state& s = the_state();
  std::uint64_t id = 0;
  {
    std::lock_guard lock(s.mutex);
    id = ++s.last_event_id;
  }
  event_state* raw = nullptr;
  if (const int failed = event_state::make(interprocess, id, &raw)) return failed;
  std::lock_guard lock(s.mutex);
  s.events.emplace(raw, std::shared_ptr<event_state>(raw));
  *handle = raw;
  return success;
}
inline int event_destroy(event_handle handle) {
  state& s = the_state();
  std::lock_guard lock(s.mutex);
  // Pending records and waits hold their own reference: the event goes when they have run.
  return s.events.erase(static_cast<event_state*>(handle)) == 1 ? static_cast<int>(success) : static_cast<int>(invalid_handle);
}
inline int event_record(event_handle handle, stream_handle stream_handle_) {
  std::shared_ptr<event_state> event = event_of(handle);
  stream_state* stream = stream_of(stream_handle_);
  if (!event || !stream) return invalid_handle;
  const std::uint64_t record = event->issue();
  stream->push([event, record, stream] {
    event->complete(record, stream->pending_error());
    return static_cast<int>(success);
  });
  return success;
}
inline int stream_wait(stream_handle stream_handle_, event_handle handle) {
  std::shared_ptr<event_state> event = event_of(handle);
  stream_state* stream = stream_of(stream_handle_);
  if (!event || !stream) return invalid_handle;
  const std::uint64_t target = event->last_issued();
  if (target == 0) return success;  // never recorded: nothing to wait for
  stream->push([event, target] {
    poll_until([&] { return event->reached(target); });
    return static_cast<int>(success);
  });
  return success;
}
inline int event_query(event_handle handle) {
  const std::shared_ptr<event_state> event = event_of(handle);
  if (!event) return invalid_handle;
  if (!event->reached(event->last_issued())) return not_ready;
  return event->error();
}
inline int event_synchronize(event_handle handle) {
  const std::shared_ptr<event_state> event = event_of(handle);
  if (!event) return invalid_handle;
  const std::uint64_t target = event->last_issued();
  poll_until([&] { return event->reached(target); });
  return event->error();
}

inline int export_memory(void* base, ipc_handle* handle) { return the_state().memory.export_memory(base, handle); }
inline int open_memory(const ipc_handle* handle, void** pointer) {
  *pointer = nullptr;
  if (fault_fires(emulated_fault::lost_handle)) return invalid_handle;
  return the_state().memory.open_memory(*handle, pointer);
}
inline int close_memory(void* pointer) {
  synchronize_everything();
  return the_state().memory.release(pointer, memory_kind::opened);
}
inline int export_event(event_handle handle, ipc_handle* exported) {
  const std::shared_ptr<event_state> event = event_of(handle);
  return event ? event->export_to(exported) : static_cast<int>(invalid_handle);
}
inline int open_event(const ipc_handle* exported, event_handle* handle) {
  *handle = nullptr;
  if (fault_fires(emulated_fault::lost_handle)) return invalid_handle;
  state& s = the_state();
  std::uint64_t id = 0;
  {
    std::lock_guard lock(s.mutex);
    id = ++s.last_event_id;
  }
  event_state* raw = nullptr;
  if (const int failed = event_state::open(*exported, id, &raw)) return failed;
  std::lock_guard lock(s.mutex);
  s.events.emplace(raw, std::shared_ptr<event_state>(raw));
  *handle = raw;
  return success;
}

inline const char* error_string(int value) { return words(value); }

inline constexpr runtime make_emulated_runtime() noexcept {
  return {
      .name = "emulated",
      .one_bit_encode = &one_bit_encode,
      .k_level_encode = &k_level_encode,
      .bfp_encode = &bfp_encode,
      .identity_encode = &identity_encode,
      .one_bit_decode = &one_bit_decode,
      .k_level_decode = &k_level_decode,
      .bfp_decode = &bfp_decode,
      .identity_decode = &identity_decode,
      .reduce = &reduce,
      .divide = &divide,
      .widen = &widen,
      .narrow = &narrow,
      .grid_cover = &grid_cover,
      .grid_add = &grid_add,
      .grid_round = &grid_round,
      .device_count = &device_count,
      .current_device = &current_device,
      .set_device = &set_device,
      .locate = &locate,
      .allocate = &allocate,
      .release = &release,
      .allocate_host = &allocate_host,
      .release_host = &release_host,
      .copy = &copy,
      .fill = &fill,
      .synchronize = &synchronize,
      .stream_create = &stream_create,
      .stream_destroy = &stream_destroy,
      .stream_device = &stream_device,
      .event_create = &event_create,
      .event_destroy = &event_destroy,
      .event_record = &event_record,
      .stream_wait = &stream_wait,
      .event_query = &event_query,
      .event_synchronize = &event_synchronize,
      .export_memory = &export_memory,
      .open_memory = &open_memory,
      .close_memory = &close_memory,
      .export_event = &export_event,
      .open_event = &open_event,
      .error_string = &error_string,
      .not_ready = not_ready,
  };
}

}  // namespace emulated_detail

/// The emulated device runtime.
inline const runtime& emulated() noexcept {
  static constexpr runtime table = emulated_detail::make_emulated_runtime();
  return table;
}

namespace emulated_detail {
/// Makes the table what QCOLL_DEVICE=emulated selects in this program (device/runtime.hpp).
inline const bool included = (included_emulated_device = &emulated(), true);
}  // namespace emulated_detail

/// Sets the emulation's options: the device count at once, the delay for work queued
/// on streams made from now on (default streams already in use keep theirs).
inline void configure_emulated(const emulated_options& options) {
  emulated_detail::state& s = emulated_detail::the_state();
  s.devices.store(std::max(1, options.devices));
  s.delay_us.store(static_cast<long>(options.delay.count()));
}

/// Injected failures, for tests of what qcoll does when the device fails.
struct emulated_faults {
  /// The (after + 1)-th call of that kind from now fails, once.
  static void inject(emulated_fault kind, std::size_t after = 0) {
    emulated_detail::the_state().faults[static_cast<std::size_t>(kind)].store(static_cast<long>(after));
  }
  /// The same for the calls the calling thread makes only (a rank of threads over the
  /// in-process transport, say): the (after + 1)-th of them fails, once.
  static void inject_here(emulated_fault kind, std::size_t after = 0) {
    emulated_detail::thread_faults()[static_cast<std::size_t>(kind)] = static_cast<long>(after);
  }
  /// Disarms every injected failure that has not fired (this thread's too).
  static void clear() {
    for (auto& f : emulated_detail::the_state().faults) f.store(-1);
    for (long& f : emulated_detail::thread_faults()) f = -1;
  }
};

/// Streams and events alive now (for tests that nothing leaks).
inline emulated_census census() {
  emulated_detail::state& s = emulated_detail::the_state();
  const std::size_t allocations = s.memory.owned();
  std::lock_guard lock(s.mutex);
  return {allocations, s.streams.size(), s.events.size()};
}

}  // namespace qcoll::device
