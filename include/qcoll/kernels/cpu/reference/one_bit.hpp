#pragma once
/// @file
/// The one_bit reference kernels: plain loops that define the results every other
/// backend must reproduce bit for bit.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/kernels/group/one_bit.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

/// residual_in and residual_out: both null, the same array, or disjoint.
inline void one_bit_encode_group(const quantizers::one_bit_options& options, const float* x,
                                 const float* residual_in, float* residual_out, std::size_t g,
                                 std::byte* record) noexcept {
  using namespace one_bit_detail;
  float threshold = 0;
  if (options.threshold == quantizers::threshold::group_mean) {
    lane_sums lanes{};
    for (std::size_t i = 0; i < g; ++i) lanes[i % summation_lanes] += fed(x, residual_in, i);
    const float total = fold_lanes(lanes);
    if (!is_finite(total) && has_nonfinite(x, residual_in, g)) {
      keep_residual(residual_in, residual_out, g);
      return store_nonfinite(record, g);
    }
    threshold = is_finite(total) ? total / static_cast<float>(g) : mean_in_double(x, residual_in, g);
  }

  std::byte* bits = record + 2 * sizeof(float);
  std::memset(bits, 0, layout(g).codes_bytes(g));
  lane_sums sum0{}, sum1{};
  bin_statistics stats;
  stats.low = std::numeric_limits<float>::infinity();
  stats.high = -std::numeric_limits<float>::infinity();
  classify(x, residual_in, 0, g, threshold, bits, sum0, sum1, stats);
  const table values = store_table(options, stats, sum0, sum1, threshold, x, residual_in, g, record);
  if (values.nonfinite) return keep_residual(residual_in, residual_out, g);
  if (residual_out) update_residual(x, residual_in, residual_out, 0, g, threshold, values);
}

/// Encodes in.size() values into the records of a frame (header excluded).
/// The residuals are both empty (no error feedback) or both as long as `in`, and
/// either the same range or disjoint.
inline void one_bit_encode(const quantizers::one_bit_options& options, std::span<const float> in,
                           std::span<const float> residual_in, std::span<float> residual_out,
                           std::byte* records) noexcept {
  one_bit_detail::encode_groups(options, in, residual_in, residual_out, records,
                                [&](const float* x, const float* r_in, float* r_out, std::size_t g, std::byte* record) {
                                  one_bit_encode_group(options, x, r_in, r_out, g, record);
                                });
}

/// out = decoded (accumulate false) or out += decoded (accumulate true).
inline void one_bit_decode(const quantizers::one_bit_options& options, const std::byte* records, std::span<float> out,
                           bool accumulate) noexcept {
  const auto records_layout = one_bit_detail::layout(options.group_size);
  for_each_group(records_layout, out.size(), records, [&](std::size_t first, std::size_t g, auto* records) {
    const float zero = load<float>(records);
    const float one = load<float>(records + sizeof(float));
    const std::byte* bits = records + 2 * sizeof(float);
    float* y = out.data() + first;
    for (std::size_t i = 0; i < g; ++i) {
      const float value = ((bits[i / 8] >> (i % 8)) & std::byte{1}) != std::byte{0} ? one : zero;
      y[i] = accumulate ? y[i] + value : value;
    }
  });
}

}  // namespace reference
QCOLL_CPU_KERNELS_END
