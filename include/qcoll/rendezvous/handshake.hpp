#pragma once
/// @file
/// The authenticated hello every qcoll TCP connection starts with (store and data): the
/// protocol alone, as logic over bytes, with no socket in sight. The I/O is elsewhere:
/// handshake_client.hpp (introduce, the client), handshake_server.hpp (admit, a
/// blocking server) and handshake_async_server.hpp (async_admit, for an Asio server),
/// all three over the deadline-bounded socket I/O of socket_io.hpp.
///
/// Protocol, version 2. All integers little-endian; every frame has a fixed size, so no
/// side ever allocates or reads a length the peer chose.
///
///     client → server  hello, 64 bytes
///        0  magic "QCOL"            4
///        4  protocol version u16    (2)
///        6  channel u8              (1 store, 2 data, 3 recovery)
///        7  flags u8                bit 0: the client has a secret; bit 1: TLS follows
///                                   (QCOLL_TLS, on every channel); other bits 0
///        8  job fingerprint        32   (a job id of any length in a fixed frame)
///       40  rank u32
///       44  size u32
///       48  client nonce           16
///     server → client  reply, 56 bytes
///        0  magic "QCOL"            4
///        4  protocol version u16    (the server's)
///        6  status u8               handshake_status; ok or why the client is refused
///        7  flags u8                bit 0: the server has a secret; bit 1: TLS follows
///        8  server nonce           16
///       24  proof_s                32   HMAC(secret, "qcoll-server" | hello | server nonce)
///     client → server  proof_c, 32 bytes    HMAC(secret, "qcoll-client" | hello | server nonce)
///     server → client  ack, 1 byte          handshake_status
///     then, when both said bit 1: a TLS 1.3 handshake on the same socket (tls.hpp)
///
/// Why it is built this way:
/// - The server reads the 4-byte magic first, so a stray HTTP request or port scan is
///   refused at once instead of waiting for 64 bytes. Then it always reads the whole
///   hello before answering, so no unread bytes turn its close into a reset that would
///   destroy the refusal before the client reads it.
/// - Both sides prove knowledge of the secret over both fresh nonces (OpenSSL's RAND_bytes):
///   a recorded exchange replayed later fails, and the two labels keep a proof from being
///   reflected back to its sender. A client whose check of proof_s fails sends zeros, not
///   its own proof, so a fake server learns nothing from it.
/// - Without a secret the proofs are zeros and not checked; both sides must agree on
///   whether there is one (flag bit 0), else the client is refused with secret_mismatch.
/// - The job field names the job; it is not a security mechanism (the proofs are, and
///   they cover the whole hello, the field included). So it is a fingerprint
///   (job_fingerprint) that any build can compute, with OpenSSL or without
///   (QCOLL_NO_OPENSSL, hmac.hpp): jobs without a secret run across both kinds of build.
///   Version 1 carried SHA-256(job id) there.
/// - Refusals that are safe to explain (version, job, channel, secret, rank, size) carry
///   a status, so both sides print the same reason. Rank and size are checked only after
///   the proofs, so an unauthenticated peer learns nothing about the job's shape.
/// - Every read and write is bounded by the caller's deadline (non-blocking socket and
///   poll(2); async_admit uses a timer), so a silent or slow peer costs at most that.
///
/// Every version keeps the 64-byte hello and the reply's first 8 bytes (magic, version,
/// status, flags) and sends anything new after the ack, so a rank can always read another
/// version's hello in full and report the version mismatch.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/little_endian.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/hmac.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace qcoll::rendezvous {

/// What a connection is for; part of the hello so a client that dialled the wrong port
/// is told so.
enum class channel : std::uint8_t { store = 1, data = 2, recovery = 3 };

