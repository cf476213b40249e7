#pragma once
/// @file
/// The byte stream that the process transports (shared memory, TCP) carry between a
/// pair of ranks, one stream per direction. A message is a `message` record (its
/// header and total length) followed by `data` records of at most max_chunk_bytes
/// each; chunks let an `abort` record follow any chunk, so an aborting rank can tell
/// its peers why even in the middle of a large message.
///
/// Every record starts with a 16-byte header, little-endian, read field by field:
///   u16 magic 0x5143 · u8 version 2 · u8 type · u32 tag (abort: the error code) · u64 length
/// message: length = total payload bytes; followed by the 24-byte message_header
///          (u64 sequence, u64 count, u32 root, u8 kind, u8 type, u8 op, u8 algorithm).
/// data:    length = chunk bytes, 1 … max_chunk_bytes, never past the message's end.
/// checked_data: the same, tag = the chunk's CRC-32C (detail/crc32c.hpp), which the
///          receiver checks before the chunk's message completes. Sent where payload
///          checksums are on (engine_options::payload_checksums: TCP's default); a
///          receiver with them on refuses plain data records.
/// abort:   length = reason bytes, at most max_reason_bytes; tag = qcoll::errc value.
/// waiting: length = 0; tag = the rank the sender is waiting for. Sent only between
///          messages, by a rank whose wait has lasted a while, to every peer: it says
///          "alive, waiting", so a peer waiting on it blames the rank it waits for,
///          not it (engine::wait).
/// Anything else is a protocol error: the receiver never allocates a size a peer
/// chose, and only writes into a posted buffer of exactly the announced length.

#include <qcoll/detail/little_endian.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace qcoll::transports::stream {

inline constexpr std::uint16_t record_magic = 0x5143;  // "CQ" on the wire
/// 4: checked data records. 3: waiting records. 2: data records of up to 1 MiB (1: 256 KiB). A peer of another
/// version fails the stream with "record version", not with a record it would take for
/// malformed.
inline constexpr std::uint8_t record_version = 4;
inline constexpr std::size_t record_header_bytes = 16;
inline constexpr std::size_t message_header_bytes = 24;
/// Large enough that a ring slice (tuning_table::ring_slice_bytes) is one record, whose
/// header then costs one read and no copy through tcp_channels' inbox per slice; small
/// enough that an abort record waits for at most this much payload ahead of it (8 ms at
/// 1 Gbit/s). 256 KiB against 1 MiB, 4 ranks on tcp, busbw at 4 / 16 / 64 MiB, three
/// alternating rounds (2026-11-26, 2-vCPU AMD EPYC, `collective_bench --job -b 1M -e 64M
/// -f 4 -c 0 -m 20`): 1.42–1.48 / 1.24–1.30 / 1.35–1.37 against 1.62–1.79 / 1.37–1.43 /
/// 1.44–1.49; 2 ranks within noise (16 MiB 2.63–2.98 against 2.75–3.13). 4 MiB: the
/// same at 4 and 16 MiB, 1.51–1.53 at 64 MiB; not taken, for the abort's sake.
inline constexpr std::size_t max_chunk_bytes = std::size_t{1} << 20;
inline constexpr std::size_t max_reason_bytes = 4096;

enum class record_type : std::uint8_t { message = 1, data = 2, abort = 3, waiting = 4, checked_data = 5 };

struct record_header {
  record_type type = record_type::message;
  std::uint32_t tag = 0;
  std::uint64_t length = 0;
};

inline void write_record_header(std::span<std::byte, record_header_bytes> out, const record_header& h) noexcept {
  qcoll::detail::store_le(out.data(), record_magic);
  out[2] = static_cast<std::byte>(record_version);
  out[3] = static_cast<std::byte>(h.type);
  qcoll::detail::store_le(out.data() + 4, h.tag);
  qcoll::detail::store_le(out.data() + 8, h.length);
}

