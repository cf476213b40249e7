#pragma once
/// @file
/// The per-value rules of the reproducible sum's float conversions (qcoll/reproducible.hpp)
/// that every backend shares as one piece of scalar code: a block's exponent from its
/// values, a value rounded onto the block's grid, a summed integer back into a float.
/// The SIMD kernels (cpu/simd/grid.hpp) vectorise the same operations in the same order
/// and use these for their tails.
///
/// Doubles' rules (P = 60, two carriers) are at the end.
///
/// @par The rules (float, bfloat16 and float16 addends, widened exactly to float)
/// - A block is `block` consecutive values of the buffer; its exponent e is the smallest
///   integer with |x| < 2^e for every finite nonzero x of the block (from the bits), or
///   `empty_block` for a block of zeros and non-finite values only.
/// - The grid is 2^(e − bits): x becomes nearest_integer(x · 2^(bits − e)) (ties to even,
///   signed as the product), |·| ≤ 2^bits, exact in a double; NaN and ±Inf stay
///   themselves. An empty block's scale is 1: its zeros and non-finite values pass as
///   they are.
/// - A summed integer s becomes s · 2^(e − bits) (exact: a normal double), one NaN for
///   every NaN, divided by `divide` (avg) in double, then rounded once to float.

#include <qcoll/kernels/group/abi.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_KERNELS_BEGIN
namespace grid_detail {

/// Values per block: they share one exponent in the ranks' max round.
inline constexpr std::size_t block = 256;
/// The grid's bits below a block's exponent, for float-family addends.
inline constexpr int bits = 30;
/// The exponent of a block without a finite nonzero value: its scale is 1.
inline constexpr double empty_block = -2000.0;

/// 2^k for k in double's normal range [−1022, 1023], from its bits.
QCOLL_HOST_DEVICE inline double power_of_two(int k) noexcept {
  const std::uint64_t pattern = static_cast<std::uint64_t>(k + 1023) << 52;
  double value;
  std::memcpy(&value, &pattern, sizeof value);
  return value;
}

/// The block's exponent raised to cover x: e with |x| < 2^e. A normal float 1.f · 2^(f − 127)
/// is below 2^(f − 126); a subnormal m · 2^−149 below 2^(bit length of m − 149).
QCOLL_HOST_DEVICE inline int covered(int e, float x) noexcept {
  const std::uint32_t magnitude = bits_of(x) & 0x7fffffffu, field = magnitude >> 23;
  if (field == 0xff || magnitude == 0) return e;  // NaN, ±Inf, ±0: no grid of their own
  const int cover = field != 0 ? static_cast<int>(field) - 126 : (32 - count_leading_zeros(magnitude)) - 149;
  return cover > e ? cover : e;
}

/// The exponent a block's values need, raising `exponent` (a double, as it travels).
QCOLL_HOST_DEVICE inline double cover_block(const float* values, std::size_t n, double exponent) noexcept {
  int e = static_cast<int>(exponent);
  for (std::size_t i = 0; i < n; ++i) e = covered(e, values[i]);
  return static_cast<double>(e);
}

/// x · to_grid(e) is x in units of the grid.
QCOLL_HOST_DEVICE inline double to_grid(double exponent) noexcept {
  return exponent == empty_block ? 1.0 : power_of_two(bits - static_cast<int>(exponent));
}
/// A grid unit: summed integer · from_grid(e) is their value.
QCOLL_HOST_DEVICE inline double from_grid(double exponent) noexcept {
  return exponent == empty_block ? 1.0 : power_of_two(static_cast<int>(exponent) - bits);
}

/// The sign bit of a double, and its other bits.
inline constexpr std::uint64_t sign_bit = std::uint64_t{1} << 63;

/// The nearest integer to s (ties to even), for |s| < 2^52, signed as s (−0.3 → −0):
/// adding and taking away 1.5 · 2^52 leaves s rounded in the current rounding mode,
/// round to nearest unless a program changed it (std::nearbyint's rule).
QCOLL_HOST_DEVICE inline double nearest_integer(double s) noexcept {
  constexpr double shift = 6755399441055744.0;  // 1.5 · 2^52
  const double rounded = sub(add(s, shift), shift);
  std::uint64_t r, sign;
  std::memcpy(&r, &rounded, sizeof r);
  std::memcpy(&sign, &s, sizeof sign);
  r = (r & ~sign_bit) | (sign & sign_bit);
  double value;
  std::memcpy(&value, &r, sizeof value);
  return value;
}

/// x on the grid of scale to_grid(e): an integer-valued double (|x · scale| ≤ 2^bits,
/// exact), or x itself if NaN or ±Inf.
QCOLL_HOST_DEVICE inline double on_grid(float x, double scale) noexcept {
  return is_finite(x) ? nearest_integer(mul(static_cast<double>(x), scale)) : static_cast<double>(x);
}

/// A summed integer (or a NaN or ±Inf sum) as a float: scaled by from_grid(e), every NaN
/// the same quiet one, divided by `divide` unless it is 1, rounded once.
QCOLL_HOST_DEVICE inline float rounded(double sum, double scale, double divide) noexcept {
  double value = mul(sum, scale);
  if (value != value) value = static_cast<double>(quiet_nan());
  if (divide != 1.0) value = qcoll::kernels::divide(value, divide);
  return static_cast<float>(value);
}

// ---- double addends: P = 60, each integer carried as high · 2^30 + low (0 ≤ low < 2^30),
// two integer-valued doubles, in two planes.

/// The grid's bits below a block's exponent, for double addends.
inline constexpr int wide_bits = 60;

/// The bits of a double, and a double from bits.
QCOLL_HOST_DEVICE inline std::uint64_t bits_of_double(double value) noexcept {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

/// The block's exponent raised to cover x (a double): e with |x| < 2^e.
QCOLL_HOST_DEVICE inline int covered_wide(int e, double x) noexcept {
  const std::uint64_t magnitude = bits_of_double(x) & ~sign_bit;
  const auto field = static_cast<int>(magnitude >> 52);
  if (field == 0x7ff || magnitude == 0) return e;
  const int cover = field != 0 ? field - 1022 : (64 - count_leading_zeros(magnitude)) - 1074;
  return cover > e ? cover : e;
}

/// x · 2^k, exactly whenever the result is a normal double (or rounded once, as
/// std::ldexp, when it is subnormal): one multiply when 2^k is normal, else two.
QCOLL_HOST_DEVICE inline double scaled(double x, int k) noexcept {
  if (k >= -1022 && k <= 1023) return mul(x, power_of_two(k));
  const int first = k / 2;
  return mul(mul(x, power_of_two(first)), power_of_two(k - first));
}

/// x on the grid of `exponent` as the two carriers {high, low}: ±0 and non-finite
/// values (and every value of an empty block) as {x, −0}, so they add as themselves.
struct wide_carriers {
  double high, low;
};
QCOLL_HOST_DEVICE inline wide_carriers on_wide_grid(double x, double exponent) noexcept {
  const std::uint64_t magnitude = bits_of_double(x) & ~sign_bit;
  if (exponent == empty_block || (magnitude >> 52) == 0x7ff || magnitude == 0) return {x, -0.0};
  const double s = scaled(x, wide_bits - static_cast<int>(exponent));  // |s| ≤ 2^60
  // From 2^52 up s is already an integer.
  const double rounded = (bits_of_double(s) & ~sign_bit) < bits_of_double(4503599627370496.0) ? nearest_integer(s) : s;
  if (rounded == 0) return {rounded, -0.0};  // signed as the float path's
  const auto q = static_cast<std::int64_t>(rounded);
  const std::int64_t low = q & ((std::int64_t{1} << 30) - 1);
  return {static_cast<double>((q - low) / (std::int64_t{1} << 30)), static_cast<double>(low)};
}

/// Summed carriers back into a double: high · 2^30 + low (one rounding), times the
/// grid's unit (once more), every NaN the same quiet one, divided by `divide` unless 1.
QCOLL_HOST_DEVICE inline double rounded_wide(double high, double low, double exponent, double divide) noexcept {
  const double integer = add(mul(high, 1073741824.0), low);
  double value = exponent == empty_block ? integer : scaled(integer, static_cast<int>(exponent) - wide_bits);
  if (value != value) value = static_cast<double>(quiet_nan());
  return divide != 1.0 ? qcoll::kernels::divide(value, divide) : value;
}

}  // namespace grid_detail
QCOLL_KERNELS_END
