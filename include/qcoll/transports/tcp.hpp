#pragma once
/// @file
/// TCP transport (Boost.Asio): two connections per pair of ranks, one per direction:
/// the rank that connected writes, the one that accepted reads. Over loopback, 16 MiB
/// each way between two processes took 4.7–5.1 ms on two one-way connections and
/// 5.5–6.4 ms on one connection carrying both (docs/transports-performance.md, "One
/// connection per direction"): a connection's two ends then contend for each other's
/// socket lock, the receive path running in the peer's send. Every connection starts
/// with the authenticated handshake of
/// rendezvous/handshake.hpp (magic, version, job, rank, world size, HMAC of the job
/// secret when one is set); a connection that fails it is refused, logged, and the
/// job carries on waiting for the real peer. Then the sockets turn non-blocking and
/// carry the record stream of stream/records.hpp: messages are streamed from the
/// caller's buffer into the socket and from the socket into the posted buffer, in
/// chunks, never staged whole; TCP_NODELAY is set. With QCOLL_TLS=1 (job.tls) every
/// connection runs TLS 1.3 after its handshake, keyed by the job's secret
/// (rendezvous/tls.hpp): the stream's bytes are encrypted and every TLS record is
/// authenticated, so bytes altered in transit break the connection, never a result.
///
/// Setup: each rank listens on `job.bind_address` (loopback unless told otherwise) on
/// an ephemeral port and publishes it in the job's store. It connects to every lower
/// rank, accepts until every higher rank has connected, then connects to every higher
/// rank and accepts the rest; a handshake waits for the peer to accept, and this order
/// never leaves two ranks each waiting for the other.
///
/// Progress happens in the waiting thread (see stream/engine.hpp): it polls the
/// sockets it can read or write and sleeps in poll(2) otherwise. A peer whose process
/// dies resets or closes its connections, which fails the requests waiting on it with
/// errc::peer_lost at once.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake_client.hpp>
#include <qcoll/rendezvous/handshake_server.hpp>
#include <qcoll/rendezvous/socket_io.hpp>
#include <qcoll/rendezvous/store.hpp>
#include <qcoll/rendezvous/tls.hpp>
#include <qcoll/transports/process.hpp>
#include <qcoll/transports/stream/engine.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <poll.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qcoll::transports::tcp {

struct options {
  /// SO_SNDBUF / SO_RCVBUF for each connection; 0 keeps the kernel's autotuning.
  std::size_t socket_buffer_bytes = 0;
  stream::engine_options engine{};
};

namespace detail {

namespace asio = boost::asio;
using asio::ip::tcp;

inline std::string endpoint_text(const tcp::socket& socket) {
  boost::system::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  return ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
}

#ifndef QCOLL_NO_OPENSSL
using tls_connections = std::vector<std::unique_ptr<rendezvous::tls_connection>>;
#else
struct tls_unavailable {  // never made: QCOLL_TLS=1 needs a secret, which such a build refuses
  std::size_t write_some(std::span<const std::byte>, std::string&) { return 0; }
  std::size_t read_some(std::span<std::byte>, std::string&) { return 0; }
  bool flush(std::string&) { return true; }
  bool has_unsent() const noexcept { return false; }
  bool has_pending() const noexcept { return false; }
};
using tls_connections = std::vector<std::unique_ptr<tls_unavailable>>;
#endif

/// The stream engine's pipes over two connected sockets per peer, one per direction.
class tcp_channels final : public stream::channels {
 public:
  /// `outgoing[p]` is written to reach p, `incoming[p]` read to hear from it; over
  /// `outgoing_tls[p]` and `incoming_tls[p]` where those are set (QCOLL_TLS).
  tcp_channels(std::unique_ptr<asio::io_context> io, std::vector<std::optional<tcp::socket>> outgoing,
               std::vector<std::optional<tcp::socket>> incoming, tls_connections outgoing_tls,
               tls_connections incoming_tls, rank_t rank)
      : io_(std::move(io)), outgoing_(std::move(outgoing)), incoming_(std::move(incoming)),
        outgoing_tls_(std::move(outgoing_tls)), incoming_tls_(std::move(incoming_tls)), rank_(rank),
        gone_(outgoing_.size()), inboxes_(outgoing_.size()) {
    loopback_.assign(outgoing_.size(), true);
    for (rank_t p = 0; p < outgoing_.size(); ++p) {
      if (p == rank_) continue;
      loopback_[p] = over_loopback(*outgoing_[p]) && over_loopback(*incoming_[p]);
      addresses_.push_back(endpoint_text(*outgoing_[p]));
      outgoing_[p]->non_blocking(true);
      incoming_[p]->non_blocking(true);
    }
  }

