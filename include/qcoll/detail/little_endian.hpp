#pragma once
/// @file
/// Integers on the wire: little-endian, byte by byte, so frames may start at any
/// address and mean the same on any host. Shared by the record stream, the handshake
/// and the store protocol.

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace qcoll::detail {

template <class Int>
  requires std::is_unsigned_v<Int>
constexpr void store_le(std::byte* out, Int value) noexcept {
  for (std::size_t i = 0; i < sizeof(Int); ++i) out[i] = static_cast<std::byte>(value >> (8 * i));
}

template <class Int>
  requires std::is_unsigned_v<Int>
constexpr Int load_le(const std::byte* in) noexcept {
  Int value = 0;
  for (std::size_t i = 0; i < sizeof(Int); ++i) value |= static_cast<Int>(std::to_integer<Int>(in[i]) << (8 * i));
  return value;
}

}  // namespace qcoll::detail
