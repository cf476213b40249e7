#pragma once
/// @file
/// What a communicator shares with the communicators split from it, and the handle
/// each of them holds on it (communicator.hpp).

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/progress_thread.hpp>

#include <cstdint>
#include <memory>
#include <utility>

namespace qcoll::detail {

/// The transport, the progress thread that runs the started calls of all of them (so
/// one thread at a time posts to the transport), and the next context no split has
/// used here.
template <transport Transport>
struct shared_connection {
  explicit shared_connection(Transport t) : transport(std::move(t)) {}
  detail::progress_thread& progress() {
    if (!progress_thread) progress_thread = std::make_unique<detail::progress_thread>();
    return *progress_thread;
  }
  Transport transport;
  std::unique_ptr<detail::progress_thread> progress_thread;  // after the transport: stops first
  std::uint64_t next_context = 1;
};

/// The shared connection, held by each communicator. Moving a communicator first
/// lets the started calls finish (they point at it).
template <transport Transport>
class connection_ref {
 public:
  explicit connection_ref(Transport transport)
      : connection_(std::make_shared<shared_connection<Transport>>(std::move(transport))) {}
  explicit connection_ref(std::shared_ptr<shared_connection<Transport>> connection)
      : connection_(std::move(connection)) {}
  connection_ref(connection_ref&& other) noexcept : connection_((other.wait_idle(), std::move(other.connection_))) {}
  connection_ref& operator=(connection_ref&& other) noexcept {
    wait_idle();
    other.wait_idle();
    connection_ = std::move(other.connection_);
    return *this;
  }
  shared_connection<Transport>* operator->() const noexcept { return connection_.get(); }
  const std::shared_ptr<shared_connection<Transport>>& get() const noexcept { return connection_; }
  void wait_idle() noexcept {
    if (connection_ && connection_->progress_thread) connection_->progress_thread->wait_idle();
  }
  bool is_progress_thread() const noexcept {
    return connection_ && connection_->progress_thread && connection_->progress_thread->is_current_thread();
  }

 private:
  std::shared_ptr<shared_connection<Transport>> connection_;
};

}  // namespace qcoll::detail
