#pragma once
/// @file
/// The parts of the one_bit kernels that every backend shares as one piece of code:
/// the reconstruction table from the bin sums, the rare paths (non-finite values, sums
/// that overflow float), the scalar loops the SIMD kernels run on a group's last
/// partial block (so it is the reference's own code), and the driver both backends
/// run (encode, decode): the walk over a frame's groups, the group-mean threshold,
/// the table and the non-finite group, around the backend's arithmetic.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

QCOLL_KERNELS_BEGIN
namespace one_bit_detail {

/// A group record: [bin 0 value: f32][bin 1 value: f32][ceil(g/8) bytes of bits].
QCOLL_HOST_DEVICE inline constexpr quantizers::wire::record_layout layout(std::size_t group) noexcept {
  return quantizers::wire::one_bit_layout(group);
}

/// The group-mean threshold when the float sum overflowed although every value is
/// finite: the values added in order, in double.
template <class In>
QCOLL_HOST_DEVICE inline float mean_in_double(const In* x, const float* residual_in, std::size_t g) noexcept {
  double sum = 0;
  for (std::size_t i = 0; i < g; ++i) sum = add(sum, static_cast<double>(fed(x, residual_in, i)));
  return static_cast<float>(divide(sum, static_cast<double>(g)));
}

struct table {
  float zero = 0;
  float one = 0;
  bool nonfinite = false;
};

/// A group holding NaN or Inf encodes as {NaN, NaN}, so every value decodes to
/// NaN (a loss scaler downstream sees it) and keeps its residual (keep_residual).
QCOLL_HOST_DEVICE inline table nonfinite_table() noexcept { return {quiet_nan(), quiet_nan(), true}; }

struct bin_statistics {
  float sum0 = 0, sum1 = 0;  // folded lane sums of the values in each bin
  std::size_t count1 = 0;    // values in bin 1 (the rest are in bin 0)
  float low = 0, high = 0;   // group minimum and maximum (min_max only)
};

/// The bin means of a finite group whose float sums overflowed, from sums in
/// double of the values in order.
template <class In>
QCOLL_HOST_DEVICE inline table bin_means_in_double(const In* x, const float* residual_in, std::size_t g,
                                                   float threshold, std::size_t count1) noexcept {
  const std::size_t count0 = g - count1;
  double sum0 = 0, sum1 = 0;
  for (std::size_t i = 0; i < g; ++i) {
    const float v = fed(x, residual_in, i);
    if (v >= threshold) sum1 = add(sum1, static_cast<double>(v));
    else sum0 = add(sum0, static_cast<double>(v));
  }
  return {count0 ? static_cast<float>(divide(sum0, static_cast<double>(count0))) : 0.0f,
          count1 ? static_cast<float>(divide(sum1, static_cast<double>(count1))) : 0.0f};
}

/// The table from the folded statistics, for a group whose bin sums are finite, or
/// any finite group with min_max. An empty bin decodes to 0.
QCOLL_HOST_DEVICE inline table table_from(const quantizers::one_bit_options& options, const bin_statistics& stats,
                                          std::size_t g) noexcept {
  const std::size_t count0 = g - stats.count1;
  if (options.reconstruction == quantizers::reconstruction::min_max) {
    // + 0.0f turns -0 into +0, so the order the minimum was found in cannot matter.
    return {count0 ? add(stats.low, 0.0f) : 0.0f, stats.count1 ? add(stats.high, 0.0f) : 0.0f};
  }
  return {count0 ? divide(stats.sum0, static_cast<float>(count0)) : 0.0f,
          stats.count1 ? divide(stats.sum1, static_cast<float>(stats.count1)) : 0.0f};
}

/// Whether the table needs more than the folded statistics: a bin sum that is not
/// finite means a non-finite value, or (bin means only) a float sum that overflowed.
QCOLL_HOST_DEVICE inline bool sums_overflowed(const bin_statistics& stats) noexcept {
  return !is_finite(stats.sum0) || !is_finite(stats.sum1);
}

/// The reconstruction values of one group.
inline table finish(const quantizers::one_bit_options& options, const bin_statistics& stats, float threshold,
                    const float* x, const float* residual_in, std::size_t g) noexcept {
  if (sums_overflowed(stats)) {
    if (has_nonfinite(x, residual_in, 0, g)) return nonfinite_table();
    if (options.reconstruction == quantizers::reconstruction::bin_means)
      return bin_means_in_double(x, residual_in, g, threshold, stats.count1);
  }
  return table_from(options, stats, g);
}

/// Stores a table's two values at the start of a record.
QCOLL_HOST_DEVICE inline void store_values(std::byte* record, const table& values) noexcept {
  store(record, values.zero);
  store(record + sizeof(float), values.one);
}

/// A group holding NaN or Inf, found while computing the group-mean threshold.
inline void store_nonfinite(std::byte* record, std::size_t g) noexcept {
  store_values(record, nonfinite_table());
  std::memset(record + 2 * sizeof(float), 0, layout(g).codes_bytes(g));
}

/// Sorts values [from, to) of a group into the bins: sets the bits of bin 1 (the
/// threshold itself goes to bin 1), adds each value to its bin's lane sum, and tracks
/// the minimum and maximum. The bits of [from, to) must be zero.
inline void classify(const float* x, const float* residual_in, std::size_t from, std::size_t to, float threshold,
                     std::byte* bits, lane_sums& sum0, lane_sums& sum1, bin_statistics& stats) noexcept {
  for (std::size_t i = from; i < to; ++i) {
    const float v = fed(x, residual_in, i);
    if (v >= threshold) {
      bits[i / 8] |= std::byte{1} << (i % 8);
      sum1[i % summation_lanes] = add(sum1[i % summation_lanes], v);
      ++stats.count1;
    } else {
      sum0[i % summation_lanes] = add(sum0[i % summation_lanes], v);
    }
    stats.low = v < stats.low ? v : stats.low;
    stats.high = v > stats.high ? v : stats.high;
  }
}

/// Folds the bins' lane sums, stores the group's table in its record and returns it;
/// a non-finite group's bits are cleared.
inline table store_table(const quantizers::one_bit_options& options, bin_statistics& stats, const lane_sums& sum0,
                         const lane_sums& sum1, float threshold, const float* x, const float* residual_in,
                         std::size_t g, std::byte* record) noexcept {
  stats.sum0 = fold_lanes(sum0);
  stats.sum1 = fold_lanes(sum1);
  const table values = finish(options, stats, threshold, x, residual_in, g);
  store_values(record, values);
  if (values.nonfinite) std::memset(record + 2 * sizeof(float), 0, layout(g).codes_bytes(g));
  return values;
}

/// What was fed minus what it decodes to: the new residual of one value.
QCOLL_HOST_DEVICE inline float new_residual(float v, float threshold, const table& values) noexcept {
  return sub(v, v >= threshold ? values.one : values.zero);
}

/// The new error of values [from, to): what was fed (x + residual_in) minus what it
/// decodes to, into residual_out.
inline void update_residual(const float* x, const float* residual_in, float* residual_out, std::size_t from,
                            std::size_t to, float threshold, const table& values) noexcept {
  for (std::size_t i = from; i < to; ++i) {
    const float v = add(x[i], residual_in[i]);
    residual_out[i] = new_residual(v, threshold, values);
  }
}

/// y[i] = (or +=) the value of bit i, i in [from, to).
inline void decode_values(const std::byte* bits, std::size_t from, std::size_t to, float zero, float one, float* y,
                          bool accumulate) noexcept {
  for (std::size_t i = from; i < to; ++i) {
    const float value = ((bits[i / 8] >> (i % 8)) & std::byte{1}) != std::byte{0} ? one : zero;
    y[i] = accumulate ? add(y[i], value) : value;
  }
}

// The driver. `Kernels` is the backend's arithmetic, a type with these static
// functions (QCOLL_KERNEL_INLINE, each called from one place below):
//   lane_sums sum(const float* x, const float* residual_in, std::size_t g)
//     the group's fed values summed into the summation lanes (lanes.hpp);
//   void classify(const quantizers::one_bit_options&, const float* x, const float* residual_in, std::size_t g,
//                 float threshold, std::byte* bits, lane_sums& sum0, lane_sums& sum1, bin_statistics& stats)
//     classify() over the whole group: every bit of the record written, sum0 and sum1
//     (zero on entry) the bins' lane sums, stats.count1, and stats.low and stats.high
//     (needed for min_max only);
//   void update_residual(const float* x, const float* residual_in, float* residual_out, std::size_t g,
//                        float threshold, const table&)
//     update_residual() over the whole group;
//   void decode_group(const std::byte* bits, std::size_t g, float zero, float one, float* y, bool accumulate)
//     decode_values(bits, 0, g, …).

/// The seed's variant (reconstruction_source::previous; a memory of
/// quantizers::one_bit_memory_per_group values per group, {NaN, NaN} when there is
/// none yet): the group is sent with the
/// table its values had at the previous encode (memory_in) when there is one, and
/// this encode's own table becomes the memory (memory_out). Returns the table sent.
QCOLL_HOST_DEVICE inline table use_previous(const table& current, const float* memory_in, float* memory_out,
                                            std::byte* record) noexcept {
  const table previous{memory_in[0], memory_in[1], false};  // read before memory_out may overwrite it
  memory_out[0] = current.zero;
  memory_out[1] = current.one;
  if (current.nonfinite || !is_finite(previous.zero) || !is_finite(previous.one)) return current;
  store_values(record, previous);
  return previous;
}

/// Encodes one group of g values into its record; residual_in and residual_out:
/// both null, the same array, or disjoint; memory_in and memory_out: both null
/// (reconstruction from the current values) or memory_per_group values each, the
/// same or disjoint.
template <class Kernels>
QCOLL_KERNEL_INLINE void encode_group(const quantizers::one_bit_options& options, const float* x,
                                      const float* residual_in, float* residual_out, const float* memory_in,
                                      float* memory_out, std::size_t g, std::byte* record) noexcept {
  float threshold = 0;
  if (options.threshold == quantizers::threshold::group_mean) {
    const float total = fold_lanes(Kernels::sum(x, residual_in, g));
    if (!is_finite(total) && has_nonfinite(x, residual_in, 0, g)) {
      keep_residual(residual_in, residual_out, g);
      if (memory_out) use_previous(nonfinite_table(), memory_in, memory_out, record);
      return store_nonfinite(record, g);
    }
    threshold = is_finite(total) ? divide(total, static_cast<float>(g)) : mean_in_double(x, residual_in, g);
  }
  lane_sums sum0{}, sum1{};
  bin_statistics stats;
  Kernels::classify(options, x, residual_in, g, threshold, record + 2 * sizeof(float), sum0, sum1, stats);
  table values = store_table(options, stats, sum0, sum1, threshold, x, residual_in, g, record);
  if (memory_out) values = use_previous(values, memory_in, memory_out, record);
  if (values.nonfinite) return keep_residual(residual_in, residual_out, g);
  if (residual_out) Kernels::update_residual(x, residual_in, residual_out, g, threshold, values);
}

/// Encodes in.size() values into the records of a frame (header excluded).
/// The residuals are both empty (no error feedback) or both as long as `in`, and
/// either the same range or disjoint. The memories are both empty (reconstruction
/// from the current values) or both memory_per_group values per group, the same
/// range or disjoint.
template <class Kernels>
void encode(const quantizers::one_bit_options& options, std::span<const float> in,
            std::span<const float> residual_in, std::span<float> residual_out, std::span<const float> memory_in,
            std::span<float> memory_out, std::byte* records) noexcept {
  const bool feedback = !residual_out.empty();
  const bool remembers = !memory_out.empty();
  for_each_group(layout(options.group_size), in.size(), records,
                 [&](std::size_t first, std::size_t g, std::byte* record) {
                   const std::size_t group = first / options.group_size * quantizers::one_bit_memory_per_group;
                   encode_group<Kernels>(options, in.data() + first, feedback ? residual_in.data() + first : nullptr,
                                         feedback ? residual_out.data() + first : nullptr,
                                         remembers ? memory_in.data() + group : nullptr,
                                         remembers ? memory_out.data() + group : nullptr, g, record);
                 });
}

/// out = decoded (accumulate false) or out += decoded (accumulate true).
template <class Kernels>
void decode(const quantizers::one_bit_options& options, const std::byte* records, std::span<float> out,
            bool accumulate) noexcept {
  for_each_group(layout(options.group_size), out.size(), records,
                 [&](std::size_t first, std::size_t g, const std::byte* record) {
                   Kernels::decode_group(record + 2 * sizeof(float), g, load<float>(record),
                                         load<float>(record + sizeof(float)), out.data() + first, accumulate);
                 });
}

}  // namespace one_bit_detail
QCOLL_KERNELS_END
