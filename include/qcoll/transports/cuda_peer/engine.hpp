#pragma once
/// @file
/// One rank's side of the CUDA peer protocol (transports/cuda_peer.hpp describes it):
/// the windows and their handles, the records' handling, progress, failures and
/// teardown.
///
/// Over 500 lines: one state machine — posting, each record's handling, progress,
/// failure and teardown all act on the same per-peer links (slots, credits, posted and
/// unexpected messages); split, each part would take the whole of the link's state.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/cpu_relax.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/transports/cuda_peer/protocol.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace qcoll::transports::cuda_peer {

/// One rank's side of the protocol: what transport (below) holds, where posted requests
/// point, so it never moves.
template <qcoll::transport Control>
class engine {
 public:
  using request = cuda_peer::request<Control>;

  engine(Control control, const options& settings)
      : control_(std::move(control)),
        settings_(settings),
        runtime_(&execution::device_runtime("cuda_peer transport")),
        links_(control_.size()) {
    if (settings_.slots == 0 || settings_.slot_bytes == 0)
      fail_connect(errc::invalid_argument, "slots ({}) and slot_bytes ({}) must be positive", settings_.slots,
                   settings_.slot_bytes);
    if (settings_.device < 0) check(runtime_->current_device(&settings_.device), "finding the current device");
    execution::with_current_device(*runtime_, settings_.device, [&] {
      stream_ = execution::device_stream_owner("cuda_peer transport");
      windows_ = execution::device_memory<std::byte>(window_bytes() * size());
      for (link& l : links_) {
        l.out_slots.resize(settings_.slots);
        for (out_slot& s : l.out_slots) s.copied = execution::device_event("cuda_peer transport");
        l.drained.resize(settings_.slots);
        for (execution::device_event& e : l.drained) e = execution::device_event("cuda_peer transport");
      }
    });
    connect();
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  ~engine() { close(); }

  rank_t rank() const noexcept { return control_.rank(); }
  rank_t size() const noexcept { return control_.size(); }
  int device() const noexcept { return settings_.device; }
  const options& settings() const noexcept { return settings_; }
  Control& control() noexcept { return control_; }
  /// The stream every copy of this transport runs on.
  device::stream_handle stream() const noexcept { return stream_.get(); }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    prepare(r, peer, tag, true, data.data(), data.size(), "send's data");
    r.send_data_ = data.data();
    link& l = links_[peer];
    if (l.broken || l.leaving) return refuse_gone(r, l.gone);
    r.id_ = l.next_id++;
    r.state_ = request::state::announced;
    detail::record announcement{detail::record::announce, r.id_, 0, data.size(), tag, header, {}};
    send_record(peer, announcement);
    if (data.size() == 0) {
      complete(r, {});
    } else {
      l.awaiting_clearance.emplace(r.id_, &r);
      pump();
    }
  }

  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    prepare(r, peer, tag, false, buffer.data(), buffer.size(), "receive's buffer");
    r.recv_data_ = buffer.data();
    link& l = links_[peer];
    if (l.broken || l.leaving) return refuse_gone(r, l.gone);
    r.state_ = request::state::announced;
    const auto waiting = std::find_if(l.unexpected.begin(), l.unexpected.end(),
                                      [&](const detail::record& a) { return a.slot == tag; });
    if (waiting != l.unexpected.end()) {
      const detail::record announcement = *waiting;
      l.unexpected.erase(waiting);
      match(r, announcement);
    } else {
      l.posted.push_back(&r);
    }
    pump();
  }

  /// True once the request completed, successfully or not.
  bool test(request& r) {
    pump();
    return r.state_ == request::state::done;
  }

  /// Moves everything until `r` completes or `until` passes (then it is withdrawn:
  /// timeout; one caught half-moved aborts the transport).
  std::error_code wait(request& r, deadline until) {
    if (r.state_ == request::state::idle || r.engine_ != this) return make_error_code(errc::invalid_argument);
    for (unsigned idle = 0;;) {
      if (pump()) idle = 0;
      if (r.state_ == request::state::done) return finish(r);
      if (clock::now() >= until) {
        withdraw(r, make_error_code(errc::timeout), "a wait timed out");
        return finish(r);
      }
      back_off(idle++);
    }
  }

  /// Aborts the control transport (every rank hears) and fails every pending request.
  void abort(std::error_code code, std::string_view reason) {
    control_.abort(code, reason);
    fail_everything(control_.failure().code ? control_.failure().code : code);
  }

  transports::failure failure() const { return control_.failure(); }

  /// Bytes this rank copied into its peers' windows.
  std::uint64_t bytes_copied() const noexcept { return bytes_copied_; }

 private:
  friend class cuda_peer::request<Control>;

  struct out_slot {
    enum class state : unsigned char { free, copying, noted } now = state::free;
    request* owner = nullptr;
    std::uint64_t id = 0, offset = 0, bytes = 0;
    execution::device_event copied;
  };
  struct drain {
    request* owner = nullptr;
    std::uint64_t slot = 0, bytes = 0;
  };
  /// What this rank keeps per peer.
  struct link {
    std::byte* window = nullptr;   ///< this rank's window at the peer (its slots)
    void* opened = nullptr;        ///< the peer's allocation as open_memory mapped it (null: not opened)
    std::vector<out_slot> out_slots;
    std::vector<execution::device_event> drained;  ///< per slot of this rank's window from the peer
    std::deque<request*> posted;            ///< receives no announcement matched yet, in order
    std::deque<detail::record> unexpected;  ///< announcements no receive matched yet, in order
    std::map<std::uint64_t, request*> awaiting_clearance;  ///< sends announced, by id
    std::deque<request*> streaming;                        ///< sends cleared, in order
    std::map<std::uint64_t, request*> receiving;           ///< receives cleared, by the sender's id
    std::vector<drain> draining;                           ///< slot copies into receives' buffers
    std::uint64_t next_id = 1;
    /// Receives of the peer's next records, posted in a ring and taken in order (see inbox_size).
    struct inbox_entry {
      typename Control::request posted;
      detail::record arrived;
    };
    std::vector<inbox_entry> inbox;
    std::size_t next_in = 0;  ///< the oldest posted
    bool leaving = false;   ///< the peer's transport is closing: nothing more goes to or from it
    bool released = false;  ///< the peer closed its mapping of this rank's window
    bool broken = false;    ///< the control transport lost the peer (or was aborted)
    std::error_code gone;   ///< why, once broken or leaving: what a request posted later fails with
  };
  struct outgoing_record {
    typename Control::request sent;
    detail::record data;
    rank_t peer = 0;
  };

  std::size_t window_bytes() const noexcept { return settings_.slots * settings_.slot_bytes; }
  /// Where peer p's chunks land in this rank's window.
  std::byte* window_from(rank_t p) const noexcept { return windows_.data() + window_bytes() * p; }

  void check(int code, const char* what) const { execution::check_device(*runtime_, code, what); }

  template <class... Args>
  [[noreturn]] void fail_connect(errc code, qcoll::detail::format_string<Args...> format, const Args&... args) const {
    qcoll::detail::throw_error(code, "cuda_peer transport: rank {} of {}: {}", rank(), size(),
                               qcoll::detail::format(format, args...));
  }

  void prepare(request& r, rank_t peer, tag_t tag, bool is_send, const void* data, std::size_t bytes,
               const char* what) {
    if (peer >= size() || peer == rank())
      qcoll::detail::throw_error(errc::invalid_argument, "cuda_peer transport: rank {} of {}: peer {} is out of range or this rank",
                                 rank(), size(), peer);
    if (tag >= first_reserved_tag)
      qcoll::detail::throw_error(errc::invalid_argument, "cuda_peer transport: rank {}: tag {:#x} is reserved (tags are below {:#x})",
                                 rank(), tag, first_reserved_tag);
    if (r.state_ == request::state::announced || r.state_ == request::state::streaming)
      qcoll::detail::throw_error(errc::invalid_argument, "cuda_peer transport: rank {}: a request was posted again while still pending",
                                 rank());
    if (bytes != 0) {
      device::pointer_facts facts;
      check(runtime_->locate(data, &facts), "locating a buffer");
      if (!facts.device || facts.ordinal != settings_.device)
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "cuda_peer transport: rank {}: the {} ({} bytes at {}) is {}; the transport moves "
                                   "device memory of device {}",
                                   rank(), what, bytes, data,
                                   facts.device ? qcoll::detail::format("memory of device {}", facts.ordinal)
                                                : std::string("host memory"),
                                   settings_.device);
    }
    r.engine_ = this;
    r.begin_post(peer, tag, is_send);
    r.size_ = bytes;
    r.queued_ = r.moved_ = 0;
  }

  // ---- connect and close

  /// Every rank sends its window to every peer, opens theirs, then tells every peer
  /// whether it could: all fail alike, naming the first failure.
  void connect() {
    const deadline until = clock::now() + settings_.timeout;
    device::ipc_handle handle;
    check(runtime_->export_memory(windows_.data(), &handle), "exporting the receive windows");
    detail::record mine{detail::record::window, static_cast<std::uint64_t>(::getpid()),
                        reinterpret_cast<std::uintptr_t>(windows_.data()), settings_.slot_bytes, settings_.slots, {}, handle};
    std::vector<detail::record> theirs = exchange(mine, until);
    std::string trouble;
    for (rank_t p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      const detail::record& w = theirs[p];
      if (w.kind != detail::record::window || w.bytes != settings_.slot_bytes || w.slot != settings_.slots) {
        trouble = qcoll::detail::format("rank {} has windows of {} slots of {} bytes, this rank {} of {}", p, w.slot,
                                        w.bytes, settings_.slots, settings_.slot_bytes);
        break;
      }
      void* opened = nullptr;
      const int code = execution::with_current_device(*runtime_, settings_.device,
                                                      [&] { return runtime_->open_memory(&w.handle, &opened); });
      if (code == 0) {
        links_[p].opened = opened;
        links_[p].window = static_cast<std::byte*>(opened) + window_bytes() * rank();
      } else {
        trouble = qcoll::detail::format("cannot open the window of rank {} (process {}): {} error {}: {}", p, w.id,
                                        runtime_->name, code, runtime_->error_string(code));
        break;
      }
    }
    // Everyone learns whether everyone could.
    detail::record verdict{detail::record::opened, 0, 0, trouble.empty() ? 0u : 1u, 0, {}, {}};
    const std::vector<detail::record> verdicts = exchange(verdict, until);
    if (!trouble.empty()) {
      close_windows();
      fail_connect(errc::invalid_argument, "{}", trouble);
    }
    for (rank_t p = 0; p < size(); ++p)
      if (p != rank() && verdicts[p].bytes != 0) {
        close_windows();
        fail_connect(errc::invalid_argument, "rank {} could not open a peer's receive window (it says why)", p);
      }
    for (rank_t p = 0; p < size(); ++p)
      if (p != rank()) {
        links_[p].inbox = std::vector<typename link::inbox_entry>(inbox_size());
        for (std::size_t k = 0; k < inbox_size(); ++k) post_incoming(p, k);
      }
  }

  /// Records a peer may send while this rank does not call into the transport (it is in
  /// a call of another user of the control transport, say a host communicator over the
  /// same connections): credits and chunks, at most `slots` each, the announcements of
  /// one step's messages, and the goodbyes. A control transport that delivers a peer's
  /// messages in order across tags (the stream engine) would hold that user's messages
  /// behind a record no receive waits for; so this many stay posted.
  std::size_t inbox_size() const noexcept { return 2 * settings_.slots + 16; }

  /// Sends `mine` to every peer and returns what each sent (blocking, before any data moves).
  std::vector<detail::record> exchange(const detail::record& mine, deadline until) {
    std::vector<detail::record> theirs(size());
    std::deque<typename Control::request> requests;
    for (rank_t p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      control_.post_recv(requests.emplace_back(), p, protocol_tag, std::as_writable_bytes(std::span(&theirs[p], 1)));
      control_.post_send(requests.emplace_back(), p, protocol_tag, message_header{}, std::as_bytes(std::span(&mine, 1)));
    }
    std::size_t k = 0;
    for (rank_t p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      for (int both = 0; both < 2; ++both, ++k)
        if (const std::error_code failed = control_.wait(requests[k], until)) {
          const std::string why = failure().reason;
          fail_connect(failed == errc::timeout ? errc::timeout : errc::peer_lost,
                       "exchanging receive windows with rank {}: {}{}{}", p, failed.message(),
                       why.empty() ? "" : ": ", why);
        }
    }
    return theirs;
  }

  void close_windows() noexcept {
    for (link& l : links_) close_window(l);
  }
  void close_window(link& l) noexcept {
    if (l.opened) runtime_->close_memory(l.opened);
    l.opened = nullptr;
    l.window = nullptr;
  }

  /// Waits for this rank's copies, closes the peers' windows and tells every peer it
  /// leaves (their requests that involve it fail with peer_lost, as a peer that leaves any
  /// transport); frees its own windows once each peer has closed its mapping of them (or
  /// is gone, or the timeout passed).
  void close() noexcept {
    if (!runtime_ || !stream_) return;
    runtime_->synchronize(stream_.get());
    close_windows();
    try {
      if (control_.failure().code || size() == 1) return;
      for (rank_t p = 0; p < size(); ++p)
        if (p != rank() && !links_[p].broken) send_record(p, {detail::record::leaving, 0, 0, 0, 0, {}, {}});
      const deadline until = clock::now() + settings_.timeout;
      for (unsigned idle = 0; clock::now() < until && !control_.failure().code;) {
        if (pump()) idle = 0;
        bool all = true;
        for (rank_t p = 0; p < size(); ++p) all = all && (p == rank() || links_[p].released || links_[p].broken);
        if (all) break;
        back_off(idle++);
      }
      // The last records must leave before the control transport goes.
      for (unsigned idle = 0; !sent_.empty() && clock::now() < until && !control_.failure().code; back_off(idle++))
        recycle_sent();
    } catch (...) {  // a control transport that throws while closing: the windows go anyway
    }
  }

  // ---- progress

  /// Moves every pending thing one step; true when anything moved.
  bool pump() {
    bool moved = false;
    for (rank_t p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      link& l = links_[p];
      while (!l.broken && control_.test(l.inbox[l.next_in].posted)) {
        moved = true;
        const std::size_t k = l.next_in;
        if (const std::error_code failed = control_.wait(l.inbox[k].posted, clock::now())) {
          lost(p, failed);
          break;
        }
        l.next_in = (k + 1) % l.inbox.size();
        handle(p, l.inbox[k].arrived);
        if (!l.broken) post_incoming(p, k);
      }
      moved = advance_sends(p) || moved;
      moved = advance_receives(p) || moved;
    }
    recycle_sent();
    return moved;
  }

  /// A receive meets its announcement: it takes the sender's header, then fails when the
  /// sizes differ (the sender hears "refused"), completes when empty, or clears the
  /// sender to stream.
  void match(request& r, const detail::record& a) {
    r.take_header(a.header);
    r.id_ = a.id;
    if (a.bytes != r.size_) {
      r.transferred_ = a.bytes;
      if (a.bytes != 0) send_record(r.peer_, {detail::record::refused, a.id, 0, 0, 0, {}, {}});
      return complete(r, make_error_code(errc::protocol_error));
    }
    if (a.bytes == 0) return complete(r, {});
    r.state_ = request::state::streaming;
    links_[r.peer_].receiving.emplace(a.id, &r);
    send_record(r.peer_, {detail::record::clear_to_send, a.id, 0, 0, 0, {}, {}});
  }

  void handle(rank_t p, const detail::record& got) {
    link& l = links_[p];
    switch (got.kind) {
      case detail::record::announce: {
        const auto waiting = std::find_if(l.posted.begin(), l.posted.end(),
                                          [&](const request* r) { return r->tag_ == got.slot; });
        if (waiting == l.posted.end()) return l.unexpected.push_back(got);
        request& r = **waiting;
        l.posted.erase(waiting);
        return match(r, got);
      }
      case detail::record::clear_to_send:
      case detail::record::refused: {
        const auto found = l.awaiting_clearance.find(got.id);
        if (found == l.awaiting_clearance.end()) return;  // withdrawn meanwhile
        request& r = *found->second;
        l.awaiting_clearance.erase(found);
        if (got.kind == detail::record::refused) {
          // As on every transport: the receiver learns the size and fails, the send completes.
          r.queued_ = r.moved_ = r.size_;
          return finish_send_if_done(r);
        }
        r.state_ = request::state::streaming;
        l.streaming.push_back(&r);
        return;
      }
      case detail::record::chunk: {
        if (got.slot >= settings_.slots || got.bytes > settings_.slot_bytes) return protocol(p, "a chunk outside the window");
        const auto found = l.receiving.find(got.id);
        if (found == l.receiving.end()) {  // a withdrawn receive's: the slot goes back unread
          send_record(p, {detail::record::credit, got.id, 0, 0, got.slot, {}, {}});
          return;
        }
        request& r = *found->second;
        if (got.offset + got.bytes > r.size_) return protocol(p, "a chunk past the end of its message");
        const std::byte* from = window_from(p) + got.slot * settings_.slot_bytes;
        if (const int code = runtime_->copy(r.recv_data_ + got.offset, from, got.bytes, stream_.get()))
          return device_failed(r, code, "copying a chunk out of the window");
        if (const int code = runtime_->event_record(l.drained[got.slot].get(), stream_.get()))
          return device_failed(r, code, "recording a chunk's copy");
        r.queued_ += got.bytes;
        if (r.queued_ == r.size_) l.receiving.erase(found);
        l.draining.push_back({&r, got.slot, got.bytes});
        return;
      }
      case detail::record::credit: {
        if (got.slot >= settings_.slots || l.out_slots[got.slot].now != out_slot::state::noted)
          return protocol(p, "a credit for a slot that is not in use");
        l.out_slots[got.slot].now = out_slot::state::free;
        return;
      }
      case detail::record::leaving:
        // Nothing more goes to or from it: fail what involves it (but a receive whose
        // every chunk is in this rank's window drains), stop writing into its window
        // (the copies already queued finish first), close the mapping and say so.
        l.leaving = true;
        l.gone = make_error_code(errc::peer_lost);
        fail_requests(p, l.gone, true);
        close_window(l);
        send_record(p, {detail::record::left, 0, 0, 0, 0, {}, {}});
        return;
      case detail::record::left: l.released = true; return;
      default: return protocol(p, "an unknown record");
    }
  }

  /// Queues copies into free slots, and sends the records of those that completed.
  bool advance_sends(rank_t p) {
    link& l = links_[p];
    bool moved = false;
    for (std::size_t s = 0; s < l.out_slots.size(); ++s) {
      out_slot& slot = l.out_slots[s];
      if (slot.now != out_slot::state::copying) continue;
      const int status = runtime_->event_query(slot.copied.get());
      if (status == runtime_->not_ready) continue;
      request& r = *slot.owner;
      if (status != 0) return device_failed(r, status, "copying a chunk into the peer's window"), true;
      slot.now = out_slot::state::noted;
      send_record(p, {detail::record::chunk, slot.id, slot.offset, slot.bytes, s, {}, {}});
      r.moved_ += slot.bytes;
      r.transferred_ = r.moved_;
      bytes_copied_ += slot.bytes;
      finish_send_if_done(r);
      moved = true;
    }
    while (!l.streaming.empty()) {
      request& r = *l.streaming.front();
      if (r.queued_ == r.size_) {
        l.streaming.pop_front();
        continue;
      }
      const auto free = std::find_if(l.out_slots.begin(), l.out_slots.end(),
                                     [](const out_slot& s) { return s.now == out_slot::state::free; });
      if (free == l.out_slots.end()) break;
      const std::size_t s = static_cast<std::size_t>(free - l.out_slots.begin());
      const std::size_t bytes = std::min(settings_.slot_bytes, r.size_ - r.queued_);
      if (const int code = runtime_->copy(l.window + s * settings_.slot_bytes, r.send_data_ + r.queued_, bytes, stream_.get()))
        return device_failed(r, code, "copying a chunk into the peer's window"), true;
      if (const int code = runtime_->event_record(free->copied.get(), stream_.get()))
        return device_failed(r, code, "recording a chunk's copy"), true;
      free->now = out_slot::state::copying;
      free->owner = &r;
      free->id = r.id_;
      free->offset = r.queued_;
      free->bytes = bytes;
      r.queued_ += bytes;
      moved = true;
    }
    return moved;
  }

  /// Returns the slots whose copies into receive buffers completed.
  bool advance_receives(rank_t p) {
    link& l = links_[p];
    bool moved = false;
    for (std::size_t k = 0; k < l.draining.size();) {
      drain& d = l.draining[k];
      const int status = runtime_->event_query(l.drained[d.slot].get());
      if (status == runtime_->not_ready) {
        ++k;
        continue;
      }
      request& r = *d.owner;
      if (status != 0) return device_failed(r, status, "copying a chunk out of the window"), true;
      if (!l.leaving) send_record(p, {detail::record::credit, r.id_, 0, 0, d.slot, {}, {}});
      r.moved_ += d.bytes;
      r.transferred_ = r.moved_;
      l.draining.erase(l.draining.begin() + static_cast<std::ptrdiff_t>(k));
      if (r.moved_ == r.size_) complete(r, {});
      moved = true;
    }
    return moved;
  }

  /// A send is done once its copies completed.
  void finish_send_if_done(request& r) {
    if (r.moved_ < r.size_) return;
    r.transferred_ = r.size_;
    complete(r, {});
  }

  // ---- records

  /// Posts the ring's entry k again: the newest.
  void post_incoming(rank_t p, std::size_t k) {
    typename link::inbox_entry& entry = links_[p].inbox[k];
    control_.post_recv(entry.posted, p, protocol_tag, std::as_writable_bytes(std::span(&entry.arrived, 1)));
  }

  void send_record(rank_t p, const detail::record& data) {
    outgoing_record& out = sent_.emplace_back();
    out.data = data;
    out.peer = p;
    control_.post_send(out.sent, p, protocol_tag, message_header{}, std::as_bytes(std::span(&out.data, 1)));
  }

  /// Drops the records that left (in order: they complete roughly in that order).
  void recycle_sent() {
    while (!sent_.empty() && control_.test(sent_.front().sent)) {
      if (const std::error_code failed = control_.wait(sent_.front().sent, clock::now())) lost(sent_.front().peer, failed);
      sent_.pop_front();
    }
  }

  // ---- completion and failure

  void complete(request& r, std::error_code result) {
    if (r.state_ == request::state::done) return;
    r.state_ = request::state::done;
    r.result_ = result;
  }

  std::error_code finish(request& r) {
    r.engine_ = nullptr;  // finished: it may now outlive the transport
    return r.result_;
  }

  /// Removes `r` from everything that points at it, with `code`. One that moved data
  /// aborts the transport: its remaining chunks could no longer be placed.
  void withdraw(request& r, std::error_code code, const char* why) noexcept {
    if (r.engine_ != this) return;
    if (r.state_ != request::state::done) {
      // Data may be moving once a receive matched, or a send was announced.
      const bool moving = r.state_ == request::state::streaming || (r.is_send_ && r.size_ != 0);
      if (moving) {
        try {
          abort(code, qcoll::detail::format("cuda_peer transport: rank {}: {} while a message to or from rank {} was "
                                            "moving", rank(), why, r.peer_));
        } catch (...) {
        }
      }
      forget(r);
      complete(r, code);
    }
    r.engine_ = nullptr;
  }

  /// Drops every reference the links hold to `r`; waits for the device's copies of it.
  void forget(request& r) noexcept {
    link& l = links_[r.peer_];
    std::erase(l.posted, &r);
    std::erase_if(l.awaiting_clearance, [&](const auto& e) { return e.second == &r; });
    std::erase_if(l.receiving, [&](const auto& e) { return e.second == &r; });
    std::erase(l.streaming, &r);
    bool on_device = false;
    for (drain& d : l.draining) on_device = on_device || d.owner == &r;
    for (out_slot& s : l.out_slots) on_device = on_device || (s.owner == &r && s.now == out_slot::state::copying);
    if (on_device) runtime_->synchronize(stream_.get());  // its buffer is read or written until then
    for (drain& d : l.draining)
      if (d.owner == &r) d.owner = nullptr;
    std::erase_if(l.draining, [](const drain& d) { return d.owner == nullptr; });
    for (out_slot& s : l.out_slots)
      if (s.owner == &r) release(s);
  }

  /// A slot whose message is gone: never announced, never used again (the transport
  /// was aborted, or the peer lost).
  static void release(out_slot& s) noexcept {
    if (s.now == out_slot::state::copying) s.now = out_slot::state::noted;
    s.owner = nullptr;
  }

  void fail_everything(std::error_code code) {
    for (rank_t p = 0; p < size(); ++p)
      if (p != rank()) lost(p, code);
  }

  /// The control transport lost `p` (or was aborted): every request that involves it
  /// fails with `code`, and nothing more is read from it.
  void lost(rank_t p, std::error_code code) {
    links_[p].broken = true;
    links_[p].gone = code;
    fail_requests(p, code);
  }

  /// Every request that involves `p` fails with `code` (`keep_arrived`: except receives
  /// whose every chunk has arrived, which finish draining).
  void fail_requests(rank_t p, std::error_code code, bool keep_arrived = false) {
    runtime_->synchronize(stream_.get());  // no copy touches a request's buffer after it failed
    std::vector<request*> gone;
    link& l = links_[p];
    std::vector<drain> kept;
    if (keep_arrived)
      for (drain& d : l.draining)
        if (d.owner && d.owner->queued_ == d.owner->size_) kept.push_back(std::exchange(d, {}));
    for (auto& [id, r] : l.awaiting_clearance) gone.push_back(r);
    for (auto& [id, r] : l.receiving) gone.push_back(r);
    for (request* r : l.streaming) gone.push_back(r);
    for (drain& d : l.draining) gone.push_back(d.owner);
    for (out_slot& s : l.out_slots)
      if (s.now == out_slot::state::copying) gone.push_back(s.owner);
    for (request* r : l.posted) gone.push_back(r);
    l.posted.clear();
    l.unexpected.clear();
    l.awaiting_clearance.clear();
    l.receiving.clear();
    l.streaming.clear();
    l.draining = std::move(kept);
    for (out_slot& s : l.out_slots) release(s);
    for (request* r : gone)
      if (r && r->state_ != request::state::done) {
        complete(*r, code);
      }
  }

  /// A request posted to a peer that left or was lost, with the reason its link went
  /// (an abort's code where the transport was aborted: a rank that saw the abort while it
  /// waited for something else must not report the peer lost on its next request).
  void refuse_gone(request& r, std::error_code why) {
    r.state_ = request::state::announced;
    complete(r, why ? why : make_error_code(errc::peer_lost));
  }

  void protocol(rank_t p, const char* what) {
    abort(make_error_code(errc::protocol_error),
          qcoll::detail::format("cuda_peer transport: rank {}: rank {} sent {}", rank(), p, what));
  }

  void device_failed(request& r, int code, const char* what) {
    abort(make_error_code(errc::device_error),
          qcoll::detail::format("cuda_peer transport: rank {}: {} for rank {}: {} error {}: {}", rank(), what, r.peer_,
                                runtime_->name, code, runtime_->error_string(code)));
  }

  /// Polls first (a GPU's copy takes microseconds), then yields its core (ranks that
  /// outnumber the cores, as in CI, must let the others run), then sleeps in short steps:
  /// every record of a message waits here once, so a long sleep is a long latency (steps
  /// growing to 1 ms made a 4 KiB allreduce of 2 ranks take 12 ms on the emulated device).
  static void back_off(unsigned idle) {
    if (idle < 64) return qcoll::detail::cpu_relax();
    if (idle < 1024) return std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }

  Control control_;
  options settings_;
  const device::runtime* runtime_;
  execution::device_stream_owner stream_;
  execution::device_memory<std::byte> windows_;  // one window per sender
  std::vector<link> links_;
  std::deque<outgoing_record> sent_;  // records not yet delivered to the control transport's peer
  std::uint64_t bytes_copied_ = 0;
};

}  // namespace qcoll::transports::cuda_peer