/// The header, or a description of what is wrong with it.
inline std::optional<record_header> read_record_header(std::span<const std::byte, record_header_bytes> in,
                                                       std::string& problem) {
  if (qcoll::detail::load_le<std::uint16_t>(in.data()) != record_magic) {
    problem = "bad record magic (not a qcoll stream)";
    return std::nullopt;
  }
  if (std::to_integer<std::uint8_t>(in[2]) != record_version) {
    problem = "record version " + std::to_string(std::to_integer<unsigned>(in[2])) + ", expected " +
                std::to_string(record_version);
    return std::nullopt;
  }
  record_header h;
  h.type = static_cast<record_type>(in[3]);
  h.tag = qcoll::detail::load_le<std::uint32_t>(in.data() + 4);
  h.length = qcoll::detail::load_le<std::uint64_t>(in.data() + 8);
  switch (h.type) {
    case record_type::message: return h;
    case record_type::data:
    case record_type::checked_data:
      if (h.length == 0 || h.length > max_chunk_bytes) {
        problem = "data record of " + std::to_string(h.length) + " bytes (1 … " + std::to_string(max_chunk_bytes) +
                  " allowed)";
        return std::nullopt;
      }
      return h;
    case record_type::abort:
      if (h.length > max_reason_bytes) {
        problem = "abort record of " + std::to_string(h.length) + " bytes (at most 4096 allowed)";
        return std::nullopt;
      }
      return h;
    case record_type::waiting:
      if (h.length != 0) {
        problem = "waiting record of " + std::to_string(h.length) + " bytes (0 allowed)";
        return std::nullopt;
      }
      return h;
  }
  problem = "unknown record type " + std::to_string(std::to_integer<unsigned>(in[3]));
  return std::nullopt;
}

inline void write_message_header(std::span<std::byte, message_header_bytes> out, const message_header& h) noexcept {
  qcoll::detail::store_le(out.data(), h.sequence);
  qcoll::detail::store_le(out.data() + 8, h.count);
  qcoll::detail::store_le(out.data() + 16, h.root);
  out[20] = static_cast<std::byte>(h.kind);
  out[21] = static_cast<std::byte>(h.type);
  out[22] = static_cast<std::byte>(h.op);
  out[23] = static_cast<std::byte>(h.way);
}

/// Enum fields are checked, so a header from a peer is always printable.
inline std::optional<message_header> read_message_header(std::span<const std::byte, message_header_bytes> in,
                                                         std::string& problem) {
  message_header h;
  h.sequence = qcoll::detail::load_le<std::uint64_t>(in.data());
  h.count = qcoll::detail::load_le<std::uint64_t>(in.data() + 8);
  h.root = qcoll::detail::load_le<std::uint32_t>(in.data() + 16);
  const auto kind = std::to_integer<std::uint8_t>(in[20]);
  const auto type = std::to_integer<std::uint8_t>(in[21]);
  const auto op = std::to_integer<std::uint8_t>(in[22]);
  const auto way = std::to_integer<std::uint8_t>(in[23]);
  if (kind < 1 || kind > max_collective || type < 1 || type > max_dtype || op < 1 || op > max_reduce_op ||
      way > max_algorithm) {
    problem = "message header with an unknown collective, type, operation or algorithm";
    return std::nullopt;
  }
  h.kind = static_cast<collective>(kind);
  h.type = static_cast<dtype>(type);
  h.op = static_cast<reduce_op>(op);
  h.way = static_cast<algorithm>(way);
  return h;
}

/// qcoll's own codes cross the wire as their value; anything else becomes `aborted`.
inline std::uint32_t wire_code(std::error_code code) noexcept {
  return code.category() == error_category() ? static_cast<std::uint32_t>(code.value())
                                             : static_cast<std::uint32_t>(errc::aborted);
}

inline std::error_code code_from_wire(std::uint32_t value) noexcept {
  if (value < static_cast<std::uint32_t>(errc::invalid_argument) || value > static_cast<std::uint32_t>(errc::aborted))
    return make_error_code(errc::aborted);
  return make_error_code(static_cast<errc>(value));
}

}  // namespace qcoll::transports::stream
