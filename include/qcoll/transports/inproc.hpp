#pragma once
/// @file
/// In-process transport: ranks are threads of one process. It is the harness the
/// tests use to run whole algorithms at any world size, and a real transport for
/// programs that reduce across their own threads.
///
/// A message is copied once, straight from the sender's buffer into the
/// receiver's: whichever side posts second performs the copy, so progress never
/// depends on the other side calling wait.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <exception>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace qcoll::transports::inproc {

namespace detail {
struct world_state;
}

/// A posted send or receive; must not outlive the transport it was posted on.
/// Destroying a posted request cancels it.
class request : public request_base {
 public:
  request() = default;
  ~request();

 private:
  friend class transport;
  friend struct detail::world_state;

  enum class state : unsigned char { idle, queued, copying, done };

  detail::world_state* world_ = nullptr;
  rank_t owner_ = 0;  // the rank that posted it
  state state_ = state::idle;
  request* prev_ = nullptr;  // intrusive list of the mailbox it is queued in
  request* next_ = nullptr;
};

namespace detail {

struct request_list {
  request* head = nullptr;
  request* tail = nullptr;
};

/// Posted operations addressed to one rank, not yet matched.
struct mailbox {
  request_list sends;  // sends to this rank
  request_list recvs;  // receives posted by this rank
};

enum class presence : unsigned char { not_yet, attached, left };

struct world_state {
  explicit world_state(rank_t n)
      : size(n), boxes(n), wakeups(std::make_unique<std::condition_variable[]>(n)), presence_of(n) {}

  const rank_t size;
  std::mutex mutex;
  std::vector<mailbox> boxes;
  std::unique_ptr<std::condition_variable[]> wakeups;  // one per rank: its requests completed
  std::vector<presence> presence_of;
  bool aborted = false;
  std::error_code abort_code;
  std::string abort_reason;

  static void push(request_list& list, request& r) noexcept {
    r.prev_ = list.tail;
    r.next_ = nullptr;
    (list.tail ? list.tail->next_ : list.head) = &r;
    list.tail = &r;
  }

  static void unlink(request_list& list, request& r) noexcept {
    (r.prev_ ? r.prev_->next_ : list.head) = r.next_;
    (r.next_ ? r.next_->prev_ : list.tail) = r.prev_;
    r.prev_ = r.next_ = nullptr;
  }

  /// The oldest queued send from `sender` with `tag`: FIFO per (pair, tag).
  static request* find_send(const request_list& sends, rank_t sender, tag_t tag) noexcept {
    for (request* r = sends.head; r; r = r->next_)
      if (r->owner_ == sender && r->tag_ == tag) return r;
    return nullptr;
  }

  /// The oldest queued receive that expects `sender` and `tag`.
  static request* find_recv(const request_list& recvs, rank_t sender, tag_t tag) noexcept {
    for (request* r = recvs.head; r; r = r->next_)
      if (r->peer_ == sender && r->tag_ == tag) return r;
    return nullptr;
  }

  request_list& list_of(const request& r) noexcept {
    return r.is_send_ ? boxes[r.peer_].sends : boxes[r.owner_].recvs;
  }

  void complete(request& r, std::error_code result) noexcept {
    r.state_ = request::state::done;
    r.result_ = result;
    wakeups[r.owner_].notify_all();
  }

  /// Called with the lock held; copies with it released so ranks copy in parallel.
  void match(std::unique_lock<std::mutex>& lock, request& send, request& recv) {
    recv.take_header(send.header_);
    if (send.size_ != recv.size_) {
      // The receiver learns the sender's header and size; the bytes are not copied.
      recv.transferred_ = send.size_;
      complete(send, {});
      complete(recv, make_error_code(errc::protocol_error));
      return;
    }
    send.state_ = recv.state_ = request::state::copying;
    lock.unlock();
    if (send.size_ != 0) std::memcpy(recv.recv_data_, send.send_data_, send.size_);
    lock.lock();
    send.transferred_ = recv.transferred_ = send.size_;
    complete(send, {});
    complete(recv, {});
  }

