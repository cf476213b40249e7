#pragma once
/// @file
/// The part the process transports share: requests (request.hpp), each peer's streams
/// of records.hpp (incoming.hpp reads and matches them, outgoing.hpp queues and writes
/// them), and over them progress, deadlines and abort. A transport supplies only
/// `channels` (channels.hpp): non-blocking byte pipes to each peer and a way to sleep
/// until one may have moved.
///
/// Progress is made by the thread that posts, tests or waits; there is no progress
/// thread. A wait on any request moves every pending request of the transport, so a
/// rank waiting for a receive keeps its own sends flowing and ring steps cannot
/// deadlock on full pipes.
///
/// Matching (incoming.hpp): a receive matches the oldest unmatched message from its
/// peer with its tag, and receives from a peer must be posted in the order it sends.
///
/// Liveness (core/liveness.hpp): a wait that lasts sends every peer between
/// messages a `waiting` record, and a wait's deadline counts only its peer's silence
/// (any byte read from it restarts the count), up to twice the span without progress
/// of the request itself.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/cpu_relax.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/liveness.hpp>
#include <qcoll/transports/stream/channels.hpp>
#include <qcoll/transports/stream/incoming.hpp>
#include <qcoll/transports/stream/outgoing.hpp>
#include <qcoll/transports/stream/records.hpp>
#include <qcoll/transports/stream/request.hpp>
#include <qcoll/tuning/table.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace qcoll::transports::stream {

/// The default poll time is the tuning table's (qcoll::automatic_spin, tuning/table.hpp):
/// long when every local rank can have a core of its own, so a step's reply is caught
/// without a wakeup, as MPI does by polling; short when ranks outnumber cores, where
/// polling would take the core a peer needs. QCOLL_SPIN_US overrides it.
using qcoll::automatic_spin;
using qcoll::automatic_pause;

struct engine_options {
  /// How long a wait polls before it sleeps: a reply within this time costs no
  /// wakeup, which dominates small-message latency. 0 sleeps at once. Unset: chosen
  /// by the transport's join from the job (see automatic_spin).
  std::optional<std::chrono::microseconds> spin;
  /// How long an abort tries to deliver its reason to the peers before closing.
  std::chrono::milliseconds abort_flush{200};
  /// For how much of `spin` a wait polls with only a pause hint between polls; after
  /// it, it hands its core to any other runnable thread between polls (sched_yield), in
  /// case the peer it waits for shares the core. A yield is a system call: polling
  /// through them notices a reply late, which dominates small-message latency. Unset:
  /// chosen by the transport's join (see automatic_pause).
  std::optional<std::chrono::microseconds> pause;
  /// Whether data records carry their CRC-32C, checked by the receiver before the
  /// payload is used (records.hpp, checked_data), and plain data records are refused.
  /// Unset: QCOLL_PAYLOAD_CRC (1: every connection, 0: none), else per connection,
  /// where it crosses a network (channels::crosses_network: tcp between hosts, not over
  /// loopback; never shm; docs/transports.md, "Payload integrity"). Both ends of a
  /// connection must agree: a rank that checks refuses a peer's plain data records.
  std::optional<bool> payload_checksums;
};

/// `options` with the poll time filled in for a job of `local_ranks` ranks on this host,
/// and payload checksums as QCOLL_PAYLOAD_CRC says, where it is set.
/// @throws qcoll::error invalid_argument when QCOLL_PAYLOAD_CRC is not 0 or 1.
inline engine_options resolve(engine_options options, rank_t local_ranks) {
  if (!options.spin) options.spin = automatic_spin(local_ranks);
  if (!options.pause) options.pause = automatic_pause(local_ranks);
  const char* given = std::getenv("QCOLL_PAYLOAD_CRC");
  if (!options.payload_checksums && given != nullptr && *given != '\0') {
    const std::string_view value(given);
    if (value != "1" && value != "0")
      qcoll::detail::throw_error(errc::invalid_argument, "qcoll: QCOLL_PAYLOAD_CRC={} is not 1 or 0", given);
    options.payload_checksums = value == "1";
  }
  return options;
}

