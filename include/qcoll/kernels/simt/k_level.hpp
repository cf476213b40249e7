#pragma once
/// @file
/// k_level on a tile (tile.hpp): the encode of one group, and the value a decode
/// reads for one element — the records and residuals of k_level_detail::encode and
/// decode (kernels/group/k_level.hpp), bit for bit, from the same decisions. The
/// extremes need no order (a minimum is a minimum; -0 is made +0 by make_table), the
/// codes are per value, and stochastic rounding's numbers depend on the value's
/// index alone, so the group is read twice: extremes, then codes and residuals (from a
/// stage, memory once: encode_groups, tile.hpp).

#include <qcoll/core/encode_position.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/group/k_level.hpp>
#include <qcoll/kernels/simt/tile.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_KERNELS_BEGIN
namespace simt {

/// Encodes one group of g values (`values`, a source of x + residual_in: tile.hpp;
/// value `first` of the encode call) into its record, as k_level_detail::encode_group
/// does. residual_in and residual_out: both null, the same array or disjoint
/// (residual_in is read only to keep it).
template <bool stochastic, class Tile, class Values>
QCOLL_HOST_DEVICE void k_level_encode_group(const Tile& tile, const quantizers::k_level_options& options,
                                            quantizers::encode_position position, std::size_t first,
                                            const Values& values, const float* residual_in, float* residual_out,
                                            std::size_t g, std::byte* record) noexcept {
  using namespace k_level_detail;
  const unsigned lane = tile.lane();
  const quantizers::wire::record_layout records = layout(options);
  const unsigned bits = records.code_bits;
  std::byte* const codes = codes_of(record);
  const std::size_t code_bytes = records.codes_bytes(g);

  float low = infinity(), high = -infinity();
  bool finite = true;
  QCOLL_DEVICE_UNROLL(4)
  for (std::size_t i = lane; i < g; i += tile_lanes) {
    const float v = values(i);
    finite = finite && is_finite(v);
    low = lower(v, low);
    high = higher(v, high);
  }
  if (!tile.all(finite)) {
    keep_residual(tile, residual_in, residual_out, g);
    if (lane == 0) store_table(record, nonfinite_value(), nonfinite_value());
    zero_bytes(tile, codes, code_bytes);
    return;
  }
  const table t = make_table(tile.lowest(low), tile.highest(high), options.levels);
  if (lane == 0) store_table(record, t.min, t.step);
  const group_stream stream = stochastic ? make_group_stream(options.seed, position, first, g) : group_stream{};
  QCOLL_DEVICE_UNROLL(4)
  for (std::size_t start = 0; start < g; start += tile_lanes) {
    const std::size_t i = start + lane;
    const bool inside = i < g;
    std::uint32_t code = 0;
    if (inside) {
      const float v = values(i);
      const float c = code_of<stochastic>(v, t, stochastic ? stream.u(i) : 0.0f);
      code = static_cast<std::uint32_t>(c);
      if (residual_out) residual_out[i] = sub(v, level(t.min, t.step, c));
    }
    store_codes(tile, code, bits, codes + start * bits / 8, code_bytes - start * bits / 8);
  }
}

/// The groups of an encode call's frame that tile `index` of `count` encodes; `stage`
/// null, or `stage_values` floats of the tile's own (encode_groups).
template <class Tile, class In>
QCOLL_HOST_DEVICE void k_level_encode(const Tile& tile, std::size_t index, std::size_t count,
                                      const quantizers::k_level_options& options,
                                      quantizers::encode_position position, const In* x, std::size_t n,
                                      const float* residual_in, float* residual_out, std::byte* records,
                                      float* stage = nullptr, std::size_t stage_values = stage_capacity) noexcept {
  const bool stochastic = options.rounding == quantizers::rounding::stochastic;
  encode_groups(tile, index, count, k_level_detail::layout(options), n, x, residual_in, records, stage, stage_values,
                [&](std::size_t first, std::size_t g, std::byte* record, const auto& values) {
                  const float* r_in = residual_in ? residual_in + first : nullptr;
                  float* r_out = residual_out ? residual_out + first : nullptr;
                  if (stochastic)
                    k_level_encode_group<true>(tile, options, position, first, values, r_in, r_out, g, record);
                  else
                    k_level_encode_group<false>(tile, options, position, first, values, r_in, r_out, g, record);
                });
}

/// What a frame's values decode to: each one's group's level for its code. A NaN
/// table decodes to the quiet NaN the CPU's min + c * step gives (0x7fc00000, the
/// encoder's; a GPU would give its own).
struct k_level_value {
  quantizers::wire::record_layout layout;

  /// Group q: its minimum and step, read once, and its codes.
  struct view {
    float min, step;
    const std::byte* codes;
    unsigned bits;
    QCOLL_HOST_DEVICE float operator()(std::size_t k) const noexcept { return of_code(load_code(codes, k, bits)); }
    /// Values k0 … k0 + m - 1 (decode_values' runs).
    QCOLL_HOST_DEVICE void run(std::size_t k0, unsigned m, float (&values)[run_values]) const noexcept {
      std::uint32_t run_codes[run_values];
      load_run_codes(codes, k0, bits, m, run_codes);
      for (unsigned j = 0; j < m; ++j) values[j] = of_code(run_codes[j]);
    }
    QCOLL_HOST_DEVICE float of_code(std::uint32_t code) const noexcept {
      const float value = k_level_detail::level(min, step, static_cast<float>(code));
      return value == value ? value : quiet_nan();
    }
  };
  QCOLL_HOST_DEVICE view at(const std::byte* records, std::size_t q) const noexcept {
    const std::byte* record = records + q * layout.full_record_bytes();
    return {load<float>(record), load<float>(record + sizeof(float)), k_level_detail::codes_of(record),
            layout.code_bits};
  }
};

/// Whether each value's code names one of `levels` levels (k_level::check_records;
/// only a number of levels that is not a power of two leaves codes that do not).
struct k_level_code_valid {
  quantizers::wire::record_layout layout;
  unsigned levels;

  struct view {
    const std::byte* codes;
    unsigned bits, levels;
    QCOLL_HOST_DEVICE bool operator()(std::size_t k) const noexcept { return load_code(codes, k, bits) < levels; }
    QCOLL_HOST_DEVICE bool run_valid(std::size_t k0, unsigned m) const noexcept {
      std::uint32_t run_codes[run_values];
      load_run_codes(codes, k0, bits, m, run_codes);
      bool valid = true;
      for (unsigned j = 0; j < m; ++j) valid = valid && run_codes[j] < levels;
      return valid;
    }
  };
  QCOLL_HOST_DEVICE view at(const std::byte* records, std::size_t q) const noexcept {
    return {k_level_detail::codes_of(records + q * layout.full_record_bytes()), layout.code_bits, levels};
  }
};

}  // namespace simt
QCOLL_KERNELS_END
