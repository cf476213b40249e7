#pragma once
/// @file
/// One peer's incoming stream: the receives posted for it, the records of records.hpp
/// read from its pipe, and how each message finds its receive. The engine (engine.hpp)
/// keeps one per peer and decides when each is pumped.
///
/// Matching: a receive matches the oldest unmatched message from its peer with its
/// tag. Payload bytes go straight from the pipe into the posted buffer (one copy out
/// of the pipe, no staging). When the next message from a peer has no matching receive
/// yet, that peer's stream waits for one (backpressure, bounded memory): messages from
/// one peer are therefore delivered in the order they were sent across all tags, and a
/// program must post receives from a peer in the order that peer sends — which every
/// qcoll algorithm does.

#include <qcoll/core/error.hpp>
#include <qcoll/core/liveness.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/crc32c.hpp>
#include <qcoll/detail/describe.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/transports/stream/channels.hpp>
#include <qcoll/transports/stream/records.hpp>
#include <qcoll/transports/stream/request.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll::transports::stream {

class incoming {
 public:
  /// The transport's abort (code, reason), which an abort record from the peer makes
  /// this rank's too, at once: the engine's abort fails and tells every peer.
  using abort_handler = std::function<void(std::error_code, std::string_view)>;

  /// Reads from `peer` through `pipes` for rank `self`, in a job of `size` ranks; payload that no
  /// receive takes is read into `discard`, which every peer's stream shares. Checked
  /// data records are checked always; with `require_checksums`, plain ones are refused.
  incoming(channels& pipes, rank_t self, rank_t peer, rank_t size, std::span<std::byte> discard,
           bool require_checksums, abort_handler abort)
      : pipes_(&pipes), self_(self), peer_(peer), size_(size), discard_(discard), abort_(std::move(abort)),
        require_checksums_(require_checksums) {}

  /// Why the stream broke; empty while it is intact.
  std::error_code broken() const noexcept { return broken_; }
  const std::string& why() const noexcept { return why_; }

  /// What this rank knows of the peer's liveness: heard is bumped by any read from it
  /// that moved bytes, the notes by its waiting records.
  transports::peer_liveness& liveness() noexcept { return live_; }
  const transports::peer_liveness& liveness() const noexcept { return live_; }

  /// Whether this rank would read from the peer now: not once the stream broke, nor
  /// while the peer's next message waits for a receive (only its leaving matters then).
  bool would_read() const noexcept { return !broken_ && !stalled_; }

  /// Whether a receive from this peer is posted, or a message from it is under way.
  bool expecting() const noexcept {
    return !recvs_.empty() || target_ != nullptr || message_left_ != 0 || at_ != phase::record ||
           staged_have_ != 0 || stalled_;
  }

  /// Queues `r` behind the receives already posted; pump() matches it.
  void enqueue(request& r) {
    r.state_ = request::state::queued;
    recvs_.push_back(&r);
  }

  /// Completes `r` with the oldest whole parked message of its tag, if there is one
  /// (a wrong size as match_stalled: the sender's header, protocol_error).
  bool deliver_parked(request& r) {
    const std::size_t whole = parked_.size() - (parking_ ? 1 : 0);
    const auto found = std::find_if(parked_.begin(), parked_.begin() + static_cast<std::ptrdiff_t>(whole),
                                    [&](const parked_message& m) { return m.tag == r.tag_; });
    if (found == parked_.begin() + static_cast<std::ptrdiff_t>(whole)) return false;
    r.take_header(found->header);
    r.transferred_ = static_cast<std::size_t>(std::min<std::uint64_t>(found->length, SIZE_MAX));
    if (found->length != r.size_) {
      r.complete(make_error_code(errc::protocol_error));
    } else {
      if (r.size_ != 0) std::memcpy(r.recv_data_, found->payload.data(), r.size_);
      r.complete({});
    }
    parked_.erase(found);
    return true;
  }

