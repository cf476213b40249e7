#pragma once
/// @file
/// The emulated device's process-wide state (runtime.hpp has the design): its options,
/// the registry of its memory, streams and events, the faults a test injects, and
/// `queue`, which every entry that runs on a stream goes through — the checks a GPU
/// would make (a stream that exists, every touched range in its device's memory, an
/// injected fault) before the work is queued. runtime.hpp's entries are built on it.

#include <qcoll/device/emulated/codes.hpp>
#include <qcoll/device/emulated/memory.hpp>
#include <qcoll/device/emulated/stream.hpp>
#include <qcoll/device/runtime.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace qcoll::device {

struct emulated_options {
  /// Devices the emulation shows (QCOLL_EMULATED_DEVICES, default 1).
  int devices = 1;
  /// The least time between queuing a piece of work and running it
  /// (QCOLL_EMULATED_DELAY_US, default 0: as soon as the worker gets to it).
  std::chrono::microseconds delay{0};
};

/// What can be made to fail, once, by emulated_faults::inject.
enum class emulated_fault : std::uint8_t {
  allocation,    ///< allocate, allocate_host: out of memory
  copy,          ///< copy, fill: refused when queued
  kernel,        ///< any kernel: refused when queued (a launch failure)
  lost_handle,   ///< open_memory, open_event: the handle is not honoured
  failed_work,   ///< the next piece of work queued on any stream fails when it runs (reported at the next synchronisation)
};
inline constexpr std::size_t emulated_fault_kinds = 5;

/// How much of the emulated device is alive: for tests that nothing leaks.
struct emulated_census {
  std::size_t allocations = 0;  ///< device and pinned host memory not released
  std::size_t streams = 0;      ///< created and not destroyed (the default streams not counted)
  std::size_t events = 0;
};

namespace emulated_detail {

inline int option_from_environment(const char* name, int fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(value, &end, 10);
  return end && *end == '\0' && parsed >= 0 && parsed < (1 << 30) ? static_cast<int>(parsed) : fallback;
}

/// The process's emulated device: created at first use, never destroyed (work may
/// still be queued on its streams while the process exits).
struct state {
  state() {
    devices.store(std::max(1, option_from_environment("QCOLL_EMULATED_DEVICES", 1)));
    delay_us.store(option_from_environment("QCOLL_EMULATED_DELAY_US", 0));
    for (auto& f : faults) f.store(-1);
  }

  std::atomic<int> devices{1};
  std::atomic<long> delay_us{0};
  std::atomic<long> faults[emulated_fault_kinds];
  memory_registry memory;

  std::mutex mutex;  // guards what follows
  std::map<stream_state*, std::shared_ptr<stream_state>> streams;  // shared: a free waits on them unlocked
  std::map<event_state*, std::shared_ptr<event_state>> events;
  std::vector<stream_state*> default_streams;  // one per device, made at first use, never destroyed
  std::uint64_t last_event_id = 0;
};

inline state& the_state() {
  static state* const instance = new state;  // never destroyed: see above
  return *instance;
}

inline int& current_ordinal() {
  thread_local int ordinal = 0;
  return ordinal;
}

/// Faults injected for the calls of one thread only (emulated_faults::inject_here).
inline long (&thread_faults())[emulated_fault_kinds] {
  thread_local long countdowns[emulated_fault_kinds] = {-1, -1, -1, -1, -1};
  return countdowns;
}

/// Whether an injected fault of `kind` fires now (and disarms it): one injected for this
/// thread's calls first, else one for any thread's.
inline bool fault_fires(emulated_fault kind) {
  long& mine = thread_faults()[static_cast<std::size_t>(kind)];
  if (mine >= 0) return mine-- == 0;
  std::atomic<long>& countdown = the_state().faults[static_cast<std::size_t>(kind)];
  long left = countdown.load();
  while (left >= 0) {
    if (countdown.compare_exchange_weak(left, left - 1)) return left == 0;
  }
  return false;
}

inline std::chrono::microseconds delay() { return std::chrono::microseconds(the_state().delay_us.load()); }

/// The stream a handle names (null: the current device's default stream), or null
/// when it names none.
inline stream_state* stream_of(stream_handle handle) {
  state& s = the_state();
  std::lock_guard lock(s.mutex);
  if (handle == nullptr) {
    const int ordinal = current_ordinal();
    if (s.default_streams.size() <= static_cast<std::size_t>(ordinal))
      s.default_streams.resize(static_cast<std::size_t>(ordinal) + 1, nullptr);
    stream_state*& fallback = s.default_streams[static_cast<std::size_t>(ordinal)];
    if (!fallback) fallback = new stream_state(ordinal, delay());  // never destroyed
    return fallback;
  }
  const auto found = s.streams.find(static_cast<stream_state*>(handle));
  return found == s.streams.end() ? nullptr : found->second.get();
}

inline std::shared_ptr<event_state> event_of(event_handle handle) {
  state& s = the_state();
  std::lock_guard lock(s.mutex);
  const auto found = s.events.find(static_cast<event_state*>(handle));
  return found == s.events.end() ? nullptr : found->second;
}

/// A range a kernel reads or writes.
struct touched {
  const void* pointer;
  std::size_t bytes;
};

/// Queues `piece` on `handle`'s stream once every range in `ranges` lies in device
/// memory of the stream's device (or pinned host memory); `fault` is the injected
/// failure that refuses it when queued.
template <class Piece>
int queue(stream_handle handle, emulated_fault fault, std::initializer_list<touched> ranges, Piece&& piece) {
  stream_state* stream = stream_of(handle);
  if (!stream) return invalid_handle;
  for (const touched& range : ranges)
    if (!the_state().memory.reachable(range.pointer, range.bytes, stream->ordinal())) return illegal_address;
  if (fault_fires(fault)) return injected;
  if (fault_fires(emulated_fault::failed_work)) {
    stream->push([] { return static_cast<int>(injected); });
    return success;
  }
  stream->push([piece = std::forward<Piece>(piece)]() mutable {
    piece();
    return static_cast<int>(success);
  });
  return success;
}

}  // namespace emulated_detail

}  // namespace qcoll::device
