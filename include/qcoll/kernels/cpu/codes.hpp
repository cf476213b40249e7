#pragma once
/// @file
/// Packing and unpacking the fixed-width codes of a group record, shared by every
/// backend (the arithmetic is vectorised; the bit packing is this one piece of code).

#include <qcoll/kernels/cpu/abi.hpp>
#include <qcoll/quantizers/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_CPU_KERNELS_BEGIN

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
inline void pack_codes(std::span<const std::uint32_t> codes, unsigned bits, std::byte* out) noexcept {
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

QCOLL_CPU_KERNELS_END