constexpr std::string_view to_string(channel kind) noexcept {
  switch (kind) {
    case channel::store: return "store";
    case channel::data: return "data";
    case channel::recovery: return "recovery";
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
  wrong_job = 2,        ///< the job fingerprints differ
  wrong_channel = 3,    ///< e.g. a store client on a data port
  secret_mismatch = 4,  ///< one side has a secret, the other has none
  bad_secret = 5,       ///< the client's proof does not verify: different secrets
  bad_rank = 6,         ///< rank not below the job's size
  wrong_size = 7,       ///< the client's world size differs from the server's
  tls_mismatch = 8,     ///< one side uses TLS (QCOLL_TLS=1), the other does not
};

inline constexpr std::uint16_t handshake_version = 2;
inline constexpr std::size_t hello_size = 64;
inline constexpr std::size_t reply_size = 56;
inline constexpr std::size_t proof_size = 32;
inline constexpr std::size_t nonce_size = 16;

namespace detail {

inline constexpr std::array<std::byte, 4> handshake_magic{std::byte{'Q'}, std::byte{'C'}, std::byte{'O'},
                                                         std::byte{'L'}};
inline constexpr std::uint8_t flag_secret = 1;
inline constexpr std::uint8_t flag_tls = 2;

/// The hello's and the reply's flags for this job (the same on every channel).
inline std::uint8_t flags_of(const job& j) noexcept {
  return static_cast<std::uint8_t>((j.secret.empty() ? 0 : flag_secret) | (j.tls ? flag_tls : 0));
}

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
      text += qcoll::detail::format("\\x{:02x}", c);
    }
  }
  if (bytes.size() > limit) text += "…";
  return text;
}
inline std::string printable(std::string_view text, std::size_t limit = 64) { return printable(as_bytes(text), limit); }

/// The hello's job field: a job id of any length in 32 bytes. Four lanes of 64-bit
/// FNV-1a, each from its own start and over the length too, each mixed by splitmix64's
/// finalizer: two job ids collide by accident with a chance near 2^-64 or less. Not a
/// cryptographic digest, and it need not be one: without a secret anyone may claim any
/// job, and with one the proofs decide.
inline std::array<std::byte, 32> job_fingerprint(std::string_view job_id) noexcept {
  std::array<std::byte, 32> field{};
  for (std::uint64_t lane = 0; lane < 4; ++lane) {
    std::uint64_t h = 0xcbf29ce484222325ull ^ ((lane + 1) * 0x9e3779b97f4a7c15ull);
    const auto absorb = [&h](std::uint64_t byte) { h = (h ^ byte) * 0x100000001b3ull; };
    for (const char c : job_id) absorb(static_cast<unsigned char>(c));
    for (int shift = 0; shift < 64; shift += 8) absorb(job_id.size() >> shift & 0xff);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
    qcoll::detail::store_le<std::uint64_t>(field.data() + 8 * lane, h);
  }
  return field;
}

inline std::array<std::byte, nonce_size> fresh_nonce() {
  std::array<std::byte, nonce_size> nonce{};
  random_bytes(nonce);
  return nonce;
}

/// HMAC(secret, label | hello | server nonce), the proof each side sends.
inline digest handshake_proof(std::string_view secret, std::string_view label, std::span<const std::byte> hello_frame,
                              std::span<const std::byte> server_nonce) {
  std::array<std::byte, 12 + hello_size + nonce_size> message{};
  std::memcpy(message.data(), label.data(), 12);
  std::memcpy(message.data() + 12, hello_frame.data(), hello_size);
  std::memcpy(message.data() + 12 + hello_size, server_nonce.data(), nonce_size);
#ifndef QCOLL_NO_OPENSSL
  return hmac_sha256(as_bytes(secret), message);
#else
  (void)secret;  // unreachable: require_authentication refused the secret
  throw qcoll::error(make_error_code(errc::invalid_argument), "a handshake proof in a build without OpenSSL");
#endif
}

inline qcoll::error make_error(errc code, std::string message) { return qcoll::error(make_error_code(code), message); }

// ---------------------------------------------------------------------------------------
// The server's side as plain logic over bytes, shared by admit() and async_admit().

class server_handshake {
 public:
  server_handshake(const job& j, channel kind)
      : job_id_(j.job_id), secret_(j.secret), flags_(flags_of(j)), job_hash_(job_fingerprint(j.job_id)), size_(j.size), kind_(kind) {
    require_authentication(j, "qcoll");
  }

