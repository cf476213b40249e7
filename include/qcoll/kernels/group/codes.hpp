#pragma once
/// @file
/// Packing and unpacking the fixed-width codes of a group record, shared by every
/// backend (the arithmetic is vectorised; the bit packing is this one piece of code).

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_KERNELS_BEGIN

/// Calls visit(first, g, record) for each group of n values — `first` its first
/// value, g its size (the last one may be shorter), `record` its record — the one
/// walk over a frame's records that every kernel driver shares.
template <class Byte, class Visit>
inline void for_each_group(const quantizers::wire::record_layout& layout, std::size_t n, Byte* records, Visit&& visit) {
  for (std::size_t first = 0; first < n; first += layout.group) {
    const std::size_t g = layout.group < n - first ? layout.group : n - first;
    visit(first, g, records);
    records += layout.record_bytes(g);
  }
}

/// What a group that keeps its residual (NaN or Inf) does with split residuals:
/// residual_out = residual_in. Nothing in place or without error feedback (null).
inline void keep_residual(const float* residual_in, float* residual_out, std::size_t g) noexcept {
  if (residual_out && residual_out != residual_in) __builtin_memcpy(residual_out, residual_in, g * sizeof(float));
}

/// Packs codes of `bits` bits (1…32) LSB-first, as docs/wire-format.md describes.
/// Codes of 1, 2 or 4 bits: whole bytes of 8/Bits codes at a time, a loop compilers
/// vectorize (the bit-at-a-time loop below took two thirds of a 4-bit compressed
/// allreduce). Returns how many codes it packed; the caller packs the rest.
template <unsigned Bits>
std::size_t pack_whole_bytes(std::span<const std::uint32_t> codes, std::byte* out) noexcept {
  constexpr unsigned per_byte = 8 / Bits;
  constexpr std::uint32_t mask = (1u << Bits) - 1;
  const std::size_t bytes = codes.size() / per_byte;
  for (std::size_t i = 0; i < bytes; ++i) {
    std::uint32_t byte = 0;
    for (unsigned k = 0; k < per_byte; ++k) byte |= (codes[i * per_byte + k] & mask) << (k * Bits);
    out[i] = static_cast<std::byte>(byte);
  }
  return bytes * per_byte;
}

template <unsigned Bits>
std::size_t unpack_whole_bytes(const std::byte* in, std::span<std::uint32_t> codes) noexcept {
  constexpr unsigned per_byte = 8 / Bits;
  constexpr std::uint32_t mask = (1u << Bits) - 1;
  const std::size_t bytes = codes.size() / per_byte;
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto byte = std::to_integer<std::uint32_t>(in[i]);
    for (unsigned k = 0; k < per_byte; ++k) codes[i * per_byte + k] = (byte >> (k * Bits)) & mask;
  }
  return bytes * per_byte;
}

/// Packs codes of Bits < 8 bits eight at a time: eight codes fill exactly Bits bytes,
/// built in one 64-bit word (the bit string's layout, LSB first) and stored byte by
/// byte. Returns how many codes it packed (a multiple of 8).
template <unsigned Bits>
std::size_t pack_eights(std::span<const std::uint32_t> codes, std::byte* out) noexcept {
  static_assert(Bits < 8, "eight codes of Bits bits must fit a 64-bit word");
  constexpr std::uint64_t mask = (std::uint64_t{1} << Bits) - 1;
  const std::size_t eights = codes.size() / 8;
  for (std::size_t e = 0; e < eights; ++e) {
    std::uint64_t word = 0;
    for (unsigned k = 0; k < 8; ++k) word |= (codes[e * 8 + k] & mask) << (k * Bits);
    for (unsigned byte = 0; byte < Bits; ++byte) out[e * Bits + byte] = static_cast<std::byte>(word >> (8 * byte));
  }
  return eights * 8;
}

