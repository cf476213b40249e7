#pragma once
/// @file
/// The TCP store's server side: store_server, which rank 0 runs, and the asynchronous
/// Asio service behind it (detail::store_service) that admits each connection with the
/// handshake, reads requests of tcp_store_protocol.hpp, hands them to the store_table of
/// tcp_store_table.hpp and writes its replies, on one thread that never blocks. With
/// QCOLL_TLS=1 each connection's bytes after the handshake go through Asio's SSL stream,
/// on a context configured as tls.hpp's (TLS 1.3, the job's pre-shared key).

#include <qcoll/rendezvous/tcp_store_protocol.hpp>
#include <qcoll/rendezvous/tcp_store_table.hpp>

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake.hpp>
#include <qcoll/rendezvous/handshake_async_server.hpp>
#include <qcoll/rendezvous/socket_io.hpp>
#include <qcoll/rendezvous/tls.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>
#ifndef QCOLL_NO_OPENSSL
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/ssl/stream.hpp>
#endif

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace qcoll::rendezvous {

namespace detail {

struct store_connection {
  store_connection(boost::asio::io_context& io, std::uint64_t n) : socket(io), number(n) {}
  boost::asio::ip::tcp::socket socket;
  std::uint64_t number;          // its name in the store_table
  std::string peer;              // "address:port"
  std::optional<rank_t> rank;    // once admitted
  std::array<std::byte, store_header_size> header{};
  store_request request;
  std::vector<std::byte> body;
  std::deque<std::vector<std::byte>> outbox;
  bool writing = false;
  bool closed = false;
#ifndef QCOLL_NO_OPENSSL
  std::optional<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>> tls;  // over `socket`, once admitted
#endif
  bool secured = false;  // TLS is up (or not used): requests may be read
};

/// Starts `operation` on the connection's byte stream: its TLS stream where it has one,
/// else the socket.
template <class Operation>
void on_stream(store_connection& connection, Operation&& operation) {
#ifndef QCOLL_NO_OPENSSL
  if (connection.tls) {
    operation(*connection.tls);
    return;
  }
#endif
  operation(connection.socket);
}

/// The server's state; every member is touched only by the thread running io_.
class store_service {
 public:
  explicit store_service(const job& j) : job_(j), acceptor_(io_), retry_timer_(io_) {
    namespace ip = boost::asio::ip;
    if (j.tls) make_tls_context();
    const std::string where = qcoll::detail::format("qcoll rank {}: cannot serve the store on {}:{}", j.rank,
                                          printable(j.store_host), j.store_port);
    boost::system::error_code ec;
    ip::tcp::endpoint endpoint;
    const auto address = ip::make_address(j.store_host, ec);
    if (!ec) {
      endpoint = ip::tcp::endpoint(address, j.store_port);
    } else {
      ip::tcp::resolver resolver(io_);
      const auto results = resolver.resolve(j.store_host, std::to_string(j.store_port), ec);
      if (ec || results.empty())
        qcoll::detail::throw_error(errc::invalid_argument, "{}: cannot resolve the host name: {}", where,
                                   ec ? ec.message() : std::string("no addresses"));
      endpoint = results.begin()->endpoint();
      // A host's own name can resolve to a loopback address on that host (Debian maps it to
      // 127.0.1.1) while the other hosts reach it by its real one: for a job that spans
      // hosts, a named store listens on every interface.
      if (!j.all_local())
        endpoint.address(endpoint.address().is_v6() ? ip::address(ip::address_v6::any())
                                                    : ip::address(ip::address_v4::any()));
    }
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (ec == boost::asio::error::address_in_use)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}: the port is in use (another job or program holds it): choose a free one with "
                                 "QCOLL_STORE=host:port or MASTER_PORT",
                                 where);
    if (ec == boost::system::errc::address_not_available)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}: {} is not an address of this host: rank 0 must run on the store's host",
                                 where, endpoint.address().to_string());
    if (!ec) acceptor_.listen(boost::asio::socket_base::max_listen_connections, ec);
    if (ec) qcoll::detail::throw_error(errc::invalid_argument, "{}: {}", where, ec.message());
    port_ = acceptor_.local_endpoint().port();
    accept_next();
  }

  ~store_service() {
    // The thread that ran io_ has stopped: closing here races with nothing, and every
    // client sees its connection end (peer_lost) instead of waiting for its deadline.
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (const auto& [number, connection] : connections_) connection->socket.close(ignored);
    connections_.clear();
  }

  store_service(const store_service&) = delete;
  store_service& operator=(const store_service&) = delete;

  std::uint16_t port() const noexcept { return port_; }

  void run() noexcept {
    auto work = boost::asio::make_work_guard(io_);
    try {
      io_.run();
    } catch (const std::exception& e) {
      qcoll::detail::log_warning("qcoll: rank {}: the store server failed: {}", job_.rank, e.what());
      close_everything();
    }
  }

  void stop() noexcept { io_.stop(); }

 private:
  void close_everything() noexcept {
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    for (const auto& [number, connection] : connections_) {
      connection->closed = true;
      connection->socket.close(ignored);
    }
    connections_.clear();
    table_.clear();
  }

  void accept_next() {
    auto connection = std::make_shared<store_connection>(io_, next_connection_++);
    acceptor_.async_accept(connection->socket, [this, connection](const boost::system::error_code& ec) {
      if (!acceptor_.is_open() || ec == boost::asio::error::operation_aborted) return;
      if (ec) {  // out of descriptors, say: try again shortly rather than spin
        qcoll::detail::log_warning("qcoll: rank {}: the store cannot accept connections: {}; retrying", job_.rank,
                                   ec.message());
        retry_timer_.expires_after(std::chrono::milliseconds(50));
        retry_timer_.async_wait([this](const boost::system::error_code& timer_ec) {
          if (!timer_ec) accept_next();
        });
        return;
      }
      admit(connection);
      accept_next();
    });
  }

  void admit(const std::shared_ptr<store_connection>& connection) {
    connection->peer = describe_peer(connection->socket);
    boost::system::error_code ignored;
    connection->socket.set_option(boost::asio::ip::tcp::no_delay(true), ignored);
    connections_.emplace(connection->number, connection);
    async_admit(connection->socket, job_, channel::store, clock::now() + job_.timeout,
                [this, connection](std::exception_ptr error, hello who) {
                  if (connection->closed) return;
                  if (error) {
                    try {
                      std::rethrow_exception(error);
                    } catch (const std::exception& e) {
                      qcoll::detail::log_warning("qcoll: rank {}: store refused a connection from {}: {}", job_.rank,
                                                 connection->peer, e.what());
                    }
                    drop(connection);
                    return;
                  }
                  connection->rank = who.rank;
                  if (!job_.tls) {
                    connection->secured = true;
                    return read_header(connection);
                  }
                  start_tls(connection);
                });
  }

  void make_tls_context() {
#ifndef QCOLL_NO_OPENSSL
    tls_context_.emplace(boost::asio::ssl::context::tls_server);
    if (!configure_psk_context(tls_context_->native_handle(), tls_role::server))
      qcoll::detail::throw_error(errc::protocol_error, "qcoll rank {}: the store cannot set up TLS 1.3: {}", job_.rank,
                                 openssl_reason(ERR_get_error()));
    tls_key_ = tls_key(job_);
#else
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll rank {}: the store cannot use TLS (QCOLL_TLS=1): this program's qcoll was built "
                               "without OpenSSL",
                               job_.rank);