  /// Checks the first four bytes; throws errc::protocol_error for anything but "QCOL".
  void check_magic(std::span<const std::byte> first) const {
    if (first.size() != handshake_magic.size() || !std::equal(first.begin(), first.end(), handshake_magic.begin()))
      throw make_error(errc::protocol_error,
                       qcoll::detail::format("not a qcoll {} connection: it starts with \"{}\", not \"QCOL\"", to_string(kind_),
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
    reply_[7] = std::byte{flags_};
    std::memcpy(reply_.data() + 8, nonce_.data(), nonce_size);

    if (version != handshake_version)
      return refuse(handshake_status::wrong_version,
                    qcoll::detail::format("the client speaks handshake version {}, this rank speaks {}: all ranks of a job "
                                "must run the same qcoll version",
                                version, handshake_version));
    if (flags & ~(flag_secret | flag_tls))
      return refuse_silently(qcoll::detail::format("malformed hello: unknown flags 0x{:02x}", flags));
    if (kind != static_cast<std::uint8_t>(kind_))
      return refuse(handshake_status::wrong_channel,
                    qcoll::detail::format("the client opened a {} connection on this rank's {} port", channel_name(kind),
                                to_string(kind_)));
    const bool client_has_secret = (flags & flag_secret) != 0;
    if (client_has_secret != !secret_.empty())
      return refuse(handshake_status::secret_mismatch,
                    client_has_secret ? "the client has a secret (QCOLL_SECRET) and this rank has none"
                                      : "the client has no secret and this rank has one (QCOLL_SECRET)");
    if ((flags & flag_tls) != (flags_ & flag_tls))
      return refuse(handshake_status::tls_mismatch,
                    (flags & flag_tls) != 0 ? "the client uses TLS (QCOLL_TLS=1) and this rank does not"
                                            : "the client does not use TLS and this rank does (QCOLL_TLS=1)");
    if (!std::equal(job_hash_.begin(), job_hash_.end(), hello_.begin() + 8))
      return refuse(handshake_status::wrong_job,
                    qcoll::detail::format("the client belongs to another job (this job's id is \"{}\")", printable(job_id_)));

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
                          qcoll::detail::format("the client (claiming rank {}) failed to prove it knows this job's secret: the "
                                      "ranks have different QCOLL_SECRET values",
                                      claimed_rank_));
    }
    if (claimed_size_ != size_)
      return refuse_ack(handshake_status::wrong_size,
                        qcoll::detail::format("the client (rank {}) says the job has {} ranks, this rank's job has {}",
                                    claimed_rank_, claimed_size_, size_));
    if (claimed_rank_ >= size_)
      return refuse_ack(handshake_status::bad_rank,
                        qcoll::detail::format("the client claims rank {}, not below the job's size {}", claimed_rank_, size_));
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
    if (kind == static_cast<std::uint8_t>(channel::recovery)) return "recovery";
    return qcoll::detail::format("unknown (kind {})", kind);
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
  std::uint8_t flags_;
  std::array<std::byte, 32> job_hash_;
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
      return qcoll::detail::format("the peer speaks handshake version {}, this rank speaks {}: all ranks of a job must run the "
                         "same qcoll version",
                         server_version, handshake_version);
    case handshake_status::wrong_job:
      return qcoll::detail::format("the peer belongs to another job (this rank's job id is \"{}\"): a different QCOLL_JOB_ID, or "
                         "another job's rank at this address",
                         printable(j.job_id));
    case handshake_status::wrong_channel:
      return qcoll::detail::format("the peer does not take {} connections on this port: wrong port", to_string(kind));
    case handshake_status::secret_mismatch:
      return server_has_secret ? "the peer requires a secret and this rank has none: set the same QCOLL_SECRET on "
                                 "every rank"
                               : "this rank has a secret (QCOLL_SECRET) and the peer has none: set the same "
                                 "QCOLL_SECRET on every rank";
    case handshake_status::bad_secret:
      return "the peer rejected this rank's proof: the ranks have different QCOLL_SECRET values";
    case handshake_status::bad_rank:
      return qcoll::detail::format("the peer rejected rank {}: not below the job's size", j.rank);
    case handshake_status::wrong_size:
      return qcoll::detail::format("the peer's job does not have {} ranks: QCOLL_WORLD_SIZE differs between ranks", j.size);
    case handshake_status::tls_mismatch:
      return j.tls ? "this rank uses TLS (QCOLL_TLS=1) and the peer does not: set the same QCOLL_TLS on every rank"
                   : "the peer uses TLS (QCOLL_TLS=1) and this rank does not: set the same QCOLL_TLS on every rank";
  }
  return qcoll::detail::format("the peer refused with unknown status {}", static_cast<unsigned>(status));
}
// ---------------------------------------------------------------------------------------
// The client's side as plain logic over bytes, for introduce().

