#pragma once
/// @file
/// MPI transport: qcoll's transport concept over the MPI a cluster already runs (its
/// fabric — InfiniBand, RoCE, Slingshot — is MPI's business), on a communicator the
/// program passes, MPI_COMM_WORLD by default. Optional: include it only in programs
/// that link MPI (CMake: `MPI::MPI_C`). Tested with Open MPI 4.1 and MPICH 4.0.
///
///     qcoll::transports::mpi::environment mpi(argc, argv);   // MPI_Init_thread, unless done
///     qcoll::communicator comm(qcoll::transports::mpi::transport(MPI_COMM_WORLD));
///
/// No store, no MASTER_ADDR: MPI has already placed and connected the ranks.
///
/// **Messages.** A qcoll message is a 32-byte frame — u64 payload length, then the
/// 24-byte message_header of stream/records.hpp, little-endian — and its payload. A
/// payload of up to `inline_payload_bytes` travels in one MPI message with its frame
/// (an MPI datatype over both buffers: no copy). A larger one is sent only when the
/// receiver, having read the frame and posted its receive straight into the posted
/// buffer, answers with a clear-to-send: so a receiver writes nothing into a buffer of
/// the wrong size and reads a frame before it trusts anything in it, and — the reason
/// for the extra round trip — a sender exposes its buffer to MPI only while both sides
/// are live and waiting for that message. A payload MPI never saw can be withdrawn at
/// a deadline; one in MPI's hands cannot (below). The qcoll tag is the MPI tag (at most
/// the communicator's MPI_TAG_UB).
///
/// **Matching.** Receives use matched probes (MPI_Improbe/MPI_Imrecv), one (peer, tag)
/// stream at a time in the order they were posted, so same-tag messages keep their
/// order even when frames and payloads complete out of order.
///
/// **Threads.** Every MPI call the transport makes holds its mutex, so qcoll needs
/// only MPI_THREAD_SERIALIZED (its progress thread and the caller's thread take turns).
/// The constructor checks the level MPI provides and refuses less with a clear error.
/// A program that also calls MPI itself while a started qcoll call is in flight needs
/// MPI_THREAD_MULTIPLE (`environment(argc, argv, MPI_THREAD_MULTIPLE)`).
///
/// **Deadlines and failure — what MPI allows.** A wait polls MPI (MPI_Test on its
/// requests) until its request completes or its deadline passes; then it returns
/// errc::timeout. A receive still waiting for its frame, and a send still waiting for
/// its clear-to-send, are withdrawn cleanly (MPI_Cancel of an unmatched receive). A
/// payload MPI has already matched — only while both sides were live — cannot be
/// withdrawn (MPI_Cancel of a matched receive does nothing, and MPI 4 deprecates
/// cancelling sends): the transport cancels what it can,
/// marks the stream to that peer broken, and keeps the MPI request until MPI finishes
/// it — every rank, the one that aborts and the ones that adopt its abort, polls MPI
/// for up to `withdraw_grace` before the failed call returns, so a payload moving
/// between live ranks lands while its buffers still exist — and logs a warning about
/// any it had to leave at destruction. `abort` sends its code and reason to every
/// peer on a control communicator that each rank polls, so every rank fails with
/// the same words. MPI reports a dead process only as errors of the calls that touch
/// it (the communicators use MPI_ERRORS_RETURN; such an error fails the peer's
/// requests with errc::peer_lost and MPI's own message) or not at all; a rank that
/// waits on a dead peer fails with errc::timeout at its deadline. A deadline counts
/// the peer's silence (core/liveness.hpp): a waiting rank sends every peer a
/// 4-byte "alive, waiting for rank w" note on the control communicator (tag 1). Open MPI's and
/// MPICH's launchers end the whole job when a rank dies: recovering survivors needs
/// ULFM, which neither Debian package enables.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/detail/little_endian.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/core/liveness.hpp>
#include <qcoll/transports/stream/records.hpp>

