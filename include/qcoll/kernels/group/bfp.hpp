#pragma once
/// @file
/// The per-block decisions of the bfp kernels that every backend shares as one
/// piece of scalar code: the shared exponent from the block's largest magnitude,
/// the exact powers of two that scale by it, the rounding of one value to its
/// mantissa, and the non-finite marker. The SIMD kernels vectorise the same
/// operations in the same order (cpu/simd/bfp.hpp) and use these for their tails.
/// Below them, the driver both backends run (encode, decode): the walk over a
/// frame's blocks, the record fields, the non-finite block and the chunks of
/// mantissas, around the backend's arithmetic.
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
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_KERNELS_BEGIN
namespace bfp_detail {

/// A block record: [shared exponent: i8][mantissas, b bits each, LSB-first].
QCOLL_HOST_DEVICE inline constexpr quantizers::wire::record_layout layout(std::size_t block, unsigned bits) noexcept {
  return quantizers::wire::bfp_layout(block, bits);
}

/// Values per block: the option, or the whole buffer for `whole_tensor` (never 0,
/// so a loop over blocks always advances).
QCOLL_HOST_DEVICE inline constexpr std::size_t block_values(const quantizers::bfp_options& options, std::size_t n) noexcept {
  if (options.block_size != quantizers::bfp_options::whole_tensor) return options.block_size;
  return n > 0 ? n : 1;
}

inline constexpr int nonfinite_exponent = -128;  ///< the exponent byte of a block holding NaN or Inf
inline constexpr int min_exponent = -127;        ///< all-zero blocks, and the clamp of tiny ones

/// Mantissas are computed and decoded in chunks of this many values through a
/// stack buffer; a multiple of 8 (chunks start on byte boundaries of the packed
/// codes) and of every SIMD width.
inline constexpr std::size_t chunk = 256;

/// |v| as bits: for non-negative floats the integer order is the numeric order,
/// and NaN and Inf sort above every finite value.
QCOLL_HOST_DEVICE inline std::uint32_t magnitude_bits(float value) noexcept { return bits_of(value) & 0x7fffffffu; }

/// 2^k exactly, for k in [−149, 127] (denormal below −126).
QCOLL_HOST_DEVICE inline float pow2(int k) noexcept {
  if (k >= -126) return float_of(static_cast<std::uint32_t>(k + 127) << 23);
  return float_of(std::uint32_t{1} << (k + 149));
}

/// ceil(log2 m) for a finite m > 0 given by its bits, exactly.
QCOLL_HOST_DEVICE inline int ceil_log2(std::uint32_t magnitude) noexcept {
  const int biased = static_cast<int>(magnitude >> 23);
  const std::uint32_t fraction = magnitude & 0x7fffffu;
  if (biased > 0) return biased - 127 + (fraction != 0 ? 1 : 0);
  // Denormal: m = fraction · 2^−149, fraction in [1, 2^23).
  const int ceil_fraction = fraction == 1 ? 0 : 32 - count_leading_zeros(fraction - 1);
  return ceil_fraction - 149;
}

/// The largest mantissa magnitude, 2^(b−1) − 1; −2^(b−1) is never written.
QCOLL_HOST_DEVICE inline constexpr std::int32_t max_mantissa(unsigned bits) noexcept {
  return static_cast<std::int32_t>((std::uint32_t{1} << (bits - 1)) - 1);
}

/// 2^(b−1) as a float (exact for every b ≤ 32): a rounded value this large saturates.
QCOLL_HOST_DEVICE inline float saturation_limit(unsigned bits) noexcept { return pow2(static_cast<int>(bits) - 1); }

/// What one block's record holds besides its mantissas.
struct block_scale {
  int exponent = min_exponent;
  float scale = 0;  ///< 2^−exponent, the multiplier that makes mantissas
  float unit = 0;   ///< 2^exponent, the value of one mantissa unit
  bool nonfinite = false;
};

/// The shared exponent from the block's largest magnitude bits.
QCOLL_HOST_DEVICE inline block_scale decide(std::uint32_t max_magnitude, unsigned bits) noexcept {
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
QCOLL_HOST_DEVICE inline float truncate(float y) noexcept {
  return magnitude(y) < 8388608.0f ? static_cast<float>(static_cast<std::int32_t>(y)) : y;
}

/// The adjustment that turns trunc(y) into y rounded half away from zero, from the
/// exact fraction d = y − trunc(y).
QCOLL_HOST_DEVICE inline float round_away_step(float fraction) noexcept {
  return fraction >= 0.5f ? 1.0f : (fraction <= -0.5f ? -1.0f : 0.0f);
}

/// The mantissa of v: round half away from zero of v · 2^−e, saturated. The
/// scaling is exact (a power of two; only results below 2^−126, far under half a
/// unit, lose bits), and so is y − trunc(y).
QCOLL_HOST_DEVICE inline std::int32_t mantissa(float v, float scale, unsigned bits) noexcept {
  const float y = mul(v, scale);
  const float t = truncate(y);
  const float rounded = add(t, round_away_step(sub(y, t)));
  const float limit = saturation_limit(bits);
  // |rounded| <= 2^(b−1); converting +2^31 would overflow int32, so saturate first.
  if (rounded >= limit) return max_mantissa(bits);
  if (rounded <= -limit) return -max_mantissa(bits);
  return static_cast<std::int32_t>(rounded);
}

/// The value of mantissa q in a block of unit 2^e: the conversion rounds only for
/// |q| > 2^24 (b = 32), then the multiply by a power of two is exact.
QCOLL_HOST_DEVICE inline float decoded(std::int32_t q, float unit) noexcept { return mul(static_cast<float>(q), unit); }

/// A b-bit two's complement field, as unpack_codes returns it, to int32.
QCOLL_HOST_DEVICE inline std::int32_t sign_extend(std::uint32_t code, unsigned bits) noexcept {
  const unsigned unused = 32 - bits;
  return static_cast<std::int32_t>(code << unused) >> unused;
}

/// The scalar loops: the reference runs them on whole blocks, the SIMD kernels on
/// the values past their last whole register.

/// max(largest, the magnitude bits of values [begin, end)).
inline std::uint32_t largest_magnitude(const float* x, const float* residual_in, std::size_t begin, std::size_t end,
                                       std::uint32_t largest) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const std::uint32_t magnitude = magnitude_bits(fed(x, residual_in, i));
    largest = magnitude > largest ? magnitude : largest;
  }
  return largest;
}

