#pragma once
/// @file
/// Blocking socket I/O bounded by a deadline, shared by the handshake and the TCP store's
/// client: the socket is non-blocking and poll(2) waits, so a silent or slow peer costs
/// at most the caller's deadline, never a hang.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <poll.h>

namespace qcoll::rendezvous::detail {

inline std::string describe(const boost::asio::ip::tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  return address.is_v6() ? qcoll::detail::format("[{}]:{}", address.to_string(), endpoint.port())
                         : qcoll::detail::format("{}:{}", address.to_string(), endpoint.port());
}

/// "address:port" of the socket's peer, or "an unconnected socket".
inline std::string describe_peer(const boost::asio::ip::tcp::socket& socket) {
  boost::system::error_code ec;
  const auto endpoint = socket.remote_endpoint(ec);
  return ec ? std::string("an unconnected peer") : describe(endpoint);
}

/// Runs `io` until `done()` or `until`; then cancels what is left (`cancel()`) and runs
/// the cancelled handlers, so no handler outlives the call. Returns done().
template <class Done, class Cancel>
bool run_until(boost::asio::io_context& io, Done&& done, deadline until, Cancel&& cancel) {
  io.restart();
  while (!done() && io.run_one_until(until) > 0) {
  }
  if (done()) return true;
  cancel();
  io.restart();
  io.run();
  return done();
}

/// Listens on `bind_address` (an IP address) on a port the kernel picks.
/// @par Errors qcoll::error (invalid_argument) "<who> cannot listen on '<address>': why".
inline void listen_on_free_port(boost::asio::ip::tcp::acceptor& acceptor, const std::string& bind_address,
                                std::string_view who) {
  namespace asio = boost::asio;
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(bind_address, ec);
  if (ec)
    qcoll::detail::throw_error(errc::invalid_argument, "{} cannot listen on '{}': not an IP address", who,
                               bind_address);
  acceptor.open(address.is_v6() ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), ec);
  if (!ec) acceptor.bind({address, 0}, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) qcoll::detail::throw_error(errc::invalid_argument, "{} cannot listen on '{}': {}", who, bind_address, ec.message());
}

/// Connects a socket to `where` before `until`: the socket, or the error
/// (boost::asio::error::timed_out when the deadline passed first).
inline boost::asio::ip::tcp::socket connect_before(boost::asio::io_context& io,
                                                   const boost::asio::ip::tcp::endpoint& where, deadline until,
                                                   boost::system::error_code& result) {
  boost::asio::ip::tcp::socket socket(io);
  bool done = false;
  result = boost::asio::error::timed_out;
  socket.async_connect(where, [&](boost::system::error_code ec) {
    result = ec;
    done = true;
  });
  run_until(io, [&] { return done; }, until, [&] {
    boost::system::error_code ignored;
    socket.close(ignored);
  });
  return socket;
}

/// "address:port" (an IP address, not a name; IPv6 in brackets or bare) as an endpoint,
/// or nothing when it is not one: the form ranks publish their listeners in.
inline std::optional<boost::asio::ip::tcp::endpoint> parse_endpoint(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(std::string(host), ec);
  unsigned port = 0;
  const std::string_view digits = text.substr(colon + 1);
  const auto parsed = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec || parsed.ec != std::errc() || parsed.ptr != digits.data() + digits.size() || port == 0 || port > 65535)
    return std::nullopt;
  return boost::asio::ip::tcp::endpoint(address, static_cast<unsigned short>(port));
}

inline long long milliseconds_between(clock::time_point from, clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

enum class io_result { done, timed_out, closed, failed };

struct io_outcome {
  io_result result = io_result::done;
  boost::system::error_code error;
  std::size_t transferred = 0;
  std::string reason;  // what broke a TLS connection (tls.hpp), which has no error code

  /// Why it failed, in words.
  std::string why() const { return reason.empty() ? error.message() : reason; }
};

/// Sets a socket non-blocking for the lifetime of the guard and restores it after.
class non_blocking_scope {
 public:
  explicit non_blocking_scope(boost::asio::ip::tcp::socket& socket) : socket_(socket), was_(socket.non_blocking()) {
    socket_.non_blocking(true);
  }
  ~non_blocking_scope() {
    boost::system::error_code ignored;
    socket_.non_blocking(was_, ignored);
  }
  non_blocking_scope(const non_blocking_scope&) = delete;
  non_blocking_scope& operator=(const non_blocking_scope&) = delete;

 private:
  boost::asio::ip::tcp::socket& socket_;
  bool was_;
};

/// Waits until the socket is ready for `events` or the deadline passes (false).
inline bool wait_ready(int fd, short events, deadline until) {
  for (;;) {
    const auto now = clock::now();
    if (now >= until) {
      pollfd probe{fd, events, 0};  // one last look: ready now counts
      return ::poll(&probe, 1, 0) > 0;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    pollfd entry{fd, events, 0};
    const int rc = ::poll(&entry, 1, static_cast<int>(std::min<long long>(left, std::numeric_limits<int>::max())));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // let the next read or write report the error
  }
}

inline bool is_closed(const boost::system::error_code& ec) noexcept {
  namespace error = boost::asio::error;
  return ec == error::eof || ec == error::connection_reset || ec == error::broken_pipe ||
         ec == error::connection_aborted || ec == error::not_connected || ec == error::shut_down;
}

inline bool would_block(const boost::system::error_code& ec) noexcept {
  return ec == boost::asio::error::would_block || ec == boost::asio::error::try_again;
}

/// Moves all of `bytes` with `step` (one read_some or write_some on the non-blocking
/// socket), waiting for `ready` (POLLIN or POLLOUT) whenever the socket would block.
template <class Bytes, class Step>
io_outcome transfer_all(boost::asio::ip::tcp::socket& socket, Bytes bytes, short ready, deadline until, Step step) {
  io_outcome outcome;
  while (outcome.transferred < bytes.size()) {
    boost::system::error_code ec;
    outcome.transferred += step(boost::asio::buffer(bytes.data() + outcome.transferred,
                                                    bytes.size() - outcome.transferred), ec);
    if (!ec) continue;
    if (ec == boost::asio::error::interrupted) continue;
    if (would_block(ec)) {
      if (!wait_ready(socket.native_handle(), ready, until)) {
        outcome.result = io_result::timed_out;
        return outcome;
      }
      continue;
    }
    outcome.result = is_closed(ec) ? io_result::closed : io_result::failed;
    outcome.error = ec;
    return outcome;
  }
  return outcome;
}

/// Reads exactly buffer.size() bytes (the socket must be non-blocking).
inline io_outcome read_exact(boost::asio::ip::tcp::socket& socket, std::span<std::byte> buffer, deadline until) {
  return transfer_all(socket, buffer, POLLIN, until,
                      [&](auto chunk, boost::system::error_code& ec) { return socket.read_some(chunk, ec); });
}

/// Writes all of `data` (the socket must be non-blocking).
inline io_outcome write_all(boost::asio::ip::tcp::socket& socket, std::span<const std::byte> data, deadline until) {
  return transfer_all(socket, data, POLLOUT, until,
                      [&](auto chunk, boost::system::error_code& ec) { return socket.write_some(chunk, ec); });
}

}  // namespace qcoll::rendezvous::detail