// The C API only: the deprecated C++ bindings would need libmpi_cxx (a program that
// wants them includes <mpi.h> itself first).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
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

namespace qcoll::transports::mpi {

/// Payloads up to this size travel in one MPI message with their frame. Part of the
/// protocol: every rank of a job must use the same value, so it is not an option.
/// Below every eager limit of Open MPI's and MPICH's shared-memory and TCP paths, so an
/// inline send completes at once and never leaves the caller's buffer to MPI.
inline constexpr std::size_t inline_payload_bytes = 2048;
/// u64 payload length, then the message header.
inline constexpr std::size_t frame_bytes = 8 + stream::message_header_bytes;

struct options {
  /// How long a wait polls MPI without pausing (yielding the core between polls);
  /// after it, a wait polls every 50 µs. Unset: QCOLL_SPIN_US, else 2 ms even when
  /// ranks outnumber cores — unlike the shm and tcp transports, which sleep in the
  /// kernel until bytes arrive, MPI moves bytes only inside MPI calls, so a rank that
  /// sleeps stalls its own sends. Measured (collective_bench_mpi --job, 4 ranks on 2
  /// cores, Open MPI 4.1, 2026-11-25): 4 KiB allreduce 1812 µs at 50 µs against 85 µs at
  /// 2 ms over shared memory, 1894 against 183 µs over TCP; 16 MiB 18.7 against 15.2 ms.
  std::optional<std::chrono::microseconds> spin;
  /// How long an abort waits for its messages to leave.
  std::chrono::milliseconds abort_flush{200};
  /// How long an abort, and destruction, wait for transfers MPI could not withdraw
  /// (payloads already moving between two live ranks: milliseconds) to finish, so that
  /// MPI is done with the caller's buffers before the failed call returns.
  std::chrono::milliseconds withdraw_grace{2000};
};

/// Initializes MPI for the life of the object, unless it already is, and finalizes it
/// only if it initialized it. Asks for MPI_THREAD_SERIALIZED unless told more.
class environment {
 public:
  environment(int& argc, char**& argv, int required = MPI_THREAD_SERIALIZED) { start(&argc, &argv, required); }
  explicit environment(int required = MPI_THREAD_SERIALIZED) { start(nullptr, nullptr, required); }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Finalize();
  }

  /// The thread level MPI provides.
  int provided() const noexcept { return provided_; }

 private:
  void start(int* argc, char*** argv, int required) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      if (MPI_Init_thread(argc, argv, required, &provided_) != MPI_SUCCESS)
        qcoll::detail::throw_error(errc::invalid_argument, "mpi transport: MPI_Init_thread failed");
      owned_ = true;
    } else {
      MPI_Query_thread(&provided_);
    }
  }

  bool owned_ = false;
  int provided_ = MPI_THREAD_SINGLE;
};

namespace detail {
struct state;
}

/// A posted send or receive. Destroying a posted request withdraws it.
class request : public request_base {
 public:
  request() = default;
  ~request();

 private:
  friend struct detail::state;
  friend class transport;
  enum class state : unsigned char { idle, sending, probing, receiving_frame, receiving_payload, done };

  detail::state* owner_ = nullptr;
  state state_ = state::idle;
  bool inline_payload_ = false;
  bool payload_posted_ = false;
  // The frame, and after it an inline payload: one contiguous message, so no MPI
  // datatype is made per small message (MPICH 4.0's UCX device leaks the UCX datatype
  // of some freed MPI datatypes: pmodels/mpich#7966, ~100 bytes a message).
  std::array<std::byte, frame_bytes + inline_payload_bytes> frame_{};
  MPI_Request frame_request_ = MPI_REQUEST_NULL;
  MPI_Request payload_request_ = MPI_REQUEST_NULL;
  MPI_Request clear_request_ = MPI_REQUEST_NULL;  // the clear-to-send: awaited (send) or sent (receive)
  request* prev_ = nullptr;  // the transport's list of pending requests, in post order
  request* next_ = nullptr;
};

