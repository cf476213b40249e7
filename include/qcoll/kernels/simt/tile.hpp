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
///   void sync() const                               every lane's memory writes before it are seen by
///                                                   every lane after it (the stage, below)
///
/// Control flow that depends on values stays uniform across a tile: a branch all
/// lanes take alike, or work that one lane does while the others skip it (lane 0
/// storing a table), never a collective inside a branch some lanes skip.

#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/lanes.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
  if (bits % 8 == 0) {  // whole bytes: each lane stores its own code's
    const unsigned width = bits / 8;
    for (unsigned b = 0; b < width; ++b)
      if (lane * width + b < room) out[lane * width + b] = static_cast<std::byte>((own >> (8 * b)) & 0xffu);
    return;
  }
  if (bits == 2 || bits == 4) {  // a byte is the codes of 8 / bits consecutive lanes
    const unsigned shift = bits == 2 ? 2 : 1;  // log2(8 / bits): shifts, not a division by a variable
    const unsigned per_byte = 1u << shift;
    std::uint32_t byte = static_cast<std::uint32_t>(own);
    for (unsigned s = 1; s < per_byte; ++s) {
      const unsigned from = lane + s < tile_lanes ? lane + s : lane;
      byte |= tile.shuffle(static_cast<std::uint32_t>(own), from) << (s * bits);
    }
    if ((lane & (per_byte - 1)) == 0 && (lane >> shift) < room)
      out[lane >> shift] = static_cast<std::byte>(byte & 0xffu);
    return;
  }
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

// ---- the values a group encodes: where its reads of x + residual_in go

/// x + residual_in read where they are (fed, kernels/group/abi.hpp).
template <class In>
struct fed_in_place {
  const In* x;
  const float* residual_in;

  QCOLL_HOST_DEVICE float operator()(std::size_t i) const noexcept { return fed(x, residual_in, i); }
  /// f(x, residual_in): for the group code that takes the pointers (the rare sums in double).
  template <class F>
  QCOLL_HOST_DEVICE auto with_pointers(F&& f) const {
    return f(x, residual_in);
  }
};

/// x + residual_in computed once into a tile's stage (stage_fed): the same floats,
/// and fed(values, nullptr, i) is values[i], so the pointer-taking code gives the same
/// bits from the copy.
struct fed_staged {
  const float* values;

  QCOLL_HOST_DEVICE float operator()(std::size_t i) const noexcept { return values[i]; }
  template <class F>
  QCOLL_HOST_DEVICE auto with_pointers(F&& f) const {
    return f(values, static_cast<const float*>(nullptr));
  }
};

/// The most values a tile stages: the CUDA kernels give each tile up to this many
/// floats of shared memory (kernels/cuda/quantizers.cuh). A larger group is read in
/// place.
inline constexpr std::size_t stage_capacity = 2048;
/// The fewest: a stage of small groups holds several, so that its load is one full
/// batch of stage_fed and the shared memory of more tiles fits an SM.
inline constexpr std::size_t min_stage = 256;

/// The stage a tile needs for groups of `group` values: one group, or min_stage
/// values of whole groups; 0 (none) for a group larger than stage_capacity.
QCOLL_HOST_DEVICE inline constexpr std::size_t stage_values_for(std::size_t group) noexcept {
  return group > stage_capacity ? 0 : group < min_stage ? min_stage : group;
}

/// Four values of x from `at` (a multiple of 4), as one vector load on the GPU when
/// the address allows it.
template <class In>
QCOLL_HOST_DEVICE inline void load_four(const In* x, std::size_t at, bool aligned, In (&out)[4]) noexcept {
#if defined(__CUDA_ARCH__)
  if (aligned) {
    if constexpr (sizeof(In) == 4) {
      const float4 v = *reinterpret_cast<const float4*>(x + at);
      out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
      return;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(x + at);
      std::memcpy(out, &v, sizeof v);
      return;
    }
  }
#else
  (void)aligned;
#endif
  for (unsigned k = 0; k < 4; ++k) out[k] = x[at + k];
}

