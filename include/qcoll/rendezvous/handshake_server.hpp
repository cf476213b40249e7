#pragma once
/// @file
/// The server's side of the handshake of handshake.hpp, blocking, bounded by a deadline:
/// for a server that admits one connection at a time (the TCP transport's setup).
/// handshake_async_server.hpp has the same for an Asio server with many clients.

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
#include <span>
#include <string_view>

namespace qcoll::rendezvous {

/// Server side: verifies a freshly accepted connection and returns who it is.
/// @par Errors qcoll::error: errc::protocol_error (garbage, wrong magic, version, job,
/// channel, secret, rank out of range, size mismatch), errc::timeout (the peer was slower
/// than `until`), errc::peer_lost (it closed the connection). The message says why but
/// not who: the caller adds the address, logs it and drops the connection.
/// The socket's non-blocking mode is restored on return.
inline hello admit(boost::asio::ip::tcp::socket& socket, const job& j, channel kind, deadline until) {
  using namespace detail;
  const auto started = clock::now();
  non_blocking_scope scope(socket);
  server_handshake handshake(j, kind);

  const auto fail_io = [&](const io_outcome& outcome, std::string_view what, std::size_t expected) -> qcoll::error {
    if (outcome.result == io_result::timed_out)
      return make_error(errc::timeout, qcoll::detail::format("timed out after {} ms {} ({} of {} bytes)",
                                                   milliseconds_between(started, clock::now()), what,
                                                   outcome.transferred, expected));
    return make_error(errc::peer_lost, qcoll::detail::format("the connection closed {} ({} of {} bytes): {}", what,
                                                   outcome.transferred, expected, outcome.error.message()));
  };

  std::array<std::byte, hello_size> frame{};
  if (auto got = read_exact(socket, std::span(frame).first(4), until); got.result != io_result::done)
    throw fail_io(got, "waiting for the hello", hello_size);
  handshake.check_magic(std::span(frame).first(4));
  if (auto got = read_exact(socket, std::span(frame).subspan(4), until); got.result != io_result::done) {
    got.transferred += 4;
    throw fail_io(got, "waiting for the hello", hello_size);
  }
  if (auto refusal = handshake.on_hello(frame)) {
    if (!handshake.silent()) write_all(socket, handshake.reply(), until);  // best effort: we refuse either way
    throw *refusal;
  }
  if (auto sent = write_all(socket, handshake.reply(), until); sent.result != io_result::done)
    throw fail_io(sent, "sending the reply", reply_size);

  std::array<std::byte, proof_size> proof{};
  if (auto got = read_exact(socket, proof, until); got.result != io_result::done)
    throw fail_io(got, "waiting for the client's proof", proof_size);
  auto refusal = handshake.on_proof(proof);
  const auto sent = write_all(socket, handshake.ack(), until);
  if (refusal) throw *refusal;
  if (sent.result != io_result::done) throw fail_io(sent, "sending the acknowledgement", 1);
  return handshake.result();
}

}  // namespace qcoll::rendezvous