  /// Why a queued request can no longer complete, if it cannot.
  std::error_code blocked_reason(const request& r) const noexcept {
    if (aborted) return abort_code;
    if (r.state_ == request::state::queued && presence_of[r.peer_] == presence::left)
      return make_error_code(errc::peer_lost);
    return {};
  }
};

}  // namespace detail

/// One rank's endpoint. Models qcoll::transport.
class transport {
 public:
  using request = inproc::request;

  transport(transport&& other) noexcept : state_(std::move(other.state_)), rank_(other.rank_) {}
  transport& operator=(transport&&) = delete;
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// Leaving wakes peers still waiting for this rank: they get errc::peer_lost.
  ~transport() {
    if (!state_) return;
    std::lock_guard lock(state_->mutex);
    state_->presence_of[rank_] = detail::presence::left;
    for (rank_t r = 0; r < state_->size; ++r) state_->wakeups[r].notify_all();
  }

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return state_->size; }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header,
                 std::span<const std::byte> data) {
    prepare(r, peer, tag, true);
    r.header_ = header;
    r.send_data_ = data.data();
    r.size_ = data.size();
    std::unique_lock lock(state_->mutex);
    if (auto reason = rejection(peer)) return state_->complete(r, reason);
    if (request* recv = detail::world_state::find_recv(state_->boxes[peer].recvs, rank_, tag)) {
      detail::world_state::unlink(state_->boxes[peer].recvs, *recv);
      state_->match(lock, r, *recv);
    } else {
      r.state_ = request::state::queued;
      detail::world_state::push(state_->boxes[peer].sends, r);
    }
  }

  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    prepare(r, peer, tag, false);
    r.recv_data_ = buffer.data();
    r.size_ = buffer.size();
    std::unique_lock lock(state_->mutex);
    auto& box = state_->boxes[rank_];
    if (state_->aborted) return state_->complete(r, state_->abort_code);
    if (request* send = detail::world_state::find_send(box.sends, peer, tag)) {
      detail::world_state::unlink(box.sends, *send);
      state_->match(lock, *send, r);
    } else if (auto reason = rejection(peer)) {
      state_->complete(r, reason);
    } else {
      r.state_ = request::state::queued;
      detail::world_state::push(box.recvs, r);
    }
  }

  /// True once the request completed, successfully or not.
  bool test(const request& r) const {
    std::lock_guard lock(state_->mutex);
    return r.state_ == request::state::done || (r.state_ == request::state::queued && state_->blocked_reason(r));
  }

  /// Waits until the request completes or `until` passes. On failure a still-queued
  /// request is withdrawn, so its buffer is free again.
  std::error_code wait(request& r, deadline until) {
    std::unique_lock lock(state_->mutex);
    if (r.state_ == request::state::idle) return make_error_code(errc::invalid_argument);
    for (;;) {
      if (r.state_ == request::state::done) {
        r.world_ = nullptr;  // finished: it may now outlive the world
        return r.result_;
      }
      if (r.state_ == request::state::queued) {
        std::error_code reason = state_->blocked_reason(r);
        if (!reason && clock::now() >= until) reason = make_error_code(errc::timeout);
        if (reason) {
          detail::world_state::unlink(state_->list_of(r), r);
          r.state_ = request::state::done;
          r.result_ = reason;
          r.world_ = nullptr;
          return reason;
        }
      }
      state_->wakeups[rank_].wait_until(lock, until);
    }
  }

  /// Fails every rank's pending and future operations with `code`; the first abort wins.
  void abort(std::error_code code, std::string_view reason) {
    std::lock_guard lock(state_->mutex);
    if (state_->aborted) return;
    state_->aborted = true;
    state_->abort_code = code;
    state_->abort_reason = reason;
    for (rank_t r = 0; r < state_->size; ++r) state_->wakeups[r].notify_all();
  }

  /// Ranks share one address space: a single-copy read is a memcpy from the peer's
  /// buffer. It is safe while the peer waits for this rank's "done" message (it leaves
  /// the buffer alone until then): the read happens only while the peer's receive from
  /// this rank is queued, and marks it copying, so the peer cannot withdraw it and
  /// leave the call (a failure elsewhere) until the copy is over.
  bool single_copy() const noexcept { return true; }
  std::error_code read_peer(rank_t peer, std::uint64_t address, std::span<std::byte> into) {
    if (peer >= state_->size || peer == rank_) return make_error_code(errc::invalid_argument);
    std::unique_lock lock(state_->mutex);
    request* waiting = state_->boxes[peer].recvs.head;
    while (waiting && waiting->peer_ != rank_) waiting = waiting->next_;
    if (!waiting) return state_->aborted ? state_->abort_code : make_error_code(errc::peer_lost);
    waiting->state_ = request::state::copying;
    lock.unlock();
    if (!into.empty())
      std::memcpy(into.data(), reinterpret_cast<const void*>(static_cast<std::uintptr_t>(address)), into.size());
    lock.lock();
    waiting->state_ = request::state::queued;
    state_->wakeups[peer].notify_all();
    return {};
  }

  /// The first abort's code and reason; an empty code while the world is intact.
  transports::failure failure() const {
    std::lock_guard lock(state_->mutex);
    return {state_->abort_code, state_->abort_reason};
  }

 private:
  friend class world;
  transport(std::shared_ptr<detail::world_state> state, rank_t rank) : state_(std::move(state)), rank_(rank) {}

  void prepare(request& r, rank_t peer, tag_t tag, bool is_send) const {
    if (peer >= state_->size)
      qcoll::detail::throw_error(errc::invalid_argument, "inproc transport: rank {} of {}: peer {} is out of range",
                                 rank_, state_->size, peer);
    if (r.state_ == request::state::queued || r.state_ == request::state::copying)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "inproc transport: rank {}: a request was posted again while still pending", rank_);
    r.world_ = state_.get();
    r.owner_ = rank_;
    r.begin_post(peer, tag, is_send);
  }

  std::error_code rejection(rank_t peer) const noexcept {
    if (state_->aborted) return state_->abort_code;
    if (state_->presence_of[peer] == detail::presence::left) return make_error_code(errc::peer_lost);
    return {};
  }

  std::shared_ptr<detail::world_state> state_;
  rank_t rank_ = 0;
};

