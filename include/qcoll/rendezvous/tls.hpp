#pragma once
/// @file
/// TLS 1.3 for the TCP transport's connections (QCOLL_TLS=1), by OpenSSL, keyed by the
/// job's secret: an external pre-shared key (RFC 8446 §2.2) derived from QCOLL_SECRET,
/// with an (EC)DHE exchange on top (psk_dhe_ke), so each connection has its own keys and
/// a recorded job cannot be decrypted later even by someone who learns the secret.
///
/// Why a key from the secret and not certificates: every job already distributes a
/// secret to its ranks (qcoll-run makes one per job), which proves membership in the
/// handshake of handshake.hpp; a PSK makes TLS need nothing more, and authenticates both
/// ends by construction — a rank without the secret cannot finish the TLS handshake, so
/// a man in the middle that relays the (authenticated) qcoll hello still cannot read or
/// alter a byte after it. Certificates would need a PKI per cluster for no added
/// guarantee among ranks that share a secret anyway.
///
/// TLS starts after the qcoll handshake's ack, on the same socket, on every channel
/// (data, store, recovery); both ends said in the hello whether they use it
/// (handshake.hpp, flag bit 1), and a mismatch is refused there with a message on both
/// sides. The connection then turns non-blocking and tls_connection moves bytes with
/// SSL_read/SSL_write: any record that fails to decrypt or authenticate breaks the
/// connection, which its user reports naming the peer. The store's server, which must
/// not block, drives the same context with Asio's SSL stream instead
/// (tcp_store_server.hpp): configure_psk_context is what both share.

namespace qcoll::rendezvous {

/// Which end of a TLS handshake a rank plays: the end that connected is the client.
enum class tls_role { client, server };

}  // namespace qcoll::rendezvous

#ifndef QCOLL_NO_OPENSSL

#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake.hpp>
#include <qcoll/rendezvous/hmac.hpp>
#include <qcoll/rendezvous/socket_io.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace qcoll::rendezvous {

