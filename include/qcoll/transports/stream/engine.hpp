#pragma once
/// @file
/// The part the process transports share: requests, matching, the record stream of
/// records.hpp, progress, deadlines and abort. A transport supplies only `channels`:
/// non-blocking byte pipes to each peer and a way to sleep until one may have moved.
///
/// Progress is made by the thread that posts, tests or waits; there is no progress
/// thread. A wait on any request moves every pending request of the transport, so a
/// rank waiting for a receive keeps its own sends flowing and ring steps cannot
/// deadlock on full pipes.
///
/// Matching: a receive matches the oldest unmatched message from its peer with its
/// tag. Payload bytes go straight from the pipe into the posted buffer (one copy out
/// of the pipe, no staging). When the next message from a peer has no matching receive
/// yet, that peer's stream waits for one (backpressure, bounded memory): messages from
/// one peer are therefore delivered in the order they were sent across all tags, and a
/// program must post receives from a peer in the order that peer sends — which every
/// qcoll algorithm does.
///
/// Liveness (core/liveness.hpp): a wait that lasts sends every peer between
/// messages a `waiting` record, and a wait's deadline counts only its peer's silence
/// (any byte read from it restarts the count), up to twice the span without progress
/// of the request itself.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/cpu_relax.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/core/liveness.hpp>
#include <qcoll/transports/stream/records.hpp>
#include <qcoll/tuning/table.hpp>

#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
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
};

/// The default poll time is the tuning table's (qcoll::automatic_spin, tuning/table.hpp):
/// long when every local rank can have a core of its own, so a step's reply is caught
/// without a wakeup, as MPI does by polling; short when ranks outnumber cores, where
/// polling would take the core a peer needs. QCOLL_SPIN_US overrides it.
using qcoll::automatic_spin;
using qcoll::automatic_pause;

class engine;

/// A posted send or receive; must not outlive its transport. Destroying a posted
/// request cancels it.
class request : public request_base {
 public:
  request() = default;
  ~request();

 private:
  friend class engine;
  enum class state : unsigned char { idle, queued, active, done };

  engine* engine_ = nullptr;
  state state_ = state::idle;
};

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
};

/// `options` with the poll time filled in for a job of `local_ranks` ranks on this host.
inline engine_options resolve(engine_options options, rank_t local_ranks) {
  if (!options.spin) options.spin = automatic_spin(local_ranks);
  if (!options.pause) options.pause = automatic_pause(local_ranks);
  return options;
}

