#pragma once
/// @file
/// One peer's outgoing stream: the sends queued toward it, oldest first, and how they
/// leave as the records of records.hpp, written into the peer's pipe as it takes them.
/// After an abort it carries what the abort needs (the rest of a chunk in flight, then
/// the abort record) and no further message. The engine (engine.hpp) keeps one per peer
/// and decides when each is pumped.

#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/crc32c.hpp>
#include <qcoll/transports/stream/channels.hpp>
#include <qcoll/transports/stream/records.hpp>
#include <qcoll/transports/stream/request.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll::transports::stream {

class outgoing {
 public:
  /// Writes toward `peer` through `pipes`, adding what it writes to `bytes_written`;
  /// with `checksums`, every data record carries its CRC-32C (checked_data).
  outgoing(channels& pipes, rank_t peer, std::atomic<std::uint64_t>& bytes_written, bool checksums) noexcept
      : pipes_(&pipes), peer_(peer), bytes_written_(&bytes_written), checksums_(checksums) {}

  /// Why the stream broke; empty while it is intact.
  std::error_code broken() const noexcept { return broken_; }
  const std::string& why() const noexcept { return why_; }

  /// Whether bytes wait for room in the pipe (never once the stream broke).
  bool has_output() const noexcept {
    if (broken_) return false;
    return staged_done_ < staged_size_ || chunk_left_ > 0 || tail_done_ < tail_.size() || !sends_.empty();
  }

  /// Queues `r` behind the sends already queued; pump() writes it.
  void enqueue(request& r) {
    r.state_ = request::state::queued;
    sends_.push_back(&r);
  }

  /// Writes what fits; true when any byte moved. `aborted`: the transport aborted, so
  /// only what is already staged or in the tail goes out, and no further message.
  bool pump(bool aborted) {
    bool moved = false;
    while (!broken_) {
      if (staged_done_ < staged_size_) {
        // Record headers, and the chunk they open in the same write.
        const std::span<const std::byte> staged =
            std::span<const std::byte>(staged_).subspan(staged_done_, staged_size_ - staged_done_);
        request* const head = chunk_left_ > 0 ? sends_.front() : nullptr;
        const std::span<const std::byte> chunk =
            head != nullptr ? std::span(head->send_data_ + head->transferred_, chunk_left_)
                            : std::span<const std::byte>();
        const std::size_t n = write(staged, chunk);
        if (n == 0) break;
        const std::size_t of_staged = std::min(n, staged.size());
        staged_done_ += of_staged;
        if (head != nullptr) {
          head->transferred_ += n - of_staged;
          chunk_left_ -= n - of_staged;
        }
        moved = true;
        continue;
      }
      if (chunk_left_ > 0) {
        request& head = *sends_.front();
        const std::size_t n = write({head.send_data_ + head.transferred_, chunk_left_});
        if (n == 0) break;
        head.transferred_ += n;
        chunk_left_ -= n;
        moved = true;
        continue;
      }
      if (tail_done_ < tail_.size()) {  // only after an abort
        const std::size_t n = write(std::as_bytes(std::span(tail_)).subspan(tail_done_));
        if (n == 0) break;
        tail_done_ += n;
        moved = true;
        continue;
      }
      if (aborted || sends_.empty()) break;
      request& head = *sends_.front();
      if (!message_open_) {
        stage_message(head);
        message_open_ = true;
        head.state_ = request::state::active;
        continue;
      }
      if (head.transferred_ < head.size_) {
        chunk_left_ = std::min<std::uint64_t>(max_chunk_bytes, head.size_ - head.transferred_);
        staged_size_ = staged_done_ = 0;
        stage_data_record(head.send_data_ + head.transferred_, chunk_left_);
        continue;
      }
      sends_.pop_front();
      message_open_ = false;
      head.complete({});
    }
    if (moved) pipes_->notify(peer_);
    return moved;
  }

  /// Stages a waiting record for `waits_for` when the stream is between messages (one
  /// that is not makes the peer hear this rank's bytes anyway); true when staged.
  bool stage_waiting(rank_t waits_for) {
    if (broken_ || has_output()) return false;
    staged_size_ = staged_done_ = 0;
    stage_record({record_type::waiting, static_cast<std::uint32_t>(waits_for), 0});
    return true;
  }

  /// The abort record of `failure` goes out at the next record boundary: the rest of a
  /// chunk in flight is copied first, because its request fails now and its buffer is
  /// the caller's.
  void queue_abort_record(const transports::failure& failure) {
    if (broken_) return;
    tail_.clear();
    if (chunk_left_ > 0) {
      const request& head = *sends_.front();
      tail_.append(reinterpret_cast<const char*>(head.send_data_ + head.transferred_), chunk_left_);
      chunk_left_ = 0;
    }
    std::array<std::byte, record_header_bytes> header{};
    write_record_header(header, {record_type::abort, wire_code(failure.code), failure.reason.size()});
    tail_.append(reinterpret_cast<const char*>(header.data()), header.size());
    tail_ += failure.reason;
    tail_done_ = 0;
    sends_.clear();  // already failed by fail_requests
    message_open_ = false;
  }