namespace detail {

/// The PSK's identity: one key per job, so one name serves.
inline constexpr std::string_view tls_identity = "qcoll-job";

/// The job's TLS key: HMAC(secret, "qcoll-tls-psk" | job fingerprint), so one secret
/// shared by two jobs still gives them different keys.
inline digest tls_key(const job& j) {
  std::array<std::byte, 13 + 32> message{};
  std::memcpy(message.data(), "qcoll-tls-psk", 13);
  const auto fingerprint = job_fingerprint(j.job_id);
  std::memcpy(message.data() + 13, fingerprint.data(), fingerprint.size());
  return hmac_sha256(as_bytes(j.secret), message);
}

/// Where an SSL keeps the job's key for the PSK callbacks: an index of our own (index 0 is
/// "app data", which Asio's SSL stream owns and deletes).
inline int key_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

/// Hands `ssl` the key its PSK callbacks read; `key` must outlive it. False on failure.
inline bool attach_key(SSL* ssl, const digest* key) {
  return key_index() >= 0 && SSL_set_ex_data(ssl, key_index(), const_cast<digest*>(key)) == 1;
}

/// The session OpenSSL resumes as the external PSK: TLS 1.3, TLS_AES_128_GCM_SHA256.
inline SSL_SESSION* psk_session(SSL* ssl) {
  const auto* key = static_cast<const digest*>(SSL_get_ex_data(ssl, key_index()));
  if (key == nullptr) return nullptr;
  static constexpr unsigned char aes_128_gcm_sha256[] = {0x13, 0x01};
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, aes_128_gcm_sha256);
  SSL_SESSION* session = SSL_SESSION_new();
  if (session == nullptr || cipher == nullptr ||
      !SSL_SESSION_set1_master_key(session, reinterpret_cast<const unsigned char*>(key->data()), key->size()) ||
      !SSL_SESSION_set_cipher(session, cipher) || !SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION)) {
    SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

inline int use_psk(SSL* ssl, const EVP_MD*, const unsigned char** id, std::size_t* id_length,
                   SSL_SESSION** session) noexcept {
  *session = psk_session(ssl);
  if (*session == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(tls_identity.data());
  *id_length = tls_identity.size();
  return 1;
}

inline int find_psk(SSL* ssl, const unsigned char* id, std::size_t id_length, SSL_SESSION** session) noexcept {
  if (std::string_view(reinterpret_cast<const char*>(id), id_length) != tls_identity) {
    *session = nullptr;  // not ours: the handshake fails
    return 1;
  }
  *session = psk_session(ssl);
  return *session != nullptr ? 1 : 0;
}

/// The socket under a TLS connection. Ciphertext is not written by OpenSSL but queued
/// for the connection (tls_connection::queue), which sends it in large writes: one
/// sendmsg for many 16 KiB records, where a socket BIO would make one write(2) each — on
/// a host short of CPU the system calls, not the cipher, bound TLS's rate. Sends use
/// MSG_NOSIGNAL (write(2) would raise SIGPIPE where the peer has gone). Reads come
/// straight from the socket.
struct socket_ends {
  int fd;
  std::vector<std::byte>* unsent;  // the connection's queue of ciphertext
};

inline BIO_METHOD* socket_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "qcoll socket");
    if (m == nullptr) return m;
    BIO_meth_set_write_ex(m, [](BIO* bio, const char* data, std::size_t count, std::size_t* written) -> int {
      auto* ends = static_cast<socket_ends*>(BIO_get_data(bio));
      const auto* bytes = reinterpret_cast<const std::byte*>(data);
      ends->unsent->insert(ends->unsent->end(), bytes, bytes + count);
      *written = count;
      return 1;
    });
    BIO_meth_set_read_ex(m, [](BIO* bio, char* into, std::size_t count, std::size_t* read) -> int {
      BIO_clear_retry_flags(bio);
      const ssize_t n = ::recv(static_cast<socket_ends*>(BIO_get_data(bio))->fd, into, count, 0);
      if (n > 0) {
        *read = static_cast<std::size_t>(n);
        return 1;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) BIO_set_retry_read(bio);
      return 0;  // 0 bytes: the peer closed
    });
    BIO_meth_set_ctrl(m, [](BIO*, int command, long, void*) -> long { return command == BIO_CTRL_FLUSH ? 1 : 0; });
    BIO_meth_set_create(m, [](BIO* bio) -> int {
      BIO_set_init(bio, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

/// What every qcoll TLS context has, whoever drives its connections: TLS 1.3 only, its
/// SHA-256 suites, no session tickets, and the job's PSK (attach_key gives each SSL
/// its key). False when OpenSSL refused a setting.
inline bool configure_psk_context(SSL_CTX* ctx, tls_role side) {
  if (ctx == nullptr || !SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION))
    return false;
  // The PSK's hash is SHA-256: a suite of another hash (OpenSSL's server prefers
  // TLS_AES_256_GCM_SHA384) would set the PSK aside and ask for a certificate.
  if (!SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")) return false;
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: every connection has its own keys
  if (side == tls_role::client)
    SSL_CTX_set_psk_use_session_callback(ctx, use_psk);
  else
    SSL_CTX_set_psk_find_session_callback(ctx, find_psk);
  return true;
}

struct ssl_ctx_free {
  void operator()(SSL_CTX* ctx) const noexcept { SSL_CTX_free(ctx); }
};

/// One context per role for every tls_connection of the process (OpenSSL makes SSLs from
/// a context from any thread): the key is per connection, so nothing else differs.
/// Null when OpenSSL could not make it.
inline SSL_CTX* shared_context(tls_role side) {
  static const auto make = [](tls_role role) {
    std::unique_ptr<SSL_CTX, ssl_ctx_free> ctx(
        SSL_CTX_new(role == tls_role::client ? TLS_client_method() : TLS_server_method()));
    if (!configure_psk_context(ctx.get(), role)) return std::unique_ptr<SSL_CTX, ssl_ctx_free>();
    // Read ahead into a buffer of many records: one recv for several 16 KiB records,
    // instead of two (header, body) for each. has_pending() reports what waits there.
    SSL_CTX_set_read_ahead(ctx.get(), 1);
    SSL_CTX_set_default_read_buffer_len(ctx.get(), 256 << 10);
    return ctx;
  };
  static const std::unique_ptr<SSL_CTX, ssl_ctx_free> client = make(tls_role::client);
  static const std::unique_ptr<SSL_CTX, ssl_ctx_free> server = make(tls_role::server);
  return side == tls_role::client ? client.get() : server.get();
}
struct ssl_free {
  void operator()(SSL* ssl) const noexcept { SSL_free(ssl); }
};

}  // namespace detail

/// One TLS connection over a connected socket this object does not own. Moves bytes
/// without blocking once the handshake is done.
class tls_connection {
 public:
  using role = tls_role;

  /// Runs the TLS handshake on `fd` (waiting in poll until `until`; the socket is left
  /// non-blocking). Throws
  /// qcoll::error: timeout, or protocol_error with OpenSSL's reason — a peer with
  /// another key (secret) cannot complete it. `peer_name` appears in messages.
  tls_connection(int fd, const job& j, role side, std::string peer_name, deadline until)
      : key_(std::make_unique<digest>(detail::tls_key(j))), peer_(std::move(peer_name)), ends_{fd, &unsent_} {
    SSL_CTX* const ctx = detail::shared_context(side);
    if (ctx == nullptr) fail("setting up TLS 1.3 with a pre-shared key");
    // Non-blocking from here on: a handshake step queues its messages and must return
    // (WANT_READ) for them to be sent, not wait in recv for the answer they ask for.
    if (const int flags = ::fcntl(fd, F_GETFL); flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
      fail(qcoll::detail::format("making the socket non-blocking: {}", std::system_category().message(errno)));
    ssl_.reset(SSL_new(ctx));
    BIO* socket = detail::socket_method() != nullptr ? BIO_new(detail::socket_method()) : nullptr;
    if (!ssl_ || socket == nullptr || !detail::attach_key(ssl_.get(), key_.get())) {
      BIO_free(socket);
      fail("setting up TLS");
    }
    BIO_set_data(socket, &ends_);
    SSL_set_bio(ssl_.get(), socket, socket);  // the SSL owns it now
    if (side == role::client)
      SSL_set_connect_state(ssl_.get());
    else
      SSL_set_accept_state(ssl_.get());
    for (;;) {
      ERR_clear_error();
      const int rc = SSL_do_handshake(ssl_.get());
      const int why = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_.get(), rc);
      std::string lost;
      if (why != SSL_ERROR_NONE && why != SSL_ERROR_WANT_READ) {
        const unsigned long reason = ERR_get_error();
        flush(lost);  // the alert that tells the peer why, where the socket takes it
        fail(qcoll::detail::format("the TLS handshake with {} failed ({}): a different QCOLL_SECRET, a peer that "
                                   "does not speak qcoll's TLS, or bytes altered in transit",
                                   peer_, detail::openssl_reason(reason)));
      }
      while (!flush(lost)) {  // the handshake's messages (and an alert) go out first
        if (!detail::wait_ready(fd, POLLOUT, until)) timed_out();
      }
      if (!lost.empty()) fail(qcoll::detail::format("the TLS handshake with {} failed: {}", peer_, lost));
      if (why == SSL_ERROR_NONE) break;
      if (!detail::wait_ready(fd, POLLIN, until)) timed_out();
    }
  }

  tls_connection(const tls_connection&) = delete;  // the BIO points at its members
  tls_connection& operator=(const tls_connection&) = delete;

  /// Encrypts up to write_batch_bytes of `data` and sends what the socket takes; returns
  /// how many bytes of `data` it took, 0 while earlier ciphertext still waits for room
  /// (flush() sends it; the transport calls it on every pump and before it sleeps).
  /// Sets `lost` when the connection broke.
  std::size_t write_some(std::span<const std::byte> data, std::string& lost) {
    if (!broken_.empty()) lost = broken_;
    if (data.empty() || !flush(lost) || !lost.empty()) return 0;
    std::size_t taken = 0;
    ERR_clear_error();
    // The BIO queues every record, so OpenSSL never has to retry a write.
    if (SSL_write_ex(ssl_.get(), data.data(), std::min(data.size(), write_batch_bytes), &taken) != 1)
      return failed(SSL_get_error(ssl_.get(), 0), lost);
    flush(lost);
    return taken;
  }

  /// Sends queued ciphertext while the socket takes it; true once none is left (or the
  /// connection broke: `lost` says why, and every later write_some too).
  bool flush(std::string& lost) {
    while (sent_ < unsent_.size()) {
      iovec one{unsent_.data() + sent_, unsent_.size() - sent_};
      msghdr message{};
      message.msg_iov = &one;
      message.msg_iovlen = 1;
      const ssize_t n = ::sendmsg(ends_.fd, &message, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        broken_ = qcoll::detail::format("the TLS connection to {} failed: {}", peer_,
                                        std::system_category().message(errno));
        lost = broken_;
        unsent_.clear();
        sent_ = 0;
        return true;
      }
      sent_ += static_cast<std::size_t>(n);
    }
    unsent_.clear();
    sent_ = 0;
    return true;
  }

  /// Ciphertext queued and not yet taken by the socket: poll for room to send it.
  bool has_unsent() const noexcept { return sent_ < unsent_.size(); }

  /// Decrypts what has arrived, up to into.size() bytes; 0: nothing now. A record that
  /// fails its authentication tag sets `lost` with OpenSSL's reason.
  std::size_t read_some(std::span<std::byte> into, std::string& lost) {
    if (into.empty()) return 0;
    std::size_t read = 0;
    ERR_clear_error();
    if (SSL_read_ex(ssl_.get(), into.data(), into.size(), &read) == 1) return read;
    return failed(SSL_get_error(ssl_.get(), 0), lost);
  }

  /// True once the connection ended because the peer closed it (a TLS close, the end of
  /// the stream, a reset), as opposed to a record that failed or a local error.
  bool closed_by_peer() const noexcept { return peer_closed_; }

  /// Decrypted bytes (or a whole record) waiting inside OpenSSL, which poll(2) cannot see.
  bool has_pending() const noexcept { return SSL_has_pending(ssl_.get()) == 1; }

 private:
  [[noreturn]] void timed_out() const {
    throw qcoll::error(make_error_code(errc::timeout),
                       qcoll::detail::format("the TLS handshake with {} did not finish by its deadline", peer_));
  }

  [[noreturn]] void fail(std::string what) const {
    throw qcoll::error(make_error_code(errc::protocol_error), qcoll::detail::format("TLS: {}", std::move(what)));
  }

  std::size_t failed(int why, std::string& lost) {
    switch (why) {
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE: return 0;
      case SSL_ERROR_ZERO_RETURN:
        peer_closed_ = true;
        lost = qcoll::detail::format("it closed the TLS connection ({})", peer_);
        return 0;
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
      case SSL_ERROR_SSL:
        if (ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
          peer_closed_ = true;
          lost = qcoll::detail::format("it closed the connection ({})", peer_);
          return 0;
        }
        return authentication_failed(lost);
#endif
      case SSL_ERROR_SYSCALL:
        peer_closed_ = errno == 0 || errno == ECONNRESET || errno == EPIPE;
        lost = qcoll::detail::format("the TLS connection to {} failed: {}", peer_,
                                     errno != 0 ? std::system_category().message(errno) : "closed without a TLS close");
        return 0;
      default: return authentication_failed(lost);
    }
  }

  std::size_t authentication_failed(std::string& lost) const {
    const unsigned long code = ERR_get_error();
    // An alert the peer sent: it refused a record of ours (altered on the way there).
    if (ERR_GET_LIB(code) == ERR_LIB_SSL && ERR_GET_REASON(code) >= SSL_AD_REASON_OFFSET)
      lost = qcoll::detail::format("{} refused a TLS record from this rank ({}): bytes altered in transit on the way "
                                   "there",
                                   peer_, detail::openssl_reason(code));
    else
      lost = qcoll::detail::format("a TLS record from {} failed to decrypt or authenticate ({}): bytes altered in "
                                   "transit, or not from the peer",
                                   peer_, detail::openssl_reason(code));
    return 0;
  }

  static constexpr std::size_t write_batch_bytes = 256 << 10;  // 16 records per sendmsg

  std::unique_ptr<digest> key_;  // read by the PSK callbacks, through the SSL's ex_data
  std::string peer_;
  std::vector<std::byte> unsent_;  // ciphertext the socket has not taken yet, from sent_ on
  std::size_t sent_ = 0;
  std::string broken_;  // why sending failed for good
  bool peer_closed_ = false;
  detail::socket_ends ends_;
  std::unique_ptr<SSL, detail::ssl_free> ssl_;
};

}  // namespace qcoll::rendezvous

#endif  // QCOLL_NO_OPENSSL
