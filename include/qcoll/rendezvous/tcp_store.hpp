#pragma once
/// @file
/// The job's key-value store over TCP (Boost.Asio): rank 0 serves it (store_server),
/// every rank, rank 0 included, is a client (store_client), which models the
/// rendezvous::store concept of store.hpp. Ranks publish their addresses in it and meet
/// at barriers; it carries a few hundred bytes per rank, not data.
///
/// Protocol (after the handshake of handshake.hpp on channel::store). All integers
/// little-endian; every length is checked against the limits before its bytes are read.
///
///     request, 12-byte header then key then value
///        0  op u8            1 set, 2 get, 3 wait, 4 cancel
///        1  reserved u8      0
///        2  key size u16     ≤ max_key_size (256)
///        4  request id u32   echoed in the response
///        8  value size u32   set: ≤ max_value_size (64 KiB); get: 0; wait: 4 (u32 count); cancel: 0
///     response, 12-byte header then value
///        0  status u8        0 ok
///        1  reserved u8 × 3
///        4  request id u32
///        8  value size u32   ≤ max_value_size (the value of a get, else 0)
///
/// - set stores (overwrites) the value and is acknowledged once every later get sees it.
/// - get is answered when the key exists; wait when keys prefix+"0" … prefix+(count−1)
///   all exist. Until then the server parks the request (it never blocks its thread).
/// - cancel (id = the request to forget) drops a parked get or wait and has no response:
///   a client that timed out sends it. Responses carry the request id, so a response that
///   crossed a cancel is recognised as stale and skipped, and the stream stays in step.
/// - A malformed request closes that connection (logged); the server serves on.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake.hpp>
#include <qcoll/rendezvous/handshake_async_server.hpp>
#include <qcoll/rendezvous/handshake_client.hpp>
#include <qcoll/rendezvous/socket_io.hpp>
#include <qcoll/rendezvous/store.hpp>
#include <qcoll/core/types.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <charconv>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

namespace qcoll::rendezvous {

inline constexpr std::size_t max_key_size = 256;
inline constexpr std::size_t max_value_size = 64 * 1024;

namespace detail {

/// missing: which keys of a wait's range do not exist yet (what a timed-out wait reports).
enum class store_op : std::uint8_t { set = 1, get = 2, wait = 3, cancel = 4, missing = 5 };
/// A missing reply: the number of absent keys (u32), then the first of them (u32 each).
inline constexpr std::size_t missing_listed = 16;
inline constexpr std::size_t store_header_size = 12;
inline constexpr std::uint8_t store_ok = 0;

struct store_request {
  store_op op{};
  std::uint16_t key_size = 0;
  std::uint32_t id = 0;
  std::uint32_t value_size = 0;
};

/// Parses and checks a request header; returns why it is malformed, or nothing.
inline std::optional<std::string> parse_request(std::span<const std::byte> header, store_request& request) {
  const auto op = std::to_integer<std::uint8_t>(header[0]);
  request.key_size = qcoll::detail::load_le<std::uint16_t>(header.data() + 2);
  request.id = qcoll::detail::load_le<std::uint32_t>(header.data() + 4);
  request.value_size = qcoll::detail::load_le<std::uint32_t>(header.data() + 8);
  if (op < 1 || op > 5) return qcoll::detail::format("unknown request type {}", op);
  request.op = static_cast<store_op>(op);
  if (header[1] != std::byte{0}) return std::string("malformed request header (reserved byte set)");
  if (request.key_size > max_key_size)
    return qcoll::detail::format("a key of {} bytes (at most {})", request.key_size, max_key_size);
  switch (request.op) {
    case store_op::set:
      if (request.value_size > max_value_size)
        return qcoll::detail::format("a value of {} bytes (at most {})", request.value_size, max_value_size);
      break;
    case store_op::get:
      if (request.value_size != 0) return qcoll::detail::format("a get with a {}-byte value", request.value_size);
      break;
    case store_op::wait:
    case store_op::missing:
      if (request.value_size != 4) return qcoll::detail::format("a wait with a {}-byte count (must be 4)", request.value_size);
      break;
    case store_op::cancel:
      if (request.key_size != 0 || request.value_size != 0) return std::string("a cancel with a key or value");
      break;
  }
  return std::nullopt;
}

inline std::vector<std::byte> encode_frame(std::uint8_t first, std::uint16_t key_size, std::uint32_t id,
                                           std::span<const std::byte> key, std::span<const std::byte> value) {
  std::vector<std::byte> frame(store_header_size + key.size() + value.size());
  frame[0] = std::byte{first};
  qcoll::detail::store_le<std::uint16_t>(frame.data() + 2, key_size);
  qcoll::detail::store_le<std::uint32_t>(frame.data() + 4, id);
  qcoll::detail::store_le<std::uint32_t>(frame.data() + 8, static_cast<std::uint32_t>(value.size()));
  if (!key.empty()) std::memcpy(frame.data() + store_header_size, key.data(), key.size());
  if (!value.empty()) std::memcpy(frame.data() + store_header_size + key.size(), value.data(), value.size());
  return frame;
}

/// The store's data and parked requests, as logic over requests with no socket in sight:
/// the server feeds it each well-formed request (parse_request passed) with its body
/// (key, then value) and sends the replies it returns. Connections are numbers the
/// server chooses; forget() a connection that closed.
class store_table {
 public:
  struct reply {
    std::uint64_t connection;
    std::uint32_t id;
    std::string value;
  };

