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

  std::array<std::byte, hello_size> frame{};
  std::memcpy(frame.data(), handshake_magic.data(), 4);
  qcoll::detail::store_le<std::uint16_t>(frame.data() + 4, handshake_version);
  frame[6] = static_cast<std::byte>(kind);
  frame[7] = std::byte{j.secret.empty() ? std::uint8_t{0} : flag_secret};
  const digest job_hash = sha256(j.job_id);
  std::memcpy(frame.data() + 8, job_hash.data(), job_hash.size());
  qcoll::detail::store_le<std::uint32_t>(frame.data() + 40, static_cast<std::uint32_t>(j.rank));
  qcoll::detail::store_le<std::uint32_t>(frame.data() + 44, static_cast<std::uint32_t>(j.size));
  const auto nonce = fresh_nonce();
  std::memcpy(frame.data() + 48, nonce.data(), nonce.size());
  if (auto sent = write_all(socket, frame, until); sent.result != io_result::done) throw fail_io(sent, "sending the hello");

  std::array<std::byte, reply_size> reply{};
  if (auto got = read_exact(socket, reply, until); got.result != io_result::done)
    throw fail_io(got, "waiting for the peer's reply");
  if (!std::equal(handshake_magic.begin(), handshake_magic.end(), reply.begin()))
    throw make_error(errc::protocol_error, qcoll::detail::format("{}: the peer is not a qcoll rank (its reply starts with \"{}\")",
                                                       where, printable(std::span(reply).first(8))));
  const std::uint16_t server_version = qcoll::detail::load_le<std::uint16_t>(reply.data() + 4);
  const auto status = static_cast<handshake_status>(reply[6]);
  const bool server_has_secret = (std::to_integer<std::uint8_t>(reply[7]) & flag_secret) != 0;
  if (status != handshake_status::ok)
    throw make_error(errc::protocol_error,
                     qcoll::detail::format("{}: refused: {}", where, refusal_reason(status, server_version, server_has_secret, j, kind)));
  if (server_version != handshake_version)
    throw make_error(errc::protocol_error, qcoll::detail::format("{}: the peer answered with handshake version {}, not {}", where,
                                                       server_version, handshake_version));
  const auto server_nonce = std::span<const std::byte>(reply).subspan(8, nonce_size);

  digest proof{};
  bool server_proved = true;
  if (!j.secret.empty()) {
    const digest expected = handshake_proof(j.secret, "qcoll-server", frame, server_nonce);
    server_proved = constant_time_equal(expected, std::span<const std::byte>(reply).subspan(24, proof_size));
    if (server_proved) proof = handshake_proof(j.secret, "qcoll-client", frame, server_nonce);
  }
  const auto proof_sent = write_all(socket, proof, until);
  if (!server_proved)
    throw make_error(errc::protocol_error,
                     qcoll::detail::format("{}: the peer failed to prove it knows this job's secret: the ranks have different "
                                 "QCOLL_SECRET values (or the peer is not of this job)",
                                 where));
  if (proof_sent.result != io_result::done) throw fail_io(proof_sent, "sending the proof");

  std::byte ack{};
  if (auto got = read_exact(socket, std::span(&ack, 1), until); got.result != io_result::done)
    throw fail_io(got, "waiting for the peer's acknowledgement");
  if (const auto verdict = static_cast<handshake_status>(ack); verdict != handshake_status::ok)
    throw make_error(errc::protocol_error, qcoll::detail::format("{}: refused: {}", where,
                                                       refusal_reason(verdict, server_version, server_has_secret, j, kind)));
}

}  // namespace qcoll::rendezvous
