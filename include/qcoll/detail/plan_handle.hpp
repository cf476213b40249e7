#pragma once
/// @file
/// What every allreduce plan shares (compressed_allreduce_plan, grid_allreduce_plan):
/// the state it owns, its committed/staging residual switch and roll-back, and the
/// handle of a call started without waiting. `State` has `committed` (which of its
/// two residual buffers holds the committed residuals) and `calls` (successful calls).

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/progress_thread.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>

#include <concepts>
#include <span>
#include <string>
#include <system_error>
#include <utility>

namespace qcoll {
template <transport Transport, ring_topology Topology>
class communicator;
}  // namespace qcoll

namespace qcoll::detail {

/// A plan a communicator's allreduce(plan, …) runs.
template <class P>
concept allreduce_plan = requires {
  typename P::quantizer_type;
  typename P::value_type;
  { P::collective_kind } -> std::convertible_to<collective>;
};

template <class State, class Value>
class plan_handle : private pending_operation {
 public:
  using value_type = Value;

  plan_handle(const plan_handle&) = delete;
  plan_handle& operator=(const plan_handle&) = delete;

  /// Plans move (so one per layer fits in a std::vector) while no call is in flight.
  /// @throws qcoll::error (invalid_argument) when one is.
  plan_handle(plan_handle&& other)
      : state_((other.require_idle("move"), std::move(other.state_))),
        name_(other.name_),
        can_roll_back_(other.can_roll_back_) {}
  plan_handle& operator=(plan_handle&& other) {
    require_idle("move");
    other.require_idle("move");
    state_ = std::move(other.state_);
    can_roll_back_ = other.can_roll_back_;
    return *this;
  }

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
      throw_error(errc::invalid_argument, "{}::roll_back_last_call: no successful call to roll back", name_);
    // The previous residuals are intact in the staging buffers until the next call.
    state_.committed = 1 - state_.committed;
    --state_.calls;
    can_roll_back_ = false;
  }

  // ---- the handle of a call started with communicator::start_allreduce ----

  /// True from start_allreduce until the call has finished (successfully or not).
  bool in_flight() const noexcept { return pending_operation::in_flight(); }
  /// True once the started call has finished; wait() then returns at once.
  bool test() const noexcept { return !in_flight(); }
  /// Blocks until the started call has finished; throws qcoll::error if it failed.
  /// Every step of the call has the communicator's timeout, so this returns.
  void wait() {
    std::string message;
    if (const std::error_code failure = wait_done(message)) throw error(failure, message);
  }
  void wait(std::error_code& ec) noexcept {
    std::string message;
    ec = wait_done(message);
  }

 protected:
  explicit plan_handle(const char* name) : name_(name) {}
  /// Waits for a call still in flight (its buffers and this state are in use).
  ~plan_handle() {
    std::string ignored;
    if (in_flight()) wait_done(ignored);
  }

  void require_idle(const char* what) const {
    if (in_flight())
      throw_error(errc::invalid_argument, "{}::{}: the plan is in flight; wait() for it first", name_, what);
  }
  /// After reset_residuals: there is nothing left to roll back.
  void forget_last_call() noexcept { can_roll_back_ = false; }

  State state_;

 private:
  template <transport Transport, ring_topology Topology>
  friend class qcoll::communicator;

  /// A successful call makes its staged residuals the committed ones.
  void commit() noexcept {
    state_.committed = 1 - state_.committed;
    ++state_.calls;
    can_roll_back_ = true;
  }
  /// A call started: the staging buffers are about to be overwritten.
  void begin_call() noexcept { can_roll_back_ = false; }

  const char* name_;
  bool can_roll_back_ = false;
  // The call a start_allreduce queued (read by the progress thread).
  std::span<const Value> started_in_;
  std::span<Value> started_out_;
  reduce_op started_op_ = reduce_op::sum;
};

}  // namespace qcoll::detail