  std::vector<reply> handle(std::uint64_t connection, const store_request& request, std::span<const std::byte> body) {
    std::vector<reply> replies;
    const auto* text = reinterpret_cast<const char*>(body.data());
    std::string key(text, request.key_size);
    switch (request.op) {
      case store_op::set: {
        replies.push_back({connection, request.id, {}});
        data_.insert_or_assign(key, std::string(text + request.key_size, request.value_size));
        notify(key, replies);
        break;
      }
      case store_op::get:
        if (const auto found = data_.find(key); found != data_.end()) {
          replies.push_back({connection, request.id, found->second});
        } else {
          key_waiters_[key].push_back({connection, request.id});
        }
        break;
      case store_op::wait: {
        barrier_waiter waiter{connection, request.id, std::move(key),
                              qcoll::detail::load_le<std::uint32_t>(body.data() + request.key_size), 0};
        if (advance(waiter)) {
          replies.push_back({connection, request.id, {}});
        } else {
          barrier_waiters_.push_back(std::move(waiter));
        }
        break;
      }
      case store_op::missing:
        replies.push_back(
            {connection, request.id, missing_keys(key, qcoll::detail::load_le<std::uint32_t>(body.data() + request.key_size))});
        break;
      case store_op::cancel: forget(connection, request.id); break;
    }
    return replies;
  }

  /// Drops the parked requests of a connection: all of them, or the one with `id`.
  void forget(std::uint64_t connection, std::optional<std::uint32_t> id = std::nullopt) {
    const auto matches = [&](std::uint64_t owner, std::uint32_t waiter_id) {
      return owner == connection && (!id || *id == waiter_id);
    };
    for (auto it = key_waiters_.begin(); it != key_waiters_.end();) {
      std::erase_if(it->second, [&](const key_waiter& w) { return matches(w.connection, w.id); });
      it = it->second.empty() ? key_waiters_.erase(it) : std::next(it);
    }
    barrier_waiters_.remove_if([&](const barrier_waiter& w) { return matches(w.connection, w.id); });
  }

  void clear() noexcept {
    key_waiters_.clear();
    barrier_waiters_.clear();
  }

 private:
  struct key_waiter {
    std::uint64_t connection;
    std::uint32_t id;
  };
  struct barrier_waiter {
    std::uint64_t connection;
    std::uint32_t id;
    std::string prefix;
    std::uint32_t count;
    std::uint32_t next;  // keys prefix+0 … prefix+(next-1) are known to exist
  };