#endif
  }

  /// The TLS handshake of an admitted connection, bounded like the admission (a client
  /// that stalls in it is dropped at the deadline); then its requests.
  void start_tls([[maybe_unused]] const std::shared_ptr<store_connection>& connection) {
#ifndef QCOLL_NO_OPENSSL
    connection->tls.emplace(connection->socket, *tls_context_);
    if (!attach_key(connection->tls->native_handle(), &tls_key_)) {
      qcoll::detail::log_warning("qcoll: rank {}: store cannot set up TLS for {}: {}", job_.rank, name(*connection),
                                 openssl_reason(ERR_get_error()));
      return drop(connection);
    }
    auto timer = std::make_shared<boost::asio::steady_timer>(io_, clock::now() + job_.timeout);
    timer->async_wait([this, connection](const boost::system::error_code& ec) {
      if (ec || connection->closed || connection->secured) return;
      qcoll::detail::log_warning("qcoll: rank {}: store dropped {}: its TLS handshake did not finish by its deadline",
                                 job_.rank, name(*connection));
      drop(connection);
    });
    connection->tls->async_handshake(
        boost::asio::ssl::stream_base::server, [this, connection, timer](const boost::system::error_code& ec) {
          timer->cancel();
          if (connection->closed) return;
          if (ec) {
            qcoll::detail::log_warning("qcoll: rank {}: store refused {}: the TLS handshake failed ({}): a different "
                                       "QCOLL_SECRET, a peer that does not speak qcoll's TLS, or bytes altered in "
                                       "transit",
                                       job_.rank, name(*connection), ec.message());
            return drop(connection);
          }
          connection->secured = true;
          read_header(connection);
        });
#endif
  }

  std::string name(const store_connection& connection) const {
    return connection.rank ? qcoll::detail::format("rank {} ({})", *connection.rank, connection.peer) : connection.peer;
  }

  void read_header(const std::shared_ptr<store_connection>& connection) {
    on_stream(*connection, [&](auto& stream) {
      boost::asio::async_read(stream, boost::asio::buffer(connection->header),
                              [this, connection](const boost::system::error_code& ec, std::size_t) {
                                if (connection->closed) return;
                                if (ec) return failed_io(connection, ec);
                                if (auto malformed = parse_request(connection->header, connection->request))
                                  return malformed_request(connection, *malformed);
                                connection->body.resize(std::size_t{connection->request.key_size} +
                                                        connection->request.value_size);
                                if (connection->body.empty()) return dispatch(connection);
                                read_body(connection);
                              });
    });
  }

  void read_body(const std::shared_ptr<store_connection>& connection) {
    on_stream(*connection, [&](auto& stream) {
      boost::asio::async_read(stream, boost::asio::buffer(connection->body),
                              [this, connection](const boost::system::error_code& ec, std::size_t) {
                                if (connection->closed) return;
                                if (ec) return failed_io(connection, ec);
                                dispatch(connection);
                              });
    });
  }

  void failed_io(const std::shared_ptr<store_connection>& connection, const boost::system::error_code& ec) {
    // A rank that leaves closes its connection (over TLS without a close_notify: Asio
    // calls that a truncated stream): normal, not worth a warning.
    bool left = is_closed(ec) || ec == boost::asio::error::operation_aborted;
#ifndef QCOLL_NO_OPENSSL
    left = left || ec == boost::asio::ssl::error::stream_truncated;
    if (!left && ec.category() == boost::asio::error::get_ssl_category()) {
      qcoll::detail::log_warning("qcoll: rank {}: store closed the connection of {}: a TLS record failed to decrypt "
                                 "or authenticate ({}): bytes altered in transit, or not from the peer",
                                 job_.rank, name(*connection), ec.message());
      return drop(connection);
    }
#endif
    if (!left)
      qcoll::detail::log_warning("qcoll: rank {}: store lost the connection of {}: {}", job_.rank, name(*connection),
                                 ec.message());
    drop(connection);
  }

  void malformed_request(const std::shared_ptr<store_connection>& connection, const std::string& why) {
    qcoll::detail::log_warning("qcoll: rank {}: store closed the connection of {}: it sent {}", job_.rank,
                               name(*connection), why);
    drop(connection);
  }

  void dispatch(const std::shared_ptr<store_connection>& connection) {
    for (auto& reply : table_.handle(connection->number, connection->request, connection->body))
      if (const auto to = connections_.find(reply.connection); to != connections_.end() && !to->second->closed)
        respond(to->second, reply.id, reply.value);
    read_header(connection);
  }

  void respond(const std::shared_ptr<store_connection>& connection, std::uint32_t id, std::string_view value) {
    connection->outbox.push_back(encode_frame(store_ok, 0, id, {}, as_bytes(value)));
    if (!connection->writing) write_next(connection);
  }

  void write_next(const std::shared_ptr<store_connection>& connection) {
    connection->writing = true;
    on_stream(*connection, [&](auto& stream) {
      boost::asio::async_write(stream, boost::asio::buffer(connection->outbox.front()),
                               [this, connection](const boost::system::error_code& ec, std::size_t) {
                                 if (connection->closed) return;
                                 if (ec) return failed_io(connection, ec);
                                 connection->outbox.pop_front();
                                 connection->writing = false;
                                 if (!connection->outbox.empty()) write_next(connection);
                               });
    });
  }

  void drop(const std::shared_ptr<store_connection>& connection) {
    if (connection->closed) return;
    connection->closed = true;
    boost::system::error_code ignored;
    connection->socket.close(ignored);
    table_.forget(connection->number);
    connections_.erase(connection->number);
  }

  job job_;