  std::size_t write_some(rank_t peer, std::span<const std::byte> bytes, std::string& lost) override {
    return write_some_gathered(peer, bytes, {}, lost);
  }

  /// Over loopback (127.0.0.0/8, ::1) the bytes never leave this host's memory; any
  /// other address may be a network's, even one of this host's own (a conservative
  /// answer: checksums there cost CPU, not correctness). Both connections of the pair
  /// count, so both ends answer alike even where the two ranks bound different
  /// addresses (each sees the other's listener on one and its own on the other).
  /// Under TLS the answer is no for every peer: TLS authenticates each of its records
  /// (a 16-byte tag), which catches everything a CRC-32C would, so the CRC would cost CPU
  /// for nothing (QCOLL_PAYLOAD_CRC=1 still forces it).
  bool crosses_network(rank_t peer) const noexcept override { return !loopback_[peer] && !outgoing_tls_[peer]; }

  /// One sendmsg for both: with TCP_NODELAY, a record header written alone would leave
  /// as a packet of its own (and be acknowledged as one) ahead of every chunk.
  std::size_t write_some_gathered(rank_t peer, std::span<const std::byte> first, std::span<const std::byte> second,
                                  std::string& lost) override {
    if (!outgoing_[peer]) {
      lost = "its connection is closed";
      return 0;
    }
    if (outgoing_tls_[peer]) return write_tls(peer, first, second, lost);
    const std::array<asio::const_buffer, 2> gathered{asio::buffer(first.data(), first.size()),
                                                     asio::buffer(second.data(), second.size())};
    boost::system::error_code ec;
    const std::size_t n = outgoing_[peer]->write_some(gathered, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return 0;
    if (ec) lost = qcoll::detail::format("the connection to {} failed: {}", address(peer), ec.message());
    return n;
  }

  /// Small reads (record headers, small payloads) are served from a per-peer buffer
  /// filled by one recv, so a small message costs one system call, not four; large
  /// reads go straight into the caller's buffer once the small one is empty.
  std::size_t read_some(rank_t peer, std::span<std::byte> into, std::string& lost) override {
    if (!incoming_[peer]) {
      lost = "its connection is closed";
      return 0;
    }
    if (into.empty()) return 0;
    inbox& box = inboxes_[peer];
    if (box.begin == box.end && into.size() < small_read_bytes) {
      box.begin = box.end = 0;
      box.bytes.resize(inbox_bytes);
      box.end = receive(peer, box.bytes, lost);
    }
    if (box.begin < box.end) {
      const std::size_t n = std::min(into.size(), box.end - box.begin);
      std::memcpy(into.data(), box.bytes.data() + box.begin, n);
      box.begin += n;
      return n;
    }
    return lost.empty() ? receive(peer, into, lost) : 0;
  }

  /// The kernel wakes the peer; under TLS, ciphertext queued by the last writes goes out.
  void notify(rank_t peer) noexcept override { flush_tls(peer); }

  bool peer_gone(rank_t peer) override {
    if (!outgoing_[peer] || !incoming_[peer]) return true;
    if (gone_[peer]) return true;
    std::array<pollfd, 2> probes{pollfd{outgoing_[peer]->native_handle(), POLLRDHUP, 0},
                                 pollfd{incoming_[peer]->native_handle(), POLLRDHUP, 0}};
    gone_[peer] = ::poll(probes.data(), probes.size(), 0) > 0 &&
                  std::any_of(probes.begin(), probes.end(),
                              [](const pollfd& p) { return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0; });
    return gone_[peer] != 0;
  }

  // poll(2) is level-triggered, so there is no counter to compare.
  std::uint64_t activity() override { return 0; }

  void wait_for_activity(std::uint64_t, std::span<const char> want_read, std::span<const char> want_write,
                         deadline until) override {
    // Bytes OpenSSL already decrypted are invisible to poll(2): no sleeping on them; and
    // ciphertext that waits for room is watched like bytes the engine wants to write.
    for (rank_t p = 0; p < incoming_tls_.size(); ++p) {
      if (want_read[p] && incoming_tls_[p] && incoming_tls_[p]->has_pending()) return;
      flush_tls(p);
    }
    probes_.clear();
    for (rank_t p = 0; p < outgoing_.size(); ++p) {
      // A peer whose next message waits for a receive is watched only for hang-ups.
      if (incoming_[p])
        probes_.push_back({incoming_[p]->native_handle(), static_cast<short>((want_read[p] ? POLLIN : 0) | POLLRDHUP), 0});
      if (outgoing_[p])
        probes_.push_back({outgoing_[p]->native_handle(),
                           static_cast<short>((want_write[p] || unsent_tls(p) ? POLLOUT : 0) | POLLRDHUP), 0});
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - clock::now()).count();
    if (left <= 0) return;
    ::poll(probes_.data(), probes_.size(), static_cast<int>(std::min<long long>(left, 1000)));
  }

  void close(rank_t peer) noexcept override {
    outgoing_tls_[peer].reset();
    incoming_tls_[peer].reset();
    for (std::optional<tcp::socket>* socket : {&outgoing_[peer], &incoming_[peer]}) {
      if (!*socket) continue;
      boost::system::error_code ignored;
      (*socket)->shutdown(tcp::socket::shutdown_both, ignored);
      (*socket)->close(ignored);
      socket->reset();
    }
  }

 private:
  // The buffer holds a whole small message (8 KiB payload and its headers); kept small
  // because a record header's read also pulls in payload that then costs a second copy.
  static constexpr std::size_t small_read_bytes = 16 << 10;
  static constexpr std::size_t inbox_bytes = 16 << 10;
  static constexpr std::size_t tls_gather_bytes = 16 << 10;  // one TLS record's plaintext at most

  struct inbox {
    std::vector<std::byte> bytes;
    std::size_t begin = 0;
    std::size_t end = 0;
  };

  std::size_t receive(rank_t peer, std::span<std::byte> into, std::string& lost) {
    if (incoming_tls_[peer]) return incoming_tls_[peer]->read_some(into, lost);
    boost::system::error_code ec;
    const std::size_t n = incoming_[peer]->read_some(asio::buffer(into.data(), into.size()), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return 0;
    if (ec == asio::error::eof)
      lost = qcoll::detail::format("it closed the connection ({})", address(peer));
    else if (ec)
      lost = qcoll::detail::format("the connection to {} failed: {}", address(peer), ec.message());
    return n;
  }

  void flush_tls(rank_t peer) noexcept {
    if (!outgoing_tls_[peer]) return;
    std::string lost;  // kept by the connection: the next write_some reports it
    outgoing_tls_[peer]->flush(lost);
  }

  bool unsent_tls(rank_t peer) const noexcept { return outgoing_tls_[peer] && outgoing_tls_[peer]->has_unsent(); }

  /// TLS cannot gather: a small record header goes out with the start of its payload in
  /// one TLS record (copied), so it does not leave as a packet of its own; large writes
  /// go straight from the caller's buffer.
  std::size_t write_tls(rank_t peer, std::span<const std::byte> first, std::span<const std::byte> second,
                        std::string& lost) {
    if (first.empty() || second.empty() || first.size() >= tls_gather_bytes)
      return outgoing_tls_[peer]->write_some(first.empty() ? second : first, lost);
    const std::size_t taken = std::min(second.size(), tls_gather_bytes - first.size());
    gathered_.resize(first.size() + taken);
    std::memcpy(gathered_.data(), first.data(), first.size());
    std::memcpy(gathered_.data() + first.size(), second.data(), taken);
    return outgoing_tls_[peer]->write_some(gathered_, lost);
  }

  const std::string& address(rank_t peer) const { return addresses_[peer < rank_ ? peer : peer - 1]; }

  static bool over_loopback(const tcp::socket& socket) {
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    return !ec && remote.address().is_loopback();
  }

  std::unique_ptr<asio::io_context> io_;  // outlives the sockets it owns
  std::vector<std::optional<tcp::socket>> outgoing_;
  std::vector<std::optional<tcp::socket>> incoming_;
  tls_connections outgoing_tls_;  // destroyed before the sockets they run over
  tls_connections incoming_tls_;
  rank_t rank_;
  std::vector<std::string> addresses_;
  std::vector<bool> loopback_;  // by peer: the connections run over loopback
  std::vector<char> gone_;
  std::vector<inbox> inboxes_;
  std::vector<pollfd> probes_;
  std::vector<std::byte> gathered_;
};

inline void tune(tcp::socket& socket, const options& opts) {
  socket.set_option(tcp::no_delay(true));
  if (opts.socket_buffer_bytes != 0) {
    const auto bytes = static_cast<int>(std::min<std::size_t>(opts.socket_buffer_bytes, INT32_MAX));
    socket.set_option(asio::socket_base::send_buffer_size(bytes));
    socket.set_option(asio::socket_base::receive_buffer_size(bytes));
  }
}

/// "host:port" as published in the store.
inline tcp::endpoint parse_endpoint(const std::string& text, rank_t peer) {
  const auto endpoint = rendezvous::detail::parse_endpoint(text);
  if (!endpoint)
    qcoll::detail::throw_error(errc::protocol_error, "tcp transport: rank {} published the address '{}'", peer, text);
  return *endpoint;
}

inline tcp::socket connect_to(asio::io_context& io, const tcp::endpoint& where, rank_t peer, deadline until) {
  // The peer's listener exists before it publishes its address, so a refusal means it is gone.
  boost::system::error_code result;
  tcp::socket socket = rendezvous::detail::connect_before(io, where, until, result);
  if (result)
    qcoll::detail::throw_error(result == asio::error::timed_out || result == asio::error::operation_aborted
                                   ? errc::timeout
                                   : errc::peer_lost,
                               "tcp transport: connecting to rank {} at {}:{} failed: {}", peer,
                               where.address().to_string(), where.port(), result.message());
  return socket;
}

}  // namespace detail

/// One rank's endpoint: the type both the shm and the tcp join give (process.hpp). A tcp
/// job never reads its peers' memory: single_copy() is false.
using transport = process_transport;

/// Connects every pair of ranks twice, once each way. Collective: every rank of the job calls it.
/// Connections that fail the handshake (garbage, wrong secret, version or job, a
/// rank already connected) are logged and refused while setup waits for the real
/// peer until job.timeout.
/// @par Errors
/// qcoll::error: invalid_argument (cannot listen on the bind address), timeout (a
/// peer never connected or answered), peer_lost (a peer refused the connection),
/// protocol_error (a peer refused this rank's handshake, with its reason), and
/// whatever the store throws.
template <rendezvous::store Store>
process_transport join(const rendezvous::job& job, Store& store, const options& opts = {}) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  const deadline until = clock::now() + job.timeout;
  auto io = std::make_unique<asio::io_context>();
  std::vector<std::optional<tcp::socket>> outgoing(job.size), incoming(job.size);
  detail::tls_connections outgoing_tls(job.size), incoming_tls(job.size);