class engine {
 public:
  /// `name` prefixes error messages ("shm transport", "tcp transport").
  engine(rank_t rank, rank_t size, std::unique_ptr<channels> pipes, std::string name, engine_options options = {})
      : rank_(rank), size_(size), pipes_(std::move(pipes)), name_(std::move(name)), options_(options) {
    peers_.reserve(size_);
    rank_t checked_connections = 0;
    for (rank_t p = 0; p < size_; ++p) {
      const bool checked = p != rank_ && options_.payload_checksums.value_or(pipes_->crosses_network(p));
      peers_.push_back({outgoing(*pipes_, p, bytes_written_, checked),
                        incoming(*pipes_, rank_, p, size_, discard_, checked,
                                 [this](std::error_code code, std::string_view reason) { abort(code, reason); })});
      checked_connections += checked;
    }
    if (qcoll::detail::debug_info_enabled() && size_ > 1)
      qcoll::detail::log_info("qcoll: rank {}: {}: payload checksums (CRC-32C) on {} of {} connections ({})", rank_,
                              name_, checked_connections, size_ - 1,
                              options_.payload_checksums ? "QCOLL_PAYLOAD_CRC or the transport's options"
                                                         : "where a connection crosses a network");
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  ~engine() {
    for (rank_t p = 0; p < size_; ++p)
      if (p != rank_) pipes_->close(p);
  }

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    prepare(r, peer, tag, true);
    r.header_ = header;
    r.send_data_ = data.data();
    r.size_ = data.size();
    outgoing& out = peers_[peer].out;
    if (failure_.code) return r.complete(failure_.code);
    if (out.broken()) return r.complete(out.broken());
    out.enqueue(r);
    pump_out(peer);
  }

  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    prepare(r, peer, tag, false);
    r.recv_data_ = buffer.data();
    r.size_ = buffer.size();
    incoming& in = peers_[peer].in;
    if (failure_.code) return r.complete(failure_.code);
    if (in.deliver_parked(r)) return;
    if (in.broken()) return r.complete(in.broken());
    in.enqueue(r);
    pump_in(peer);
  }

  /// True once the request completed, successfully or not.
  bool test(request& r) {
    progress();
    return r.state_ == request::state::done;
  }

  /// Moves everything until `r` completes or its peer has been silent for as long as
  /// from now to `until` (at most twice that in all: see Liveness above). On a timeout
  /// the request is withdrawn (its buffer is free again); one caught half-transferred
  /// breaks the stream to that peer, since the rest of its bytes can no longer be placed.
  std::error_code wait(request& r, deadline until) {
    if (r.state_ == request::state::idle || r.engine_ != this) return make_error_code(errc::invalid_argument);
    deadline now = clock::now();
    const deadline spin_until = now + options_.spin.value_or(std::chrono::microseconds(50));
    const deadline pause_until = now + options_.pause.value_or(std::chrono::microseconds(0));
    transports::peer_liveness& live = peers_[r.peer_].in.liveness();
    transports::liveness_watch watch(now, until, live);
    bool woken = false;  // after a sleep, whatever woke it is read, from whichever peer
    for (unsigned polls = 1;; ++polls) {
      const std::uint64_t seen = pipes_->activity();
      progress(!woken);
      woken = false;
      if (r.state_ == request::state::done) return finish(r);
      // The clock only every 16th poll while pausing: reading it took a third of a
      // polling wait's time (perf, 2 ranks, 4 KiB), and a poll is well under a microsecond.
      if (polls % 16 != 0 && now < pause_until) {
        qcoll::detail::cpu_relax();
        continue;
      }
      now = clock::now();
      if (now >= watch.silent_until(now, live, r.transferred_)) {
        live.last_stall = watch.stall(now, live);
        withdraw(r, make_error_code(errc::timeout));
        return r.result_;
      }
      if (watch.note_due(now)) say_waiting(r.peer_);
      if (now < spin_until) {
        if (now < pause_until) qcoll::detail::cpu_relax();
        else std::this_thread::yield();  // lets a peer on this core run
        continue;
      }
      sleep(seen, std::min(watch.silent_until(now, live, r.transferred_), watch.next_note()));
      woken = true;
    }
  }

  /// Fails every pending and future request with `code`, tells every peer why (they
  /// fail the same way and pass it on), then closes all pipes. The first abort wins.
  void abort(std::error_code code, std::string_view reason) {
    if (failure_.code) return;
    failure_ = {code, std::string(reason.substr(0, max_reason_bytes))};
    for (rank_t p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      fail_requests(p, code);
      peers_[p].out.queue_abort_record(failure_);
    }
    // Best effort and bounded: a peer that is not reading learns of it from the close.
    const deadline give_up = clock::now() + options_.abort_flush;
    for (;;) {
      const std::uint64_t seen = pipes_->activity();
      bool pending = false;
      for (rank_t p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        pump_out(p);
        pending = pending || peers_[p].out.has_output();
      }
      if (!pending || clock::now() >= give_up) break;
      sleep(seen, give_up);
    }
    for (rank_t p = 0; p < size_; ++p)
      if (p != rank_) pipes_->close(p);
  }

  /// The first abort's code and reason, this rank's or a peer's; empty while intact.
  transports::failure failure() const { return failure_; }

  /// What ended the last wait on `peer` that timed out (see Liveness above).
  transports::stall stall(rank_t peer) const {
    return peer < size_ ? peers_[peer].in.liveness().last_stall : transports::stall{};
  }

  /// Bytes this rank has written into its pipes or sockets, record headers included:
  /// what it sent, measured where it leaves (a single-copy step's block, which the peer
  /// reads from this rank's memory, is not among them).
  std::uint64_t bytes_written() const noexcept { return bytes_written_.load(std::memory_order_relaxed); }

  /// Why the stream from or to `peer` broke; empty while it is intact.
  std::string_view lost_reason(rank_t peer) const noexcept {
    const peer_state& of = peers_[peer];
    return of.in.broken() ? std::string_view(of.in.why()) : std::string_view(of.out.why());
  }

 private:
  friend class request;

  struct peer_state {
    outgoing out;
    incoming in;
  };
  std::uint32_t progress_calls_ = 0;

  void prepare(request& r, rank_t peer, tag_t tag, bool is_send) const {
    if (peer >= size_ || peer == rank_)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: rank {} of {}: peer {} is out of range or this rank",
                                 name_, rank_, size_, peer);
    if (r.state_ == request::state::queued || r.state_ == request::state::active)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: rank {}: a request was posted again while still pending",
                                 name_, rank_);
    r.engine_ = const_cast<engine*>(this);
    r.begin_post(peer, tag, is_send);
  }

  /// A completed request's result; a failed one first reads what every peer sent.
  std::error_code finish(const request& r) {
    if (r.result_ && !failure_.code) progress();
    return r.result_;
  }

  void sleep(std::uint64_t seen, deadline until) {
    for (rank_t p = 0; p < size_; ++p) {
      want_read_[p] = p != rank_ && peers_[p].in.would_read();
      want_write_[p] = p != rank_ && peers_[p].out.has_output();
    }
    pipes_->wait_for_activity(seen, want_read_, want_write_, until);
  }

  void progress(bool skip_idle_peers = false) {
    // A polling wait reads the peers this rank neither expects nor writes to every 16th
    // time only: on tcp each read is a system call, and they would outnumber the useful
    // ones (2 of 3 in a 4-rank recursive doubling). What they send (an abort, a message
    // for a later receive) waits that long; a wait woken from sleep reads every peer, and
    // a request that fails reads every peer first (finish), so that a peer's abort, which
    // arrives before its connections break, is what the failure reports.
    const bool every_peer = !skip_idle_peers || ++progress_calls_ % 16 == 0;
    bool moved = true;
    while (moved) {
      moved = false;
      for (rank_t p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        moved = pump_out(p) || moved;
        if (every_peer || peers_[p].in.expecting() || peers_[p].out.has_output()) moved = pump_in(p) || moved;
      }
    }
  }

  /// Writes what fits toward `p`; true when any byte moved.
  bool pump_out(rank_t p) { return peers_[p].out.pump(static_cast<bool>(failure_.code)); }

  /// Reads what has arrived from `p`; true when any byte moved.
  bool pump_in(rank_t p) { return peers_[p].in.pump(); }

  /// A waiting record to every peer whose stream is between messages (one that is
  /// not hears this rank's bytes anyway, or is not reading from it).
  void say_waiting(rank_t waits_for) {
    if (failure_.code) return;
    for (rank_t p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (peers_[p].out.stage_waiting(waits_for)) pump_out(p);
    }
  }

  void fail_requests(rank_t p, std::error_code code) {
    peers_[p].in.fail_requests(code);
    peers_[p].out.fail_requests(code);
  }

  /// Takes a pending request back with `code`. One half-transferred breaks its stream.
  void withdraw(request& r, std::error_code code) noexcept {
    if (r.state_ == request::state::done || r.state_ == request::state::idle) return;
    peer_state& peer = peers_[r.peer_];
    if (r.is_send_) peer.out.withdraw(r, code);
    else peer.in.withdraw(r, code);
    r.complete(code);
  }

  const rank_t rank_;
  const rank_t size_;
  std::unique_ptr<channels> pipes_;
  std::string name_;
  engine_options options_;
  std::vector<peer_state> peers_;
  transports::failure failure_;
  std::atomic<std::uint64_t> bytes_written_{0};  // written by the engine's thread, read by anyone
  std::vector<char> want_read_ = std::vector<char>(size_);
  std::vector<char> want_write_ = std::vector<char>(size_);
  std::array<std::byte, 64 << 10> discard_{};  // where dropped payload is read to
};