#ifndef QCOLL_NO_OPENSSL
  // Before io_: the connections that pending handlers still hold go with io_.
  std::optional<boost::asio::ssl::context> tls_context_;  // with QCOLL_TLS=1
  digest tls_key_{};
#endif
  // Declared before the sockets and timers that belong to it, so it is destroyed after them.
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_timer_;
  std::uint16_t port_ = 0;
  std::uint64_t next_connection_ = 0;
  std::unordered_map<std::uint64_t, std::shared_ptr<store_connection>> connections_;
  store_table table_;
};

}  // namespace detail

/// Rank 0's store: binds job.store_host:job.store_port (SO_REUSEADDR; port 0 picks a free
/// one, see port(); a host *name* in a job that spans hosts binds every interface) and
/// serves any number of clients on a background thread with its own io_context, until
/// destroyed. Each connection must pass admit(…, channel::store, …) within job.timeout;
/// one that fails is logged and closed, the others are unaffected.
/// @par Errors errc::invalid_argument when the address cannot be bound (port in use, not
/// an address of this host, unresolvable name), with the address in the message.
/// @par Thread safety port() from any thread; construction and destruction from one.
class store_server {
 public:
  explicit store_server(const job& j) : service_(std::make_unique<detail::store_service>(j)) {
    thread_ = std::thread([service = service_.get()] { service->run(); });
  }

  /// Stops serving and joins the thread; every client's connection is closed, so a
  /// client waiting on a key gets errc::peer_lost.
  ~store_server() {
    service_->stop();
    thread_.join();
  }

  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  /// The port it listens on (the one chosen when job.store_port was 0).
  std::uint16_t port() const noexcept { return service_->port(); }

 private:
  std::unique_ptr<detail::store_service> service_;
  std::thread thread_;
};

}  // namespace qcoll::rendezvous
