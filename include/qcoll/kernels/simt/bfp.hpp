#pragma once
/// @file
/// bfp on a tile (tile.hpp): the encode of one block, the value a decode reads for
/// one element, and the checks of a received block — the records and residuals of
/// bfp_detail::encode and decode (kernels/group/bfp.hpp), bit for bit, from the same
/// decisions. The shared exponent comes from the largest magnitude, an integer
/// maximum of bit patterns that no order can change, so a block is read twice:
/// the maximum, then mantissas and residuals (from a stage, memory once:
/// encode_groups, tile.hpp).

#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/group/bfp.hpp>
#include <qcoll/kernels/simt/tile.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_KERNELS_BEGIN
namespace simt {

/// Encodes one block of g values (`values`, a source of x + residual_in: tile.hpp)
/// with `bits`-bit mantissas into its record, as bfp_detail::encode_block does.
/// residual_in and residual_out: both null, the same array or disjoint (residual_in
/// is read only to keep it).
template <class Tile, class Values>
QCOLL_HOST_DEVICE void bfp_encode_block(const Tile& tile, unsigned bits, const Values& values,
                                        const float* residual_in, float* residual_out, std::size_t g,
                                        std::byte* record) noexcept {
  using namespace bfp_detail;
  const unsigned lane = tile.lane();
  const quantizers::wire::record_layout records = layout(g, bits);
  std::byte* const codes = record + records.table_bytes;
  const std::size_t code_bytes = records.codes_bytes(g);

  std::uint32_t largest = 0;
  QCOLL_DEVICE_UNROLL(4)
  for (std::size_t i = lane; i < g; i += tile_lanes) {
    const std::uint32_t m = magnitude_bits(values(i));
    largest = m > largest ? m : largest;
  }
  const block_scale block = decide(tile.highest(largest), bits);
  if (lane == 0) store<std::int8_t>(record, static_cast<std::int8_t>(block.exponent));
  if (block.nonfinite) {
    keep_residual(tile, residual_in, residual_out, g);
    zero_bytes(tile, codes, code_bytes);
    return;
  }
  QCOLL_DEVICE_UNROLL(4)
  for (std::size_t start = 0; start < g; start += tile_lanes) {
    const std::size_t i = start + lane;
    const bool inside = i < g;
    std::int32_t q = 0;
    if (inside) {
      const float v = values(i);
      q = mantissa(v, block.scale, bits);
      if (residual_out) residual_out[i] = sub(v, decoded(q, block.unit));
    }
    store_codes(tile, static_cast<std::uint32_t>(q), bits, codes + start * bits / 8, code_bytes - start * bits / 8);
  }
}

/// The blocks of an encode call's frame that tile `index` of `count` encodes; `stage`
/// null, or `stage_values` floats of the tile's own (encode_groups).
template <class Tile, class In>
QCOLL_HOST_DEVICE void bfp_encode(const Tile& tile, std::size_t index, std::size_t count,
                                  const quantizers::bfp_options& options, const In* x, std::size_t n,
                                  const float* residual_in, float* residual_out, std::byte* records,
                                  float* stage = nullptr, std::size_t stage_values = stage_capacity) noexcept {
  encode_groups(tile, index, count, bfp_detail::layout(bfp_detail::block_values(options, n), options.mantissa_bits), n,
                x, residual_in, records, stage, stage_values,
                [&](std::size_t first, std::size_t g, std::byte* record, const auto& values) {
                  bfp_encode_block(tile, options.mantissa_bits, values, residual_in ? residual_in + first : nullptr,
                                   residual_out ? residual_out + first : nullptr, g, record);
                });
}

/// What a frame's values decode to (NaN for a block sent as non-finite, in both
/// decode modes: out + NaN is NaN, and the CPU stores the one quiet NaN there).
struct bfp_value {
  quantizers::wire::record_layout layout;

  /// Block q: its exponent, read once, and its mantissas.
  struct view {
    bool nonfinite;
    float unit;
    const std::byte* fields;
    unsigned bits;
    QCOLL_HOST_DEVICE float operator()(std::size_t k) const noexcept {
      if (nonfinite) return quiet_nan();
      return bfp_detail::decoded(bfp_detail::sign_extend(load_code(fields, k, bits), bits), unit);
    }
    /// Values k0 … k0 + m - 1 (decode_values' runs).
    QCOLL_HOST_DEVICE void run(std::size_t k0, unsigned m, float (&values)[run_values]) const noexcept {
      std::uint32_t codes[run_values] = {};
      if (!nonfinite) load_run_codes(fields, k0, bits, m, codes);
      for (unsigned j = 0; j < m; ++j)
        values[j] = nonfinite ? quiet_nan() : bfp_detail::decoded(bfp_detail::sign_extend(codes[j], bits), unit);
    }
  };
  QCOLL_HOST_DEVICE view at(const std::byte* records, std::size_t q) const noexcept {
    const std::byte* record = records + q * layout.full_record_bytes();
    const int exponent = load<std::int8_t>(record);
    const bool nonfinite = exponent == bfp_detail::nonfinite_exponent;
    return {nonfinite, nonfinite ? 0.0f : bfp_detail::pow2(exponent), record + layout.table_bytes, layout.code_bits};
  }
};

/// Whether each value's mantissa is one the encoder writes (bfp::check_records):
/// never -2^(b-1), and 0 in a non-finite block.
struct bfp_mantissa_valid {
  quantizers::wire::record_layout layout;

  struct view {
    bool nonfinite;
    const std::byte* fields;
    unsigned bits;
    QCOLL_HOST_DEVICE bool operator()(std::size_t k) const noexcept { return valid(load_code(fields, k, bits)); }
    QCOLL_HOST_DEVICE bool run_valid(std::size_t k0, unsigned m) const noexcept {
      std::uint32_t codes[run_values];
      load_run_codes(fields, k0, bits, m, codes);
      bool all = true;
      for (unsigned j = 0; j < m; ++j) all = all && valid(codes[j]);
      return all;
    }
    QCOLL_HOST_DEVICE bool valid(std::uint32_t field) const noexcept {
      return nonfinite ? field == 0 : field != std::uint32_t{1} << (bits - 1);
    }
  };
  QCOLL_HOST_DEVICE view at(const std::byte* records, std::size_t q) const noexcept {
    const std::byte* record = records + q * layout.full_record_bytes();
    return {load<std::int8_t>(record) == bfp_detail::nonfinite_exponent, record + layout.table_bytes,
            layout.code_bits};
  }
};

/// Whether block k's exponent is one the encoder writes: in [-127, 129 - b], or -128.
struct bfp_exponent_valid {
  quantizers::wire::record_layout layout;

  QCOLL_HOST_DEVICE bool operator()(const std::byte* records, std::size_t k) const noexcept {
    const int exponent = load<std::int8_t>(records + k * layout.full_record_bytes());
    return exponent == bfp_detail::nonfinite_exponent || exponent <= 129 - static_cast<int>(layout.code_bits);
  }
};

}  // namespace simt
QCOLL_KERNELS_END