  tcp::acceptor acceptor(*io);
  rendezvous::detail::listen_on_free_port(acceptor, job.bind_address, qcoll::detail::format("tcp transport: rank {}", job.rank));
  store.set(qcoll::detail::format("qcoll/tcp/address/{}", job.rank),
            qcoll::detail::format("{}:{}", job.bind_address, acceptor.local_endpoint().port()));

  const auto connect = [&](rank_t peer) {
    const auto where =
        detail::parse_endpoint(store.get(qcoll::detail::format("qcoll/tcp/address/{}", peer), until), peer);
    tcp::socket socket = detail::connect_to(*io, where, peer, until);
    rendezvous::introduce(socket, job, rendezvous::channel::data, until);
    detail::tune(socket, opts);
#ifndef QCOLL_NO_OPENSSL
    if (job.tls)
      outgoing_tls[peer] = std::make_unique<rendezvous::tls_connection>(
          socket.native_handle(), job, rendezvous::tls_connection::role::client,
          qcoll::detail::format("rank {} at {}", peer, detail::endpoint_text(socket)), until);
#endif
    outgoing[peer].emplace(std::move(socket));
  };
  // Accepts any peer's connection, once each, until ranks [first, size) all connected.
  const auto accept_until_connected = [&](rank_t first) {
    const auto missing = [&] {
      rank_t count = 0;
      for (rank_t p = first; p < job.size; ++p) count += p != job.rank && !incoming[p];
      return count;
    };
    while (missing() > 0) {
      tcp::socket socket(*io);
      bool accepted = false;
      boost::system::error_code accept_error = asio::error::timed_out;
      acceptor.async_accept(socket, [&](boost::system::error_code e) {
        accept_error = e;
        accepted = true;
      });
      rendezvous::detail::run_until(*io, [&] { return accepted; }, until, [&] { acceptor.cancel(); });
      if (accept_error)
        qcoll::detail::throw_error(errc::timeout, "tcp transport: rank {} waited {}ms for {} rank(s) to connect; {}",
                                   job.rank, job.timeout.count(), missing(), accept_error.message());
      const std::string from = detail::endpoint_text(socket);
      try {
        // A connection that says nothing must not hold up the real peers for long.
        const deadline admit_until = std::min(until, clock::now() + std::chrono::seconds(5));
        const rendezvous::hello peer = rendezvous::admit(socket, job, rendezvous::channel::data, admit_until);
        if (peer.rank == job.rank || incoming[peer.rank])
          qcoll::detail::throw_error(errc::protocol_error, "rank {} is this rank or already connected", peer.rank);
        detail::tune(socket, opts);
#ifndef QCOLL_NO_OPENSSL
        if (job.tls)
          incoming_tls[peer.rank] = std::make_unique<rendezvous::tls_connection>(
              socket.native_handle(), job, rendezvous::tls_connection::role::server,
              qcoll::detail::format("rank {} at {}", peer.rank, from), admit_until);
#endif
        incoming[peer.rank].emplace(std::move(socket));
      } catch (const qcoll::error& refused) {
        qcoll::detail::log_warning("qcoll: rank {}: tcp transport refused a connection from {}: {}", job.rank, from,
                                   refused.what());
      }
    }
  };
  for (rank_t peer = 0; peer < job.rank; ++peer) connect(peer);
  accept_until_connected(job.rank + 1);  // every higher rank; lower ones may already come too
  for (rank_t peer = job.rank + 1; peer < job.size; ++peer) connect(peer);
  accept_until_connected(0);
  if (job.tls && qcoll::detail::debug_info_enabled() && job.size > 1)
    qcoll::detail::log_info("qcoll: rank {}: tcp transport: TLS 1.3 on all {} connections (QCOLL_TLS=1, keyed by "
                            "the job's secret)",
                            job.rank, 2 * (job.size - 1));
  auto pipes = std::make_unique<detail::tcp_channels>(std::move(io), std::move(outgoing), std::move(incoming),
                                                       std::move(outgoing_tls), std::move(incoming_tls), job.rank);
  return process_transport(std::make_unique<stream::engine>(job.rank, job.size, std::move(pipes), "tcp transport",
                                                            stream::resolve(opts.engine, job.local_size)),
                           job.timeout, rendezvous::transport_kind::tcp);
}

}  // namespace qcoll::transports::tcp