/// The mantissas of values [begin, end) of a finite block into mantissas[i - begin]
/// (two's complement bits: uint32, or int8 for b = 8), their new errors to
/// residual_out[i] (when not null).
template <class Code>
inline void encode_values(const block_scale& block, unsigned bits, const float* x, const float* residual_in,
                          float* residual_out, std::size_t begin, std::size_t end, Code* mantissas) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const float v = fed(x, residual_in, i);
    const std::int32_t q = mantissa(v, block.scale, bits);
    mantissas[i - begin] = static_cast<Code>(q);
    if (residual_out) residual_out[i] = sub(v, decoded(q, block.unit));
  }
}

/// y[j] = (or +=) the value of the b-bit field fields[j] in a block of unit 2^e, j < count.
inline void decode_values(const std::uint32_t* fields, std::size_t count, unsigned bits, float unit, float* y,
                          bool accumulate) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const float value = decoded(sign_extend(fields[j], bits), unit);
    y[j] = accumulate ? add(y[j], value) : value;
  }
}

/// y[j] = (or +=) the value of the 8-bit mantissa codes[j] in a block of unit 2^e,
/// j < count: decode_values for b = 8, read from the record's bytes in place.
inline void decode_byte_values(const std::int8_t* codes, std::size_t count, float unit, float* y,
                               bool accumulate) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const float value = decoded(codes[j], unit);
    y[j] = accumulate ? add(y[j], value) : value;
  }
}

