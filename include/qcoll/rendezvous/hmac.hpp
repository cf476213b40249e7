#pragma once
/// @file
/// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), with no external crypto library.
///
/// The rendezvous needs exactly two things from cryptography: a fixed-size name for a
/// job id of any length (sha256) and a proof that a peer knows the job's secret
/// without sending it (hmac_sha256). Both are small, so qcoll carries them instead of
/// a dependency. Not hardened against side channels beyond constant_time_equal;
/// the secret only gates who may join a job.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace qcoll::rendezvous {

/// A SHA-256 or HMAC-SHA256 result.
using digest = std::array<std::byte, 32>;

/// Incremental SHA-256: update() any number of times, then finish() once.
class sha256_hasher {
 public:
  sha256_hasher() noexcept = default;

  void update(std::span<const std::byte> data) noexcept {
    total_bytes_ += data.size();
    while (!data.empty()) {
      const std::size_t take = std::min(data.size(), block_.size() - filled_);
      std::memcpy(block_.data() + filled_, data.data(), take);
      filled_ += take;
      data = data.subspan(take);
      if (filled_ == block_.size()) {
        compress();
        filled_ = 0;
      }
    }
  }

  void update(std::string_view text) noexcept { update(std::as_bytes(std::span(text.data(), text.size()))); }

  /// The digest of everything passed to update(). The hasher is spent afterwards.
  digest finish() noexcept {
    const std::uint64_t bit_length = total_bytes_ * 8;
    block_[filled_++] = std::byte{0x80};
    if (filled_ > 56) {  // no room for the length: pad out this block
      std::memset(block_.data() + filled_, 0, block_.size() - filled_);
      compress();
      filled_ = 0;
    }
    std::memset(block_.data() + filled_, 0, 56 - filled_);
    for (int i = 0; i < 8; ++i) block_[56 + i] = static_cast<std::byte>(bit_length >> (56 - 8 * i));
    compress();
    digest out{};
    for (std::size_t i = 0; i < 8; ++i)
      for (std::size_t b = 0; b < 4; ++b) out[4 * i + b] = static_cast<std::byte>(state_[i] >> (24 - 8 * b));
    return out;
  }

 private:
  static constexpr std::array<std::uint32_t, 64> round_constants{
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

  void compress() noexcept {
    std::array<std::uint32_t, 64> w{};
    for (std::size_t i = 0; i < 16; ++i)
      w[i] = std::uint32_t(block_[4 * i]) << 24 | std::uint32_t(block_[4 * i + 1]) << 16 |
             std::uint32_t(block_[4 * i + 2]) << 8 | std::uint32_t(block_[4 * i + 3]);
    for (std::size_t i = 16; i < 64; ++i) {
      const std::uint32_t s0 = std::rotr(w[i - 15], 7) ^ std::rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = std::rotr(w[i - 2], 17) ^ std::rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto [a, b, c, d, e, f, g, h] = state_;
    for (std::size_t i = 0; i < 64; ++i) {
      const std::uint32_t t1 = h + (std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                               round_constants[i] + w[i];
      const std::uint32_t t2 = (std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const std::array<std::uint32_t, 8> add{a, b, c, d, e, f, g, h};
    for (std::size_t i = 0; i < 8; ++i) state_[i] += add[i];
  }

  std::array<std::uint32_t, 8> state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<std::byte, 64> block_{};
  std::size_t filled_ = 0;
  std::uint64_t total_bytes_ = 0;
};

inline digest sha256(std::span<const std::byte> data) noexcept {
  sha256_hasher hasher;
  hasher.update(data);
  return hasher.finish();
}

inline digest sha256(std::string_view text) noexcept { return sha256(std::as_bytes(std::span(text.data(), text.size()))); }

/// HMAC-SHA256 of `message` under `key` (RFC 2104; a key longer than 64 bytes is hashed first).
inline digest hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> message) noexcept {
  std::array<std::byte, 64> block_key{};
  if (key.size() > block_key.size()) {
    const digest hashed = sha256(key);
    std::memcpy(block_key.data(), hashed.data(), hashed.size());
  } else if (!key.empty()) {
    std::memcpy(block_key.data(), key.data(), key.size());
  }
  std::array<std::byte, 64> pad{};
  for (std::size_t i = 0; i < pad.size(); ++i) pad[i] = block_key[i] ^ std::byte{0x36};
  sha256_hasher inner;
  inner.update(pad);
  inner.update(message);
  const digest inner_digest = inner.finish();
  for (std::size_t i = 0; i < pad.size(); ++i) pad[i] = block_key[i] ^ std::byte{0x5c};
  sha256_hasher outer;
  outer.update(pad);
  outer.update(inner_digest);
  return outer.finish();
}

/// Equality whose running time depends only on the sizes, not on where the bytes
/// differ, so comparing a received proof leaks nothing about the expected one.
inline bool constant_time_equal(std::span<const std::byte> a, std::span<const std::byte> b) noexcept {
  if (a.size() != b.size()) return false;
  unsigned difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    difference |= std::to_integer<unsigned>(a[i] ^ b[i]);
  // Read through a volatile so the compiler cannot turn the loop into an early exit.
  volatile unsigned result = difference;
  return result == 0;
}

}  // namespace qcoll::rendezvous
