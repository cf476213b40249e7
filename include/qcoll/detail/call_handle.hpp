#pragma once
/// @file
/// call_handle: what every handle of a call started without waiting offers its user
/// (in_flight, test, wait) — a plan is one, a collective_handle another. It is the
/// progress thread's queue entry, so it must not move while the call is in flight.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/progress_thread.hpp>

#include <string>
#include <system_error>

namespace qcoll::detail {

class call_handle : private pending_operation {
 public:
  call_handle(const call_handle&) = delete;
  call_handle& operator=(const call_handle&) = delete;

  /// True from the start of a call until it has finished (successfully or not).
  bool in_flight() const noexcept { return pending_operation::in_flight(); }
  /// True once the started call has finished; wait() then returns at once.
  bool test() const noexcept { return !in_flight(); }
  /// Blocks until the started call has finished; throws qcoll::error if it failed.
  /// Every step of a call has its communicator's timeout, so this returns.
  void wait() {
    std::string message;
    if (const std::error_code failure = wait_done(message)) throw error(failure, message);
  }
  void wait(std::error_code& ec) noexcept {
    std::string message;
    ec = wait_done(message);
  }

  /// @throws qcoll::error (invalid_argument) when a call is in flight.
  void require_idle(const char* what) const {
    if (in_flight()) throw_error(errc::invalid_argument, "{}::{}: a call is in flight; wait() for it first", name_, what);
  }

 protected:
  /// `name` names the handle's kind in error messages (a string literal).
  explicit call_handle(const char* name) noexcept : name_(name) {}
  /// Handles move while idle; the caller checks (require_idle) before moving.
  call_handle(call_handle&& other) noexcept : pending_operation(), name_(other.name_) {}
  call_handle& operator=(call_handle&&) noexcept { return *this; }
  ~call_handle() { finish_in_flight(); }

  /// Waits for a call still in flight. A derived handle whose members the call uses
  /// calls this in its own destructor, before they go.
  void finish_in_flight() noexcept {
    std::string ignored;
    if (in_flight()) wait_done(ignored);
  }

  const char* name() const noexcept { return name_; }
  /// The progress thread's entry for the next call.
  pending_operation& operation() noexcept { return *this; }

 private:
  const char* name_;
};

}  // namespace qcoll::detail