// The driver. `Kernels` is the backend's arithmetic, a type with these static
// functions (QCOLL_KERNEL_INLINE, each called from one place below):
//   std::uint32_t max_magnitude(const float* x, const float* residual_in, std::size_t g)
//     the largest magnitude_bits(fed(…)) of a block's g values;
//   void encode_chunk(const block_scale&, unsigned bits, const float* x, const float* residual_in,
//                     float* residual_out, std::size_t first, std::size_t count, std::uint32_t* mantissas)
//     the mantissas (two's complement bits) of values [first, first + count) of a finite
//     block into mantissas[0, count) (64-byte aligned), and their new residuals when
//     residual_out is not null;
//   void encode_bytes(const block_scale&, const float* x, const float* residual_in, float* residual_out,
//                     std::size_t first, std::size_t count, std::int8_t* codes)
//     the same for b = 8, the mantissas written straight into the record;
//   void fill_nan(float* y, std::size_t g)
//     y[0, g) = quiet_nan(), for a non-finite block in both decode modes;
//   void decode_chunk(const std::uint32_t* fields, std::size_t count, unsigned bits, float unit, float* y,
//                     bool accumulate)
//     y[j] = (or +=) decoded(sign_extend(fields[j], bits), unit), j < count (fields 64-byte aligned);
//   void decode_bytes(const std::int8_t* codes, std::size_t count, float unit, float* y, bool accumulate)
//     the same for b = 8, straight from the record (no unpacking into 32-bit fields: a SIMD
//     load of fields that narrower stores just wrote stalls on store forwarding).

/// Encodes one block of g values into its record.
template <class Kernels>
QCOLL_KERNEL_INLINE void encode_block(unsigned bits, const float* x, const float* residual_in, float* residual_out,
                                      std::size_t g, std::byte* record) noexcept {
  const block_scale block = decide(Kernels::max_magnitude(x, residual_in, g), bits);
  store<std::int8_t>(record, static_cast<std::int8_t>(block.exponent));
  std::byte* codes = record + layout(g, bits).table_bytes;
  if (block.nonfinite) {
    keep_residual(residual_in, residual_out, g);
    __builtin_memset(codes, 0, layout(g, bits).codes_bytes(g));
    return;
  }
  if (bits == 8)
    return Kernels::encode_bytes(block, x, residual_in, residual_out, 0, g, reinterpret_cast<std::int8_t*>(codes));
  alignas(64) std::uint32_t mantissas[chunk];
  for (std::size_t first = 0; first < g; first += chunk) {
    const std::size_t c = g - first < chunk ? g - first : chunk;
    Kernels::encode_chunk(block, bits, x, residual_in, residual_out, first, c, mantissas);
    pack_codes(std::span<const std::uint32_t>(mantissas, c), bits, codes + first * bits / 8);
  }
}

/// Encodes in.size() values into the records of a frame (header excluded).
/// The residuals are both empty (no error feedback) or both as long as `in`, and
/// either the same range or disjoint.
template <class Kernels>
void encode(const quantizers::bfp_options& options, std::span<const float> in, std::span<const float> residual_in,
            std::span<float> residual_out, std::byte* records) noexcept {
  const std::size_t block = block_values(options, in.size());
  const bool feedback = !residual_out.empty();
  for_each_group(layout(block, options.mantissa_bits), in.size(), records,
                 [&](std::size_t first, std::size_t g, std::byte* record) {
                   encode_block<Kernels>(options.mantissa_bits, in.data() + first,
                                         feedback ? residual_in.data() + first : nullptr,
                                         feedback ? residual_out.data() + first : nullptr, g, record);
                 });
}

/// out = decoded (accumulate false) or out += decoded (accumulate true). The
/// records must have passed the quantizer's checks (exponents in range).
template <class Kernels>
void decode(const quantizers::bfp_options& options, const std::byte* records, std::span<float> out,
            bool accumulate) noexcept {
  const unsigned bits = options.mantissa_bits;
  const auto records_layout = layout(block_values(options, out.size()), bits);
  for_each_group(records_layout, out.size(), records, [&](std::size_t first, std::size_t g, const std::byte* record) {
    const int exponent = load<std::int8_t>(record);
    const std::byte* codes = record + records_layout.table_bytes;
    float* y = out.data() + first;
    // out + NaN is NaN: both modes store the one quiet NaN, whatever out held, so
    // no backend's NaN payload differs.
    if (exponent == nonfinite_exponent) return Kernels::fill_nan(y, g);
    const float unit = pow2(exponent);
    if (bits == 8) return Kernels::decode_bytes(reinterpret_cast<const std::int8_t*>(codes), g, unit, y, accumulate);
    alignas(64) std::uint32_t fields[chunk];
    for (std::size_t start = 0; start < g; start += chunk) {
      const std::size_t c = g - start < chunk ? g - start : chunk;
      unpack_codes(codes + start * bits / 8, bits, std::span<std::uint32_t>(fields, c));
      Kernels::decode_chunk(fields, c, bits, unit, y + start, accumulate);
    }
  });
}

}  // namespace bfp_detail
QCOLL_KERNELS_END