/// The transport interface over an engine, shared by the process transports; each
/// adds how it joins a job. The engine stays put when the endpoint moves, because
/// posted requests point at it.
class endpoint {
 public:
  using request = stream::request;

  rank_t rank() const noexcept { return engine_->rank(); }
  rank_t size() const noexcept { return engine_->size(); }
  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    engine_->post_send(r, peer, tag, header, data);
  }
  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    engine_->post_recv(r, peer, tag, buffer);
  }
  bool test(request& r) { return engine_->test(r); }
  std::error_code wait(request& r, deadline until) { return engine_->wait(r, until); }
  void abort(std::error_code code, std::string_view reason) { engine_->abort(code, reason); }
  transports::failure failure() const { return engine_->failure(); }
  transports::stall stall(rank_t peer) const { return engine_->stall(peer); }
  /// Why the stream from or to `peer` broke, in the pipe's words; empty while intact.
  std::string lost_reason(rank_t peer) const { return std::string(engine_->lost_reason(peer)); }
  /// Bytes this rank has sent through the transport (engine::bytes_written).
  std::uint64_t bytes_written() const noexcept { return engine_->bytes_written(); }
  /// The timeout of the job it was joined from (QCOLL_TIMEOUT_MS): a communicator made
  /// over it without options takes it as its step deadline.
  std::chrono::milliseconds job_timeout() const noexcept { return job_timeout_; }

 protected:
  endpoint(std::unique_ptr<engine> core, std::chrono::milliseconds job_timeout)
      : engine_(std::move(core)), job_timeout_(job_timeout) {}

 private:
  std::unique_ptr<engine> engine_;
  std::chrono::milliseconds job_timeout_;
};

inline request::~request() {
  // A finished request no longer involves its engine, which may be gone by now.
  if (engine_ && state_ != state::done && state_ != state::idle) engine_->withdraw(*this, make_error_code(errc::aborted));
}

}  // namespace qcoll::transports::stream
