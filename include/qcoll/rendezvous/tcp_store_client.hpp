#pragma once
/// @file
/// The TCP store's client side: store_client, each rank's connection to the store, which
/// models the rendezvous::store concept of store.hpp. It speaks tcp_store_protocol.hpp
/// synchronously on a non-blocking socket, every call bounded by a deadline (poll(2)),
/// through TLS when the job has QCOLL_TLS=1 (secured_socket.hpp).

#include <qcoll/rendezvous/tcp_store_protocol.hpp>

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake.hpp>
#include <qcoll/rendezvous/handshake_client.hpp>
#include <qcoll/rendezvous/secured_socket.hpp>
#include <qcoll/rendezvous/socket_io.hpp>
#include <qcoll/rendezvous/store.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace qcoll::rendezvous {

/// A rank's connection to the store.
/// @par Errors every call throws qcoll::error: errc::invalid_argument (a key over
/// max_key_size or value over max_value_size, checked before anything is sent),
/// errc::timeout (naming the key), errc::peer_lost (the server went away; every later call
/// fails the same way), errc::protocol_error (the server sent a malformed response).
/// @par Thread safety one thread at a time; give each thread its own client.
class store_client {
 public:
  /// Connects to job.store_host:job.store_port, retrying every 25 ms until `until`
  /// (rank 0 may start later than this rank), then introduces itself as job.rank.
  /// A host name is resolved with getaddrinfo, which the deadline cannot bound.
  store_client(const job& j, deadline until)
      : job_(j),
        where_(qcoll::detail::format("qcoll rank {}: store at {}:{}", j.rank, detail::printable(j.store_host), j.store_port)),
        socket_(io_) {
    connect(until);
    boost::system::error_code ignored;
    socket_.set_option(boost::asio::ip::tcp::no_delay(true), ignored);
    introduce(socket_, job_, channel::store, until);
    connection_.emplace(std::move(socket_), job_, tls_role::client,
                        qcoll::detail::format("the store at {}:{}", detail::printable(j.store_host), j.store_port), until);
  }

  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  /// Stores `value` under `key` (overwriting), and returns once the server has it: a
  /// get by any rank after this returns sees it. Bounded by job.timeout.
  void set(std::string_view key, std::string_view value) {
    check_key(key, "set");
    if (value.size() > max_value_size)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: the value for key \"{}\" has {} bytes, more than {}",
                                 where_, detail::printable(key), value.size(), max_value_size);
    transact(detail::store_op::set, key, detail::as_bytes(value), clock::now() + job_.timeout,
             qcoll::detail::format("setting key \"{}\"", detail::printable(key)), "the store server is not answering");
  }

  /// The value of `key`, waiting until some rank has set it.
  std::string get(std::string_view key, deadline until) {
    check_key(key, "get");
    return transact(detail::store_op::get, key, {}, until,
                    qcoll::detail::format("waiting for key \"{}\"", detail::printable(key)),
                    "no rank has set it: did the rank that should have failed, or is it slower?");
  }

  /// Waits until the keys prefix+"0" … prefix+(n−1) all exist: a barrier when each rank
  /// first sets prefix+its rank.
  void wait_all(std::string_view prefix, rank_t n, deadline until) {
    if (n == 0) return;
    const std::string last = qcoll::detail::format("{}{}", prefix, n - 1);
    check_key(last, "wait_all");
    if (n > std::numeric_limits<std::uint32_t>::max())
      qcoll::detail::throw_error(errc::invalid_argument, "{}: wait_all for {} keys (at most 2^32 - 1)", where_, n);
    std::array<std::byte, 4> count{};
    qcoll::detail::store_le<std::uint32_t>(count.data(), static_cast<std::uint32_t>(n));
    const std::string what =
        qcoll::detail::format("waiting for keys \"{}0\" … \"{}\"", detail::printable(prefix), detail::printable(last));
    const auto started = clock::now();
    try {
      transact(detail::store_op::wait, prefix, count, until, what, "");
    } catch (const qcoll::error& e) {
      if (e.code() != errc::timeout) throw;
      // Name the ranks that never arrived: the store knows which keys are missing.
      qcoll::detail::throw_error(errc::timeout, "{}: timed out after {} ms {}: {}: did it fail, or is it slower?",
                                 where_, detail::milliseconds_between(started, clock::now()), what,
                                 absent_ranks(prefix, count));
    }
  }

 private:
  /// "rank 2 has not arrived" or "3 ranks have not arrived (1, 4, 6)", from the store,
  /// which is asked with a short deadline of its own (its answer is a hint).
  std::string absent_ranks(std::string_view prefix, std::span<const std::byte> count) {
    std::string reply;
    try {
      reply = transact(detail::store_op::missing, prefix, count, clock::now() + std::chrono::seconds(1),
                       "asking which keys are missing", "");
    } catch (const qcoll::error&) {
      return "some ranks have not arrived";
    }
    if (reply.size() < 4 || reply.size() % 4 != 0) return "some ranks have not arrived";
    const auto* bytes = reinterpret_cast<const std::byte*>(reply.data());
    const std::uint32_t total = qcoll::detail::load_le<std::uint32_t>(bytes);
    std::string listed;
    for (std::size_t k = 1; k < reply.size() / 4; ++k)
      listed += qcoll::detail::format("{}{}", k == 1 ? "" : ", ", qcoll::detail::load_le<std::uint32_t>(bytes + 4 * k));
    if (total == 0) return "every rank had arrived by the time the store was asked";
    if (total == 1) return qcoll::detail::format("rank {} has not arrived", listed);
    return qcoll::detail::format("{} ranks have not arrived ({}{})", total, listed,
                                 total > reply.size() / 4 - 1 ? ", …" : "");
  }

  void check_key(std::string_view key, std::string_view operation) const {
    if (key.size() > max_key_size)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: {} with a key of {} bytes (at most {}): \"{}\"", where_,
                                 operation, key.size(), max_key_size, detail::printable(key, 32));
  }

  [[noreturn]] void fail(errc code, std::string message) {
    broken_ = detail::make_error(code, std::move(message));
    connection_->close();
    throw *broken_;
  }

  void connect(deadline until) {
    namespace ip = boost::asio::ip;
    const auto started = clock::now();
    std::string last_error;
    for (;;) {  // at least one attempt, however late
      std::vector<ip::tcp::endpoint> endpoints;
      boost::system::error_code ec;
      const auto address = ip::make_address(job_.store_host, ec);
      if (!ec) {
        endpoints.emplace_back(address, job_.store_port);
      } else {
        ip::tcp::resolver resolver(io_);
        const auto results = resolver.resolve(job_.store_host, std::to_string(job_.store_port), ec);
        if (ec) last_error = qcoll::detail::format("cannot resolve the host name: {}", ec.message());
        for (const auto& entry : results) endpoints.push_back(entry.endpoint());
      }
      for (const auto& endpoint : endpoints)
        if (try_connect(endpoint, until, last_error)) return;
      const auto now = clock::now();
      if (now >= until) break;
      std::this_thread::sleep_for(std::min<clock::duration>(std::chrono::milliseconds(25), until - now));
    }
    qcoll::detail::throw_error(errc::timeout,
                               "{}: no store answered within {} ms (last error: {}): is rank 0 running, and serving "
                               "this address (QCOLL_STORE, or MASTER_ADDR:MASTER_PORT)?",
                               where_, detail::milliseconds_between(started, clock::now()), last_error);
  }

  /// One non-blocking connect bounded by `until`; asio's own connect would wait unbounded.
  bool try_connect(const boost::asio::ip::tcp::endpoint& endpoint, deadline until, std::string& last_error) {
    boost::system::error_code ec;
    if (socket_.is_open()) socket_.close(ec);
    socket_.open(endpoint.protocol(), ec);
    if (!ec) socket_.non_blocking(true, ec);
    if (ec) {
      last_error = ec.message();
      return false;
    }
    const int fd = socket_.native_handle();
    int rc = ::connect(fd, endpoint.data(), static_cast<socklen_t>(endpoint.size()));
    int error = rc == 0 ? 0 : errno;
    if (rc != 0 && (error == EINPROGRESS || error == EINTR)) {
      if (!detail::wait_ready(fd, POLLOUT, until)) {
        last_error = "connection attempt timed out";
        socket_.close(ec);
        return false;
      }
      socklen_t length = sizeof(error);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    }
    if (error != 0) {
      last_error = std::strerror(error);
      socket_.close(ec);
      return false;
    }
    // Connecting to a local port nobody listens on can, rarely, connect the socket to itself.
    boost::system::error_code local_ec, remote_ec;
    const auto local = socket_.local_endpoint(local_ec);
    const auto remote = socket_.remote_endpoint(remote_ec);
    if (local_ec || remote_ec || local == remote) {
      last_error = local_ec   ? local_ec.message()
                   : remote_ec ? remote_ec.message()
                               : std::string("connected to itself (nobody listens yet)");
      socket_.close(ec);
      return false;
    }
    return true;
  }

  /// The next response from the buffered bytes or the socket, or nothing at the deadline.
  std::optional<detail::store_response> receive(deadline until, std::string_view what) {
    for (;;) {
      try {
        if (auto response = detail::take_response(inbox_)) return response;
      } catch (const qcoll::error& e) {
        fail(errc::protocol_error, qcoll::detail::format("{}: malformed response while {}: {}", where_, what, e.what()));
      }
      std::array<std::byte, 16 * 1024> chunk;
      const auto got = connection_->read_some(chunk, until);
      inbox_.insert(inbox_.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got.transferred));
      if (got.result == detail::io_result::done) continue;
      if (got.result == detail::io_result::timed_out) return std::nullopt;
      if (got.result == detail::io_result::closed)
        fail(errc::peer_lost, qcoll::detail::format("{}: the store closed the connection while {} ({}): rank 0 exited "
                                                    "or failed",
                                                    where_, what, got.why()));
      fail(errc::peer_lost, qcoll::detail::format("{}: the connection to the store failed while {}: {}", where_, what,
                                                  got.why()));
    }
  }

  std::string transact(detail::store_op op, std::string_view key, std::span<const std::byte> value, deadline until,
                       const std::string& what, std::string_view timeout_hint) {
    if (broken_) throw *broken_;
    const auto started = clock::now();
    const std::uint32_t id = next_id_++;
    const auto frame = detail::encode_frame(static_cast<std::uint8_t>(op), static_cast<std::uint16_t>(key.size()), id,
                                            detail::as_bytes(key), value);
    const auto sent = connection_->write_all(frame, until);
    if (sent.result == detail::io_result::timed_out && sent.transferred == 0)
      qcoll::detail::throw_error(errc::timeout, "{}: timed out after {} ms {}: the store server is not reading", where_,
                                 detail::milliseconds_between(started, clock::now()), what);
    if (sent.result == detail::io_result::timed_out)  // half a frame sent: the stream cannot be resumed
      fail(errc::timeout, qcoll::detail::format("{}: timed out after {} ms {}: the store server is not reading", where_,
                                      detail::milliseconds_between(started, clock::now()), what));
    if (sent.result != detail::io_result::done)
      fail(errc::peer_lost, qcoll::detail::format("{}: the store closed the connection while {} ({}): rank 0 exited or failed",
                                        where_, what, sent.why()));
    for (;;) {
      auto reply = receive(until, what);
      if (!reply) {
        cancel(id);
        qcoll::detail::throw_error(errc::timeout, "{}: timed out after {} ms {}: {}", where_,
                                   detail::milliseconds_between(started, clock::now()), what, timeout_hint);
      }
      if (reply->id != id) continue;  // the late answer to a request that timed out
      if (reply->status != detail::store_ok)
        fail(errc::protocol_error,
             qcoll::detail::format("{}: malformed response while {}: status {}", where_, what, unsigned{reply->status}));
      return std::move(reply->value);
    }
  }

  /// Tells the server to forget a parked request; never waits (a full send buffer means
  /// a stalled server, which the next call will find out).
  void cancel(std::uint32_t id) {
    const auto frame = detail::encode_frame(static_cast<std::uint8_t>(detail::store_op::cancel), 0, id, {}, {});
    const auto sent = connection_->write_all(frame, clock::now());
    if (sent.result != detail::io_result::done && sent.transferred != 0) {
      broken_ = detail::make_error(errc::peer_lost, qcoll::detail::format("{}: the connection to the store stalled", where_));
      connection_->close();
    }
  }

  job job_;
  std::string where_;
  boost::asio::io_context io_;  // never run: the socket is used synchronously, with poll(2)
  boost::asio::ip::tcp::socket socket_;  // while connecting; then connection_'s
  std::optional<secured_socket> connection_;  // in clear, or TLS (QCOLL_TLS=1)
  std::uint32_t next_id_ = 1;
  std::vector<std::byte> inbox_;          // received bytes not yet taken as responses
  std::optional<qcoll::error> broken_;    // once the connection is unusable, every call throws this
};

static_assert(store<store_client>);

}  // namespace qcoll::rendezvous
