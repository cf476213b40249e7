#pragma once
/// @file
/// One connection's bytes for the code that talks on it synchronously, every wait bounded
/// by a deadline — the store's client and the recovery channel: in clear, or through TLS
/// 1.3 (tls.hpp) when the job has QCOLL_TLS=1. Either way the same calls, so that code
/// never asks which.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/socket_io.hpp>
#include <qcoll/rendezvous/tls.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <poll.h>

namespace qcoll::rendezvous {

/// A connected socket past the handshake of handshake.hpp, and its TLS when the job has
/// it. Non-blocking; every call waits in poll(2) until its deadline at most. Move-only.
class secured_socket {
 public:
  using socket_type = boost::asio::ip::tcp::socket;

  /// Takes `socket` and, when j.tls, runs the TLS handshake on it as `side` by `until`.
  /// `peer_name` appears in TLS's messages.
  /// @par Errors qcoll::error: protocol_error (the peer has another key — another
  /// secret or job — or does not speak TLS; bytes altered), timeout; invalid_argument for
  /// j.tls in a build without OpenSSL.
  secured_socket(socket_type socket, const job& j, tls_role side, std::string peer_name, deadline until)
      : socket_(std::move(socket)) {
    socket_.non_blocking(true);
    if (!j.tls) return;
#ifndef QCOLL_NO_OPENSSL
    tls_ = std::make_unique<tls_connection>(socket_.native_handle(), j, side, std::move(peer_name), until);
#else
    (void)side;
    (void)until;
    qcoll::detail::throw_error(errc::invalid_argument,
                               "TLS (QCOLL_TLS=1) with {}: this program's qcoll was built without OpenSSL", peer_name);
#endif
  }

  /// Reads exactly bytes.size() bytes.
  detail::io_outcome read_exact(std::span<std::byte> bytes, deadline until) {
    if (!tls_) return detail::read_exact(socket_, bytes, until);
    return through_tls(bytes, until, reading::all, [this](std::span<std::byte> rest, std::string& lost) {
      return tls_->read_some(rest, lost);
    });
  }

  /// Reads what has arrived, at least one byte, into `bytes` (not empty).
  detail::io_outcome read_some(std::span<std::byte> bytes, deadline until) {
    if (tls_)
      return through_tls(bytes, until, reading::any, [this](std::span<std::byte> rest, std::string& lost) {
        return tls_->read_some(rest, lost);
      });
    detail::io_outcome outcome;
    for (;;) {
      outcome.transferred = socket_.read_some(boost::asio::buffer(bytes.data(), bytes.size()), outcome.error);
      if (!outcome.error) return outcome;
      if (outcome.error == boost::asio::error::interrupted) continue;
      if (!detail::would_block(outcome.error)) break;
      if (!detail::wait_ready(socket_.native_handle(), POLLIN, until)) {
        outcome.result = detail::io_result::timed_out;
        return outcome;
      }
    }
    outcome.result = detail::is_closed(outcome.error) ? detail::io_result::closed : detail::io_result::failed;
    return outcome;
  }

  /// Writes all of `bytes` (through TLS: encrypted and sent, not only queued). Through
  /// TLS, `transferred` counts the plaintext TLS took, which it takes whole and at once:
  /// a write that times out has then queued a record that will still go out, so a
  /// caller that gives up on one must treat the stream as unusable (the store's client
  /// does, as after half a frame in clear).
  detail::io_outcome write_all(std::span<const std::byte> bytes, deadline until) {
    if (!tls_) return detail::write_all(socket_, bytes, until);
    auto outcome = through_tls(bytes, until, reading::no, [this](std::span<const std::byte> rest, std::string& lost) {
      return tls_->write_some(rest, lost);
    });
    std::string lost;
    while (outcome.result == detail::io_result::done && !tls_->flush(lost))  // the last records' ciphertext
      if (!detail::wait_ready(socket_.native_handle(), POLLOUT, until)) outcome.result = detail::io_result::timed_out;
    if (!lost.empty()) broken(outcome, std::move(lost));
    return outcome;
  }

  /// Closes the connection; every later call fails.
  void close() noexcept {
    tls_.reset();  // first: it keeps the descriptor's number, which the next socket may get
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  /// True when the bytes travel through TLS.
  bool encrypted() const noexcept { return tls_ != nullptr; }

  const socket_type& socket() const noexcept { return socket_; }

 private:
  enum class reading { no, all, any };

  /// Moves `bytes` with `step` (tls_connection's read_some or write_some) until all of
  /// them (or, reading::any, some) moved, the connection broke or `until` passed.
  /// Ciphertext the socket has not taken yet goes out on the way, so a request is sent
  /// before its answer is waited for.
  template <class Bytes, class Step>
  detail::io_outcome through_tls(Bytes bytes, deadline until, reading direction, Step step) {
    detail::io_outcome outcome;
    std::string lost;
    while (outcome.transferred < bytes.size() && !(direction == reading::any && outcome.transferred > 0)) {
      const std::size_t n = step(bytes.subspan(outcome.transferred), lost);
      outcome.transferred += n;
      if (lost.empty() && n == 0) {
        const bool unsent = !tls_->flush(lost);
        // No whole record has arrived (SSL_read wants more), or the socket is full.
        const short events = direction == reading::no ? POLLOUT : static_cast<short>(POLLIN | (unsent ? POLLOUT : 0));
        if (lost.empty() && !detail::wait_ready(socket_.native_handle(), events, until)) {
          outcome.result = detail::io_result::timed_out;
          return outcome;
        }
      }
      if (!lost.empty()) return broken(outcome, std::move(lost));
    }
    return outcome;
  }

  detail::io_outcome& broken(detail::io_outcome& outcome, std::string why) const {
    outcome.result = tls_->closed_by_peer() ? detail::io_result::closed : detail::io_result::failed;
    outcome.reason = std::move(why);
    return outcome;
  }

  socket_type socket_;
#ifndef QCOLL_NO_OPENSSL
  std::unique_ptr<tls_connection> tls_;  // after the socket: destroyed first
#else
  struct no_tls {
    std::size_t read_some(std::span<std::byte>, std::string&) { return 0; }
    std::size_t write_some(std::span<const std::byte>, std::string&) { return 0; }
    bool flush(std::string&) { return true; }
    bool closed_by_peer() const noexcept { return false; }
  };
  std::unique_ptr<no_tls> tls_;  // never made: such a build refuses QCOLL_TLS=1 above
#endif
};

}  // namespace qcoll::rendezvous
