#pragma once
/// @file
/// The client's side of the handshake of handshake.hpp, blocking, bounded by a deadline.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake.hpp>
#include <qcoll/rendezvous/socket_io.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace qcoll::rendezvous {

/// Client side: identifies this process as `j.rank` of `j.size` on a freshly connected
/// socket and verifies the peer is a rank of the same job (and knows its secret).
/// @par Errors qcoll::error: errc::protocol_error (refused, with the reason the peer
/// gave, or the peer is not a qcoll rank), errc::timeout (past `until`),
/// errc::peer_lost (the connection closed), errc::invalid_argument (rank or size beyond u32).
/// The socket's non-blocking mode is restored on return.
inline void introduce(boost::asio::ip::tcp::socket& socket, const job& j, channel kind, deadline until) {
  using namespace detail;
  const auto started = clock::now();
  const std::string where =
      qcoll::detail::format("qcoll rank {}: {} handshake with {}", j.rank, to_string(kind), describe_peer(socket));
  if (j.rank > std::numeric_limits<std::uint32_t>::max() || j.size > std::numeric_limits<std::uint32_t>::max())
    qcoll::detail::throw_error(errc::invalid_argument, "{}: rank {} of {} does not fit the handshake's 32 bits", where,
                               j.rank, j.size);
  non_blocking_scope scope(socket);

  const auto fail_io = [&](const io_outcome& outcome, std::string_view what) -> qcoll::error {
    if (outcome.result == io_result::timed_out)
      return make_error(errc::timeout, qcoll::detail::format("{}: timed out after {} ms {} (is the peer a qcoll rank of this "
                                                   "job, and alive?)",
                                                   where, milliseconds_between(started, clock::now()), what));
    return make_error(errc::peer_lost, qcoll::detail::format("{}: the connection closed {}: {} (the peer may have refused us: "
                                                   "see its log)",
                                                   where, what, outcome.error.message()));
  };

  client_handshake handshake(j, kind, where);
  if (auto sent = write_all(socket, handshake.hello(), until); sent.result != io_result::done)
    throw fail_io(sent, "sending the hello");
  std::array<std::byte, reply_size> reply{};
  if (auto got = read_exact(socket, reply, until); got.result != io_result::done)
    throw fail_io(got, "waiting for the peer's reply");
  const auto refusal = handshake.on_reply(reply);
  const auto proof_sent = write_all(socket, handshake.proof(), until);
  if (refusal) throw *refusal;
  if (proof_sent.result != io_result::done) throw fail_io(proof_sent, "sending the proof");
  std::byte ack{};
  if (auto got = read_exact(socket, std::span(&ack, 1), until); got.result != io_result::done)
    throw fail_io(got, "waiting for the peer's acknowledgement");
  handshake.on_ack(ack);
}

}  // namespace qcoll::rendezvous
