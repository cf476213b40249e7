#pragma once
/// @file
/// The per-group decisions of the one_bit kernels that every backend shares as one
/// piece of code: the reconstruction table from the bin sums, and the rare paths
/// (non-finite values, sums that overflow float).

#include <qcoll/kernels/cpu/abi.hpp>
#include <qcoll/quantizers/options.hpp>
#include <qcoll/quantizers/wire.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

QCOLL_CPU_KERNELS_BEGIN
namespace one_bit_detail {

/// A group record: [bin 0 value: f32][bin 1 value: f32][ceil(g/8) bytes of bits].
inline constexpr quantizers::wire::record_layout layout(std::size_t group) noexcept {
  return quantizers::wire::one_bit_layout(group);
}

/// The value fed to the quantizer: x + residual, or x alone without error feedback.
inline float fed(const float* x, const float* residual, std::size_t i) noexcept {
  return residual ? x[i] + residual[i] : x[i];
}

inline bool has_nonfinite(const float* x, const float* residual, std::size_t g) noexcept {
  for (std::size_t i = 0; i < g; ++i)
    if (!is_finite(fed(x, residual, i))) return true;
  return false;
}

/// The group-mean threshold when the float sum overflowed although every value is finite.
inline float mean_in_double(const float* x, const float* residual, std::size_t g) noexcept {
  double sum = 0;
  for (std::size_t i = 0; i < g; ++i) sum += fed(x, residual, i);
  return static_cast<float>(sum / static_cast<double>(g));
}

struct table {
  float zero = 0;
  float one = 0;
  bool nonfinite = false;
};

/// A group holding NaN or Inf encodes as {NaN, NaN}, so every value decodes to
/// NaN (a loss scaler downstream sees it) and its residual is left untouched.
inline constexpr table nonfinite_table{std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::quiet_NaN(), true};

struct bin_statistics {
  float sum0 = 0, sum1 = 0;  // folded lane sums of the values in each bin
  std::size_t count1 = 0;    // values in bin 1 (the rest are in bin 0)
  float low = 0, high = 0;   // group minimum and maximum (min_max only)
};

/// The reconstruction values of one group. An empty bin decodes to 0.
inline table finish(const quantizers::one_bit_options& options, const bin_statistics& stats, float threshold,
                    const float* x, const float* residual, std::size_t g) noexcept {
  const std::size_t count0 = g - stats.count1;
  if (!is_finite(stats.sum0) || !is_finite(stats.sum1)) {
    if (has_nonfinite(x, residual, g)) return nonfinite_table;
    if (options.reconstruction == quantizers::reconstruction::bin_means) {
      // Every value is finite but a float sum overflowed: sum in double instead.
      double sum0 = 0, sum1 = 0;
      for (std::size_t i = 0; i < g; ++i) {
        const float v = fed(x, residual, i);
        (v >= threshold ? sum1 : sum0) += v;
      }
      return {count0 ? static_cast<float>(sum0 / static_cast<double>(count0)) : 0.0f,
              stats.count1 ? static_cast<float>(sum1 / static_cast<double>(stats.count1)) : 0.0f};
    }
  }
  if (options.reconstruction == quantizers::reconstruction::min_max) {
    // + 0.0f turns -0 into +0, so the order the minimum was found in cannot matter.
    return {count0 ? stats.low + 0.0f : 0.0f, stats.count1 ? stats.high + 0.0f : 0.0f};
  }
  return {count0 ? stats.sum0 / static_cast<float>(count0) : 0.0f,
          stats.count1 ? stats.sum1 / static_cast<float>(stats.count1) : 0.0f};
}

}  // namespace one_bit_detail
QCOLL_CPU_KERNELS_END
