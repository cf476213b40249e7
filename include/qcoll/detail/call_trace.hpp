#pragma once
/// @file
/// QCOLL_DEBUG=INFO's line per exact collective: the algorithm and why (written by the
/// communicator when the call begins), then, when the call ends — returning or
/// throwing — how long it took, how much of that it waited on the transport, and which
/// copy path its bytes took. A call's speed depends on that path (docs/transports.md,
/// "Single copy"), and so does a run that is slower than the last one: the line says
/// which path a slow call took instead of leaving it to be guessed from the numbers.

#include <qcoll/detail/log.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace qcoll::detail {

/// Bytes by the way they moved, on this rank, in one call.
struct copy_paths {
  std::uint64_t transport = 0;  ///< posted to the transport (its pipes, sockets or MPI)
  std::uint64_t mapped = 0;     ///< read through a mapping of a peer's shared memory, no copy in between
  std::uint64_t peer_read = 0;  ///< copied out of a peer's memory by the transport (shm: process_vm_readv)
  std::uint64_t staged = 0;     ///< copied into this rank's shared staging buffer for a peer to map
};

/// Counts a call's bytes always (a few additions per step); measures and writes only
/// when armed, and tells a call's time to whoever asked with time_to(). Moving it moves
/// both duties; a moved-from trace does neither.
class call_trace {
 public:
  using clock = std::chrono::steady_clock;
  /// Told how long a call took that returned (not one that threw).
  using on_end = void (*)(void* context, clock::duration took) noexcept;

  call_trace() = default;
  call_trace(call_trace&& other) noexcept
      : paths(other.paths), prefix_(std::move(other.prefix_)), started_(other.started_), waited_(other.waited_),
        armed_(std::exchange(other.armed_, false)), ended_(std::exchange(other.ended_, nullptr)),
        context_(other.context_), exceptions_(other.exceptions_) {}
  call_trace& operator=(call_trace&&) = delete;
  ~call_trace() {
    if (ended_ && std::uncaught_exceptions() == exceptions_) ended_(context_, clock::now() - started_);
    if (armed_) write();
  }

  /// From now on the call is timed, and `ended(context, took)` is called when it
  /// returns (the single-copy path's chooser, tuning/copy_path.hpp). Before arm().
  void time_to(on_end ended, void* context) noexcept {
    ended_ = ended;
    context_ = context;
    exceptions_ = std::uncaught_exceptions();
    started_ = clock::now();
  }

  /// From now on the call is timed, and when it ends a line starting with `prefix` is
  /// written (log_info).
  void arm(std::string prefix) {
    prefix_ = std::move(prefix);
    if (!ended_) started_ = clock::now();
    armed_ = true;
  }
  bool armed() const noexcept { return armed_; }

  /// Time spent blocked in the transport's wait (counted only when armed).
  void add_wait(clock::duration d) noexcept { waited_ += d; }

  copy_paths paths;

 private:
  void write() const noexcept {
    using us = std::chrono::duration<double, std::micro>;
    log_info("{}; {:.1f} us, {:.1f} us of it waiting; bytes: transport {}, mapped {}, peer_read {}, staged {}",
             prefix_, us(clock::now() - started_).count(), us(waited_).count(), paths.transport, paths.mapped,
             paths.peer_read, paths.staged);
  }

  std::string prefix_;
  clock::time_point started_{};
  clock::duration waited_{};
  bool armed_ = false;
  on_end ended_ = nullptr;
  void* context_ = nullptr;
  int exceptions_ = 0;
};

}  // namespace qcoll::detail
