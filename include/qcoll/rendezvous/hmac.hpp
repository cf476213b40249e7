#pragma once
/// @file
/// The cryptography the rendezvous needs, from OpenSSL's libcrypto: HMAC-SHA256 (a
/// proof that a peer knows the job's secret without sending it), a constant-time
/// comparison of proofs, and random bytes for the handshake's nonces. qcoll carries no
/// cryptography of its own.
///
/// OpenSSL is a dependency unless a build says otherwise: CMake's QCOLL_WITH_OPENSSL=OFF
/// (or, for a build without CMake, defining QCOLL_NO_OPENSSL) builds qcoll without it.
/// Such a build cannot authenticate ranks, so it refuses a job with a secret
/// (QCOLL_SECRET) when a connection is made, and says why; jobs without a secret run as
/// usual and interoperate with builds that have OpenSSL (the handshake's job field is a
/// fingerprint, not a digest: rendezvous/handshake.hpp).

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <string>

#ifndef QCOLL_NO_OPENSSL
#  if defined(__has_include) && !__has_include(<openssl/hmac.h>)
#    error "qcoll authenticates ranks with OpenSSL's HMAC-SHA256 and did not find <openssl/hmac.h>: install OpenSSL's headers (Debian: libssl-dev) and link it (-lssl -lcrypto, CMake: OpenSSL::SSL), or define QCOLL_NO_OPENSSL to build without authentication (a job with QCOLL_SECRET is then refused)"
#  endif
#  include <openssl/crypto.h>
#  include <openssl/err.h>
#  include <openssl/evp.h>
#  include <openssl/hmac.h>
#  include <openssl/rand.h>
#else
#  include <random>
#endif

#include <qcoll/core/error.hpp>
#include <qcoll/detail/format.hpp>

namespace qcoll::rendezvous {

/// An HMAC-SHA256 result.
using digest = std::array<std::byte, 32>;

/// Whether this build can authenticate ranks (was built with OpenSSL).
inline constexpr bool authentication_available =
#ifdef QCOLL_NO_OPENSSL
    false;
#else
    true;
#endif

namespace detail {

#ifndef QCOLL_NO_OPENSSL
/// OpenSSL's words for an error code (ERR_get_error()'s), for a message.
inline std::string openssl_reason(unsigned long code) {
  if (code == 0) return "no reason given";
  std::array<char, 256> text{};
  ERR_error_string_n(code, text.data(), text.size());
  return text.data();
}
#endif

}  // namespace detail

#ifndef QCOLL_NO_OPENSSL
/// HMAC-SHA256 of `message` under `key` (RFC 2104), by OpenSSL.
inline digest hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> message) {
  digest out{};
  unsigned length = 0;
  // A null key pointer with length 0 is refused by some OpenSSL versions: point at `out`.
  const void* key_bytes = key.empty() ? static_cast<const void*>(out.data()) : key.data();
  if (HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), reinterpret_cast<unsigned char*>(out.data()), &length) == nullptr ||
      length != out.size())
    throw qcoll::error(make_error_code(errc::protocol_error),
                       qcoll::detail::format("OpenSSL's HMAC-SHA256 failed: {}", detail::openssl_reason(ERR_get_error())));
  return out;
}
#endif

/// Equality whose running time depends only on the sizes, not on where the bytes
/// differ, so comparing a received proof leaks nothing about the expected one.
inline bool constant_time_equal(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  if (a.size() != b.size()) return false;
#ifndef QCOLL_NO_OPENSSL
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
#else
  return std::equal(a.begin(), a.end(), b.begin());  // nothing secret to compare in such a build
#endif
}

/// Fills `out` with random bytes: OpenSSL's generator (seeded by the operating system).
/// Without OpenSSL there is no secret for a nonce to protect, and std::random_device serves.
inline void random_bytes(std::span<std::byte> out) {
#ifndef QCOLL_NO_OPENSSL
  if (out.empty()) return;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1)
    throw qcoll::error(make_error_code(errc::protocol_error),
                       qcoll::detail::format("OpenSSL could not generate random bytes: {}", detail::openssl_reason(ERR_get_error())));
#else
  std::random_device device;
  for (std::byte& b : out) b = static_cast<std::byte>(device());
#endif
}

}  // namespace qcoll::rendezvous