QCOLL_HOST_DEVICE inline bool aligned_to(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

/// stage[i] = fed(x, residual_in, i) for i < count, by the tile's lanes together. Each
/// lane loads four consecutive values per chunk and keeps `batch` chunks of x and of
/// the residuals in flight before it adds: one pass over memory, many loads
/// outstanding, which is what a GPU needs to reach its memory bandwidth. `stage` is
/// 16-byte aligned (the GPU stores four values at once).
template <class Tile, class In>
QCOLL_HOST_DEVICE void stage_fed(const Tile& tile, const In* x, const float* residual_in, std::size_t count,
                                 float* stage) noexcept {
  constexpr unsigned batch = 4;
  constexpr std::size_t step = 4 * tile_lanes * batch;
  const bool aligned = aligned_to(x, 4 * sizeof(In)) && (!residual_in || aligned_to(residual_in, 16));
  const std::size_t lane_offset = 4 * tile.lane();
  std::size_t start = 0;
  for (; start + step <= count; start += step) {
    In xs[batch][4];
    float rs[batch][4] = {};  // unread without residuals; zeroed for the compilers that cannot see it
    for (unsigned u = 0; u < batch; ++u) {
      const std::size_t at = start + u * 4 * tile_lanes + lane_offset;
      load_four(x, at, aligned, xs[u]);
      if (residual_in) load_four(residual_in, at, aligned, rs[u]);
    }
    for (unsigned u = 0; u < batch; ++u) {
      const std::size_t at = start + u * 4 * tile_lanes + lane_offset;
      float values[4];
      for (unsigned k = 0; k < 4; ++k) values[k] = fed_value(widened(xs[u], k), residual_in != nullptr, rs[u][k]);
#if defined(__CUDA_ARCH__)
      // One store of four: scalar stores from 16 lanes 4 floats apart conflict on banks.
      *reinterpret_cast<float4*>(stage + at) = float4{values[0], values[1], values[2], values[3]};
#else
      for (unsigned k = 0; k < 4; ++k) stage[at + k] = values[k];
#endif
    }
  }
  for (std::size_t i = start + tile.lane(); i < count; i += tile_lanes) stage[i] = fed(x, residual_in, i);
}

/// The encode of a frame's groups by tile `index` of `count`, each group through
/// encode_group(first, g, record, values): `first` its first value, g its size,
/// `values` a source of its fed values (fed_staged or fed_in_place).
///
/// With a stage (stage_values floats of the tile's own, stage_values_for(group) or
/// more; the CUDA kernels' shared memory), the tile takes spans of whole groups, stages each
/// span's fed values in one pass, and encodes its groups from the stage: the passes a
/// group needs (a threshold, statistics, then codes) read memory once. Otherwise
/// (no stage, or groups larger than it) each group reads x and the residuals in place,
/// once per pass.
template <class Tile, class In, class EncodeGroup>
QCOLL_HOST_DEVICE void encode_groups(const Tile& tile, std::size_t index, std::size_t count,
                                     const quantizers::wire::record_layout& layout, std::size_t n, const In* x,
                                     const float* residual_in, std::byte* records, float* stage,
                                     std::size_t stage_values, EncodeGroup&& encode_group) {
  const std::size_t group = layout.group;
  if (stage != nullptr && group <= stage_values) {
    const std::size_t span = stage_values / group * group;
    const std::size_t spans = (n + span - 1) / span;
    for (std::size_t s = index; s < spans; s += count) {
      const std::size_t first = s * span;
      const std::size_t values = n - first < span ? n - first : span;
      stage_fed(tile, x + first, residual_in ? residual_in + first : nullptr, values, stage);
      tile.sync();
      for (std::size_t offset = 0; offset < values; offset += group)
        encode_group(first + offset, values - offset < group ? values - offset : group,
                     records + (first + offset) / group * layout.full_record_bytes(), fed_staged{stage + offset});
      tile.sync();  // every lane done with the stage before the next span overwrites it
    }
    return;
  }
  const std::size_t groups = layout.groups(n);
  for (std::size_t q = index; q < groups; q += count) {
    const std::size_t first = q * group;
    encode_group(first, n - first < group ? n - first : group, records + q * layout.full_record_bytes(),
                 fed_in_place<In>{x + first, residual_in ? residual_in + first : nullptr});
  }
}

// ---- decodes and checks: runs of eight values

/// Decodes and checks go by runs of eight consecutive values, a thread's share on the
/// GPU: one division finds the run's group, whose table is read once; out moves as
/// two vectors. Groups are multiples of 8 values (or one group), so a run rarely
/// crosses into the next group; when it does, the next group's view is taken.
inline constexpr unsigned run_values = 8;

/// The codes of values k0 … k0 + m - 1 (m ≤ 8) of a group whose codes start at `codes`
/// (`bits` wide, packed LSB-first). A run that starts on a byte (k0 a multiple of 8)
/// with codes of at most 8 bits is one word of the ⌈m·bits/8⌉ bytes that hold it —
/// no byte of another run read — then shifts; others go code by code.
QCOLL_HOST_DEVICE inline void load_run_codes(const std::byte* codes, std::size_t k0, unsigned bits, unsigned m,
                                             std::uint32_t (&out)[run_values]) noexcept {
  if (k0 % 8 == 0 && bits <= 8) {
    const std::byte* first = codes + k0 / 8 * bits;
    const unsigned bytes = (m * bits + 7) / 8;
    std::uint64_t word = 0;
    for (unsigned b = 0; b < bytes; ++b) word |= std::uint64_t{static_cast<std::uint8_t>(first[b])} << (8 * b);
    const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
    for (unsigned j = 0; j < m; ++j) out[j] = static_cast<std::uint32_t>((word >> (j * bits)) & mask);
    return;
  }
  for (unsigned j = 0; j < m; ++j) out[j] = load_code(codes, k0 + j, bits);
}

/// Walks the m ≤ 8 values i0 + j of a run: whole(view, k) when they lie in one group
/// (the usual case), `view` its at(records, q) and k the run's first place in it;
/// otherwise each(j, view, k) value by value across the groups.
template <class At, class Whole, class Each>
QCOLL_HOST_DEVICE void for_each_in_run(const quantizers::wire::record_layout& layout, const std::byte* records,
                                       std::size_t n, std::size_t i0, unsigned m, const At& at, Whole&& whole,
                                       Each&& each) {
  // The division once per run, in 32 bits where the values' indices fit (most frames).
  std::size_t q, k;
  if (n <= 0xffffffffu) {
    q = static_cast<std::uint32_t>(i0) / static_cast<std::uint32_t>(layout.group);
    k = static_cast<std::uint32_t>(i0) - static_cast<std::uint32_t>(q) * static_cast<std::uint32_t>(layout.group);
  } else {
    q = i0 / layout.group;
    k = i0 - q * layout.group;
  }
  auto view = at(records, q);
  if (k + m <= layout.group) return whole(view, k);
  for (unsigned j = 0; j < m; ++j, ++k) {
    if (k == layout.group) {
      view = at(records, ++q);
      k = 0;
    }
    each(j, view, k);
  }
}

/// Eight floats from `at`, as two vector loads on the GPU when m is 8 and the address allows.
QCOLL_HOST_DEVICE inline void load_run(const float* at, unsigned m, float (&v)[run_values]) noexcept {
#if defined(__CUDA_ARCH__)
  if (m == run_values && aligned_to(at, 16)) {
    const float4 a = reinterpret_cast<const float4*>(at)[0], b = reinterpret_cast<const float4*>(at)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#endif
  for (unsigned j = 0; j < m; ++j) v[j] = at[j];
}
QCOLL_HOST_DEVICE inline void store_run(float* at, unsigned m, const float (&v)[run_values]) noexcept {
#if defined(__CUDA_ARCH__)
  if (m == run_values && aligned_to(at, 16)) {
    reinterpret_cast<float4*>(at)[0] = float4{v[0], v[1], v[2], v[3]};
    reinterpret_cast<float4*>(at)[1] = float4{v[4], v[5], v[6], v[7]};
    return;
  }
#endif
  for (unsigned j = 0; j < m; ++j) at[j] = v[j];
}

/// Decodes runs first, first + stride, … of n values: out[i] = the value the frame
/// holds for i, or out[i] += it. value_of.at(records, q) is group q's view, and
/// view(k) the value of its k-th element. (A grid's threads each take their share of
/// runs; the CPU tests take all.)
template <class ValueOf>
QCOLL_HOST_DEVICE void decode_values(std::size_t first, std::size_t stride, const std::byte* records, std::size_t n,
                                     float* out, bool accumulate_into, const ValueOf& value_of) noexcept {
  const std::size_t runs = (n + run_values - 1) / run_values;
  for (std::size_t r = first; r < runs; r += stride) {
    const std::size_t i0 = r * run_values;
    const unsigned m = n - i0 < run_values ? static_cast<unsigned>(n - i0) : run_values;
    float values[run_values];
    for_each_in_run(value_of.layout, records, n, i0, m,
                    [&](const std::byte* at_records, std::size_t q) { return value_of.at(at_records, q); },
                    [&](const auto& view, std::size_t k) { view.run(k, m, values); },
                    [&](unsigned j, const auto& view, std::size_t k) { values[j] = view(k); });
    if (accumulate_into) {
      float sums[run_values];
      load_run(out + i0, m, sums);
      for (unsigned j = 0; j < m; ++j) sums[j] = accumulate(sums[j], values[j]);
      store_run(out + i0, m, sums);
    } else {
      store_run(out + i0, m, values);
    }
  }
}

/// Every value and group is one the quantizer may write (one_bit; k_level with a
/// power of two levels).
struct always_valid {
  struct view {
    QCOLL_HOST_DEVICE bool operator()(std::size_t) const noexcept { return true; }
    QCOLL_HOST_DEVICE bool run_valid(std::size_t, unsigned) const noexcept { return true; }
  };
  QCOLL_HOST_DEVICE view at(const std::byte*, std::size_t) const noexcept { return {}; }
  QCOLL_HOST_DEVICE bool operator()(const std::byte*, std::size_t) const noexcept { return true; }
};

/// Whether this share of a frame's records is one the quantizer writes:
/// value_valid.at(records, q)(k) for the values of runs first, first + stride, … of n,
/// group_valid(records, q) for groups first, first + stride, …, and (for first 0) the
/// last group's padding.
template <class ValueValid, class GroupValid>
QCOLL_HOST_DEVICE bool records_valid(std::size_t first, std::size_t stride,
                                     const quantizers::wire::record_layout& layout, const std::byte* records,
                                     std::size_t n, const ValueValid& value_valid,
                                     const GroupValid& group_valid) noexcept {
  if (first == 0 && !last_padding_zero(layout, records, n)) return false;
  if constexpr (!std::is_same_v<GroupValid, always_valid>) {
    const std::size_t groups = layout.groups(n);
    for (std::size_t q = first; q < groups; q += stride)
      if (!group_valid(records, q)) return false;
  }
  if constexpr (std::is_same_v<ValueValid, always_valid>) return true;
  const std::size_t runs = (n + run_values - 1) / run_values;
  bool valid = true;
  for (std::size_t r = first; valid && r < runs; r += stride) {
    const std::size_t i0 = r * run_values;
    const unsigned m = n - i0 < run_values ? static_cast<unsigned>(n - i0) : run_values;
    for_each_in_run(layout, records, n, i0, m,
                    [&](const std::byte* at_records, std::size_t q) { return value_valid.at(at_records, q); },
                    [&](const auto& view, std::size_t k) { valid = valid && view.run_valid(k, m); },
                    [&](unsigned, const auto& view, std::size_t k) { valid = valid && view(k); });
  }
  return valid;
}

}  // namespace simt
QCOLL_KERNELS_END