/// The shared state of `size` ranks. Hand endpoint(r) to the thread that runs rank r.
class world {
 public:
  explicit world(rank_t size) {
    if (size == 0) qcoll::detail::throw_error(errc::invalid_argument, "inproc world: size must be at least 1");
    state_ = std::make_shared<detail::world_state>(size);
  }

  rank_t size() const noexcept { return state_->size; }

  /// The endpoint of rank r; each rank's endpoint can be taken once.
  transport endpoint(rank_t r) {
    std::lock_guard lock(state_->mutex);
    if (r >= state_->size)
      qcoll::detail::throw_error(errc::invalid_argument, "inproc world: rank {} is out of range for size {}", r,
                                 state_->size);
    if (state_->presence_of[r] != detail::presence::not_yet)
      qcoll::detail::throw_error(errc::invalid_argument, "inproc world: the endpoint of rank {} was already taken", r);
    state_->presence_of[r] = detail::presence::attached;
    return transport(state_, r);
  }

 private:
  std::shared_ptr<detail::world_state> state_;
};

/// Runs fn(transport) for each rank of a new world of `size` ranks, each on its own
/// thread, and waits for all of them. Returns what each rank threw (null where it
/// returned). A rank that throws leaves, so the others fail with errc::peer_lost
/// (or the error it aborted with) instead of waiting.
template <class Fn>
std::vector<std::exception_ptr> run_ranks(rank_t size, Fn fn) {
  world ranks(size);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::jthread> threads;
  threads.reserve(size);
  for (rank_t r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(ranks.endpoint(r));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  threads.clear();  // joins
  return errors;
}

inline request::~request() {
  if (!world_) return;
  std::unique_lock lock(world_->mutex);
  if (state_ == state::queued) {
    detail::world_state::unlink(world_->list_of(*this), *this);
  } else {
    // Another rank is copying into or out of this request's buffer: let it finish.
    world_->wakeups[owner_].wait(lock, [this] { return state_ != state::copying; });
  }
}

static_assert(qcoll::transport<transport>);

}  // namespace qcoll::transports::inproc
