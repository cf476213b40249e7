#pragma once
/// @file
/// The header every message of a collective carries, what every transport's
/// request reports, and what a transport says once it can no longer deliver. A receiver compares the header it got with the
/// one it expects, so ranks that disagree about the call (count, type, operation,
/// root, or how many collectives they have run) are told precisely, instead of
/// reducing mismatched bytes. Vocabulary of the transport concept: no fmt here.

#include <qcoll/core/types.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>

namespace qcoll::transports {

/// Tags separate concurrent streams of messages between one pair of ranks.
using tag_t = std::uint32_t;

struct message_header {
  std::uint64_t sequence = 0;  ///< how many collectives this communicator ran before
  std::uint64_t count = 0;     ///< element count as the caller passed it
  std::uint32_t root = 0;      ///< broadcast root; 0 for the others
  collective kind = collective::barrier;
  dtype type = dtype::f32;  ///< the caller's element type (16-bit collectives also send float partials)
  reduce_op op = reduce_op::sum;
  algorithm way = algorithm::unspecified;  ///< how an exact collective runs

  friend bool operator==(const message_header&, const message_header&) = default;
};

/// What every transport's request reports: the header that arrived with a received
/// message and the bytes moved (for a receive of the wrong size: the size the sender
/// announced) — and what a transport records about any posted request. A request is
/// caller-owned and must not move while posted, so it is not copyable; each transport
/// derives its request from this and adds its own bookkeeping.
class request_base {
 public:
  request_base() = default;
  request_base(const request_base&) = delete;
  request_base& operator=(const request_base&) = delete;

  const message_header& header() const noexcept { return header_; }
  std::size_t transferred() const noexcept { return transferred_; }
  /// Whether a receive was matched with a message, so header() is the sender's: a
  /// receive that failed before (a malformed stream, a lost peer) has none.
  bool header_arrived() const noexcept { return header_arrived_; }

 protected:
  ~request_base() = default;

  /// What every transport records when it posts a request: peer, tag and direction,
  /// with the outcome of the request's last use cleared.
  void begin_post(rank_t peer, tag_t tag, bool is_send) noexcept {
    peer_ = peer;
    tag_ = tag;
    is_send_ = is_send;
    transferred_ = 0;
    result_ = {};
    header_ = {};
    header_arrived_ = false;
  }

  /// A receive takes the header of the message it was matched with.
  void take_header(const message_header& header) noexcept {
    header_ = header;
    header_arrived_ = true;
  }

  message_header header_{};
  std::size_t transferred_ = 0;
  rank_t peer_ = 0;
  tag_t tag_ = 0;
  bool is_send_ = false;
  const std::byte* send_data_ = nullptr;
  std::byte* recv_data_ = nullptr;
  std::size_t size_ = 0;  // bytes to send, or capacity of the receive buffer
  bool header_arrived_ = false;
  std::error_code result_{};
};

/// Where a block lies in memory its owner allocated through a transport that lets peers
/// map it (the shm transport's shared buffers): what a peer needs to map it. Sent in a
/// single-copy step's "where" message; serial 0: the block is in ordinary memory.
struct shared_region {
  std::uint64_t serial = 0;  ///< the region's number at its owner (never reused)
  std::uint64_t handle = 0;  ///< the transport's handle for it (shm: the owner's file descriptor)
  std::uint64_t base = 0;    ///< where the region's bytes begin in the owner's address space
  std::uint64_t bytes = 0;   ///< how many there are
};

/// What a transport that watches its peers' liveness (liveness_transport) learned about
/// a peer while a wait on it timed out: whether the peer was heard from during the
/// wait (it is alive but did not do what the wait needed: it waits on something
/// itself), and, when it said so, which rank it waits for.
struct stall {
  bool peer_alive = false;
  std::optional<rank_t> waits_for;  ///< in the transport's own numbering
  std::chrono::milliseconds waited{0};  ///< how long the wait lasted
};

/// Why a transport can no longer deliver: the first abort's code and words.
/// An empty code means the transport is intact.
struct failure {
  std::error_code code;
  std::string reason;
};

}  // namespace qcoll::transports