namespace detail {

inline std::string mpi_error_text(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text.data(), static_cast<std::size_t>(length));
}

/// A committed datatype over up to two byte ranges at absolute addresses (for
/// MPI_BOTTOM), any size: ranges of 2 GiB or more are described in 1 GiB units.
/// The caller frees it once the operation is posted (MPI keeps what it needs).
class byte_ranges_type {
 public:
  byte_ranges_type(const void* first, std::size_t first_bytes, const void* second, std::size_t second_bytes) {
    add(first, first_bytes);
    add(second, second_bytes);
    MPI_Type_create_struct(used_, lengths_.data(), addresses_.data(), types_.data(), &type_);
    MPI_Type_commit(&type_);
  }
  byte_ranges_type(const byte_ranges_type&) = delete;
  byte_ranges_type& operator=(const byte_ranges_type&) = delete;
  ~byte_ranges_type() {
    MPI_Type_free(&type_);
    if (units_ != MPI_DATATYPE_NULL) MPI_Type_free(&units_);
  }
  MPI_Datatype get() const noexcept { return type_; }

 private:
  static constexpr std::size_t unit = std::size_t{1} << 30;

  void add(const void* data, std::size_t bytes) {
    if (bytes == 0) return;
    MPI_Aint address = 0;
    MPI_Get_address(data, &address);
    if (bytes > std::size_t(INT_MAX)) {
      if (units_ == MPI_DATATYPE_NULL) {
        MPI_Type_contiguous(int(unit), MPI_BYTE, &units_);
        MPI_Type_commit(&units_);
      }
      push(address, int(bytes / unit), units_);
      address = MPI_Aint_add(address, MPI_Aint(bytes / unit * unit));
      bytes %= unit;
      if (bytes == 0) return;
    }
    push(address, int(bytes), MPI_BYTE);
  }
  void push(MPI_Aint address, int length, MPI_Datatype type) {
    addresses_[used_] = address;
    lengths_[used_] = length;
    types_[used_] = type;
    ++used_;
  }

  std::array<MPI_Aint, 4> addresses_{};
  std::array<int, 4> lengths_{};
  std::array<MPI_Datatype, 4> types_{};
  int used_ = 0;
  MPI_Datatype units_ = MPI_DATATYPE_NULL;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// What an abort message carries: the code, then the reason.
inline constexpr std::size_t abort_message_bytes = 4 + stream::max_reason_bytes;

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
    for (MPI_Comm* comm : {&frames, &payloads, &clears, &control}) {
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
    abort_sends.assign(size, MPI_REQUEST_NULL);
    liveness.resize(size);
    note_sends.assign(size, MPI_REQUEST_NULL);
    note_messages = std::make_unique<std::array<std::byte, 4>[]>(size);
    post_control_receive();
    post_note_receive();
  }

  state(const state&) = delete;
  state& operator=(const state&) = delete;

  ~state() {
    std::lock_guard lock(mutex);
    poll_notes();  // receives the notes that came while no one waited: MPI warns of unmatched ones
    for (MPI_Request* listening : {&control_request, &note_request}) {
      if (*listening == MPI_REQUEST_NULL) continue;
      MPI_Cancel(listening);
      MPI_Wait(listening, MPI_STATUS_IGNORE);
    }
    while (head) withdraw(*head, make_error_code(errc::aborted));
    drain(clock::now() + opts.withdraw_grace, clock::now() + opts.abort_flush, true);
    for (orphan& o : orphans)  // a payload the sender never sent: its sink is unmatched
      if (o.sink) MPI_Cancel(&o.request);
    test_orphans();
    const bool leftovers = !orphans.empty() || pending_control_sends();
    if (leftovers) {
      std::string which;
      for (const orphan& o : orphans) which += qcoll::detail::format("{}{} peer {}", which.empty() ? "" : ", ", o.what, o.peer);
      qcoll::detail::log_warning("qcoll: rank {}: mpi transport: {} transfer(s) still in MPI's hands at destruction "
                                 "({}); their buffers and qcoll's communicators are left to MPI",
                                 rank, orphans.size(), which.empty() ? "abort messages" : which);
      for (orphan& o : orphans) {
        MPI_Request_free(&o.request);
        (void)o.sink.release();  // MPI may still write into it
      }
      for (auto* sends : {&abort_sends, &note_sends})
        for (MPI_Request& r : *sends)
          if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      (void)abort_message.release();  // MPI may still read them
      (void)note_messages.release();
      return;
    }
    for (MPI_Comm* comm : {&frames, &payloads, &clears, &control}) MPI_Comm_free(comm);
  }

