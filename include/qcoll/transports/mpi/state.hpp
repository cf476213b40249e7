#pragma once
/// @file
/// The MPI transport's state: everything a transport's requests point to, and the
/// protocol of transports/mpi.hpp's top comment — posting, matched probes, frames and
/// inline payloads, clear-to-sends, progress, deadlines, and withdrawal and failure.
/// Its parts live beside it: the control communicator (control.hpp), the transfers MPI
/// still holds after a withdrawal (orphans.hpp), payloads of any size (byte_ranges.hpp).

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/liveness.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/detail/little_endian.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/transports/mpi/byte_ranges.hpp>
#include <qcoll/transports/mpi/c_api.hpp>
#include <qcoll/transports/mpi/control.hpp>
#include <qcoll/transports/mpi/options.hpp>
#include <qcoll/transports/mpi/orphans.hpp>
#include <qcoll/transports/mpi/request.hpp>
#include <qcoll/transports/stream/records.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace qcoll::transports::mpi::detail {

/// Everything a transport's requests point to; it stays put when the transport moves.
struct state {
  state(MPI_Comm parent, const options& given) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "mpi transport: MPI is {}; construct qcoll::transports::mpi::environment first",
                                 finalized ? "finalized" : "not initialized");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
      qcoll::detail::throw_error(
          errc::invalid_argument,
          "mpi transport: MPI provides thread level {} but qcoll needs MPI_THREAD_SERIALIZED or more (its progress "
          "thread calls MPI): initialize MPI with MPI_Init_thread(…, MPI_THREAD_SERIALIZED, …) or through "
          "qcoll::transports::mpi::environment",
          thread_level_name(provided));
    int rank_int = 0, size_int = 0;
    MPI_Comm_rank(parent, &rank_int);
    MPI_Comm_size(parent, &size_int);
    rank = rank_t(rank_int);
    size = rank_t(size_int);
    // Communicators of qcoll's own: nothing of the program's can match its messages,
    // and payloads, clear-to-sends and aborts cannot be mistaken for frames.
    for (MPI_Comm* comm : {&frames, &payloads, &clears, &control.comm}) {
      check_call(MPI_Comm_dup(parent, comm), "MPI_Comm_dup");
      MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN);
    }
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(frames, MPI_TAG_UB, &value, &found);
    tag_upper_bound = found ? tag_t(*static_cast<int*>(value)) : tag_t(32767);
    opts = given;
    if (!opts.spin) {
      const char* text = std::getenv("QCOLL_SPIN_US");
      opts.spin = std::chrono::microseconds(text && *text ? std::strtoll(text, nullptr, 10) : 2000);
    }
    broken.resize(size);
    liveness.resize(size);
    control.start(rank, size);
  }

  state(const state&) = delete;
  state& operator=(const state&) = delete;

  ~state() {
    std::lock_guard lock(mutex);
    control.poll_notes(liveness);  // receives the notes that came while no one waited: MPI warns of unmatched ones
    control.stop_listening();
    while (head) withdraw(*head, make_error_code(errc::aborted));
    drain(clock::now() + opts.withdraw_grace, clock::now() + opts.abort_flush, true);
    orphans.cancel_sinks();  // a payload the sender never sent: its sink is unmatched
    orphans.test();
    const bool leftovers = !orphans.empty() || control.pending_sends();
    if (leftovers) {
      const std::string which = orphans.describe();
      qcoll::detail::log_warning("qcoll: rank {}: mpi transport: {} transfer(s) still in MPI's hands at destruction "
                                 "({}); their buffers and qcoll's communicators are left to MPI",
                                 rank, orphans.size(), which.empty() ? "abort messages" : which);
      orphans.leave_to_mpi();
      control.leave_to_mpi();
      return;
    }
    for (MPI_Comm* comm : {&frames, &payloads, &clears, &control.comm}) MPI_Comm_free(comm);
  }

  void check_call(int code, std::string_view call) const {
    if (code != MPI_SUCCESS)
      qcoll::detail::throw_error(errc::invalid_argument, "mpi transport: rank {}: {} failed: {}", rank, call,
                                 mpi_error_text(code));
  }

  // ---- posting ------------------------------------------------------------------

  /// Checks and resets `r` for a post of `bytes`; false when it completed at once
  /// because the transport failed or the peer is lost.
  bool prepare(request& r, rank_t peer, tag_t tag, bool is_send, std::size_t bytes) {
    if (peer >= size || peer == rank)
      qcoll::detail::throw_error(errc::invalid_argument, "mpi transport: rank {} of {}: peer {} is out of range or this rank",
                                 rank, size, peer);
    if (tag > tag_upper_bound)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "mpi transport: rank {}: tag {} is above this MPI's MPI_TAG_UB ({})", rank, tag,
                                 tag_upper_bound);
    if (r.state_ != request::state::idle && r.state_ != request::state::done)
      qcoll::detail::throw_error(errc::invalid_argument, "mpi transport: rank {}: a request was posted again while still pending",
                                 rank);
    r.owner_ = this;
    r.begin_post(peer, tag, is_send);
    r.inline_payload_ = false;
    r.payload_posted_ = false;
    r.size_ = bytes;
    if (failure.code) {
      complete(r, failure.code);
      return false;
    }
    if (!broken[peer].empty()) {
      complete(r, make_error_code(errc::peer_lost));
      return false;
    }
    return true;
  }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    std::lock_guard lock(mutex);
    r.send_data_ = data.data();
    if (!prepare(r, peer, tag, true, data.size())) return;
    qcoll::detail::store_le(r.frame_.data(), std::uint64_t(data.size()));
    stream::write_message_header(std::span(r.frame_).subspan<8, stream::message_header_bytes>(), header);
    r.header_ = header;
    link(r, request::state::sending);
    const int to = int(peer), mpi_tag = int(tag);
    int code = MPI_SUCCESS;
    if (data.size() <= inline_payload_bytes) {
      std::copy(data.begin(), data.end(), r.frame_.begin() + frame_bytes);
      code = MPI_Isend(r.frame_.data(), int(frame_bytes + data.size()), MPI_BYTE, to, mpi_tag, frames, &r.frame_request_);
    } else {
      // The k-th clear-to-send of this (peer, tag) matches the k-th receive posted for
      // it: MPI keeps both in order, so each large send gets its own.
      code = MPI_Isend(r.frame_.data(), int(frame_bytes), MPI_BYTE, to, mpi_tag, frames, &r.frame_request_);
      if (code == MPI_SUCCESS) code = MPI_Irecv(nullptr, 0, MPI_BYTE, to, mpi_tag, clears, &r.clear_request_);
    }
    if (code != MPI_SUCCESS) lose(peer, qcoll::detail::format("MPI_Isend to it failed: {}", mpi_error_text(code)));
  }

  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    std::lock_guard lock(mutex);
    r.recv_data_ = buffer.data();
    if (!prepare(r, peer, tag, false, buffer.size())) return;
    link(r, request::state::probing);
    progress_locked();
  }

  // ---- progress -----------------------------------------------------------------

  bool test(request& r) {
    std::lock_guard lock(mutex);
    progress_locked();
    return r.state_ == request::state::done;
  }

  /// Polls until `r` completes or its peer has been silent for as long as from now to
  /// `until` (at most twice that in all: core/liveness.hpp).
  std::error_code wait(request& r, deadline until) {
    const deadline started = clock::now();
    const deadline spin_until = started + *opts.spin;
    std::optional<transports::liveness_watch> watch;
    for (;;) {
      {
        std::lock_guard lock(mutex);
        if (r.state_ == request::state::done) return r.result_;
        if (r.owner_ != this || r.state_ == request::state::idle) return make_error_code(errc::invalid_argument);
        transports::peer_liveness& live = liveness[r.peer_];
        if (!watch) watch.emplace(started, until, live);
        progress_locked();
        if (r.state_ == request::state::done) return r.result_;
        const deadline now = clock::now();
        if (now >= watch->silent_until(now, live, r.transferred_)) {
          live.last_stall = watch->stall(now, live);
          withdraw(r, make_error_code(errc::timeout));
          return r.result_;
        }
        if (watch->note_due(now) && !failure.code) control.say_waiting(r.peer_);
      }
      if (clock::now() < spin_until)
        std::this_thread::yield();  // lets an oversubscribed peer run
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void progress_locked() {
    // A peer's abort is this rank's too, with the peer's code and words.
    if (std::optional<transports::failure> peer_abort = control.poll_abort())
      fail_all(peer_abort->code, peer_abort->reason, false);
    control.poll_notes(liveness);
    for (request* r = head; r;) {
      request* next = r->next_;
      advance(*r);
      r = next;
    }
    orphans.test();
  }

  /// Moves one request as far as MPI lets it now.
  void advance(request& r) {
    switch (r.state_) {
      case request::state::sending: {
        if (r.clear_request_ != MPI_REQUEST_NULL) {  // a large payload waits for its clear-to-send
          // Payloads of one stream leave in post order: MPI may report a later
          // clear-to-send first, and the receiver's payload receives are in order.
          if (!first_of_its_stream(r) || !finished(r, r.clear_request_)) return;
          if (const int code = isend_bytes(r.send_data_, r.size_, r.peer_, r.tag_, payloads, r.payload_request_);
              code != MPI_SUCCESS)
            return lose(r.peer_, qcoll::detail::format("MPI_Isend to it failed: {}", mpi_error_text(code)));
          r.payload_posted_ = true;
        }
        if (r.size_ > inline_payload_bytes && !r.payload_posted_) return;
        if (!finished(r, r.frame_request_) || !finished(r, r.payload_request_)) return;
        r.transferred_ = r.size_;
        return complete(r, {});
      }
      case request::state::probing: return probe(r);
      case request::state::receiving_frame: {
        if (!finished(r, r.frame_request_)) return;
        return frame_arrived(r);
      }
      case request::state::receiving_payload: {
        if (!finished(r, r.payload_request_) || !finished(r, r.clear_request_)) return;
        r.transferred_ = r.size_;
        return complete(r, {});
      }
      default: return;
    }
  }

  /// Tests one MPI request; on an MPI error the peer is lost (which completes `r`).
  bool finished(request& r, MPI_Request& pending) {
    if (pending == MPI_REQUEST_NULL) return true;
    int done = 0;
    if (const int code = MPI_Test(&pending, &done, MPI_STATUS_IGNORE); code != MPI_SUCCESS) {
      lose(r.peer_, qcoll::detail::format("MPI reported: {}", mpi_error_text(code)));
      return false;
    }
    return done != 0;
  }

  /// Whether an earlier request of r's (peer, tag) stream and direction has yet to post
  /// its payload: a receive (probing, or its frame arriving) or a large send (awaiting
  /// its clear-to-send). Only the first moves on, which keeps payloads in order.
  bool first_of_its_stream(const request& r) const {
    for (const request* e = head; e != &r; e = e->next_) {
      if (e->is_send_ != r.is_send_ || e->peer_ != r.peer_ || e->tag_ != r.tag_) continue;
      const bool payload_to_come = e->is_send_ ? e->size_ > inline_payload_bytes && !e->payload_posted_
                                               : e->state_ == request::state::probing ||
                                                     e->state_ == request::state::receiving_frame;
      if (payload_to_come) return false;
    }
    return true;
  }

  void probe(request& r) {
    if (!first_of_its_stream(r)) return;
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    int code = MPI_Improbe(int(r.peer_), int(r.tag_), frames, &found, &message, &status);
    if (code != MPI_SUCCESS) return lose(r.peer_, qcoll::detail::format("MPI_Improbe failed: {}", mpi_error_text(code)));
    if (!found) return;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    const std::size_t bytes = count < 0 ? 0 : std::size_t(count);
    if (bytes < frame_bytes || bytes > frame_bytes + inline_payload_bytes) {
      // Not a frame qcoll writes: never received (its size is the peer's choice).
      return break_stream(r.peer_, qcoll::detail::format("a message of {} bytes is not a qcoll frame ({} to {} bytes)", bytes,
                                               frame_bytes, frame_bytes + inline_payload_bytes));
    }
    r.state_ = request::state::receiving_frame;
    if (bytes == frame_bytes + r.size_ && r.size_ > 0) {  // frame and payload: copied into place once checked
      r.inline_payload_ = true;
      code = MPI_Imrecv(r.frame_.data(), int(bytes), MPI_BYTE, &message, &r.frame_request_);
    } else if (bytes == frame_bytes) {  // the frame alone: the payload, if any, follows
      code = MPI_Imrecv(r.frame_.data(), int(frame_bytes), MPI_BYTE, &message, &r.frame_request_);
    } else {  // an inline payload of the wrong size: behind the frame, then reported
      r.inline_payload_ = true;
      code = MPI_Mrecv(r.frame_.data(), int(bytes), MPI_BYTE, &message, MPI_STATUS_IGNORE);
      if (code == MPI_SUCCESS) return frame_arrived(r, bytes - frame_bytes);
    }
    if (code != MPI_SUCCESS) lose(r.peer_, qcoll::detail::format("receiving a frame failed: {}", mpi_error_text(code)));
  }

  /// The frame is in r.frame_: check it, then finish or receive the payload.
  void frame_arrived(request& r, std::optional<std::size_t> inline_bytes_received = std::nullopt) {
    ++liveness[r.peer_].heard;
    std::string problem;
    const auto header = stream::read_message_header(
        std::span<const std::byte>(r.frame_).subspan<8, stream::message_header_bytes>(), problem);
    const std::uint64_t length = qcoll::detail::load_le<std::uint64_t>(r.frame_.data());
    if (!header) return break_stream(r.peer_, problem);
    const bool inline_frame = r.inline_payload_ || length == 0;
    const std::size_t inline_bytes = inline_bytes_received.value_or(r.inline_payload_ ? r.size_ : 0);
    if ((inline_frame && length != inline_bytes) || (!inline_frame && length <= inline_payload_bytes))
      return break_stream(r.peer_, qcoll::detail::format("a frame announces {} payload bytes but {} came with it", length,
                                               inline_bytes));
    r.take_header(*header);
    r.transferred_ = std::size_t(length);
    if (length != r.size_) {
      // Nothing was written into the posted buffer. A separate payload stays unreceived,
      // so later messages of this stream could not be told from it: the stream breaks.
      if (!inline_frame) mark_broken(r.peer_, qcoll::detail::format("a message of {} bytes arrived where {} were expected", length, r.size_));
      return complete(r, make_error_code(errc::protocol_error));
    }
    if (inline_frame) {
      if (r.inline_payload_) std::copy_n(r.frame_.begin() + frame_bytes, r.size_, r.recv_data_);
      return complete(r, {});
    }
    r.state_ = request::state::receiving_payload;
    int code = irecv_bytes(r.recv_data_, r.size_, r.peer_, r.tag_, payloads, r.payload_request_);
    if (code == MPI_SUCCESS)  // the receive is in place: the sender may go ahead
      code = MPI_Isend(nullptr, 0, MPI_BYTE, int(r.peer_), int(r.tag_), clears, &r.clear_request_);
    if (code != MPI_SUCCESS) lose(r.peer_, qcoll::detail::format("MPI_Irecv failed: {}", mpi_error_text(code)));
  }

  // ---- completion, withdrawal, failure -----------------------------------------------

  void link(request& r, request::state s) {
    r.state_ = s;
    r.prev_ = tail;
    r.next_ = nullptr;
    (tail ? tail->next_ : head) = &r;
    tail = &r;
  }

  void unlink(request& r) noexcept {
    (r.prev_ ? r.prev_->next_ : head) = r.next_;
    (r.next_ ? r.next_->prev_ : tail) = r.prev_;
    r.prev_ = r.next_ = nullptr;
  }

  void complete(request& r, std::error_code result) noexcept {
    if (r.state_ != request::state::idle && r.state_ != request::state::done) unlink(r);
    r.state_ = request::state::done;
    r.result_ = result;
    r.owner_ = nullptr;  // done: the request no longer refers to this transport
  }

  /// Completes `r` with `code` now. What MPI holds of it is cancelled where MPI allows
  /// and otherwise kept (orphans) until MPI finishes it.
  void withdraw(request& r, std::error_code code) {
    for (MPI_Request* pending : {&r.frame_request_, &r.clear_request_, &r.payload_request_}) {
      if (*pending == MPI_REQUEST_NULL) continue;
      // The receives that may be unmatched — a clear-to-send awaited, a payload the
      // sender has not sent — are cancelled. (A frame was matched by its probe; sends
      // are not cancelled, which MPI 4 deprecates.)
      const bool receive = r.is_send_ ? pending == &r.clear_request_ : pending == &r.payload_request_;
      if (receive) MPI_Cancel(pending);
      int done = 0, cancelled = 0;
      MPI_Status status;
      MPI_Test(pending, &done, &status);
      if (done) MPI_Test_cancelled(&status, &cancelled);
      if (cancelled && !r.is_send_) {
        // This rank cleared the sender, which may post the payload before it learns of
        // the failure: a sink of the buffer's size (this rank's choice, not the peer's)
        // takes it, so the sender's MPI finishes and nothing lands in the caller's buffer.
        orphan sink{MPI_REQUEST_NULL, r.peer_, "a payload (into a sink) from",
                    std::make_unique_for_overwrite<std::byte[]>(r.size_)};
        if (irecv_bytes(sink.sink.get(), r.size_, r.peer_, r.tag_, payloads, sink.request) == MPI_SUCCESS)
          orphans.add(std::move(sink));
        mark_broken(r.peer_, "a transfer was cut off midway");
      } else if (!done) {
        const char* what = pending == &r.frame_request_     ? (r.is_send_ ? "a frame to" : "a frame from")
                           : pending == &r.payload_request_ ? (r.is_send_ ? "a payload to" : "a payload from")
                                                            : (r.is_send_ ? "a clear-to-send from" : "a clear-to-send to");
        orphans.add({*pending, r.peer_, what, nullptr});
        *pending = MPI_REQUEST_NULL;
        mark_broken(r.peer_, "a transfer was cut off midway");
      }
    }
    complete(r, code);
  }

  void mark_broken(rank_t peer, std::string why) {
    if (broken[peer].empty()) broken[peer] = std::move(why);
  }

  /// The stream from `peer` carries something qcoll cannot read: its pending receives fail.
  void break_stream(rank_t peer, std::string why) {
    mark_broken(peer, qcoll::detail::format("peer {}: {}", peer, why));
    fail_peer(peer, make_error_code(errc::protocol_error));
  }

  /// MPI failed a call involving `peer`.
  void lose(rank_t peer, std::string why) {
    mark_broken(peer, qcoll::detail::format("peer {}: {}", peer, why));
    fail_peer(peer, make_error_code(errc::peer_lost));
  }

  void fail_peer(rank_t peer, std::error_code code) {
    for (request* r = head; r;) {
      request* next = r->next_;
      if (r->peer_ == peer) withdraw(*r, code);
      r = next;
    }
  }

  void abort(std::error_code code, std::string_view reason) {
    std::lock_guard lock(mutex);
    fail_all(code, reason, true);
  }

  void fail_all(std::error_code code, std::string_view reason, bool tell_peers) {
    if (failure.code) return;
    failure = {code, std::string(reason.substr(0, stream::max_reason_bytes))};
    while (head) withdraw(*head, code);
    // Every rank lets MPI finish the transfers it could not withdraw, the rank that
    // adopts an abort as much as the one that sent it: a payload moving between two
    // live ranks needs both to progress, and its buffers are the caller's again once
    // this call returns. (Without this a rank that adopted the abort left, freed its
    // buffer, and its peer's MPI later copied from it: a crash in Open MPI, a hang in
    // MPICH's finalize; job.mpi_*.mismatched_sizes caught it about 1 run in 20.)
    if (!tell_peers) return drain(clock::now() + opts.withdraw_grace, clock::now() + opts.abort_flush);
    control.send_abort(failure);
    drain(clock::now() + opts.withdraw_grace, clock::now() + opts.abort_flush);  // best effort and bounded
  }

  /// Lets MPI finish the orphaned transfers (until `orphans_until`) and the abort
  /// messages (until `aborts_until`), polling all the while: MPI progresses only then.
  void drain(deadline orphans_until, deadline aborts_until, bool waiting_for_sinks = false) {
    for (;;) {
      orphans.test();
      const deadline now = clock::now();
      // A failed call waits only for transfers into or out of the caller's buffers;
      // sinks own theirs, and destruction gives them the same grace.
      const bool user_buffers = orphans.hold_buffers(waiting_for_sinks);
      const bool orphans_done = !user_buffers || now >= orphans_until;
      const bool aborts_done = !control.pending_abort_sends() || now >= aborts_until;
      if (orphans_done && aborts_done) return;
      std::this_thread::yield();
    }
  }

  std::mutex mutex;
  rank_t rank = 0, size = 0;
  tag_t tag_upper_bound = 32767;
  options opts;
  MPI_Comm frames = MPI_COMM_NULL, payloads = MPI_COMM_NULL, clears = MPI_COMM_NULL;
  request* head = nullptr;  // pending requests, in post order
  request* tail = nullptr;
  std::vector<std::string> broken;        // per peer: why its stream can no longer be used
  orphan_list orphans;                    // transfers withdrawn while MPI still held them
  control_channel control;                // aborts and liveness notes
  std::vector<transports::peer_liveness> liveness;  // per peer
  transports::failure failure;
};

}  // namespace qcoll::transports::mpi::detail

namespace qcoll::transports::mpi {

inline request::~request() {
  if (owner_ && state_ != state::idle && state_ != state::done) {
    std::lock_guard lock(owner_->mutex);
    owner_->withdraw(*this, make_error_code(errc::aborted));
  }
}

}  // namespace qcoll::transports::mpi
