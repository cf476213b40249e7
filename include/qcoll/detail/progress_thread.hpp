#pragma once
/// @file
/// The one background thread a communicator may own: it runs the collectives that
/// were started without waiting, one after another in the order they were started,
/// so every rank posts its messages in the same order. Nothing here allocates per
/// operation: the queue is intrusive and an operation's storage is its caller's.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace qcoll::detail {

class progress_thread;

/// A queued collective. Its owner (a plan) keeps it alive until it has run.
class pending_operation {
 public:
  /// Runs the collective on the progress thread; returns its outcome and, on
  /// failure, the message that names what went wrong. `context` and `subject` are
  /// what submit() was given (say, a communicator and the plan it runs).
  using runner = std::error_code (*)(void* context, void* subject, std::string& message) noexcept;

  pending_operation() = default;
  pending_operation(const pending_operation&) = delete;
  pending_operation& operator=(const pending_operation&) = delete;

  /// True from submission until it has run.
  bool in_flight() const noexcept { return owner_ != nullptr && !done_.load(std::memory_order_acquire); }

 protected:
  ~pending_operation() = default;

  /// Blocks until the operation has run; returns its outcome and message.
  std::error_code wait_done(std::string& message);

 private:
  friend class progress_thread;

  runner run_ = nullptr;
  void* context_ = nullptr;
  void* subject_ = nullptr;
  progress_thread* owner_ = nullptr;  // valid while in flight: a communicator drains before it goes
  pending_operation* next_ = nullptr;
  std::atomic<bool> done_{false};
  std::error_code result_{};  // written before done_ is set
  std::string message_;
};

class progress_thread {
 public:
  progress_thread() = default;
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  /// Runs what was queued, then stops the thread.
  ~progress_thread() {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return idle(); });
      stopping_ = true;
    }
    work_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Queues `op`; `run(context, subject, message)` runs it on the progress thread.
  /// The thread starts with the first submission. `op` must not be in flight.
  void submit(pending_operation& op, pending_operation::runner run, void* context, void* subject) {
    std::lock_guard lock(mutex_);
    op.run_ = run;
    op.context_ = context;
    op.subject_ = subject;
    op.owner_ = this;
    op.next_ = nullptr;
    op.result_ = {};
    op.message_.clear();
    op.done_.store(false, std::memory_order_relaxed);
    (tail_ != nullptr ? tail_->next_ : head_) = &op;
    tail_ = &op;
    if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
    work_.notify_one();
  }

  /// Blocks until every queued operation has run.
  void wait_idle() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return idle(); });
  }

  bool is_current_thread() const noexcept { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  friend class pending_operation;

  bool idle() const noexcept { return head_ == nullptr && !busy_; }

  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return head_ != nullptr || stopping_; });
      if (head_ == nullptr) return;
      pending_operation& op = *head_;
      head_ = op.next_;
      if (head_ == nullptr) tail_ = nullptr;
      busy_ = true;
      lock.unlock();
      std::string message;
      const std::error_code result = op.run_(op.context_, op.subject_, message);
      lock.lock();
      op.result_ = result;
      op.message_ = std::move(message);
      op.done_.store(true, std::memory_order_release);
      busy_ = false;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_;     // something was queued, or the thread should stop
  std::condition_variable changed_;  // an operation completed
  pending_operation* head_ = nullptr;
  pending_operation* tail_ = nullptr;
  bool busy_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

inline std::error_code pending_operation::wait_done(std::string& message) {
  if (owner_ != nullptr && !done_.load(std::memory_order_acquire)) {
    std::unique_lock lock(owner_->mutex_);
    owner_->changed_.wait(lock, [&] { return done_.load(std::memory_order_relaxed); });
  }
  message = message_;
  return result_;
}

}  // namespace qcoll::detail