  static const char* thread_level_name(int level) {
    switch (level) {
      case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
      case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
      case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
      default: return "MPI_THREAD_MULTIPLE";
    }
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

  /// A payload receive of `bytes` into `into`, any size.
  int post_receive(std::byte* into, std::size_t bytes, rank_t peer, tag_t tag, MPI_Request& request) {
    if (bytes <= std::size_t(INT_MAX))
      return MPI_Irecv(into, int(bytes), MPI_BYTE, int(peer), int(tag), payloads, &request);
    byte_ranges_type type(nullptr, 0, into, bytes);
    return MPI_Irecv(MPI_BOTTOM, 1, type.get(), int(peer), int(tag), payloads, &request);
  }

  int isend_payload(request& r) {
    const int to = int(r.peer_), mpi_tag = int(r.tag_);
    if (r.size_ <= std::size_t(INT_MAX))
      return MPI_Isend(r.send_data_, int(r.size_), MPI_BYTE, to, mpi_tag, payloads, &r.payload_request_);
    byte_ranges_type type(nullptr, 0, r.send_data_, r.size_);
    return MPI_Isend(MPI_BOTTOM, 1, type.get(), to, mpi_tag, payloads, &r.payload_request_);
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
        if (watch->note_due(now)) say_waiting(r.peer_);
      }
      if (clock::now() < spin_until)
        std::this_thread::yield();  // lets an oversubscribed peer run
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void progress_locked() {
    poll_control();
    poll_notes();
    for (request* r = head; r;) {
      request* next = r->next_;
      advance(*r);
      r = next;
    }
    test_orphans();
  }

  void test_orphans() {
    for (auto it = orphans.begin(); it != orphans.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? orphans.erase(it) : it + 1;
    }
  }

  /// Moves one request as far as MPI lets it now.
  void advance(request& r) {
    switch (r.state_) {
      case request::state::sending: {
        if (r.clear_request_ != MPI_REQUEST_NULL) {  // a large payload waits for its clear-to-send
          // Payloads of one stream leave in post order: MPI may report a later
          // clear-to-send first, and the receiver's payload receives are in order.
          if (!first_of_its_stream(r) || !finished(r, r.clear_request_)) return;
          if (const int code = isend_payload(r); code != MPI_SUCCESS)
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
    int code = post_receive(r.recv_data_, r.size_, r.peer_, r.tag_, r.payload_request_);
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
        if (post_receive(sink.sink.get(), r.size_, r.peer_, r.tag_, sink.request) == MPI_SUCCESS)
          orphans.push_back(std::move(sink));
        mark_broken(r.peer_, "a transfer was cut off midway");
      } else if (!done) {
        const char* what = pending == &r.frame_request_     ? (r.is_send_ ? "a frame to" : "a frame from")
                           : pending == &r.payload_request_ ? (r.is_send_ ? "a payload to" : "a payload from")
                                                            : (r.is_send_ ? "a clear-to-send from" : "a clear-to-send to");
        orphans.push_back({*pending, r.peer_, what, nullptr});
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

  void post_control_receive() {
    if (!abort_received) abort_received = std::make_unique<std::array<std::byte, abort_message_bytes>>();
    MPI_Irecv(abort_received->data(), int(abort_message_bytes), MPI_BYTE, MPI_ANY_SOURCE, 0, control,
              &control_request);
  }

  /// A peer's abort is this rank's too, with the peer's code and words.
  void poll_control() {
    if (control_request == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Status status;
    if (MPI_Test(&control_request, &done, &status) != MPI_SUCCESS || !done) return;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (count < 4) return post_control_receive();  // not an abort message; keep listening
    const auto code = stream::code_from_wire(qcoll::detail::load_le<std::uint32_t>(abort_received->data()));
    const std::string reason(reinterpret_cast<const char*>(abort_received->data() + 4), std::size_t(count - 4));
    fail_all(code, reason, false);
  }

  void abort(std::error_code code, std::string_view reason) {
    std::lock_guard lock(mutex);
    fail_all(code, reason, true);
  }

  /// The liveness notes (core/liveness.hpp): four bytes, the rank this one waits
  /// for, on the control communicator with a tag of their own.
  static constexpr int note_tag = 1;

  void post_note_receive() {
    MPI_Irecv(note_received.data(), int(note_received.size()), MPI_BYTE, MPI_ANY_SOURCE, note_tag, control,
              &note_request);
  }

  void poll_notes() {
    for (;;) {
      if (note_request == MPI_REQUEST_NULL) return;
      int done = 0, count = 0;
      MPI_Status status;
      if (MPI_Test(&note_request, &done, &status) != MPI_SUCCESS || !done) return;
      MPI_Get_count(&status, MPI_BYTE, &count);
      const auto from = rank_t(status.MPI_SOURCE);
      const auto waits_for = rank_t(qcoll::detail::load_le<std::uint32_t>(note_received.data()));
      if (from < size && from != rank && count == 4 && waits_for < size && waits_for != from) {
        transports::peer_liveness& live = liveness[from];
        ++live.heard;
        ++live.waiting_notes;
        live.waits_for = waits_for;
      }
      post_note_receive();
    }
  }

  /// Tells every peer this rank is alive and waits for `waits_for`; a peer whose last
  /// note MPI still holds is skipped (it is not reading them).
  void say_waiting(rank_t waits_for) {
    if (failure.code) return;
    for (rank_t p = 0; p < size; ++p) {
      if (p == rank) continue;
      if (note_sends[p] != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&note_sends[p], &done, MPI_STATUS_IGNORE);
        if (!done) continue;
      }
      qcoll::detail::store_le(note_messages[p].data(), std::uint32_t(waits_for));
      MPI_Isend(note_messages[p].data(), 4, MPI_BYTE, int(p), note_tag, control, &note_sends[p]);
    }
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
    abort_message = std::make_unique<std::array<std::byte, abort_message_bytes>>();
    qcoll::detail::store_le(abort_message->data(), stream::wire_code(code));
    std::copy_n(reinterpret_cast<const std::byte*>(failure.reason.data()), failure.reason.size(),
                abort_message->data() + 4);
    const int bytes = int(4 + failure.reason.size());
    for (rank_t p = 0; p < size; ++p)
      if (p != rank) MPI_Isend(abort_message->data(), bytes, MPI_BYTE, int(p), 0, control, &abort_sends[p]);
    drain(clock::now() + opts.withdraw_grace, clock::now() + opts.abort_flush);  // best effort and bounded
  }

  bool pending_abort_sends() { return pending(abort_sends); }
  bool pending_control_sends() { return pending(abort_sends) || pending(note_sends); }

  static bool pending(std::vector<MPI_Request>& sends) {
    bool any = false;
    for (MPI_Request& r : sends) {
      if (r == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      any = any || !done;
    }
    return any;
  }

  /// Lets MPI finish the orphaned transfers (until `orphans_until`) and the abort
  /// messages (until `aborts_until`), polling all the while: MPI progresses only then.
  void drain(deadline orphans_until, deadline aborts_until, bool waiting_for_sinks = false) {
    for (;;) {
      test_orphans();
      const deadline now = clock::now();
      // A failed call waits only for transfers into or out of the caller's buffers;
      // sinks own theirs, and destruction gives them the same grace.
      const bool user_buffers = std::any_of(orphans.begin(), orphans.end(), [&](const orphan& o) {
        return !o.sink || waiting_for_sinks;
      });
      const bool orphans_done = !user_buffers || now >= orphans_until;
      const bool aborts_done = !pending_abort_sends() || now >= aborts_until;
      if (orphans_done && aborts_done) return;
      std::this_thread::yield();
    }
  }

  std::mutex mutex;
  rank_t rank = 0, size = 0;
  tag_t tag_upper_bound = 32767;
  options opts;
  MPI_Comm frames = MPI_COMM_NULL, payloads = MPI_COMM_NULL, clears = MPI_COMM_NULL, control = MPI_COMM_NULL;
  request* head = nullptr;  // pending requests, in post order
  request* tail = nullptr;
  std::vector<std::string> broken;        // per peer: why its stream can no longer be used
  struct orphan {
    MPI_Request request;
    rank_t peer;
    const char* what;
    std::unique_ptr<std::byte[]> sink;  // a sink receive's own buffer
  };
  std::vector<orphan> orphans;            // transfers withdrawn while MPI still held them
  std::unique_ptr<std::array<std::byte, abort_message_bytes>> abort_received, abort_message;
  MPI_Request control_request = MPI_REQUEST_NULL;
  std::vector<MPI_Request> abort_sends;
  std::vector<transports::peer_liveness> liveness;  // per peer
  std::array<std::byte, 4> note_received{};
  MPI_Request note_request = MPI_REQUEST_NULL;
  std::vector<MPI_Request> note_sends;  // per peer: the last liveness note
  std::unique_ptr<std::array<std::byte, 4>[]> note_messages;
  transports::failure failure;
};

}  // namespace detail

/// qcoll's transport over MPI point-to-point. Construction is collective over `comm`.
class transport {
 public:
  using request = mpi::request;

  /// Duplicates `comm` (collective over it). MPI must be initialized with at least
  /// MPI_THREAD_SERIALIZED; errc::invalid_argument otherwise.
  explicit transport(MPI_Comm comm = MPI_COMM_WORLD, const options& opts = {})
      : state_(std::make_unique<detail::state>(comm, opts)) {}

  rank_t rank() const noexcept { return state_->rank; }
  rank_t size() const noexcept { return state_->size; }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    state_->post_send(r, peer, tag, header, data);
  }
  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    state_->post_recv(r, peer, tag, buffer);
  }
  bool test(request& r) { return state_->test(r); }
  std::error_code wait(request& r, deadline until) { return state_->wait(r, until); }
  void abort(std::error_code code, std::string_view reason) { state_->abort(code, reason); }
  transports::failure failure() const {
    std::lock_guard lock(state_->mutex);
    return state_->failure;
  }
  transports::stall stall(rank_t peer) const {
    std::lock_guard lock(state_->mutex);
    return peer < state_->size ? state_->liveness[peer].last_stall : transports::stall{};
  }
  /// The highest tag MPI accepts here (the communicator's MPI_TAG_UB).
  tag_t max_tag() const noexcept { return state_->tag_upper_bound; }

 private:
  std::unique_ptr<detail::state> state_;
};

inline request::~request() {
  if (owner_ && state_ != state::idle && state_ != state::done) {
    std::lock_guard lock(owner_->mutex);
    owner_->withdraw(*this, make_error_code(errc::aborted));
  }
}

static_assert(qcoll::liveness_transport<transport>);

}  // namespace qcoll::transports::mpi
