#pragma once
/// @file
/// What a process transport supplies to the stream engine (engine.hpp): non-blocking
/// byte pipes to each peer and a way to sleep until one may have moved. shm.hpp and
/// tcp.hpp implement it; the engine does everything else.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/types.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace qcoll::transports::stream {

/// Non-blocking byte pipes between this rank and each peer (one per direction).
class channels {
 public:
  virtual ~channels() = default;
  /// Copies up to bytes.size() bytes toward `peer`; returns how many (0: no room now).
  /// Sets `lost` to the reason when the pipe is broken for good.
  virtual std::size_t write_some(rank_t peer, std::span<const std::byte> bytes, std::string& lost) = 0;
  /// Copies up to into.size() bytes from `peer`; returns how many (0: none now). Sets
  /// `lost` once the peer closed or died and everything it wrote has been read.
  virtual std::size_t read_some(rank_t peer, std::span<std::byte> into, std::string& lost) = 0;
  /// write_some of `first` and then `second` as one stream; returns how many bytes of
  /// the two together moved. A pipe that can gather overrides it (TCP: one sendmsg, so
  /// a record's header does not leave as a packet of its own ahead of its payload).
  virtual std::size_t write_some_gathered(rank_t peer, std::span<const std::byte> first,
                                          std::span<const std::byte> second, std::string& lost) {
    const std::size_t n = write_some(peer, first, lost);
    if (n < first.size() || second.empty()) return n;
    return n + write_some(peer, second, lost);
  }
  /// Bytes moved to or from `peer` since the last call: wake it if it sleeps. Called
  /// once per pump rather than per copy, so a message costs one wakeup, not one per chunk.
  virtual void notify(rank_t peer) noexcept = 0;
  /// True once the peer closed or died (bytes it wrote may still be unread).
  virtual bool peer_gone(rank_t peer) = 0;
  /// A counter that changes whenever a pipe may have moved; read it before looking.
  virtual std::uint64_t activity() = 0;
  /// Sleeps until activity() differs from `seen`, a peer dies, or `until` passes.
  /// `want_read[p]`: this rank would read from p now (false while p's next message
  /// waits for a receive: only p leaving matters then); `want_write[p]`: this rank has
  /// bytes waiting for room toward p.
  virtual void wait_for_activity(std::uint64_t seen, std::span<const char> want_read, std::span<const char> want_write,
                                 deadline until) = 0;
  /// Closes both directions to `peer`; the peer's reads end after what was written.
  virtual void close(rank_t peer) noexcept = 0;
  /// Whether the bytes to and from `peer` cross a network (a NIC, a cable, a switch)
  /// rather than this host's memory or loopback: where payload checksums are on unless
  /// set (engine_options::payload_checksums). Both ends of a pair answer alike.
  virtual bool crosses_network(rank_t /*peer*/) const noexcept { return false; }
};

}  // namespace qcoll::transports::stream