  /// The keys prefix+0 … prefix+(count−1) that do not exist: their number, then the
  /// first missing_listed of them. The work is bounded by the keys that exist, not by
  /// `count`, which the client chose (a count of 2^32 − 1 must not stall the store).
  std::string missing_keys(const std::string& prefix, std::uint32_t count) const {
    std::uint32_t present = 0;
    for (const auto& entry : data_) {
      const std::string_view key = entry.first;
      if (!key.starts_with(prefix)) continue;
      const std::string_view digits = key.substr(prefix.size());
      std::uint32_t index = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      // Only the spelling std::to_string gives counts: "07" is not key 7.
      if (ec == std::errc{} && end == digits.data() + digits.size() && index < count &&
          (digits.size() == 1 || digits.front() != '0'))
        ++present;
    }
    std::vector<std::uint32_t> absent;
    for (std::uint32_t i = 0; i < count && absent.size() < missing_listed; ++i)
      if (!data_.contains(prefix + std::to_string(i))) absent.push_back(i);
    std::string reply(4 * (1 + absent.size()), '\0');
    qcoll::detail::store_le<std::uint32_t>(reinterpret_cast<std::byte*>(reply.data()), count - present);
    for (std::size_t k = 0; k < absent.size(); ++k)
      qcoll::detail::store_le<std::uint32_t>(reinterpret_cast<std::byte*>(reply.data()) + 4 * (k + 1), absent[k]);
    return reply;
  }

  bool advance(barrier_waiter& waiter) const {
    while (waiter.next < waiter.count && data_.contains(waiter.prefix + std::to_string(waiter.next))) ++waiter.next;
    return waiter.next == waiter.count;
  }

  void notify(const std::string& key, std::vector<reply>& replies) {
    if (auto found = key_waiters_.find(key); found != key_waiters_.end()) {
      const std::string& value = data_.at(key);
      for (const auto& waiter : found->second) replies.push_back({waiter.connection, waiter.id, value});
      key_waiters_.erase(found);
    }
    for (auto it = barrier_waiters_.begin(); it != barrier_waiters_.end();) {
      if (key.starts_with(it->prefix) && advance(*it)) {
        replies.push_back({it->connection, it->id, {}});
        it = barrier_waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<key_waiter>> key_waiters_;
  std::list<barrier_waiter> barrier_waiters_;
};

struct store_response {
  std::uint8_t status = 0;
  std::uint32_t id = 0;
  std::string value;
};

/// Takes the next whole response out of `inbox` (the bytes a client received), or
/// nothing while it holds none. @par Errors errc::protocol_error for a value over
/// max_value_size (the stream cannot be trusted after it).
inline std::optional<store_response> take_response(std::vector<std::byte>& inbox) {
  if (inbox.size() < store_header_size) return std::nullopt;
  const std::uint32_t size = qcoll::detail::load_le<std::uint32_t>(inbox.data() + 8);
  if (size > max_value_size)
    qcoll::detail::throw_error(errc::protocol_error, "a response with a value of {} bytes (at most {})", size,
                               max_value_size);
  if (inbox.size() < store_header_size + size) return std::nullopt;
  store_response out{std::to_integer<std::uint8_t>(inbox[0]), qcoll::detail::load_le<std::uint32_t>(inbox.data() + 4),
                     std::string(reinterpret_cast<const char*>(inbox.data()) + store_header_size, size)};
  inbox.erase(inbox.begin(), inbox.begin() + static_cast<std::ptrdiff_t>(store_header_size + size));
  return out;
}

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
};

/// The server's state; every member is touched only by the thread running io_.
class store_service {
 public:
  explicit store_service(const job& j) : job_(j), acceptor_(io_), retry_timer_(io_) {
    namespace ip = boost::asio::ip;
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
                  read_header(connection);
                });
  }

  std::string name(const store_connection& connection) const {
    return connection.rank ? qcoll::detail::format("rank {} ({})", *connection.rank, connection.peer) : connection.peer;
  }

