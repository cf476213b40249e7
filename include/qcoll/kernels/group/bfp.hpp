#pragma once
/// @file
/// The per-block decisions of the bfp kernels that every backend shares as one
/// piece of scalar code: the shared exponent from the block's largest magnitude,
/// the exact powers of two that scale by it, the rounding of one value to its
/// mantissa, and the non-finite marker. The SIMD kernels vectorise the same
/// operations in the same order (cpu/simd/bfp.hpp) and use these for their tails.
///
/// @par The rules (spec bfp-lazy-update.md §2; b = mantissa bits with the sign)
/// - v = x + residual (x alone without error feedback); m = max |v| over the block,
///   taken on the bit patterns (abs, then an integer max), so it is exact and
///   independent of the order.
/// - Any v non-finite: exponent byte −128, mantissas 0, the block keeps its
///   residual (residual_out = residual_in); the block decodes to NaN.
/// - m = 0: exponent −127, mantissas 0 (v itself becomes the residual).
/// - Otherwise e = ceil(log2 m) − (b − 1), computed exactly from m's bits, clamped
///   below at −127. So e ∈ [−127, 129 − b] and |v| · 2^−e ≤ 2^(b−1).
/// - q = round half away from zero (v · 2^−e), saturated to ±(2^(b−1) − 1): only
///   an exact power-of-two maximum (or, for b ≤ 16, a value within half a unit
///   below it) reaches 2^(b−1).
/// - decoded = float(q) · 2^e (convert, then an exact power-of-two multiply);
///   residual = v − decoded. Error ≤ 2^e / 2 except for saturated values (≤ 2^e).

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/quantizers/format/options.hpp>
#include <qcoll/quantizers/format/wire.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_CPU_KERNELS_BEGIN
namespace bfp_detail {

/// A block record: [shared exponent: i8][mantissas, b bits each, LSB-first].
inline constexpr quantizers::wire::record_layout layout(std::size_t block, unsigned bits) noexcept {
  return quantizers::wire::bfp_layout(block, bits);
}

/// Values per block: the option, or the whole buffer for `whole_tensor` (never 0,
/// so a loop over blocks always advances).
inline constexpr std::size_t block_values(const quantizers::bfp_options& options, std::size_t n) noexcept {
  if (options.block_size != quantizers::bfp_options::whole_tensor) return options.block_size;
  return n > 0 ? n : 1;
}

inline constexpr int nonfinite_exponent = -128;  ///< the exponent byte of a block holding NaN or Inf
inline constexpr int min_exponent = -127;        ///< all-zero blocks, and the clamp of tiny ones

/// Mantissas are computed and decoded in chunks of this many values through a
/// stack buffer; a multiple of 8 (chunks start on byte boundaries of the packed
/// codes) and of every SIMD width.
inline constexpr std::size_t chunk = 256;

/// The value fed to the quantizer: x + residual_in, or x alone without error feedback
/// (null). Every read of a residual is of residual_in, the old one; kernels write the
/// new one to residual_out, the same array (in place) or a disjoint one.
inline float fed(const float* x, const float* residual_in, std::size_t i) noexcept {
  return residual_in ? x[i] + residual_in[i] : x[i];
}

inline std::uint32_t bits_of(float value) noexcept {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float float_of(std::uint32_t bits) noexcept {
  float value;
  __builtin_memcpy(&value, &bits, sizeof value);
  return value;
}

/// |v| as bits: for non-negative floats the integer order is the numeric order,
/// and NaN and Inf sort above every finite value.
inline std::uint32_t magnitude_bits(float value) noexcept { return bits_of(value) & 0x7fffffffu; }

/// 2^k exactly, for k in [−149, 127] (denormal below −126).
inline float pow2(int k) noexcept {
  if (k >= -126) return float_of(static_cast<std::uint32_t>(k + 127) << 23);
  return float_of(std::uint32_t{1} << (k + 149));
}

/// ceil(log2 m) for a finite m > 0 given by its bits, exactly.
inline int ceil_log2(std::uint32_t magnitude) noexcept {
  const int biased = static_cast<int>(magnitude >> 23);
  const std::uint32_t fraction = magnitude & 0x7fffffu;
  if (biased > 0) return biased - 127 + (fraction != 0 ? 1 : 0);
  // Denormal: m = fraction · 2^−149, fraction in [1, 2^23).
  const int ceil_fraction = fraction == 1 ? 0 : 32 - __builtin_clz(fraction - 1);
  return ceil_fraction - 149;
}

/// The largest mantissa magnitude, 2^(b−1) − 1; −2^(b−1) is never written.
inline constexpr std::int32_t max_mantissa(unsigned bits) noexcept {
  return static_cast<std::int32_t>((std::uint32_t{1} << (bits - 1)) - 1);
}

/// 2^(b−1) as a float (exact for every b ≤ 32): a rounded value this large saturates.
inline float saturation_limit(unsigned bits) noexcept { return pow2(static_cast<int>(bits) - 1); }

/// What one block's record holds besides its mantissas.
struct block_scale {
  int exponent = min_exponent;
  float scale = 0;  ///< 2^−exponent, the multiplier that makes mantissas
  float unit = 0;   ///< 2^exponent, the value of one mantissa unit
  bool nonfinite = false;
};

/// The shared exponent from the block's largest magnitude bits.
inline block_scale decide(std::uint32_t max_magnitude, unsigned bits) noexcept {
  block_scale result;
  if (max_magnitude >= 0x7f800000u) {
    result.exponent = nonfinite_exponent;
    result.nonfinite = true;
    return result;
  }
  int exponent = min_exponent;
  if (max_magnitude != 0) {
    exponent = ceil_log2(max_magnitude) - (static_cast<int>(bits) - 1);
    if (exponent < min_exponent) exponent = min_exponent;
  }
  result.exponent = exponent;   // in [−127, 129 − b]
  result.scale = pow2(-exponent);  // in [2^(b−129), 2^127]: exact
  result.unit = pow2(exponent);
  return result;
}

/// trunc(y) for any finite y: floats of magnitude 2^23 and above are integers
/// already; below, the conversion truncates exactly. (The sign of a zero result
/// may differ from truncf; no caller can see it.)
inline float truncate(float y) noexcept {
  return __builtin_fabsf(y) < 8388608.0f ? static_cast<float>(static_cast<std::int32_t>(y)) : y;
}

/// The adjustment that turns trunc(y) into y rounded half away from zero, from the
/// exact fraction d = y − trunc(y).
inline float round_away_step(float fraction) noexcept {
  return fraction >= 0.5f ? 1.0f : (fraction <= -0.5f ? -1.0f : 0.0f);
}

/// The mantissa of v: round half away from zero of v · 2^−e, saturated. The
/// scaling is exact (a power of two; only results below 2^−126, far under half a
/// unit, lose bits), and so is y − trunc(y).
inline std::int32_t mantissa(float v, float scale, unsigned bits) noexcept {
  const float y = v * scale;
  const float t = truncate(y);
  const float rounded = t + round_away_step(y - t);
  const float limit = saturation_limit(bits);
  // |rounded| <= 2^(b−1); converting +2^31 would overflow int32, so saturate first.
  if (rounded >= limit) return max_mantissa(bits);
  if (rounded <= -limit) return -max_mantissa(bits);
  return static_cast<std::int32_t>(rounded);
}

/// The value of mantissa q in a block of unit 2^e: the conversion rounds only for
/// |q| > 2^24 (b = 32), then the multiply by a power of two is exact.
inline float decoded(std::int32_t q, float unit) noexcept { return static_cast<float>(q) * unit; }

/// A b-bit two's complement field, as unpack_codes returns it, to int32.
inline std::int32_t sign_extend(std::uint32_t code, unsigned bits) noexcept {
  const unsigned unused = 32 - bits;
  return static_cast<std::int32_t>(code << unused) >> unused;
}

inline float quiet_nan() noexcept { return float_of(0x7fc00000u); }

}  // namespace bfp_detail
QCOLL_CPU_KERNELS_END