  /// Completes every queued send with `code` (they stay queued: see queue_abort_record).
  void fail_requests(std::error_code code) noexcept {
    for (request* r : sends_) r->complete(code);
  }

  /// Takes back the pending send `r` (the caller completes it). One half-written breaks
  /// the stream, since the rest of its message can no longer follow.
  void withdraw(request& r, std::error_code code) noexcept {
    const bool started = !sends_.empty() && sends_.front() == &r && message_open_;
    if (started) {
      break_stream(code, "a send was withdrawn half-written");
      pipes_->close(peer_);
    } else {
      sends_.erase(std::remove(sends_.begin(), sends_.end(), &r), sends_.end());
    }
  }

 private:
  /// Messages up to this size leave in one write (headers and payload copied together),
  /// so a small message costs one system call on TCP instead of three.
  static constexpr std::size_t small_message_bytes = 8192;

  std::size_t write(std::span<const std::byte> bytes) { return write(bytes, {}); }

  std::size_t write(std::span<const std::byte> first, std::span<const std::byte> second) {
    std::string lost;
    const std::size_t n = pipes_->write_some_gathered(peer_, first, second, lost);
    if (!lost.empty())
      break_stream(make_error_code(errc::peer_lost), "peer " + std::to_string(peer_) + ": " + lost);
    bytes_written_->fetch_add(n, std::memory_order_relaxed);
    return n;
  }

  /// The header of a data record of `bytes` at `chunk`: with its CRC-32C where checksums are on.
  void stage_data_record(const std::byte* chunk, std::size_t bytes) {
    if (!checksums_) return stage_record({record_type::data, 0, bytes});
    stage_record({record_type::checked_data, qcoll::detail::crc32c::of({chunk, bytes}), bytes});
  }

  void stage_record(const record_header& record) {
    const std::size_t at = staged_size_;
    staged_size_ += record_header_bytes;
    if (staged_.size() < staged_size_) staged_.resize(staged_size_);
    write_record_header(std::span(staged_).subspan(at).first<record_header_bytes>(), record);
  }

  /// The message record, its header and the first data record's header; a small
  /// message's payload too (it is then the engine's, and the request is fully copied).
  void stage_message(request& head) {
    staged_size_ = staged_done_ = 0;
    staged_.reserve(2 * record_header_bytes + message_header_bytes + small_message_bytes);
    stage_record({record_type::message, head.tag_, head.size_});
    staged_.resize(std::max(staged_.size(), staged_size_ + message_header_bytes));
    write_message_header(std::span(staged_).subspan(staged_size_).first<message_header_bytes>(), head.header_);
    staged_size_ += message_header_bytes;
    if (head.size_ == 0) return;
    const std::size_t first_chunk = std::min(max_chunk_bytes, head.size_);
    stage_data_record(head.send_data_, first_chunk);
    if (head.size_ <= small_message_bytes) {
      staged_.resize(std::max(staged_.size(), staged_size_ + head.size_));
      std::memcpy(staged_.data() + staged_size_, head.send_data_, head.size_);
      staged_size_ += head.size_;
      head.transferred_ = head.size_;
    } else {
      chunk_left_ = first_chunk;
    }
  }

  void break_stream(std::error_code code, std::string why) {
    if (broken_) return;
    broken_ = code;
    why_ = std::move(why);
    for (request* r : sends_) r->complete(code);
    sends_.clear();
    chunk_left_ = 0;
    staged_size_ = staged_done_ = 0;
    tail_.clear();
    tail_done_ = 0;
  }

  channels* pipes_;
  rank_t peer_;
  std::atomic<std::uint64_t>* bytes_written_;  // the engine's: written by its thread, read by anyone
  std::deque<request*> sends_;  // FIFO; the front one is being written
  std::vector<std::byte> staged_;  // record headers, and the whole of a small message
  std::size_t staged_size_ = 0;
  std::size_t staged_done_ = 0;
  bool message_open_ = false;     // the front send's message record is staged or written
  std::uint64_t chunk_left_ = 0;  // payload bytes of the current data record still to write
  std::string tail_;              // engine-owned bytes to write last: rest of a chunk, then the abort record
  std::size_t tail_done_ = 0;
  std::error_code broken_;
  std::string why_;
  bool checksums_ = false;  // data records carry their CRC-32C
};

}  // namespace qcoll::transports::stream
