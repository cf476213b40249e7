#pragma once
/// @file
/// one_bit on a tile (tile.hpp): the encode of one group, and the value a decode
/// reads for one element. The same records and residuals, bit for bit, as
/// one_bit_detail::encode and decode (kernels/group/one_bit.hpp), whose decisions
/// these call.
///
/// The encode reads the group three times (the group-mean threshold, the bins'
/// statistics, then the bits and the residual), in lane order each time, so the
/// lanes add exactly the reference's summation lanes; from a stage, memory once
/// (encode_groups, tile.hpp). A group holding NaN or Inf
/// writes {NaN, NaN} and zero bits and keeps its residual, as on the CPU.

#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/group/one_bit.hpp>
#include <qcoll/kernels/simt/tile.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_KERNELS_BEGIN
namespace simt {

/// Whether any of the g values is NaN or Inf, on every lane.
template <class Tile, class Values>
QCOLL_HOST_DEVICE bool any_nonfinite(const Tile& tile, const Values& values, std::size_t g) noexcept {
  bool found = false;
  for (std::size_t i = tile.lane(); i < g; i += tile_lanes) found = found || !is_finite(values(i));
  return tile.any(found);
}

/// Lane 0's value on every lane (its result of work the other lanes skipped).
template <class Tile>
QCOLL_HOST_DEVICE one_bit_detail::table broadcast_table(const Tile& tile, const one_bit_detail::table& t) noexcept {
  return {tile.shuffle(t.zero, 0), tile.shuffle(t.one, 0), tile.shuffle(t.nonfinite ? 1u : 0u, 0) != 0};
}

/// Encodes one group of g values (`values`, a source of x + residual_in: tile.hpp)
/// into its record, as one_bit_detail::encode_group does. residual_in and
/// residual_out: both null, the same array or disjoint (residual_in is read only to
/// keep it); memory_in and memory_out: both null, or memory_per_group values each.
template <class Tile, class Values>
QCOLL_HOST_DEVICE void one_bit_encode_group(const Tile& tile, const quantizers::one_bit_options& options,
                                            const Values& values_of, const float* residual_in, float* residual_out,
                                            const float* memory_in, float* memory_out, std::size_t g,
                                            std::byte* record) noexcept {
  using namespace one_bit_detail;
  const unsigned lane = tile.lane();
  std::byte* const bits = record + 2 * sizeof(float);
  const std::size_t code_bytes = layout(g).codes_bytes(g);

  float threshold = 0.0f;
  if (options.threshold == quantizers::threshold::group_mean) {
    float lane_sum = 0.0f;
    QCOLL_DEVICE_UNROLL(4)
    for (std::size_t i = lane; i < g; i += tile_lanes) lane_sum = add(lane_sum, values_of(i));
    const float total = tile.fold(lane_sum);
    if (!is_finite(total) && any_nonfinite(tile, values_of, g)) {
      keep_residual(tile, residual_in, residual_out, g);
      if (lane == 0) {
        if (memory_out) use_previous(nonfinite_table(), memory_in, memory_out, record);
        store_values(record, nonfinite_table());
      }
      zero_bytes(tile, bits, code_bytes);
      return;
    }
    // The overflowed sum's fallback adds in order, in double: one lane's work.
    const float mean = is_finite(total) ? divide(total, static_cast<float>(g))
                       : lane == 0 ? values_of.with_pointers([g](const auto* x, const float* r) {
                                         return mean_in_double(x, r, g);
                                       })
                                   : 0.0f;
    threshold = tile.shuffle(mean, 0);
  }

  float sum0 = 0.0f, sum1 = 0.0f, low = infinity(), high = -infinity();
  std::uint32_t count1 = 0;
  QCOLL_DEVICE_UNROLL(4)
  for (std::size_t i = lane; i < g; i += tile_lanes) {
    const float v = values_of(i);
    if (v >= threshold) {
      sum1 = add(sum1, v);
      ++count1;
    } else {
      sum0 = add(sum0, v);
    }
    low = v < low ? v : low;
    high = v > high ? v : high;
  }
  bin_statistics stats;
  stats.sum0 = tile.fold(sum0);
  stats.sum1 = tile.fold(sum1);
  stats.count1 = tile.total(count1);
  stats.low = tile.lowest(low);
  stats.high = tile.highest(high);

  table values;
  if (sums_overflowed(stats)) {
    if (any_nonfinite(tile, values_of, g)) {
      values = nonfinite_table();
    } else if (options.reconstruction == quantizers::reconstruction::bin_means) {
      table in_double;
      if (lane == 0)
        in_double = values_of.with_pointers([&](const auto* x, const float* r) {
          return bin_means_in_double(x, r, g, threshold, stats.count1);
        });
      values = broadcast_table(tile, in_double);
    } else {
      values = table_from(options, stats, g);
    }
  } else {
    values = table_from(options, stats, g);
  }
  table sent = values;
  if (lane == 0) {
    store_values(record, values);
    if (memory_out) sent = use_previous(values, memory_in, memory_out, record);
  }
  if (memory_out) values = broadcast_table(tile, sent);

  if (values.nonfinite) {
    zero_bytes(tile, bits, code_bytes);
    keep_residual(tile, residual_in, residual_out, g);
    return;
  }
  QCOLL_DEVICE_UNROLL(4)
  for (std::size_t first = 0; first < g; first += tile_lanes) {
    const std::size_t i = first + lane;
    const bool inside = i < g;
    const float v = inside ? values_of(i) : 0.0f;
    const bool one = inside && v >= threshold;
    store_codes(tile, one ? 1u : 0u, 1, bits + first / 8, code_bytes - first / 8);
    if (inside && residual_out) residual_out[i] = new_residual(v, threshold, values);
  }
}

/// The groups of an encode call's frame that tile `index` of `count` encodes; `stage`
/// null, or `stage_values` floats of the tile's own (encode_groups).
template <class Tile, class In>
QCOLL_HOST_DEVICE void one_bit_encode(const Tile& tile, std::size_t index, std::size_t count,
                                      const quantizers::one_bit_options& options, const In* x, std::size_t n,
                                      const float* residual_in, float* residual_out, const float* memory_in,
                                      float* memory_out, std::byte* records, float* stage = nullptr,
                                      std::size_t stage_values = stage_capacity) noexcept {
  encode_groups(tile, index, count, one_bit_detail::layout(options.group_size), n, x, residual_in, records, stage,
                stage_values,
                [&](std::size_t first, std::size_t g, std::byte* record, const auto& values) {
                  const std::size_t memory = first / options.group_size * quantizers::one_bit_memory_per_group;
                  one_bit_encode_group(tile, options, values, residual_in ? residual_in + first : nullptr,
                                       residual_out ? residual_out + first : nullptr,
                                       memory_out ? memory_in + memory : nullptr,
                                       memory_out ? memory_out + memory : nullptr, g, record);
                });
}

/// What a frame's values decode to: its group's bin value for each one's bit.
struct one_bit_value {
  quantizers::wire::record_layout layout;

  /// Group q: its two values, read once, and its bits.
  struct view {
    float zero, one;
    const std::byte* bits;
    QCOLL_HOST_DEVICE float operator()(std::size_t k) const noexcept {
      return ((static_cast<unsigned>(bits[k / 8]) >> (k % 8)) & 1u) != 0 ? one : zero;
    }
    /// Values k0 … k0 + m - 1 (decode_values' runs).
    QCOLL_HOST_DEVICE void run(std::size_t k0, unsigned m, float (&values)[run_values]) const noexcept {
      std::uint32_t codes[run_values];
      load_run_codes(bits, k0, 1, m, codes);
      for (unsigned j = 0; j < m; ++j) values[j] = codes[j] != 0 ? one : zero;
    }
  };
  QCOLL_HOST_DEVICE view at(const std::byte* records, std::size_t q) const noexcept {
    const std::byte* record = records + q * layout.full_record_bytes();
    return {load<float>(record), load<float>(record + sizeof(float)), record + 2 * sizeof(float)};
  }
};

}  // namespace simt
QCOLL_KERNELS_END