/// The inverse of pack_eights.
template <unsigned Bits>
std::size_t unpack_eights(const std::byte* in, std::span<std::uint32_t> codes) noexcept {
  static_assert(Bits < 8, "eight codes of Bits bits must fit a 64-bit word");
  constexpr std::uint64_t mask = (std::uint64_t{1} << Bits) - 1;
  const std::size_t eights = codes.size() / 8;
  for (std::size_t e = 0; e < eights; ++e) {
    std::uint64_t word = 0;
    for (unsigned byte = 0; byte < Bits; ++byte)
      word |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(in[e * Bits + byte])) << (8 * byte);
    for (unsigned k = 0; k < 8; ++k) codes[e * 8 + k] = static_cast<std::uint32_t>((word >> (k * Bits)) & mask);
  }
  return eights * 8;
}

inline void pack_codes(std::span<const std::uint32_t> codes, unsigned bits, std::byte* out) noexcept {
  std::size_t done = 0;
  switch (bits) {
    case 1: done = pack_whole_bytes<1>(codes, out); break;
    case 2: done = pack_whole_bytes<2>(codes, out); break;
    case 3: done = pack_eights<3>(codes, out); break;
    case 4: done = pack_whole_bytes<4>(codes, out); break;
    case 5: done = pack_eights<5>(codes, out); break;
    case 6: done = pack_eights<6>(codes, out); break;
    case 7: done = pack_eights<7>(codes, out); break;
    default: break;
  }
  if (done != 0) {  // the rest fills one last byte from its first bit
    codes = codes.subspan(done);
    out += done * bits / 8;
  }
  switch (bits) {
    case 8:
      for (std::size_t i = 0; i < codes.size(); ++i) out[i] = static_cast<std::byte>(codes[i]);
      return;
    case 16:
      for (std::size_t i = 0; i < codes.size(); ++i) store<std::uint16_t>(out + 2 * i, static_cast<std::uint16_t>(codes[i]));
      return;
    case 32:
      __builtin_memcpy(out, codes.data(), codes.size_bytes());
      return;
    default:
      break;
  }
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  std::uint64_t pending = 0;
  unsigned pending_bits = 0;
  for (const std::uint32_t code : codes) {
    pending |= (code & mask) << pending_bits;
    pending_bits += bits;
    while (pending_bits >= 8) {
      *out++ = static_cast<std::byte>(pending & 0xff);
      pending >>= 8;
      pending_bits -= 8;
    }
  }
  if (pending_bits) *out = static_cast<std::byte>(pending & 0xff);
}

/// The inverse of pack_codes: unpacks codes.size() codes of `bits` bits.
inline void unpack_codes(const std::byte* in, unsigned bits, std::span<std::uint32_t> codes) noexcept {
  std::size_t done = 0;
  switch (bits) {
    case 1: done = unpack_whole_bytes<1>(in, codes); break;
    case 2: done = unpack_whole_bytes<2>(in, codes); break;
    case 3: done = unpack_eights<3>(in, codes); break;
    case 4: done = unpack_whole_bytes<4>(in, codes); break;
    case 5: done = unpack_eights<5>(in, codes); break;
    case 6: done = unpack_eights<6>(in, codes); break;
    case 7: done = unpack_eights<7>(in, codes); break;
    default: break;
  }
  if (done != 0) {
    codes = codes.subspan(done);
    in += done * bits / 8;
  }
  switch (bits) {
    case 8:
      for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint32_t>(in[i]);
      return;
    case 16:
      for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = load<std::uint16_t>(in + 2 * i);
      return;
    case 32:
      __builtin_memcpy(codes.data(), in, codes.size_bytes());
      return;
    default:
      break;
  }
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  std::uint64_t pending = 0;
  unsigned pending_bits = 0;
  for (std::uint32_t& code : codes) {
    while (pending_bits < bits) {
      pending |= static_cast<std::uint64_t>(*in++) << pending_bits;
      pending_bits += 8;
    }
    code = static_cast<std::uint32_t>(pending & mask);
    pending >>= bits;
    pending_bits -= bits;
  }
}

QCOLL_KERNELS_END
