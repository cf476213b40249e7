#pragma once
/// @file
/// The TCP store's wire protocol, which its server (tcp_store_server.hpp) and client
/// (tcp_store_client.hpp) share: the limits, the request and response frames, and the
/// checks that parse them. Plain logic over bytes, no sockets, so a fuzz target drives it.
///
/// Protocol (after the handshake of handshake.hpp on channel::store). All integers
/// little-endian; every length is checked against the limits before its bytes are read.
///
///     request, 12-byte header then key then value
///        0  op u8            1 set, 2 get, 3 wait, 4 cancel
///        1  reserved u8      0
///        2  key size u16     ≤ max_key_size (256)
///        4  request id u32   echoed in the response
///        8  value size u32   set: ≤ max_value_size (64 KiB); get: 0; wait: 4 (u32 count); cancel: 0
///     response, 12-byte header then value
///        0  status u8        0 ok
///        1  reserved u8 × 3
///        4  request id u32
///        8  value size u32   ≤ max_value_size (the value of a get, else 0)
///
/// - set stores (overwrites) the value and is acknowledged once every later get sees it.
/// - get is answered when the key exists; wait when keys prefix+"0" … prefix+(count−1)
///   all exist. Until then the server parks the request (it never blocks its thread).
/// - cancel (id = the request to forget) drops a parked get or wait and has no response:
///   a client that timed out sends it. Responses carry the request id, so a response that
///   crossed a cancel is recognised as stale and skipped, and the stream stays in step.
/// - A malformed request closes that connection (logged); the server serves on.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/detail/little_endian.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qcoll::rendezvous {

inline constexpr std::size_t max_key_size = 256;
inline constexpr std::size_t max_value_size = 64 * 1024;

namespace detail {

/// missing: which keys of a wait's range do not exist yet (what a timed-out wait reports).
enum class store_op : std::uint8_t { set = 1, get = 2, wait = 3, cancel = 4, missing = 5 };
/// A missing reply: the number of absent keys (u32), then the first of them (u32 each).
inline constexpr std::size_t missing_listed = 16;
inline constexpr std::size_t store_header_size = 12;
inline constexpr std::uint8_t store_ok = 0;

struct store_request {
  store_op op{};
  std::uint16_t key_size = 0;
  std::uint32_t id = 0;
  std::uint32_t value_size = 0;
};

/// Parses and checks a request header; returns why it is malformed, or nothing.
inline std::optional<std::string> parse_request(std::span<const std::byte> header, store_request& request) {
  const auto op = std::to_integer<std::uint8_t>(header[0]);
  request.key_size = qcoll::detail::load_le<std::uint16_t>(header.data() + 2);
  request.id = qcoll::detail::load_le<std::uint32_t>(header.data() + 4);
  request.value_size = qcoll::detail::load_le<std::uint32_t>(header.data() + 8);
  if (op < 1 || op > 5) return qcoll::detail::format("unknown request type {}", op);
  request.op = static_cast<store_op>(op);
  if (header[1] != std::byte{0}) return std::string("malformed request header (reserved byte set)");
  if (request.key_size > max_key_size)
    return qcoll::detail::format("a key of {} bytes (at most {})", request.key_size, max_key_size);
  switch (request.op) {
    case store_op::set:
      if (request.value_size > max_value_size)
        return qcoll::detail::format("a value of {} bytes (at most {})", request.value_size, max_value_size);
      break;
    case store_op::get:
      if (request.value_size != 0) return qcoll::detail::format("a get with a {}-byte value", request.value_size);
      break;
    case store_op::wait:
    case store_op::missing:
      if (request.value_size != 4) return qcoll::detail::format("a wait with a {}-byte count (must be 4)", request.value_size);
      break;
    case store_op::cancel:
      if (request.key_size != 0 || request.value_size != 0) return std::string("a cancel with a key or value");
      break;
  }
  return std::nullopt;
}

inline std::vector<std::byte> encode_frame(std::uint8_t first, std::uint16_t key_size, std::uint32_t id,
                                           std::span<const std::byte> key, std::span<const std::byte> value) {
  std::vector<std::byte> frame(store_header_size + key.size() + value.size());
  frame[0] = std::byte{first};
  qcoll::detail::store_le<std::uint16_t>(frame.data() + 2, key_size);
  qcoll::detail::store_le<std::uint32_t>(frame.data() + 4, id);
  qcoll::detail::store_le<std::uint32_t>(frame.data() + 8, static_cast<std::uint32_t>(value.size()));
  if (!key.empty()) std::memcpy(frame.data() + store_header_size, key.data(), key.size());
  if (!value.empty()) std::memcpy(frame.data() + store_header_size + key.size(), value.data(), value.size());
  return frame;
}

struct store_response {
  std::uint8_t status = 0;
  std::uint32_t id = 0;
  std::string value;
};

/// Takes the next whole response out of `inbox` (the bytes a client received), or
/// nothing while it holds none. @par Errors errc::protocol_error for a value over
/// max_value_size (the stream cannot be trusted after it).
inline std::optional<store_response> take_response(std::vector<std::byte>& inbox) {
  if (inbox.size() < store_header_size) return std::nullopt;
  const std::uint32_t size = qcoll::detail::load_le<std::uint32_t>(inbox.data() + 8);
  if (size > max_value_size)
    qcoll::detail::throw_error(errc::protocol_error, "a response with a value of {} bytes (at most {})", size,
                               max_value_size);
  if (inbox.size() < store_header_size + size) return std::nullopt;
  store_response out{std::to_integer<std::uint8_t>(inbox[0]), qcoll::detail::load_le<std::uint32_t>(inbox.data() + 4),
                     std::string(reinterpret_cast<const char*>(inbox.data()) + store_header_size, size)};
  inbox.erase(inbox.begin(), inbox.begin() + static_cast<std::ptrdiff_t>(store_header_size + size));
  return out;
}

}  // namespace detail

}  // namespace qcoll::rendezvous
