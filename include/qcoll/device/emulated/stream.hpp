#pragma once
/// @file
/// The emulated device's streams and events. A stream is an in-order queue that a
/// worker thread of its own runs, each piece of work no sooner than `delay` after it
/// was queued, so work has not run when the call that queued it returns and a missing
/// wait shows as a wrong result (and, under ThreadSanitizer, as a data race). An event
/// is a pair of counters — records issued, records completed — that the stream's
/// worker advances when it reaches the record; an interprocess event keeps them in a
/// memfd page another process can open. The first error a piece of work returns stays
/// with its stream and is reported by the next synchronisation with it.

#include <qcoll/detail/posix_handles.hpp>
#include <qcoll/device/emulated/codes.hpp>
#include <qcoll/device/emulated/memfd.hpp>
#include <qcoll/device/runtime.hpp>

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace qcoll::device::emulated_detail {

using emulated_clock = std::chrono::steady_clock;

/// Polls `done` with a growing pause (up to 100 µs): waits on counters another thread
/// or process advances.
template <class Done>
void poll_until(Done&& done) {
  std::chrono::microseconds pause(1);
  while (!done()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(100));
  }
}

/// An event's counters; in a memfd page when it is interprocess.
struct event_counters {
  std::uint64_t magic;
  std::atomic<std::uint64_t> recorded;   ///< records issued
  std::atomic<std::uint64_t> completed;  ///< the highest record its stream has reached
  std::atomic<std::int32_t> error;       ///< an error of the stream it was recorded on
};
inline constexpr std::uint64_t event_magic = 0x71636f6c6c657674ULL;  // "qcollevt"
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "interprocess counters must be lock-free");

struct event_handle_bytes {
  std::uint64_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t id;
};

class event_state {
 public:
  /// A process-local event, or (interprocess) one in a memfd page others may open.
  static int make(bool interprocess, std::uint64_t id, event_state** made) {
    *made = nullptr;
    if (!interprocess) {
      auto* event = new event_state(id);
      event->counters_ = &event->local_;
      event->local_.magic = event_magic;
      *made = event;
      return success;
    }
    detail::file_descriptor fd = make_memfd(memfd_name("event", ::getpid(), id));
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    if (fd.get() < 0 || ::ftruncate(fd.get(), static_cast<off_t>(page)) != 0) return out_of_memory;
    void* shared = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (shared == MAP_FAILED) return out_of_memory;
    auto* event = new event_state(id);
    event->counters_ = new (shared) event_counters{event_magic, {0}, {0}, {0}};
    event->page_ = detail::mapping(shared, page);
    event->fd_ = std::move(fd);
    *made = event;
    return success;
  }

  /// Opens an event another process exported; a gone process or a reused descriptor is refused.
  static int open(const ipc_handle& handle, std::uint64_t id, event_state** opened) {
    *opened = nullptr;
    event_handle_bytes described{};
    std::memcpy(&described, handle.bytes, sizeof described);
    if (described.magic != event_magic) return invalid_handle;
    const detail::file_descriptor process = detail::open_process(described.pid);
    if (process.get() < 0) return invalid_handle;
    detail::file_descriptor fd = detail::fetch_descriptor(process, described.fd);
    if (fd.get() < 0 || !names_memfd(fd, memfd_name("event", described.pid, described.id))) return invalid_handle;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    void* shared = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (shared == MAP_FAILED) return out_of_memory;
    auto* event = new event_state(id);
    event->counters_ = static_cast<event_counters*>(shared);
    event->page_ = detail::mapping(shared, page);
    if (event->counters_->magic != event_magic) {
      delete event;
      return invalid_handle;
    }
    *opened = event;
    return success;
  }

  int export_to(ipc_handle* handle) const {
    if (fd_.get() < 0) return invalid_value;  // not made interprocess
    const event_handle_bytes described{event_magic, static_cast<std::int32_t>(::getpid()), fd_.get(), id_};
    *handle = {};
    std::memcpy(handle->bytes, &described, sizeof described);
    return success;
  }

  /// A new record; returns its number, which the stream completes when it reaches it.
  std::uint64_t issue() noexcept { return counters_->recorded.fetch_add(1, std::memory_order_acq_rel) + 1; }
  void complete(std::uint64_t record, int error) noexcept {
    if (error != 0) counters_->error.store(error, std::memory_order_release);
    std::uint64_t seen = counters_->completed.load(std::memory_order_acquire);
    while (seen < record &&
           !counters_->completed.compare_exchange_weak(seen, record, std::memory_order_acq_rel)) {
    }
  }
  /// The last record issued (what a wait issued now waits for).
  std::uint64_t last_issued() const noexcept { return counters_->recorded.load(std::memory_order_acquire); }
  bool reached(std::uint64_t record) const noexcept {
    return counters_->completed.load(std::memory_order_acquire) >= record;
  }
  int error() const noexcept { return counters_->error.load(std::memory_order_acquire); }

 private:
  explicit event_state(std::uint64_t id) : id_(id) {}

  std::uint64_t id_;
  event_counters local_{event_magic, {0}, {0}, {0}};
  event_counters* counters_ = nullptr;
  detail::mapping page_;
  detail::file_descriptor fd_;
};

/// A piece of work queued on a stream; returns 0 or an error code.
using work = std::function<int()>;

class stream_state {
 public:
  stream_state(int ordinal, std::chrono::microseconds delay) : ordinal_(ordinal), delay_(delay) {
    worker_ = std::thread([this] { run(); });
  }
  stream_state(const stream_state&) = delete;
  stream_state& operator=(const stream_state&) = delete;
  /// Runs what is queued, then stops the worker.
  ~stream_state() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    has_work_.notify_one();
    worker_.join();
  }

  int ordinal() const noexcept { return ordinal_; }

  void push(work piece) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({std::move(piece), emulated_clock::now() + delay_});
      ++queued_;
    }
    has_work_.notify_one();
  }

  /// Waits until what was queued before the call has run; returns (and forgets) the
  /// first error any of it returned since the last synchronisation.
  int synchronize() {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = queued_;
    idle_.wait(lock, [&] { return done_ >= target; });
    return std::exchange(error_, success);
  }

  /// Waits until what was queued before the call has run, leaving any error for the
  /// next synchronisation (what freeing memory does: cudaFree waits for the device).
  void wait_idle() {
    std::unique_lock lock(mutex_);
    const std::uint64_t target = queued_;
    idle_.wait(lock, [&] { return done_ >= target; });
  }

  /// The error work has returned since the last synchronisation (kept).
  int pending_error() {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  struct entry {
    work piece;
    emulated_clock::time_point not_before;
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      has_work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything ran
      entry next = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_until(next.not_before);
      const int result = next.piece();
      lock.lock();
      if (result != success && error_ == success) error_ = result;
      ++done_;
      idle_.notify_all();
    }
  }

  const int ordinal_;
  const std::chrono::microseconds delay_;
  std::mutex mutex_;
  std::condition_variable has_work_, idle_;
  std::deque<entry> queue_;
  std::uint64_t queued_ = 0, done_ = 0;
  int error_ = success;
  bool stopping_ = false;
  std::thread worker_;  // last: started once the rest is ready
};

}  // namespace qcoll::device::emulated_detail