class client_handshake {
 public:
  /// `where` starts every error message ("qcoll rank 3: data handshake with …").
  client_handshake(job j, channel kind, std::string where) : job_(std::move(j)), kind_(kind), where_(std::move(where)) {
    std::memcpy(hello_.data(), handshake_magic.data(), 4);
    qcoll::detail::store_le<std::uint16_t>(hello_.data() + 4, handshake_version);
    hello_[6] = static_cast<std::byte>(kind);
    require_authentication(job_, where_);
    hello_[7] = std::byte{flags_of(job_)};
    const auto job_hash = job_fingerprint(job_.job_id);
    std::memcpy(hello_.data() + 8, job_hash.data(), job_hash.size());
    qcoll::detail::store_le<std::uint32_t>(hello_.data() + 40, static_cast<std::uint32_t>(job_.rank));
    qcoll::detail::store_le<std::uint32_t>(hello_.data() + 44, static_cast<std::uint32_t>(job_.size));
    const auto nonce = fresh_nonce();
    std::memcpy(hello_.data() + 48, nonce.data(), nonce.size());
  }

  std::span<const std::byte> hello() const noexcept { return hello_; }

  /// Takes the server's reply. Throws errc::protocol_error for a peer that is not a qcoll
  /// rank or refused us (nothing more is sent then); otherwise prepares proof() and
  /// returns the refusal to throw once it is sent (a server that failed its own proof
  /// gets zeros), or nothing.
  std::optional<qcoll::error> on_reply(std::span<const std::byte> reply) {
    if (!std::equal(handshake_magic.begin(), handshake_magic.end(), reply.begin()))
      throw make_error(errc::protocol_error, qcoll::detail::format("{}: the peer is not a qcoll rank (its reply starts with \"{}\")",
                                                         where_, printable(reply.first(8))));
    server_version_ = qcoll::detail::load_le<std::uint16_t>(reply.data() + 4);
    const auto status = static_cast<handshake_status>(reply[6]);
    server_has_secret_ = (std::to_integer<std::uint8_t>(reply[7]) & flag_secret) != 0;
    if (status != handshake_status::ok) throw refused(status);
    if (server_version_ != handshake_version)
      throw make_error(errc::protocol_error, qcoll::detail::format("{}: the peer answered with handshake version {}, not {}",
                                                         where_, server_version_, handshake_version));
    if (job_.secret.empty()) return std::nullopt;
    const auto server_nonce = reply.subspan(8, nonce_size);
    const digest expected = handshake_proof(job_.secret, "qcoll-server", hello_, server_nonce);
    if (!constant_time_equal(expected, reply.subspan(24, proof_size)))
      return make_error(errc::protocol_error,
                        qcoll::detail::format("{}: the peer failed to prove it knows this job's secret: the ranks have "
                                    "different QCOLL_SECRET values (or the peer is not of this job)",
                                    where_));
    proof_ = handshake_proof(job_.secret, "qcoll-client", hello_, server_nonce);
    return std::nullopt;
  }

  std::span<const std::byte> proof() const noexcept { return proof_; }

  /// Takes the server's verdict on our proof; throws errc::protocol_error unless it is ok.
  void on_ack(std::byte ack) const {
    if (const auto verdict = static_cast<handshake_status>(ack); verdict != handshake_status::ok) throw refused(verdict);
  }

 private:
  qcoll::error refused(handshake_status status) const {
    return make_error(errc::protocol_error, qcoll::detail::format("{}: refused: {}", where_,
                                                        refusal_reason(status, server_version_, server_has_secret_, job_, kind_)));
  }

  job job_;
  channel kind_;
  std::string where_;
  std::array<std::byte, hello_size> hello_{};
  digest proof_{};
  std::uint16_t server_version_ = 0;
  bool server_has_secret_ = false;
};
}  // namespace detail

}  // namespace qcoll::rendezvous