  void read_header(const std::shared_ptr<store_connection>& connection) {
    boost::asio::async_read(connection->socket, boost::asio::buffer(connection->header),
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
  }

  void read_body(const std::shared_ptr<store_connection>& connection) {
    boost::asio::async_read(connection->socket, boost::asio::buffer(connection->body),
                            [this, connection](const boost::system::error_code& ec, std::size_t) {
                              if (connection->closed) return;
                              if (ec) return failed_io(connection, ec);
                              dispatch(connection);
                            });
  }

  void failed_io(const std::shared_ptr<store_connection>& connection, const boost::system::error_code& ec) {
    // A rank that leaves closes its connection: normal, not worth a warning.
    if (!is_closed(ec) && ec != boost::asio::error::operation_aborted)
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
    boost::asio::async_write(connection->socket, boost::asio::buffer(connection->outbox.front()),
                             [this, connection](const boost::system::error_code& ec, std::size_t) {
                               if (connection->closed) return;
                               if (ec) return failed_io(connection, ec);
                               connection->outbox.pop_front();
                               connection->writing = false;
                               if (!connection->outbox.empty()) write_next(connection);
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
    socket_.non_blocking(true);
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
    boost::system::error_code ignored;
    socket_.close(ignored);
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
      boost::system::error_code ec;
      const std::size_t n = socket_.read_some(boost::asio::buffer(chunk), ec);
      inbox_.insert(inbox_.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(n));
      if (!ec || ec == boost::asio::error::interrupted) continue;
      if (detail::would_block(ec)) {
        if (!detail::wait_ready(socket_.native_handle(), POLLIN, until)) return std::nullopt;
        continue;
      }
      fail(errc::peer_lost, qcoll::detail::format("{}: the store closed the connection while {} ({}): rank 0 exited or failed",
                                        where_, what, ec.message()));
    }
  }

  std::string transact(detail::store_op op, std::string_view key, std::span<const std::byte> value, deadline until,
                       const std::string& what, std::string_view timeout_hint) {
    if (broken_) throw *broken_;
    const auto started = clock::now();
    const std::uint32_t id = next_id_++;
    const auto frame = detail::encode_frame(static_cast<std::uint8_t>(op), static_cast<std::uint16_t>(key.size()), id,
                                            detail::as_bytes(key), value);
    const auto sent = detail::write_all(socket_, frame, until);
    if (sent.result == detail::io_result::timed_out && sent.transferred == 0)
      qcoll::detail::throw_error(errc::timeout, "{}: timed out after {} ms {}: the store server is not reading", where_,
                                 detail::milliseconds_between(started, clock::now()), what);
    if (sent.result == detail::io_result::timed_out)  // half a frame sent: the stream cannot be resumed
      fail(errc::timeout, qcoll::detail::format("{}: timed out after {} ms {}: the store server is not reading", where_,
                                      detail::milliseconds_between(started, clock::now()), what));
    if (sent.result != detail::io_result::done)
      fail(errc::peer_lost, qcoll::detail::format("{}: the store closed the connection while {} ({}): rank 0 exited or failed",
                                        where_, what, sent.error.message()));
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
    const auto sent = detail::write_all(socket_, frame, clock::now());
    if (sent.result != detail::io_result::done && sent.transferred != 0) {
      broken_ = detail::make_error(errc::peer_lost, qcoll::detail::format("{}: the connection to the store stalled", where_));
      boost::system::error_code ignored;
      socket_.close(ignored);
    }
  }

  job job_;
  std::string where_;
  boost::asio::io_context io_;  // never run: the socket is used synchronously, with poll(2)
  boost::asio::ip::tcp::socket socket_;
  std::uint32_t next_id_ = 1;
  std::vector<std::byte> inbox_;          // received bytes not yet taken as responses
  std::optional<qcoll::error> broken_;    // once the connection is unusable, every call throws this
};

static_assert(store<store_client>);

}  // namespace qcoll::rendezvous
