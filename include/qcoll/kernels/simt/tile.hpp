#pragma once
/// @file
/// The GPU's quantizer kernels, written once for a *tile*: 16 lanes that run the same
/// code in lockstep, one group (or bfp block) at a time. Lane j holds the group's
/// values j, j + 16, j + 32, …: exactly the values the CPU's summation lane j adds
/// (kernels/group/lanes.hpp), in the same order, and the folds across lanes follow
/// fold_lanes, so the sums — and every table computed from them — are the CPU's bits.
/// The per-value and per-group decisions are kernels/group/'s own functions.
///
/// CUDA runs a tile on half a warp (kernels/cuda/tile.cuh); the CPU tests run the
/// same code on 16 threads (tests/support/threaded_tile.hpp) and compare frames and
/// residuals with the reference, so the kernels' logic — indexing, the last short
/// group, packing, the rare paths — is tested before a GPU ever runs it.
///
/// A Tile provides these members; every lane calls each of them, in the same order
/// (they are collective, as CUDA's *_sync intrinsics are):
///
///   unsigned lane() const                           0 … 15
///   float fold(float v) const                       v_j += v_{j+8}, then +4, +2, +1 (fold_lanes); lane 0's
///                                                   result, on every lane
///   float lowest(float v) const                     the v with no smaller v (b < a ? b : a), on every lane
///   float highest(float v) const                    the v with no larger v
///   std::uint32_t highest(std::uint32_t v) const
///   std::uint32_t total(std::uint32_t v) const      the sum of v
///   bool any(bool p) const, bool all(bool p) const
///   std::uint32_t ballot(bool p) const              bit j = lane j's p
///   std::uint32_t shuffle(std::uint32_t v, unsigned from) const   lane `from`'s v
///   float shuffle(float v, unsigned from) const
///
/// Control flow that depends on values stays uniform across a tile: a branch all
/// lanes take alike, or work that one lane does while the others skip it (lane 0
/// storing a table), never a collective inside a branch some lanes skip.

#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/lanes.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_KERNELS_BEGIN
namespace simt {

inline constexpr unsigned tile_lanes = 16;
static_assert(tile_lanes == summation_lanes, "a tile's lanes are the summation lanes");

/// Copies residual_in to residual_out over a group's g values (a group that keeps
/// its residual); nothing in place or without error feedback (null).
template <class Tile>
QCOLL_HOST_DEVICE void keep_residual(const Tile& tile, const float* residual_in, float* residual_out,
                                     std::size_t g) noexcept {
  if (!residual_out || residual_out == residual_in) return;
  for (std::size_t i = tile.lane(); i < g; i += tile_lanes) residual_out[i] = residual_in[i];
}

/// Zeroes `bytes` bytes at `out`.
template <class Tile>
QCOLL_HOST_DEVICE void zero_bytes(const Tile& tile, std::byte* out, std::size_t bytes) noexcept {
  for (std::size_t k = tile.lane(); k < bytes; k += tile_lanes) out[k] = std::byte{0};
}

/// Stores the codes of 16 consecutive values (lane j's `code`, `bits` wide: 1…16 or
/// 32), packed LSB-first as kernels/group/codes.hpp's pack_codes packs them: 2·bits
/// bytes from `out`, of which only the first `room` are written (the rest belong to
/// the next record). A lane past the group's end passes code 0, so the padding bits
/// of the last byte are zero. Collective.
template <class Tile>
QCOLL_HOST_DEVICE void store_codes(const Tile& tile, std::uint32_t code, unsigned bits, std::byte* out,
                                   std::size_t room) noexcept {
  const unsigned lane = tile.lane();
  if (bits == 1) {  // the one_bit case: one ballot gives both bytes
    const std::uint32_t word = tile.ballot((code & 1u) != 0);
    if (lane < 2 && lane < room) out[lane] = static_cast<std::byte>((word >> (8 * lane)) & 0xffu);
    return;
  }
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  const std::uint64_t own = code & mask;
  const unsigned bytes = 2 * bits;
  // A byte holds bits of at most this many codes: ceil(8 / bits) + 1 (two from 8 bits on).
  const unsigned sources = bits >= 8 ? 2 : (8 + bits - 1) / bits + 1;
  for (unsigned first = 0; first < bytes; first += tile_lanes) {
    const unsigned m = first + lane;  // the byte this lane assembles
    const unsigned start = 8 * m;     // its first bit in the 16 codes' bit string
    const unsigned first_code = start / bits;
    std::uint32_t byte = 0;
    for (unsigned s = 0; s < sources; ++s) {
      const unsigned c = first_code + s;
      const std::uint64_t value = tile.shuffle(static_cast<std::uint32_t>(own), c < tile_lanes ? c : 0);
      if (m < bytes && c < tile_lanes) {
        const unsigned at = c * bits;  // code c's first bit
        byte |= static_cast<std::uint32_t>((at >= start ? value << (at - start) : value >> (start - at)) & 0xffu);
      }
    }
    if (m < bytes && m < room) out[m] = static_cast<std::byte>(byte);
  }
}

/// The `bits`-bit code (1…16 or 32) of value k of a group whose codes start at
/// `codes`, reading only the bytes that hold it.
QCOLL_HOST_DEVICE inline std::uint32_t load_code(const std::byte* codes, std::size_t k, unsigned bits) noexcept {
  const std::size_t first_bit = k * bits;
  const std::size_t first = first_bit / 8, last = (first_bit + bits - 1) / 8;
  std::uint64_t word = 0;
  for (std::size_t b = first; b <= last; ++b)
    word |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(codes[b])) << (8 * (b - first));
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  return static_cast<std::uint32_t>((word >> (first_bit % 8)) & mask);
}

