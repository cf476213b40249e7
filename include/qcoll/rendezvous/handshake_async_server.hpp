#pragma once
/// @file
/// The server's side of the handshake of handshake.hpp as an asynchronous Asio operation:
/// for a server that must not block on one slow client (the TCP store's).

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake.hpp>
#include <qcoll/rendezvous/socket_io.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <array>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

namespace qcoll::rendezvous {

/// Called with the error (null on success) and, on success, who connected.
using admit_handler = std::function<void(std::exception_ptr, hello)>;

/// admit() as an asynchronous operation on the socket's executor, for servers that must
/// not block on one slow client: the handler runs on that executor once, with the
/// error admit() would have thrown or with the hello. A timer closes the wait at `until`.
/// The socket must outlive the operation, and the io_context must be run by one thread
/// (or the socket's executor be a strand): the timer and the reads share state.
inline void async_admit(boost::asio::ip::tcp::socket& socket, const job& j, channel kind, deadline until,
                        admit_handler handler) {
  using namespace detail;
  struct operation : std::enable_shared_from_this<operation> {
    operation(boost::asio::ip::tcp::socket& s, const job& j, channel kind, admit_handler h)
        : socket(s), timer(s.get_executor()), handshake(j, kind), done(std::move(h)) {}

    boost::asio::ip::tcp::socket& socket;
    boost::asio::steady_timer timer;
    server_handshake handshake;
    admit_handler done;
    clock::time_point started = clock::now();
    std::array<std::byte, hello_size> frame{};
    std::array<std::byte, proof_size> proof{};
    std::optional<qcoll::error> refusal;
    bool timed_out = false;
    bool finished = false;

    void finish(std::exception_ptr error) {
      if (finished) return;
      finished = true;
      timer.cancel();
      const hello who = error ? hello{0, 0, channel::store} : handshake.result();
      done(std::move(error), who);
    }

    // Turns a failed step into the error admit() would throw; true when it failed.
    bool failed(const boost::system::error_code& ec, std::size_t transferred, std::size_t expected,
                std::string_view what) {
      if (finished) return true;
      if (!ec && !timed_out) return false;
      if (timed_out)
        finish(std::make_exception_ptr(make_error(
            errc::timeout, qcoll::detail::format("timed out after {} ms {} ({} of {} bytes)",
                                       milliseconds_between(started, clock::now()), what, transferred, expected))));
      else
        finish(std::make_exception_ptr(make_error(
            errc::peer_lost,
            qcoll::detail::format("the connection closed {} ({} of {} bytes): {}", what, transferred, expected, ec.message()))));
      return true;
    }

    void start(deadline until) {
      timer.expires_at(until);
      timer.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
        if (ec || self->finished) return;
        self->timed_out = true;
        boost::system::error_code ignored;
        self->socket.cancel(ignored);
      });
      boost::asio::async_read(socket, boost::asio::buffer(frame.data(), 4),
                              [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
                                self->on_magic(ec, n);
                              });
    }

    void on_magic(const boost::system::error_code& ec, std::size_t n) {
      if (failed(ec, n, hello_size, "waiting for the hello")) return;
      try {
        handshake.check_magic(std::span(frame).first(4));
      } catch (...) {
        finish(std::current_exception());
        return;
      }
      boost::asio::async_read(socket, boost::asio::buffer(frame.data() + 4, hello_size - 4),
                              [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
                                self->on_hello(ec, n);
                              });
    }

    void on_hello(const boost::system::error_code& ec, std::size_t n) {
      if (failed(ec, n + 4, hello_size, "waiting for the hello")) return;
      refusal = handshake.on_hello(frame);
      if (refusal && handshake.silent()) {
        finish(std::make_exception_ptr(*refusal));
        return;
      }
      const auto reply = handshake.reply();
      boost::asio::async_write(socket, boost::asio::buffer(reply.data(), reply.size()),
                               [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
                                 self->on_reply_sent(ec, n);
                               });
    }

    void on_reply_sent(const boost::system::error_code& ec, std::size_t n) {
      if (refusal) {
        finish(std::make_exception_ptr(*refusal));
        return;
      }
      if (failed(ec, n, reply_size, "sending the reply")) return;
      boost::asio::async_read(socket, boost::asio::buffer(proof),
                              [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
                                self->on_proof(ec, n);
                              });
    }

    void on_proof(const boost::system::error_code& ec, std::size_t n) {
      if (failed(ec, n, proof_size, "waiting for the client's proof")) return;
      refusal = handshake.on_proof(proof);
      const auto ack = handshake.ack();
      boost::asio::async_write(socket, boost::asio::buffer(ack.data(), ack.size()),
                               [self = shared_from_this()](const boost::system::error_code& ec, std::size_t n) {
                                 self->on_ack_sent(ec, n);
                               });
    }

    void on_ack_sent(const boost::system::error_code& ec, std::size_t n) {
      if (refusal) {
        finish(std::make_exception_ptr(*refusal));
        return;
      }
      if (failed(ec, n, 1, "sending the acknowledgement")) return;
      finish(nullptr);
    }
  };
  auto op = std::make_shared<operation>(socket, j, kind, std::move(handler));
  op->start(until);
}

}  // namespace qcoll::rendezvous
