#pragma once
/// @file
/// The encoded frame every quantizer writes (docs/wire-format.md): a 24-byte
/// header, then one record per group. Little-endian; every multi-byte field is
/// read and written with memcpy, so a frame may start at any address.
///
///   offset size  field
///        0    1  magic 0x51 ('Q')
///        1    1  format version (1)
///        2    1  scheme: 1 identity, 2 one_bit, 3 k_level, 4 bfp
///        3    1  value dtype (qcoll::dtype)
///        4    1  parameter a (scheme-specific)
///        5    1  parameter b (scheme-specific)
///        6    2  reserved, 0
///        8    4  group size (0: the whole buffer is one group)
///       12    4  reserved, 0
///       16    8  element count
///       24       group records: [table][packed codes], groups of `group size`
///                values, the last one possibly shorter

#include <qcoll/core/error.hpp>
#include <qcoll/core/host_device.hpp>
#include <qcoll/core/types.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <system_error>

namespace qcoll::quantizers::wire {

static_assert(std::endian::native == std::endian::little, "qcoll's wire format assumes a little-endian host");

inline constexpr std::uint8_t magic = 0x51;
inline constexpr std::uint8_t format_version = 1;
inline constexpr std::size_t header_size = 24;
/// The largest group a frame may declare: counts within a group stay exact in float.
inline constexpr std::size_t max_group_size = std::size_t{1} << 24;

enum class scheme : std::uint8_t { identity = 1, one_bit = 2, k_level = 3, bfp = 4 };

struct frame_header {
  wire::scheme scheme{};
  dtype type{};
  std::uint8_t parameter_a = 0;
  std::uint8_t parameter_b = 0;
  std::uint32_t group_size = 0;
  std::uint64_t count = 0;
};

/// How a frame's payload is cut into records. Every group but the last holds
/// `group` values; a record is `table_bytes` of reconstruction data followed by
/// the group's codes, `code_bits` each, packed LSB-first.
struct record_layout {
  std::size_t group = 1;
  std::size_t table_bytes = 0;
  unsigned code_bits = 8;

