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
///
/// The parts live in transports/mpi/: the request and the protocol's sizes
/// (request.hpp), the options (options.hpp), the state with the protocol (state.hpp),
/// the control communicator (control.hpp), the transfers MPI still holds after a
/// withdrawal (orphans.hpp), payloads of any size (byte_ranges.hpp) and MPI's C API
/// as the transport includes it (c_api.hpp).

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/transports/mpi/c_api.hpp>
#include <qcoll/transports/mpi/options.hpp>
#include <qcoll/transports/mpi/request.hpp>
#include <qcoll/transports/mpi/state.hpp>

#include <mpi.h>

#include <memory>
#include <mutex>
#include <span>
#include <string_view>

namespace qcoll::transports::mpi {

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

static_assert(qcoll::liveness_transport<transport>);

}  // namespace qcoll::transports::mpi
