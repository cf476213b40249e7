#pragma once
/// @file
/// bfp on a tile (tile.hpp): the encode of one block, the value a decode reads for
/// one element, and the checks of a received block — the records and residuals of
/// bfp_detail::encode and decode (kernels/group/bfp.hpp), bit for bit, from the same
/// decisions. The shared exponent comes from the largest magnitude, an integer
/// maximum of bit patterns that no order can change, so a block is read twice:
/// the maximum, then mantissas and residuals.

#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/group/bfp.hpp>
#include <qcoll/kernels/simt/tile.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_KERNELS_BEGIN
namespace simt {

/// Encodes one block of g values of `x` with `bits`-bit mantissas into its record, as
/// bfp_detail::encode_block does. residual_in and residual_out: both null, the same
/// array or disjoint.
template <class Tile, class In>
QCOLL_HOST_DEVICE void bfp_encode_block(const Tile& tile, unsigned bits, const In* x, const float* residual_in,
                                        float* residual_out, std::size_t g, std::byte* record) noexcept {
  using namespace bfp_detail;
  const unsigned lane = tile.lane();
  const quantizers::wire::record_layout records = layout(g, bits);
  std::byte* const codes = record + records.table_bytes;
  const std::size_t code_bytes = records.codes_bytes(g);

  std::uint32_t largest = 0;
  for (std::size_t i = lane; i < g; i += tile_lanes) {
    const std::uint32_t m = magnitude_bits(fed(x, residual_in, i));
    largest = m > largest ? m : largest;
  }
  const block_scale block = decide(tile.highest(largest), bits);
  if (lane == 0) store<std::int8_t>(record, static_cast<std::int8_t>(block.exponent));
  if (block.nonfinite) {
    keep_residual(tile, residual_in, residual_out, g);
    zero_bytes(tile, codes, code_bytes);
    return;
  }
  for (std::size_t start = 0; start < g; start += tile_lanes) {
    const std::size_t i = start + lane;
    const bool inside = i < g;
    std::int32_t q = 0;
    if (inside) {
      const float v = fed(x, residual_in, i);
      q = mantissa(v, block.scale, bits);
      if (residual_out) residual_out[i] = sub(v, decoded(q, block.unit));
    }
    store_codes(tile, static_cast<std::uint32_t>(q), bits, codes + start * bits / 8, code_bytes - start * bits / 8);
  }
}

/// The blocks of an encode call's frame that tile `index` of `count` encodes.
template <class Tile, class In>
QCOLL_HOST_DEVICE void bfp_encode(const Tile& tile, std::size_t index, std::size_t count,
                                  const quantizers::bfp_options& options, const In* x, std::size_t n,
                                  const float* residual_in, float* residual_out, std::byte* records) noexcept {
  for_each_tile_group(index, count, bfp_detail::layout(bfp_detail::block_values(options, n), options.mantissa_bits), n,
                      records, [&](std::size_t first, std::size_t g, std::byte* record) {
                        bfp_encode_block(tile, options.mantissa_bits, x + first,
                                         residual_in ? residual_in + first : nullptr,
                                         residual_out ? residual_out + first : nullptr, g, record);
                      });
}

/// What value i of a frame decodes to (NaN for a block sent as non-finite, in both
/// decode modes: out + NaN is NaN, and the CPU stores the one quiet NaN there).
struct bfp_value {
  quantizers::wire::record_layout layout;

  QCOLL_HOST_DEVICE float operator()(const std::byte* records, std::size_t i) const noexcept {
    const std::byte* record = records + i / layout.group * layout.full_record_bytes();
    const int exponent = load<std::int8_t>(record);
    if (exponent == bfp_detail::nonfinite_exponent) return quiet_nan();
    const std::uint32_t field = load_code(record + layout.table_bytes, i % layout.group, layout.code_bits);
    return bfp_detail::decoded(bfp_detail::sign_extend(field, layout.code_bits), bfp_detail::pow2(exponent));
  }
};

/// Whether value i's mantissa is one the encoder writes (bfp::check_records): never
/// -2^(b-1), and 0 in a non-finite block.
struct bfp_mantissa_valid {
  quantizers::wire::record_layout layout;

  QCOLL_HOST_DEVICE bool operator()(const std::byte* records, std::size_t i) const noexcept {
    const std::byte* record = records + i / layout.group * layout.full_record_bytes();
    const std::uint32_t field = load_code(record + layout.table_bytes, i % layout.group, layout.code_bits);
    if (load<std::int8_t>(record) == bfp_detail::nonfinite_exponent) return field == 0;
    return field != std::uint32_t{1} << (layout.code_bits - 1);
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
