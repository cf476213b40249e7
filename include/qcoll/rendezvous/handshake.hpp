#pragma once
/// @file
/// The authenticated hello every qcoll TCP connection starts with (store and data).
///
/// Protocol, version 1. All integers little-endian; every frame has a fixed size, so no
/// side ever allocates or reads a length the peer chose.
///
///     client → server  hello, 64 bytes
///        0  magic "QCOL"            4
///        4  protocol version u16    (1)
///        6  channel u8              (1 store, 2 data)
///        7  flags u8                bit 0: the client has a secret; other bits 0
///        8  SHA-256(job id)        32   (a job id of any length in a fixed frame)
///       40  rank u32
///       44  size u32
///       48  client nonce           16
///     server → client  reply, 56 bytes
///        0  magic "QCOL"            4
///        4  protocol version u16    (the server's)
///        6  status u8               handshake_status; ok or why the client is refused
///        7  flags u8                bit 0: the server has a secret
///        8  server nonce           16
///       24  proof_s                32   HMAC(secret, "qcoll-server" | hello | server nonce)
///     client → server  proof_c, 32 bytes    HMAC(secret, "qcoll-client" | hello | server nonce)
///     server → client  ack, 1 byte          handshake_status
///
/// Why it is built this way:
/// - The server reads the 4-byte magic first, so a stray HTTP request or port scan is
///   refused at once instead of waiting for 64 bytes. Then it always reads the whole
///   hello before answering, so no unread bytes turn its close into a reset that would
///   destroy the refusal before the client reads it.
/// - Both sides prove knowledge of the secret over both fresh nonces (std::random_device):
///   a recorded exchange replayed later fails, and the two labels keep a proof from being
///   reflected back to its sender. A client whose check of proof_s fails sends zeros, not
///   its own proof, so a fake server learns nothing from it.
/// - Without a secret the proofs are zeros and not checked; both sides must agree on
///   whether there is one (flag bit 0), else the client is refused with secret_mismatch.
/// - Refusals that are safe to explain (version, job, channel, secret, rank, size) carry
///   a status, so both sides print the same reason. Rank and size are checked only after
///   the proofs, so an unauthenticated peer learns nothing about the job's shape.
/// - Every read and write is bounded by the caller's deadline (non-blocking socket and
///   poll(2); async_admit uses a timer), so a silent or slow peer costs at most that.
///
/// Every later version keeps the 64-byte hello and the reply's first 8 bytes (magic,
/// version, status, flags) and sends anything new after the ack, so a version-1 rank can
/// always read a newer peer's hello in full and report the version mismatch.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/little_endian.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/hmac.hpp>
#include <qcoll/core/types.hpp>

#include <boost/asio.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <poll.h>