  QCOLL_HOST_DEVICE constexpr std::size_t codes_bytes(std::size_t values) const noexcept {
    return (values * code_bits + 7) / 8;
  }
  QCOLL_HOST_DEVICE constexpr std::size_t record_bytes(std::size_t values) const noexcept {
    return table_bytes + codes_bytes(values);
  }
  QCOLL_HOST_DEVICE constexpr std::size_t full_record_bytes() const noexcept { return record_bytes(group); }
  QCOLL_HOST_DEVICE constexpr std::size_t groups(std::size_t n) const noexcept { return (n + group - 1) / group; }
  QCOLL_HOST_DEVICE constexpr std::size_t payload_bytes(std::size_t n) const noexcept {
    const std::size_t full = n / group;
    const std::size_t rest = n % group;
    return full * full_record_bytes() + (rest ? record_bytes(rest) : 0);
  }
  QCOLL_HOST_DEVICE constexpr std::size_t frame_bytes(std::size_t n) const noexcept {
    return header_size + payload_bytes(n);
  }
};

/// Each scheme's records (docs/wire-format.md): the table, then the codes.
QCOLL_HOST_DEVICE inline constexpr record_layout one_bit_layout(std::size_t group) noexcept {
  return {.group = group, .table_bytes = 2 * sizeof(float), .code_bits = 1};  // bin 0 value, bin 1 value
}
QCOLL_HOST_DEVICE inline constexpr record_layout k_level_layout(std::size_t group, unsigned code_bits) noexcept {
  return {.group = group, .table_bytes = 2 * sizeof(float), .code_bits = code_bits};  // minimum, step
}
QCOLL_HOST_DEVICE inline constexpr record_layout bfp_layout(std::size_t block, unsigned mantissa_bits) noexcept {
  return {.group = block, .table_bytes = 1, .code_bits = mantissa_bits};  // shared exponent
}

namespace detail {
template <class T>
QCOLL_HOST_DEVICE inline void store(std::byte* at, T value) noexcept {
  std::memcpy(at, &value, sizeof value);
}
template <class T>
QCOLL_HOST_DEVICE inline T load(const std::byte* at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}
}  // namespace detail

/// Writes the 24 header bytes at `at` (device code writes a device frame's header).
QCOLL_HOST_DEVICE inline void write_header(const frame_header& header, std::byte* at) noexcept {
  for (std::size_t i = 0; i < header_size; ++i) at[i] = std::byte{0};
  detail::store<std::uint8_t>(at + 0, magic);
  detail::store<std::uint8_t>(at + 1, format_version);
  detail::store<std::uint8_t>(at + 2, static_cast<std::uint8_t>(header.scheme));
  detail::store<std::uint8_t>(at + 3, static_cast<std::uint8_t>(header.type));
  detail::store<std::uint8_t>(at + 4, header.parameter_a);
  detail::store<std::uint8_t>(at + 5, header.parameter_b);
  detail::store<std::uint32_t>(at + 8, header.group_size);
  detail::store<std::uint64_t>(at + 16, header.count);
}

inline void write_header(const frame_header& header, std::span<std::byte> frame) noexcept {
  write_header(header, frame.data());
}

/// Checks that `frame` is exactly the frame `expected` describes, `frame_size`
/// bytes long. Nothing past the header is read. A different count gives
/// count_mismatch, a different value type type_mismatch, anything else
/// (truncated, oversize, foreign, another version, other settings, nonzero
/// reserved bytes) protocol_error.
/// check_header's verdict as a plain errc value (0: the header is right), for code
/// that runs on the device, where std::error_code does not. `frame` holds
/// `frame_bytes` bytes; the header is read only when there are 24.
QCOLL_HOST_DEVICE inline int header_verdict(const std::byte* frame, std::size_t frame_bytes,
                                            const frame_header& expected, std::size_t frame_size) noexcept {
  if (frame_bytes < header_size) return static_cast<int>(errc::protocol_error);
  const std::byte* at = frame;
  if (detail::load<std::uint8_t>(at + 0) != magic || detail::load<std::uint8_t>(at + 1) != format_version ||
      detail::load<std::uint8_t>(at + 2) != static_cast<std::uint8_t>(expected.scheme) ||
      detail::load<std::uint16_t>(at + 6) != 0 || detail::load<std::uint32_t>(at + 12) != 0)
    return static_cast<int>(errc::protocol_error);
  if (detail::load<std::uint8_t>(at + 3) != static_cast<std::uint8_t>(expected.type))
    return static_cast<int>(errc::type_mismatch);
  if (detail::load<std::uint8_t>(at + 4) != expected.parameter_a ||
      detail::load<std::uint8_t>(at + 5) != expected.parameter_b ||
      detail::load<std::uint32_t>(at + 8) != expected.group_size)
    return static_cast<int>(errc::protocol_error);
  if (detail::load<std::uint64_t>(at + 16) != expected.count) return static_cast<int>(errc::count_mismatch);
  if (frame_bytes != frame_size) return static_cast<int>(errc::protocol_error);
  return 0;
}

inline std::error_code check_header(std::span<const std::byte> frame, const frame_header& expected,
                                    std::size_t frame_size) noexcept {
  const int verdict = header_verdict(frame.data(), frame.size(), expected, frame_size);
  if (verdict == 0) return {};
  return make_error_code(static_cast<errc>(verdict));
}

/// Codes are packed LSB-first: code i of a group occupies bits [i*b, i*b + b) of
/// the little-endian bit string that starts at the group's first code byte
/// (kernels/group/codes.hpp packs them). Unused bits of the last byte are zero.
///
/// True when the bits after the last code of a packed group are all zero, as the
/// encoder leaves them (a decoder rejects anything else as malformed).
QCOLL_HOST_DEVICE inline bool padding_is_zero(const std::byte* codes, std::size_t values, unsigned bits) noexcept {
  const std::size_t used_bits = values * bits;
  if (used_bits % 8 == 0) return true;
  const auto last = static_cast<unsigned>(codes[used_bits / 8]);
  return (last >> (used_bits % 8)) == 0;
}

}  // namespace qcoll::quantizers::wire
