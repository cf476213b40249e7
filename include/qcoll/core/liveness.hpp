#pragma once
/// @file
/// Telling a stopped peer from a live one that waits on a third (liveness_transport in
/// core/concepts.hpp). Without it, deadlines blame the wrong rank: when rank 2 stops,
/// rank 0 waits on it and rank 1 on rank 0, and whichever deadline passes first names
/// its peer — rank 1's names rank 0, which is alive. So a rank whose wait lasts tells
/// every peer "alive, waiting for rank w" every quarter of the wait's span (at most
/// every second), and a wait's deadline counts only its peer's silence: anything heard
/// from the peer restarts the count. Ranks that wait on each other (a deadlock of live
/// ranks: say, two roots of one broadcast) hear each other forever, so twice the span
/// without a byte of the awaited message itself moving ends a wait in any case, and the
/// stall says who waits for whom. (A large message over a slow link moves its own bytes:
/// it is never cut off while they flow.)
///
/// The transports keep a peer_liveness per peer (bumping it as they hear the peer) and
/// run each wait under a liveness_watch; sending the notes is theirs.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace qcoll::transports {

/// What this rank knows of one peer's liveness.
struct peer_liveness {
  std::uint64_t heard = 0;          ///< bumped whenever anything arrives from the peer
  std::uint64_t waiting_notes = 0;  ///< bumped with each "alive, waiting" note it sends
  rank_t waits_for = 0;             ///< what its last note named
  stall last_stall;                 ///< what ended the last timed-out wait on it
};

/// One wait's deadline: `until - now` of silence from the peer ends it, and so does
/// twice that without progress of the request itself. While it lasts, note_due() says when to tell the peers this rank
/// is waiting.
class liveness_watch {
 public:
  liveness_watch(deadline now, deadline until, const peer_liveness& peer)
      : started_(now),
        span_(std::max(until - now, clock::duration::zero())),
        hard_until_(until + std::min(span_, deadline::max() - until)),
        note_every_(std::clamp<clock::duration>(span_ / 4, std::chrono::milliseconds(1), std::chrono::seconds(1))),
        next_note_(now + note_every_),
        heard_(peer.heard),
        heard_at_(now),
        notes_(peer.waiting_notes) {}

  /// When the wait ends unless the peer is heard from before. `moved`: bytes of the
  /// awaited request moved so far (progress of the request itself).
  deadline silent_until(deadline now, const peer_liveness& peer, std::size_t moved) {
    if (peer.heard != heard_) {
      heard_ = peer.heard;
      heard_at_ = now;
    }
    if (moved != moved_) {
      moved_ = moved;
      hard_until_ = now + std::min(2 * span_, deadline::max() - now);
    }
    return std::min(heard_at_ + span_, hard_until_);
  }

  /// True when this rank should say again that it is waiting (and then counts from now).
  bool note_due(deadline now) {
    if (now < next_note_) return false;
    next_note_ = now + note_every_;
    return true;
  }
  deadline next_note() const noexcept { return next_note_; }

  /// What ended the wait, for the error that names the peer.
  transports::stall stall(deadline now, const peer_liveness& peer) const {
    transports::stall s;
    s.peer_alive = heard_at_ != started_ || peer.heard != heard_;
    if (s.peer_alive && peer.waiting_notes != notes_) s.waits_for = peer.waits_for;
    s.waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - started_);
    return s;
  }

 private:
  deadline started_;
  clock::duration span_;
  deadline hard_until_;
  clock::duration note_every_;
  deadline next_note_;
  std::uint64_t heard_;
  deadline heard_at_;
  std::uint64_t notes_;
  std::size_t moved_ = 0;
};

}  // namespace qcoll::transports
