#pragma once
/// @file
/// The MPI transport's control communicator: the abort messages (tag 0) that make every
/// rank fail with the aborting rank's code and words, and the liveness notes (tag 1,
/// core/liveness.hpp) a waiting rank sends its peers. Each rank keeps one receive of
/// each kind posted and polls them with every progress step.

#include <qcoll/core/liveness.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/little_endian.hpp>
#include <qcoll/transports/mpi/c_api.hpp>
#include <qcoll/transports/stream/records.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace qcoll::transports::mpi::detail {

/// What an abort message carries: the code, then the reason.
inline constexpr std::size_t abort_message_bytes = 4 + stream::max_reason_bytes;

/// The control communicator's messages, both ways. Called under the transport's mutex.
class control_channel {
 public:
  /// The liveness notes (core/liveness.hpp): four bytes, the rank this one waits
  /// for, on the control communicator with a tag of their own.
  static constexpr int note_tag = 1;

  /// Duplicated and freed by the state with its other communicators.
  MPI_Comm comm = MPI_COMM_NULL;

  /// Sizes the per-peer records and posts the two receives; `comm` is set.
  void start(rank_t rank, rank_t size) {
    rank_ = rank;
    size_ = size;
    abort_sends_.assign(size, MPI_REQUEST_NULL);
    note_sends_.assign(size, MPI_REQUEST_NULL);
    note_messages_ = std::make_unique<std::array<std::byte, 4>[]>(size);
    post_abort_receive();
    post_note_receive();
  }

  /// A peer's abort, once it has arrived: this rank's too, with the peer's code and words.
  std::optional<transports::failure> poll_abort() {
    if (abort_request_ == MPI_REQUEST_NULL) return std::nullopt;
    int done = 0;
    MPI_Status status;
    if (MPI_Test(&abort_request_, &done, &status) != MPI_SUCCESS || !done) return std::nullopt;
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    if (count < 4) {  // not an abort message; keep listening
      post_abort_receive();
      return std::nullopt;
    }
    const auto code = stream::code_from_wire(qcoll::detail::load_le<std::uint32_t>(abort_received_->data()));
    return transports::failure{code, std::string(reinterpret_cast<const char*>(abort_received_->data() + 4),
                                                 std::size_t(count - 4))};
  }

  /// Takes in every note that has arrived: each counts as hearing from its sender.
  void poll_notes(std::vector<transports::peer_liveness>& liveness) {
    for (;;) {
      if (note_request_ == MPI_REQUEST_NULL) return;
      int done = 0, count = 0;
      MPI_Status status;
      if (MPI_Test(&note_request_, &done, &status) != MPI_SUCCESS || !done) return;
      MPI_Get_count(&status, MPI_BYTE, &count);
      const auto from = rank_t(status.MPI_SOURCE);
      const auto waits_for = rank_t(qcoll::detail::load_le<std::uint32_t>(note_received_.data()));
      if (from < size_ && from != rank_ && count == 4 && waits_for < size_ && waits_for != from) {
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
    for (rank_t p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (note_sends_[p] != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&note_sends_[p], &done, MPI_STATUS_IGNORE);
        if (!done) continue;
      }
      qcoll::detail::store_le(note_messages_[p].data(), std::uint32_t(waits_for));
      MPI_Isend(note_messages_[p].data(), 4, MPI_BYTE, int(p), note_tag, comm, &note_sends_[p]);
    }
  }

  /// Sends `failure` (its reason already cut to stream::max_reason_bytes) to every peer.
  void send_abort(const transports::failure& failure) {
    abort_message_ = std::make_unique<std::array<std::byte, abort_message_bytes>>();
    qcoll::detail::store_le(abort_message_->data(), stream::wire_code(failure.code));
    std::copy_n(reinterpret_cast<const std::byte*>(failure.reason.data()), failure.reason.size(),
                abort_message_->data() + 4);
    const int bytes = int(4 + failure.reason.size());
    for (rank_t p = 0; p < size_; ++p)
      if (p != rank_) MPI_Isend(abort_message_->data(), bytes, MPI_BYTE, int(p), 0, comm, &abort_sends_[p]);
  }

  bool pending_abort_sends() { return pending(abort_sends_); }
  bool pending_sends() { return pending(abort_sends_) || pending(note_sends_); }

  /// Withdraws the two posted receives (destruction).
  void stop_listening() {
    for (MPI_Request* listening : {&abort_request_, &note_request_}) {
      if (*listening == MPI_REQUEST_NULL) continue;
      MPI_Cancel(listening);
      MPI_Wait(listening, MPI_STATUS_IGNORE);
    }
  }

  /// Leaves the sends MPI still holds to it, with their buffers (destruction).
  void leave_to_mpi() {
    for (auto* sends : {&abort_sends_, &note_sends_})
      for (MPI_Request& r : *sends)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    (void)abort_message_.release();  // MPI may still read them
    (void)note_messages_.release();
  }

 private:
  void post_abort_receive() {
    if (!abort_received_) abort_received_ = std::make_unique<std::array<std::byte, abort_message_bytes>>();
    MPI_Irecv(abort_received_->data(), int(abort_message_bytes), MPI_BYTE, MPI_ANY_SOURCE, 0, comm,
              &abort_request_);
  }

  void post_note_receive() {
    MPI_Irecv(note_received_.data(), int(note_received_.size()), MPI_BYTE, MPI_ANY_SOURCE, note_tag, comm,
              &note_request_);
  }

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

  rank_t rank_ = 0, size_ = 0;
  std::unique_ptr<std::array<std::byte, abort_message_bytes>> abort_received_, abort_message_;
  MPI_Request abort_request_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> abort_sends_;
  std::array<std::byte, 4> note_received_{};
  MPI_Request note_request_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> note_sends_;  // per peer: the last liveness note
  std::unique_ptr<std::array<std::byte, 4>[]> note_messages_;
};

}  // namespace qcoll::transports::mpi::detail