  /// Reads what has arrived; true when any byte moved.
  bool pump() {
    bool moved = false;
    while (!broken_) {
      if (stalled_) {
        if (match_stalled()) continue;
        // The stalled message stays deliverable after its sender left (it may have
        // finished and exited). Receives waiting for other tags then read past it: it
        // is parked for a later receive with its tag, and what the sender wrote after
        // it decides them — a message they match, its abort (a rank that found a
        // mismatch sends one behind the message this rank has not matched: every rank
        // then fails with that first cause), or the end of its stream (peer_lost).
        if (!recvs_.empty() && pipes_->peer_gone(peer_)) {
          park();
          moved = true;
          continue;
        }
        break;
      }
      if (at_ == phase::payload) {
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_left_, discard_.size()));
        std::vector<std::byte>* parked = parking_ ? &parked_.back().payload : nullptr;
        const std::size_t parked_before = parked ? parked->size() : 0;
        if (parked) parked->resize(parked_before + want);  // what a gone peer wrote: bounded by its pipe
        const std::span<std::byte> into =
            target_ ? std::span(target_->recv_data_ + target_->transferred_, chunk_left_)
            : parked ? std::span(*parked).subspan(parked_before)
                     : discard_.first(want);
        const std::size_t n = read(into);
        if (parked) parked->resize(parked_before + n);
        if (n == 0) break;
        moved = true;
        if (checked_) chunk_crc_ = qcoll::detail::crc32c::extend(chunk_crc_, into.first(n));
        chunk_left_ -= n;
        message_left_ -= n;
        if (target_) target_->transferred_ += n;
        if (chunk_left_ == 0) {
          if (checked_ && chunk_crc_ != record_.tag) return corrupted();  // before the message completes
          expect_record();
        }
        if (message_left_ == 0) {
          parking_ = false;
          if (target_) target_->complete({});
          target_ = nullptr;
        }
        continue;
      }
      if (at_ == phase::reason) {
        const std::size_t have = reason_.size();
        reason_.resize(record_.length);
        const std::size_t n = read(std::as_writable_bytes(std::span(reason_)).subspan(have));
        reason_.resize(have + n);
        if (n == 0) break;
        moved = true;
        if (reason_.size() == record_.length) {
          expect_record();
          abort_(code_from_wire(record_.tag), reason_);  // a peer's abort is this rank's too
          return true;
        }
        continue;
      }
      const std::size_t n = read(std::span(staged_).subspan(staged_have_, staged_need_ - staged_have_));
      if (n == 0) break;
      moved = true;
      staged_have_ += n;
      if (staged_have_ == staged_need_) on_staged();
    }
    if (moved) {
      ++live_.heard;
      pipes_->notify(peer_);
    }
    return moved;
  }

  /// Completes the receive being filled and every posted one with `code`.
  void fail_requests(std::error_code code) noexcept {
    if (target_) target_->complete(code);
    target_ = nullptr;
    for (request* r : recvs_) r->complete(code);
    recvs_.clear();
  }

  /// Takes back the pending receive `r` (the caller completes it). One half-filled
  /// breaks the stream, since the rest of its bytes can no longer be placed.
  void withdraw(request& r, std::error_code code) noexcept {
    if (target_ == &r) {
      break_stream(code, "a receive was withdrawn half-filled");
      pipes_->close(peer_);
    } else {
      recvs_.erase(std::remove(recvs_.begin(), recvs_.end(), &r), recvs_.end());
    }
  }

 private:
  enum class phase : unsigned char { record, message_header, payload, reason };

  std::size_t read(std::span<std::byte> into) {
    std::string lost;
    const std::size_t n = pipes_->read_some(peer_, into, lost);
    if (!lost.empty())
      break_stream(make_error_code(errc::peer_lost), "peer " + std::to_string(peer_) + ": " + lost);
    return n;
  }

  void expect_record() noexcept {
    at_ = phase::record;
    staged_need_ = record_header_bytes;
    staged_have_ = 0;
  }

  void on_staged() {
    std::string problem;
    if (at_ == phase::message_header) {
      const auto header = read_message_header(std::span(staged_).first<message_header_bytes>(), problem);
      if (!header) return malformed(problem);
      stalled_header_ = *header;
      stalled_ = true;
      expect_record();
      return;
    }
    const auto record = read_record_header(std::span(staged_).first<record_header_bytes>(), problem);
    if (!record) return malformed(problem);
    record_ = *record;
    switch (record->type) {
      case record_type::message:
        if (message_left_ != 0) return malformed("a message began inside an unfinished one");
        at_ = phase::message_header;
        staged_need_ = message_header_bytes;
        staged_have_ = 0;
        return;
      case record_type::data:
      case record_type::checked_data:
        if (record->type == record_type::data && require_checksums_)
          return malformed("a data record without its CRC-32C, where payload checksums are on (QCOLL_PAYLOAD_CRC: "
                           "every rank must agree)");
        checked_ = record->type == record_type::checked_data;
        chunk_crc_ = 0;
        if (record->length > message_left_)
          return malformed(qcoll::detail::format("a data record of {} bytes where {} remain of the message",
                                                 record->length, message_left_));
        at_ = phase::payload;
        chunk_left_ = record->length;
        return;
      case record_type::waiting:
        if (message_left_ != 0) return malformed("a waiting record inside a message");
        if (record->tag >= size_ || record->tag == peer_)
          return malformed(qcoll::detail::format("a waiting record for rank {} of {}", record->tag, size_));
        live_.waits_for = record->tag;
        ++live_.waiting_notes;
        expect_record();
        return;
      case record_type::abort:
        at_ = phase::reason;
        reason_.clear();
        if (record->length == 0) {
          expect_record();
          abort_(code_from_wire(record->tag), qcoll::detail::format("peer {} aborted", peer_));
        }
        return;
    }
  }

  /// Takes the stalled message off the stream: its payload is read into the parked
  /// queue as it arrives (pump), and the records behind it are read on.
  void park() {
    parked_.push_back({record_.tag, stalled_header_, record_.length, {}});
    stalled_ = false;
    message_left_ = record_.length;
    target_ = nullptr;
    parking_ = record_.length != 0;
  }

  /// Hands the stalled message to the oldest receive with its tag, if one is posted.
  bool match_stalled() {
    const auto found =
        std::find_if(recvs_.begin(), recvs_.end(), [&](const request* r) { return r->tag_ == record_.tag; });
    if (found == recvs_.end()) return false;
    request& r = **found;
    recvs_.erase(found);
    stalled_ = false;
    message_left_ = record_.length;
    r.take_header(stalled_header_);
    if (record_.length != r.size_) {
      // The receiver learns the sender's header and size; the payload is read and dropped.
      r.transferred_ = static_cast<std::size_t>(std::min<std::uint64_t>(record_.length, SIZE_MAX));
      r.complete(make_error_code(errc::protocol_error));
      target_ = nullptr;
      return true;
    }
    target_ = &r;
    r.state_ = request::state::active;
    if (message_left_ == 0) {
      r.complete({});
      target_ = nullptr;
    }
    return true;
  }

  /// A chunk whose bytes are not those its sender checksummed: corrupted on the way.
  /// The stream breaks, and this rank aborts with the finding, so every rank's error
  /// names the peer and the call (and none uses the chunk: its message never completes).
  bool corrupted() {
    malformed(qcoll::detail::format("the CRC-32C of a data record's {} bytes is {:#010x}, its sender's {:#010x}: the "
                                    "payload was corrupted in transit, in {}", record_.length, chunk_crc_, record_.tag,
                                    qcoll::detail::describe(stalled_header_)));
    abort_(make_error_code(errc::protocol_error), qcoll::detail::format("rank {}: {}", self_, why_));
    return true;
  }

  void malformed(std::string_view problem) {
    break_stream(make_error_code(errc::protocol_error),
                 qcoll::detail::format("peer {} sent a malformed stream: {}", peer_, problem));
    pipes_->close(peer_);
  }

  void break_stream(std::error_code code, std::string why) {
    if (broken_) return;
    broken_ = code;
    why_ = std::move(why);
    if (target_) target_->complete(code);
    target_ = nullptr;
    for (request* r : recvs_) r->complete(code);
    recvs_.clear();
    stalled_ = false;
  }

  channels* pipes_;
  rank_t self_;
  rank_t peer_;
  rank_t size_;
  std::span<std::byte> discard_;
  abort_handler abort_;
  std::deque<request*> recvs_;  // posted, not yet matched; FIFO
  phase at_ = phase::record;
  std::array<std::byte, message_header_bytes> staged_{};
  std::size_t staged_need_ = record_header_bytes;
  std::size_t staged_have_ = 0;
  record_header record_;
  bool stalled_ = false;  // a whole message record waits for a matching receive
  message_header stalled_header_;
  std::uint64_t message_left_ = 0;  // payload bytes of the open message still to come
  std::uint64_t chunk_left_ = 0;    // bytes of the current data record still to come
  bool require_checksums_ = false;  // plain data records are refused
  bool checked_ = false;            // the current data record carries a CRC-32C (record_.tag) ...
  std::uint32_t chunk_crc_ = 0;     // ... and this is its bytes' so far
  request* target_ = nullptr;       // the receive being filled; null while discarding or parking
  /// Messages read past a stalled one after their sender left (park): whole ones wait
  /// for a receive with their tag; the last may still be filling (`parking_`).
  struct parked_message {
    tag_t tag;
    message_header header;
    std::uint64_t length;
    std::vector<std::byte> payload;
  };
  std::deque<parked_message> parked_;
  bool parking_ = false;
  std::string reason_;
  std::error_code broken_;
  std::string why_;
  transports::peer_liveness live_;  // heard: a read from it moved bytes; notes: its waiting records
};

}  // namespace qcoll::transports::stream