namespace qcoll::rendezvous {

/// What a connection is for; part of the hello so a client that dialled the wrong port
/// is told so.
enum class channel : std::uint8_t { store = 1, data = 2 };

constexpr std::string_view to_string(channel kind) noexcept {
  switch (kind) {
    case channel::store: return "store";
    case channel::data: return "data";
  }
  return "channel?";
}

/// Who connected, as admit() verified it.
struct hello {
  rank_t rank;
  rank_t size;
  channel kind;
};

/// The status byte of the reply and of the ack.
enum class handshake_status : std::uint8_t {
  ok = 0,
  wrong_version = 1,    ///< the peers speak different protocol versions
  wrong_job = 2,        ///< SHA-256(job id) differs
  wrong_channel = 3,    ///< e.g. a store client on a data port
  secret_mismatch = 4,  ///< one side has a secret, the other has none
  bad_secret = 5,       ///< the client's proof does not verify: different secrets
  bad_rank = 6,         ///< rank not below the job's size
  wrong_size = 7,       ///< the client's world size differs from the server's
};

inline constexpr std::uint16_t handshake_version = 1;
inline constexpr std::size_t hello_size = 64;
inline constexpr std::size_t reply_size = 56;
inline constexpr std::size_t proof_size = 32;
inline constexpr std::size_t nonce_size = 16;

namespace detail {

inline constexpr std::array<std::byte, 4> handshake_magic{std::byte{'Q'}, std::byte{'C'}, std::byte{'O'},
                                                         std::byte{'L'}};
inline constexpr std::uint8_t flag_secret = 1;


inline std::span<const std::byte> as_bytes(std::string_view text) noexcept {
  return std::as_bytes(std::span(text.data(), text.size()));
}

/// Bytes as text a person can read: printable ASCII as is, the rest as \xNN; at most `limit` bytes.
inline std::string printable(std::span<const std::byte> bytes, std::size_t limit = 64) {
  std::string text;
  for (std::size_t i = 0; i < bytes.size() && i < limit; ++i) {
    const auto c = std::to_integer<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      text.push_back(static_cast<char>(c));
    } else {
      text += fmt::format("\\x{:02x}", c);
    }
  }
  if (bytes.size() > limit) text += "…";
  return text;
}
inline std::string printable(std::string_view text, std::size_t limit = 64) { return printable(as_bytes(text), limit); }

inline std::array<std::byte, nonce_size> fresh_nonce() {
  std::random_device device;
  std::array<std::byte, nonce_size> nonce{};
  for (std::size_t i = 0; i < nonce.size(); i += 4) qcoll::detail::store_le<std::uint32_t>(nonce.data() + i, static_cast<std::uint32_t>(device()));
  return nonce;
}

/// HMAC(secret, label | hello | server nonce), the proof each side sends.
inline digest handshake_proof(std::string_view secret, std::string_view label, std::span<const std::byte> hello_frame,
                              std::span<const std::byte> server_nonce) {
  std::array<std::byte, 12 + hello_size + nonce_size> message{};
  std::memcpy(message.data(), label.data(), 12);
  std::memcpy(message.data() + 12, hello_frame.data(), hello_size);
  std::memcpy(message.data() + 12 + hello_size, server_nonce.data(), nonce_size);
  return hmac_sha256(as_bytes(secret), message);
}

inline std::string describe(const boost::asio::ip::tcp::endpoint& endpoint) {
  const auto address = endpoint.address();
  return address.is_v6() ? fmt::format("[{}]:{}", address.to_string(), endpoint.port())
                         : fmt::format("{}:{}", address.to_string(), endpoint.port());
}

/// "address:port" of the socket's peer, or "an unconnected socket".
inline std::string describe_peer(const boost::asio::ip::tcp::socket& socket) {
  boost::system::error_code ec;
  const auto endpoint = socket.remote_endpoint(ec);
  return ec ? std::string("an unconnected peer") : describe(endpoint);
}

inline qcoll::error make_error(errc code, std::string message) { return qcoll::error(make_error_code(code), message); }

inline long long milliseconds_between(clock::time_point from, clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// ---------------------------------------------------------------------------------------
// Blocking I/O bounded by a deadline: the socket is non-blocking, poll(2) waits.

enum class io_result { done, timed_out, closed, failed };

struct io_outcome {
  io_result result = io_result::done;
  boost::system::error_code error;
  std::size_t transferred = 0;
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

// ---------------------------------------------------------------------------------------
// The server's side as plain logic over bytes, shared by admit() and async_admit().

class server_handshake {
 public:
  server_handshake(const job& j, channel kind)
      : job_id_(j.job_id), secret_(j.secret), job_hash_(sha256(j.job_id)), size_(j.size), kind_(kind) {}

  /// Checks the first four bytes; throws errc::protocol_error for anything but "QCOL".
  void check_magic(std::span<const std::byte> first) const {
    if (first.size() != handshake_magic.size() || !std::equal(first.begin(), first.end(), handshake_magic.begin()))
      throw make_error(errc::protocol_error,
                       fmt::format("not a qcoll {} connection: it starts with \"{}\", not \"QCOL\"", to_string(kind_),
                                   printable(first)));
  }

  /// Takes the whole hello and prepares the reply. Returns the refusal to throw once the
  /// reply (which then carries the reason) is sent, or nothing when the proofs come next.
  std::optional<qcoll::error> on_hello(std::span<const std::byte> frame) {
    std::memcpy(hello_.data(), frame.data(), hello_size);
    const std::uint16_t version = qcoll::detail::load_le<std::uint16_t>(hello_.data() + 4);
    const auto kind = std::to_integer<std::uint8_t>(hello_[6]);
    const auto flags = std::to_integer<std::uint8_t>(hello_[7]);
    claimed_rank_ = qcoll::detail::load_le<std::uint32_t>(hello_.data() + 40);
    claimed_size_ = qcoll::detail::load_le<std::uint32_t>(hello_.data() + 44);
    nonce_ = fresh_nonce();

    std::memcpy(reply_.data(), handshake_magic.data(), 4);
    qcoll::detail::store_le<std::uint16_t>(reply_.data() + 4, handshake_version);
    reply_[7] = std::byte{secret_.empty() ? std::uint8_t{0} : flag_secret};
    std::memcpy(reply_.data() + 8, nonce_.data(), nonce_size);

    if (version != handshake_version)
      return refuse(handshake_status::wrong_version,
                    fmt::format("the client speaks handshake version {}, this rank speaks {}: all ranks of a job "
                                "must run the same qcoll version",
                                version, handshake_version));
    if (flags & ~flag_secret)
      return refuse_silently(fmt::format("malformed hello: unknown flags 0x{:02x}", flags));
    if (kind != static_cast<std::uint8_t>(kind_))
      return refuse(handshake_status::wrong_channel,
                    fmt::format("the client opened a {} connection on this rank's {} port", channel_name(kind),
                                to_string(kind_)));
    const bool client_has_secret = (flags & flag_secret) != 0;
    if (client_has_secret != !secret_.empty())
      return refuse(handshake_status::secret_mismatch,
                    client_has_secret ? "the client has a secret (QCOLL_SECRET) and this rank has none"
                                      : "the client has no secret and this rank has one (QCOLL_SECRET)");
    if (!std::equal(job_hash_.begin(), job_hash_.end(), hello_.begin() + 8))
      return refuse(handshake_status::wrong_job,
                    fmt::format("the client belongs to another job (this job's id is \"{}\")", printable(job_id_)));

    reply_[6] = static_cast<std::byte>(handshake_status::ok);
    if (!secret_.empty()) {
      const digest proof = handshake_proof(secret_, "qcoll-server", hello_, nonce_);
      std::memcpy(reply_.data() + 24, proof.data(), proof.size());
    }
    return std::nullopt;
  }

  std::span<const std::byte> reply() const noexcept { return reply_; }

  /// Takes the client's proof and prepares the ack. Returns the refusal to throw once
  /// the ack is sent, or nothing when the client is admitted (see result()).
  std::optional<qcoll::error> on_proof(std::span<const std::byte> proof) {
    if (!secret_.empty()) {
      const digest expected = handshake_proof(secret_, "qcoll-client", hello_, nonce_);
      if (!constant_time_equal(expected, proof.first(proof_size)))
        return refuse_ack(handshake_status::bad_secret,
                          fmt::format("the client (claiming rank {}) failed to prove it knows this job's secret: the "
                                      "ranks have different QCOLL_SECRET values",
                                      claimed_rank_));
    }
    if (claimed_size_ != size_)
      return refuse_ack(handshake_status::wrong_size,
                        fmt::format("the client (rank {}) says the job has {} ranks, this rank's job has {}",
                                    claimed_rank_, claimed_size_, size_));
    if (claimed_rank_ >= size_)
      return refuse_ack(handshake_status::bad_rank,
                        fmt::format("the client claims rank {}, not below the job's size {}", claimed_rank_, size_));
    ack_ = std::byte{static_cast<std::uint8_t>(handshake_status::ok)};
    return std::nullopt;
  }

  std::span<const std::byte> ack() const noexcept { return {&ack_, 1}; }

  hello result() const noexcept { return {claimed_rank_, claimed_size_, kind_}; }

  /// True when a refusal must not be answered (a malformed hello: not a qcoll peer).
  bool silent() const noexcept { return silent_; }

 private:
  static std::string channel_name(std::uint8_t kind) {
    if (kind == static_cast<std::uint8_t>(channel::store)) return "store";
    if (kind == static_cast<std::uint8_t>(channel::data)) return "data";
    return fmt::format("unknown (kind {})", kind);
  }

  std::optional<qcoll::error> refuse(handshake_status status, std::string why) {
    reply_[6] = static_cast<std::byte>(status);
    return make_error(errc::protocol_error, std::move(why));
  }

  std::optional<qcoll::error> refuse_silently(std::string why) {
    silent_ = true;
    return make_error(errc::protocol_error, std::move(why));
  }

  std::optional<qcoll::error> refuse_ack(handshake_status status, std::string why) {
    ack_ = static_cast<std::byte>(status);
    return make_error(errc::protocol_error, std::move(why));
  }

  std::string job_id_;
  std::string secret_;
  digest job_hash_;
  rank_t size_;
  channel kind_;
  std::array<std::byte, hello_size> hello_{};
  std::array<std::byte, reply_size> reply_{};
  std::array<std::byte, nonce_size> nonce_{};
  std::byte ack_{0xff};
  rank_t claimed_rank_ = 0;
  rank_t claimed_size_ = 0;
  bool silent_ = false;
};

/// Why a server refused us, from the client's side.
inline std::string refusal_reason(handshake_status status, std::uint16_t server_version, bool server_has_secret,
                                  const job& j, channel kind) {
  switch (status) {
    case handshake_status::ok: return "no refusal";
    case handshake_status::wrong_version:
      return fmt::format("the peer speaks handshake version {}, this rank speaks {}: all ranks of a job must run the "
                         "same qcoll version",
                         server_version, handshake_version);
    case handshake_status::wrong_job:
      return fmt::format("the peer belongs to another job (this rank's job id is \"{}\"): a different QCOLL_JOB_ID, or "
                         "another job's rank at this address",
                         printable(j.job_id));
    case handshake_status::wrong_channel:
      return fmt::format("the peer does not take {} connections on this port: wrong port", to_string(kind));
    case handshake_status::secret_mismatch:
      return server_has_secret ? "the peer requires a secret and this rank has none: set the same QCOLL_SECRET on "
                                 "every rank"
                               : "this rank has a secret (QCOLL_SECRET) and the peer has none: set the same "
                                 "QCOLL_SECRET on every rank";
    case handshake_status::bad_secret:
      return "the peer rejected this rank's proof: the ranks have different QCOLL_SECRET values";
    case handshake_status::bad_rank:
      return fmt::format("the peer rejected rank {}: not below the job's size", j.rank);
    case handshake_status::wrong_size:
      return fmt::format("the peer's job does not have {} ranks: QCOLL_WORLD_SIZE differs between ranks", j.size);
  }
  return fmt::format("the peer refused with unknown status {}", static_cast<unsigned>(status));
}

}  // namespace detail

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
      fmt::format("qcoll rank {}: {} handshake with {}", j.rank, to_string(kind), describe_peer(socket));
  if (j.rank > std::numeric_limits<std::uint32_t>::max() || j.size > std::numeric_limits<std::uint32_t>::max())
    qcoll::detail::throw_error(errc::invalid_argument, "{}: rank {} of {} does not fit the handshake's 32 bits", where,
                               j.rank, j.size);
  non_blocking_scope scope(socket);

  const auto fail_io = [&](const io_outcome& outcome, std::string_view what) -> qcoll::error {
    if (outcome.result == io_result::timed_out)
      return make_error(errc::timeout, fmt::format("{}: timed out after {} ms {} (is the peer a qcoll rank of this "
                                                   "job, and alive?)",
                                                   where, milliseconds_between(started, clock::now()), what));
    return make_error(errc::peer_lost, fmt::format("{}: the connection closed {}: {} (the peer may have refused us: "
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
    throw make_error(errc::protocol_error, fmt::format("{}: the peer is not a qcoll rank (its reply starts with \"{}\")",
                                                       where, printable(std::span(reply).first(8))));
  const std::uint16_t server_version = qcoll::detail::load_le<std::uint16_t>(reply.data() + 4);
  const auto status = static_cast<handshake_status>(reply[6]);
  const bool server_has_secret = (std::to_integer<std::uint8_t>(reply[7]) & flag_secret) != 0;
  if (status != handshake_status::ok)
    throw make_error(errc::protocol_error,
                     fmt::format("{}: refused: {}", where, refusal_reason(status, server_version, server_has_secret, j, kind)));
  if (server_version != handshake_version)
    throw make_error(errc::protocol_error, fmt::format("{}: the peer answered with handshake version {}, not {}", where,
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
                     fmt::format("{}: the peer failed to prove it knows this job's secret: the ranks have different "
                                 "QCOLL_SECRET values (or the peer is not of this job)",
                                 where));
  if (proof_sent.result != io_result::done) throw fail_io(proof_sent, "sending the proof");

  std::byte ack{};
  if (auto got = read_exact(socket, std::span(&ack, 1), until); got.result != io_result::done)
    throw fail_io(got, "waiting for the peer's acknowledgement");
  if (const auto verdict = static_cast<handshake_status>(ack); verdict != handshake_status::ok)
    throw make_error(errc::protocol_error, fmt::format("{}: refused: {}", where,
                                                       refusal_reason(verdict, server_version, server_has_secret, j, kind)));
}

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
      return make_error(errc::timeout, fmt::format("timed out after {} ms {} ({} of {} bytes)",
                                                   milliseconds_between(started, clock::now()), what,
                                                   outcome.transferred, expected));
    return make_error(errc::peer_lost, fmt::format("the connection closed {} ({} of {} bytes): {}", what,
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
            errc::timeout, fmt::format("timed out after {} ms {} ({} of {} bytes)",
                                       milliseconds_between(started, clock::now()), what, transferred, expected))));
      else
        finish(std::make_exception_ptr(make_error(
            errc::peer_lost,
            fmt::format("the connection closed {} ({} of {} bytes): {}", what, transferred, expected, ec.message()))));
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