class engine {
 public:
  /// `name` prefixes error messages ("shm transport", "tcp transport").
  engine(rank_t rank, rank_t size, std::unique_ptr<channels> pipes, std::string name, engine_options options = {})
      : rank_(rank), size_(size), pipes_(std::move(pipes)), name_(std::move(name)), options_(options), peers_(size) {}

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
    if (failure_.code) return complete(r, failure_.code);
    if (out.broken) return complete(r, out.broken);
    r.state_ = request::state::queued;
    out.sends.push_back(&r);
    pump_out(peer);
  }

  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    prepare(r, peer, tag, false);
    r.recv_data_ = buffer.data();
    r.size_ = buffer.size();
    incoming& in = peers_[peer].in;
    if (failure_.code) return complete(r, failure_.code);
    if (deliver_parked(in, r)) return;
    if (in.broken) return complete(r, in.broken);
    r.state_ = request::state::queued;
    in.recvs.push_back(&r);
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
    transports::peer_liveness& live = peers_[r.peer_].in.live;
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
      queue_abort_record(p);
    }
    // Best effort and bounded: a peer that is not reading learns of it from the close.
    const deadline give_up = clock::now() + options_.abort_flush;
    for (;;) {
      const std::uint64_t seen = pipes_->activity();
      bool pending = false;
      for (rank_t p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        pump_out(p);
        pending = pending || has_output(peers_[p].out);
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
    return peer < size_ ? peers_[peer].in.live.last_stall : transports::stall{};
  }

  /// Bytes this rank has written into its pipes or sockets, record headers included:
  /// what it sent, measured where it leaves (a single-copy step's block, which the peer
  /// reads from this rank's memory, is not among them).
  std::uint64_t bytes_written() const noexcept { return bytes_written_.load(std::memory_order_relaxed); }

  /// Why the stream from or to `peer` broke; empty while it is intact.
  std::string_view lost_reason(rank_t peer) const noexcept {
    return peers_[peer].in.broken ? std::string_view(peers_[peer].in.why) : std::string_view(peers_[peer].out.why);
  }

 private:
  friend class request;

  struct outgoing {
    std::deque<request*> sends;  // FIFO; the front one is being written
    std::vector<std::byte> staged;  // record headers, and the whole of a small message
    std::size_t staged_size = 0;
    std::size_t staged_done = 0;
    bool message_open = false;     // the front send's message record is staged or written
    std::uint64_t chunk_left = 0;  // payload bytes of the current data record still to write
    std::string tail;              // engine-owned bytes to write last: rest of a chunk, then the abort record
    std::size_t tail_done = 0;
    std::error_code broken;
    std::string why;
  };

  enum class phase : unsigned char { record, message_header, payload, reason };

  struct incoming {
    std::deque<request*> recvs;  // posted, not yet matched; FIFO
    phase at = phase::record;
    std::array<std::byte, message_header_bytes> staged{};
    std::size_t staged_need = record_header_bytes;
    std::size_t staged_have = 0;
    record_header record;
    bool stalled = false;  // a whole message record waits for a matching receive
    message_header stalled_header;
    std::uint64_t message_left = 0;  // payload bytes of the open message still to come
    std::uint64_t chunk_left = 0;    // bytes of the current data record still to come
    request* target = nullptr;       // the receive being filled; null while discarding or parking
    /// Messages read past a stalled one after their sender left (park): whole ones wait
    /// for a receive with their tag; the last may still be filling (`parking`).
    struct parked_message {
      tag_t tag;
      message_header header;
      std::uint64_t length;
      std::vector<std::byte> payload;
    };
    std::deque<parked_message> parked;
    bool parking = false;
    std::string reason;
    std::error_code broken;
    std::string why;
    transports::peer_liveness live;  // heard: a read from it moved bytes; notes: its waiting records
  };

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

  static void complete(request& r, std::error_code result) noexcept {
    r.state_ = request::state::done;
    r.result_ = result;
  }

  /// A completed request's result; a failed one first reads what every peer sent.
  std::error_code finish(const request& r) {
    if (r.result_ && !failure_.code) progress();
    return r.result_;
  }

  static bool has_output(const outgoing& out) noexcept {
    if (out.broken) return false;
    return out.staged_done < out.staged_size || out.chunk_left > 0 || out.tail_done < out.tail.size() ||
           !out.sends.empty();
  }

  void sleep(std::uint64_t seen, deadline until) {
    for (rank_t p = 0; p < size_; ++p) {
      const incoming& in = peers_[p].in;
      want_read_[p] = p != rank_ && !in.broken && !in.stalled;
      want_write_[p] = p != rank_ && has_output(peers_[p].out);
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
        if (every_peer || expecting(peers_[p].in) || has_output(peers_[p].out)) moved = pump_in(p) || moved;
      }
    }
  }

  /// Whether a receive from this peer is posted, or a message from it is under way.
  static bool expecting(const incoming& in) noexcept {
    return !in.recvs.empty() || in.target != nullptr || in.message_left != 0 || in.at != phase::record ||
           in.staged_have != 0 || in.stalled;
  }

  // ---- outgoing -------------------------------------------------------------------

  std::size_t write(rank_t p, std::span<const std::byte> bytes) { return write(p, bytes, {}); }

  std::size_t write(rank_t p, std::span<const std::byte> first, std::span<const std::byte> second) {
    std::string lost;
    const std::size_t n = pipes_->write_some_gathered(p, first, second, lost);
    if (!lost.empty()) break_out(p, make_error_code(errc::peer_lost), "peer " + std::to_string(p) + ": " + lost);
    bytes_written_.fetch_add(n, std::memory_order_relaxed);
    return n;
  }

  /// Messages up to this size leave in one write (headers and payload copied together),
  /// so a small message costs one system call on TCP instead of three.
  static constexpr std::size_t small_message_bytes = 8192;

  void stage_record(outgoing& out, const record_header& record) {
    const std::size_t at = out.staged_size;
    out.staged_size += record_header_bytes;
    if (out.staged.size() < out.staged_size) out.staged.resize(out.staged_size);
    write_record_header(std::span(out.staged).subspan(at).first<record_header_bytes>(), record);
  }

  /// The message record, its header and the first data record's header; a small
  /// message's payload too (it is then the engine's, and the request is fully copied).
  void stage_message(outgoing& out, request& head) {
    out.staged_size = out.staged_done = 0;
    out.staged.reserve(2 * record_header_bytes + message_header_bytes + small_message_bytes);
    stage_record(out, {record_type::message, head.tag_, head.size_});
    out.staged.resize(std::max(out.staged.size(), out.staged_size + message_header_bytes));
    write_message_header(std::span(out.staged).subspan(out.staged_size).first<message_header_bytes>(), head.header_);
    out.staged_size += message_header_bytes;
    if (head.size_ == 0) return;
    const std::size_t first_chunk = std::min(max_chunk_bytes, head.size_);
    stage_record(out, {record_type::data, 0, first_chunk});
    if (head.size_ <= small_message_bytes) {
      out.staged.resize(std::max(out.staged.size(), out.staged_size + head.size_));
      std::memcpy(out.staged.data() + out.staged_size, head.send_data_, head.size_);
      out.staged_size += head.size_;
      head.transferred_ = head.size_;
    } else {
      out.chunk_left = first_chunk;
    }
  }

  /// Writes what fits toward `p`; true when any byte moved.
  bool pump_out(rank_t p) {
    outgoing& out = peers_[p].out;
    bool moved = false;
    while (!out.broken) {
      if (out.staged_done < out.staged_size) {
        // Record headers, and the chunk they open in the same write.
        const std::span<const std::byte> staged =
            std::span<const std::byte>(out.staged).subspan(out.staged_done, out.staged_size - out.staged_done);
        request* const head = out.chunk_left > 0 ? out.sends.front() : nullptr;
        const std::span<const std::byte> chunk =
            head != nullptr ? std::span(head->send_data_ + head->transferred_, out.chunk_left)
                            : std::span<const std::byte>();
        const std::size_t n = write(p, staged, chunk);
        if (n == 0) break;
        const std::size_t of_staged = std::min(n, staged.size());
        out.staged_done += of_staged;
        if (head != nullptr) {
          head->transferred_ += n - of_staged;
          out.chunk_left -= n - of_staged;
        }
        moved = true;
        continue;
      }
      if (out.chunk_left > 0) {
        request& head = *out.sends.front();
        const std::size_t n = write(p, {head.send_data_ + head.transferred_, out.chunk_left});
        if (n == 0) break;
        head.transferred_ += n;
        out.chunk_left -= n;
        moved = true;
        continue;
      }
      if (out.tail_done < out.tail.size()) {  // only after an abort
        const std::size_t n = write(p, std::as_bytes(std::span(out.tail)).subspan(out.tail_done));
        if (n == 0) break;
        out.tail_done += n;
        moved = true;
        continue;
      }
      if (failure_.code || out.sends.empty()) break;
      request& head = *out.sends.front();
      if (!out.message_open) {
        stage_message(out, head);
        out.message_open = true;
        head.state_ = request::state::active;
        continue;
      }
      if (head.transferred_ < head.size_) {
        out.chunk_left = std::min<std::uint64_t>(max_chunk_bytes, head.size_ - head.transferred_);
        out.staged_size = out.staged_done = 0;
        stage_record(out, {record_type::data, 0, out.chunk_left});
        continue;
      }
      out.sends.pop_front();
      out.message_open = false;
      complete(head, {});
    }
    if (moved) pipes_->notify(p);
    return moved;
  }

  /// The abort record goes out at the next record boundary: the rest of a chunk in
  /// flight is copied first, because its request fails now and its buffer is the caller's.
  void queue_abort_record(rank_t p) {
    outgoing& out = peers_[p].out;
    if (out.broken) return;
    out.tail.clear();
    if (out.chunk_left > 0) {
      const request& head = *out.sends.front();
      out.tail.append(reinterpret_cast<const char*>(head.send_data_ + head.transferred_), out.chunk_left);
      out.chunk_left = 0;
    }
    std::array<std::byte, record_header_bytes> header{};
    write_record_header(header, {record_type::abort, wire_code(failure_.code), failure_.reason.size()});
    out.tail.append(reinterpret_cast<const char*>(header.data()), header.size());
    out.tail += failure_.reason;
    out.tail_done = 0;
    out.sends.clear();  // already failed by fail_requests
    out.message_open = false;
  }

  /// A waiting record to every peer whose stream is between messages (one that is
  /// not hears this rank's bytes anyway, or is not reading from it).
  void say_waiting(rank_t waits_for) {
    if (failure_.code) return;
    for (rank_t p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      outgoing& out = peers_[p].out;
      if (out.broken || has_output(out)) continue;
      out.staged_size = out.staged_done = 0;
      stage_record(out, {record_type::waiting, static_cast<std::uint32_t>(waits_for), 0});
      pump_out(p);
    }
  }

  void break_out(rank_t p, std::error_code code, std::string why) {
    outgoing& out = peers_[p].out;
    if (out.broken) return;
    out.broken = code;
    out.why = std::move(why);
    for (request* r : out.sends) complete(*r, code);
    out.sends.clear();
    out.chunk_left = 0;
    out.staged_size = out.staged_done = 0;
    out.tail.clear();
    out.tail_done = 0;
  }

  // ---- incoming -------------------------------------------------------------------

  std::size_t read(rank_t p, std::span<std::byte> into) {
    std::string lost;
    const std::size_t n = pipes_->read_some(p, into, lost);
    if (!lost.empty()) break_in(p, make_error_code(errc::peer_lost), "peer " + std::to_string(p) + ": " + lost);
    return n;
  }

  /// Reads what has arrived from `p`; true when any byte moved.
  bool pump_in(rank_t p) {
    incoming& in = peers_[p].in;
    bool moved = false;
    while (!in.broken) {
      if (in.stalled) {
        if (match_stalled(p)) continue;
        // The stalled message stays deliverable after its sender left (it may have
        // finished and exited). Receives waiting for other tags then read past it: it
        // is parked for a later receive with its tag, and what the sender wrote after
        // it decides them — a message they match, its abort (a rank that found a
        // mismatch sends one behind the message this rank has not matched: every rank
        // then fails with that first cause), or the end of its stream (peer_lost).
        if (!in.recvs.empty() && pipes_->peer_gone(p)) {
          park(in);
          moved = true;
          continue;
        }
        break;
      }
      if (in.at == phase::payload) {
        const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(in.chunk_left, discard_.size()));
        std::vector<std::byte>* parked = in.parking ? &in.parked.back().payload : nullptr;
        const std::size_t parked_before = parked ? parked->size() : 0;
        if (parked) parked->resize(parked_before + want);  // what a gone peer wrote: bounded by its pipe
        const std::span<std::byte> into =
            in.target ? std::span(in.target->recv_data_ + in.target->transferred_, in.chunk_left)
            : parked  ? std::span(*parked).subspan(parked_before)
                      : std::span(discard_).first(want);
        const std::size_t n = read(p, into);
        if (parked) parked->resize(parked_before + n);
        if (n == 0) break;
        moved = true;
        in.chunk_left -= n;
        in.message_left -= n;
        if (in.target) in.target->transferred_ += n;
        if (in.chunk_left == 0) expect_record(in);
        if (in.message_left == 0) {
          in.parking = false;
          if (in.target) complete(*in.target, {});
          in.target = nullptr;
        }
        continue;
      }
      if (in.at == phase::reason) {
        const std::size_t have = in.reason.size();
        in.reason.resize(in.record.length);
        const std::size_t n = read(p, std::as_writable_bytes(std::span(in.reason)).subspan(have));
        in.reason.resize(have + n);
        if (n == 0) break;
        moved = true;
        if (in.reason.size() == in.record.length) {
          expect_record(in);
          abort(code_from_wire(in.record.tag), in.reason);  // a peer's abort is this rank's too
          return true;
        }
        continue;
      }
      const std::size_t n = read(p, std::span(in.staged).subspan(in.staged_have, in.staged_need - in.staged_have));
      if (n == 0) break;
      moved = true;
      in.staged_have += n;
      if (in.staged_have == in.staged_need) on_staged(p);
    }
    if (moved) {
      ++in.live.heard;
      pipes_->notify(p);
    }
    return moved;
  }

  static void expect_record(incoming& in) noexcept {
    in.at = phase::record;
    in.staged_need = record_header_bytes;
    in.staged_have = 0;
  }

  void on_staged(rank_t p) {
    incoming& in = peers_[p].in;
    std::string problem;
    if (in.at == phase::message_header) {
      const auto header = read_message_header(std::span(in.staged).first<message_header_bytes>(), problem);
      if (!header) return malformed(p, problem);
      in.stalled_header = *header;
      in.stalled = true;
      expect_record(in);
      return;
    }
    const auto record = read_record_header(std::span(in.staged).first<record_header_bytes>(), problem);
    if (!record) return malformed(p, problem);
    in.record = *record;
    switch (record->type) {
      case record_type::message:
        if (in.message_left != 0) return malformed(p, "a message began inside an unfinished one");
        in.at = phase::message_header;
        in.staged_need = message_header_bytes;
        in.staged_have = 0;
        return;
      case record_type::data:
        if (record->length > in.message_left)
          return malformed(p, qcoll::detail::format("a data record of {} bytes where {} remain of the message", record->length,
                                          in.message_left));
        in.at = phase::payload;
        in.chunk_left = record->length;
        return;
      case record_type::waiting:
        if (in.message_left != 0) return malformed(p, "a waiting record inside a message");
        if (record->tag >= size_ || record->tag == p)
          return malformed(p, qcoll::detail::format("a waiting record for rank {} of {}", record->tag, size_));
        in.live.waits_for = record->tag;
        ++in.live.waiting_notes;
        expect_record(in);
        return;
      case record_type::abort:
        in.at = phase::reason;
        in.reason.clear();
        if (record->length == 0) {
          expect_record(in);
          abort(code_from_wire(record->tag), qcoll::detail::format("peer {} aborted", p));
        }
        return;
    }
  }

  /// Takes the stalled message off the stream: its payload is read into the parked
  /// queue as it arrives (pump_in), and the records behind it are read on.
  static void park(incoming& in) {
    in.parked.push_back({in.record.tag, in.stalled_header, in.record.length, {}});
    in.stalled = false;
    in.message_left = in.record.length;
    in.target = nullptr;
    in.parking = in.record.length != 0;
  }

  /// Completes `r` with the oldest whole parked message of its tag, if there is one
  /// (a wrong size as match_stalled: the sender's header, protocol_error).
  static bool deliver_parked(incoming& in, request& r) {
    const std::size_t whole = in.parked.size() - (in.parking ? 1 : 0);
    const auto found = std::find_if(in.parked.begin(), in.parked.begin() + static_cast<std::ptrdiff_t>(whole),
                                    [&](const incoming::parked_message& m) { return m.tag == r.tag_; });
    if (found == in.parked.begin() + static_cast<std::ptrdiff_t>(whole)) return false;
    r.take_header(found->header);
    r.transferred_ = static_cast<std::size_t>(std::min<std::uint64_t>(found->length, SIZE_MAX));
    if (found->length != r.size_) {
      complete(r, make_error_code(errc::protocol_error));
    } else {
      if (r.size_ != 0) std::memcpy(r.recv_data_, found->payload.data(), r.size_);
      complete(r, {});
    }
    in.parked.erase(found);
    return true;
  }

  /// Hands the stalled message to the oldest receive with its tag, if one is posted.
  bool match_stalled(rank_t p) {
    incoming& in = peers_[p].in;
    const auto found = std::find_if(in.recvs.begin(), in.recvs.end(),
                                    [&](const request* r) { return r->tag_ == in.record.tag; });
    if (found == in.recvs.end()) return false;
    request& r = **found;
    in.recvs.erase(found);
    in.stalled = false;
    in.message_left = in.record.length;
    r.take_header(in.stalled_header);
    if (in.record.length != r.size_) {
      // The receiver learns the sender's header and size; the payload is read and dropped.
      r.transferred_ = static_cast<std::size_t>(std::min<std::uint64_t>(in.record.length, SIZE_MAX));
      complete(r, make_error_code(errc::protocol_error));
      in.target = nullptr;
      return true;
    }
    in.target = &r;
    r.state_ = request::state::active;
    if (in.message_left == 0) {
      complete(r, {});
      in.target = nullptr;
    }
    return true;
  }

  void malformed(rank_t p, std::string_view problem) {
    break_in(p, make_error_code(errc::protocol_error), qcoll::detail::format("peer {} sent a malformed stream: {}", p, problem));
    pipes_->close(p);
  }

  void break_in(rank_t p, std::error_code code, std::string why) {
    incoming& in = peers_[p].in;
    if (in.broken) return;
    in.broken = code;
    in.why = std::move(why);
    if (in.target) complete(*in.target, code);
    in.target = nullptr;
    for (request* r : in.recvs) complete(*r, code);
    in.recvs.clear();
    in.stalled = false;
  }

  void fail_requests(rank_t p, std::error_code code) {
    incoming& in = peers_[p].in;
    if (in.target) complete(*in.target, code);
    in.target = nullptr;
    for (request* r : in.recvs) complete(*r, code);
    in.recvs.clear();
    for (request* r : peers_[p].out.sends) complete(*r, code);
  }

  /// Takes a pending request back with `code`. One half-transferred breaks its stream.
  void withdraw(request& r, std::error_code code) noexcept {
    if (r.state_ == request::state::done || r.state_ == request::state::idle) return;
    peer_state& peer = peers_[r.peer_];
    if (r.is_send_) {
      auto& sends = peer.out.sends;
      const bool started = !sends.empty() && sends.front() == &r && peer.out.message_open;
      if (started) {
        break_out(r.peer_, code, "a send was withdrawn half-written");
        pipes_->close(r.peer_);
      } else {
        sends.erase(std::remove(sends.begin(), sends.end(), &r), sends.end());
      }
    } else if (peer.in.target == &r) {
      break_in(r.peer_, code, "a receive was withdrawn half-filled");
      pipes_->close(r.peer_);
    } else {
      auto& recvs = peer.in.recvs;
      recvs.erase(std::remove(recvs.begin(), recvs.end(), &r), recvs.end());
    }
    complete(r, code);
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