/// Whether the padding bits after the last code of n values are zero (every
/// quantizer's check_records asks it of the last group; the others fill whole bytes).
QCOLL_HOST_DEVICE inline bool last_padding_zero(const quantizers::wire::record_layout& layout,
                                                const std::byte* records, std::size_t n) noexcept {
  if (n == 0) return true;
  const std::size_t full = (n - 1) / layout.group;  // groups before the last
  const std::byte* last = records + full * layout.full_record_bytes();
  return quantizers::wire::padding_is_zero(last + layout.table_bytes, n - full * layout.group, layout.code_bits);
}

/// Where tile `index` of `count` finds its groups: index, index + count, … of a
/// frame of n values in groups of layout.group. Calls encode_group(first, g, record)
/// for each, `first` the group's first value, g its size.
template <class EncodeGroup>
QCOLL_HOST_DEVICE void for_each_tile_group(std::size_t index, std::size_t count,
                                           const quantizers::wire::record_layout& layout, std::size_t n,
                                           std::byte* records, EncodeGroup&& encode_group) {
  const std::size_t groups = layout.groups(n);
  for (std::size_t q = index; q < groups; q += count) {
    const std::size_t first = q * layout.group;
    encode_group(first, n - first < layout.group ? n - first : layout.group, records + q * layout.full_record_bytes());
  }
}

/// Decodes values first, first + stride, … of n: out[i] = value_of(records, i), or
/// out[i] += it. (A grid's threads each take their share; the CPU tests take all.)
template <class ValueOf>
QCOLL_HOST_DEVICE void decode_values(std::size_t first, std::size_t stride, const std::byte* records, std::size_t n,
                                     float* out, bool accumulate_into, const ValueOf& value_of) noexcept {
  for (std::size_t i = first; i < n; i += stride) {
    const float value = value_of(records, i);
    out[i] = accumulate_into ? accumulate(out[i], value) : value;
  }
}

struct always_valid {
  QCOLL_HOST_DEVICE bool operator()(const std::byte*, std::size_t) const noexcept { return true; }
};

/// Whether this share of a frame's records is one the quantizer writes:
/// value_valid(records, i) for values first, first + stride, … of n, group_valid(records, k)
/// for groups likewise, and (for first 0) the last group's padding.
template <class ValueValid, class GroupValid>
QCOLL_HOST_DEVICE bool records_valid(std::size_t first, std::size_t stride,
                                     const quantizers::wire::record_layout& layout, const std::byte* records,
                                     std::size_t n, const ValueValid& value_valid,
                                     const GroupValid& group_valid) noexcept {
  if (first == 0 && !last_padding_zero(layout, records, n)) return false;
  const std::size_t groups = layout.groups(n);
  for (std::size_t k = first; k < groups; k += stride)
    if (!group_valid(records, k)) return false;
  for (std::size_t i = first; i < n; i += stride)
    if (!value_valid(records, i)) return false;
  return true;
}

}  // namespace simt
QCOLL_KERNELS_END
