#pragma once
/// @file
/// The per-group decisions of the k_level kernels that every backend shares as one
/// piece of code: the table (minimum, step) from a group's extremes, the rounding of
/// one value, and the counter-based random numbers of stochastic rounding. The
/// SIMD kernels vectorise the same operations in the same order and fall back to
/// these functions for the last partial vector of a group, so every backend gives
/// the same bits. quantizers/k_level.hpp states the semantics. Below them, the
/// driver both backends run (encode, decode): the walk over a frame's groups, the
/// random streams, the table, the non-finite group and the chunks of codes, around
/// the backend's arithmetic. The per-value and per-group decisions are
/// QCOLL_HOST_DEVICE: kernels/simt/k_level.hpp makes them on the GPU.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

QCOLL_KERNELS_BEGIN
namespace k_level_detail {

/// Bits per code: ceil(log2(levels)), 1…8 for 2…256 levels.
QCOLL_HOST_DEVICE inline constexpr unsigned code_bits(unsigned levels) noexcept {
  unsigned bits = 1;
  while (bits < 32 && (std::uint64_t{1} << bits) < levels) ++bits;
  return bits;
}

/// A group record: [minimum: f32][step: f32][codes, code_bits each, LSB-first].
QCOLL_HOST_DEVICE inline constexpr quantizers::wire::record_layout layout(const quantizers::k_level_options& options) noexcept {
  return quantizers::wire::k_level_layout(options.group_size, code_bits(options.levels));
}

/// Codes are computed into a stack buffer of this many, then packed. A multiple of
/// 8 (so every chunk starts on a byte boundary) and of every SIMD width.
inline constexpr std::size_t chunk = 256;

/// The running extremes of a group, updated the same way by every backend (a NaN
/// never replaces an extreme; non-finite groups are caught separately).
QCOLL_HOST_DEVICE inline float lower(float value, float low) noexcept { return value < low ? value : low; }
QCOLL_HOST_DEVICE inline float higher(float value, float high) noexcept { return value > high ? value : high; }

/// Widens [low, high] over values [begin, end) of a group; whether they are all finite.
inline bool widen_extremes(const float* x, const float* residual_in, std::size_t begin, std::size_t end, float& low,
                           float& high) noexcept {
  bool finite = true;
  for (std::size_t i = begin; i < end; ++i) {
    const float v = fed(x, residual_in, i);
    finite = finite && is_finite(v);
    low = lower(v, low);
    high = higher(v, high);
  }
  return finite;
}

struct table {
  float min = 0;   ///< level 0 (on the wire)
  float step = 0;  ///< distance between levels (on the wire)
  float scale = 1;    ///< 2^24 for a subnormal step, else 1 (encode only)
  float inverse = 0;  ///< 1 / (step * scale), or 0 for step 0 (encode only)
  float top = 0;      ///< levels - 1, the largest code
};

/// A group holding NaN or Inf encodes as {NaN, NaN} with all codes 0, so every
/// value decodes to NaN (a loss scaler downstream sees it); it keeps its residual
/// (keep_residual).
QCOLL_HOST_DEVICE inline float nonfinite_value() noexcept { return quiet_nan(); }

/// The table of a finite group whose values lie in [low, high].
QCOLL_HOST_DEVICE inline table make_table(float low, float high, unsigned levels) noexcept {
  const float largest = float_of(0x7f7fffffu);          // FLT_MAX
  const float smallest_normal = float_of(0x00800000u);  // FLT_MIN
  table result;
  result.top = static_cast<float>(levels - 1);
  // + 0.0f turns -0 into +0, so the order the extremes were found in cannot matter.
  result.min = add(low, 0.0f);
  const float max = add(high, 0.0f);
  float step = divide(sub(max, result.min), result.top);
  if (!is_finite(step))  // the range overflowed float
    step = sub(divide(max, result.top), divide(result.min, result.top));
  // Every level min + c * step (c <= top) must be finite, the product included;
  // rounding is monotonic, so checking the top level is enough. A range wider than
  // float's largest value cannot be covered: the levels then span [min, min + FLT_MAX].
  if (!is_finite(mul(result.top, step))) step = divide(largest, result.top);
  while (!is_finite(mul(result.top, step)) || !is_finite(add(result.min, mul(result.top, step))))
    step = next_toward_zero(step);
  result.step = step;
  // 1 / step overflows for steps below 2^-128; scaling (v - min) and the step by 2^24
  // (exact: a power of two, far from overflow there) keeps t exact to rounding.
  if (step > 0.0f && step < smallest_normal) result.scale = 0x1p24f;
  result.inverse = step > 0.0f ? divide(1.0f, mul(step, result.scale)) : 0.0f;
  return result;
}

/// t = ((v - min) * scale) * inverse in [0, top]: the position of v between the levels.
/// v >= min, so t >= 0 (never NaN: inverse is finite, and 0 only when v == min).
QCOLL_HOST_DEVICE inline float position(float v, const table& t) noexcept {
  const float scaled = mul(mul(sub(v, t.min), t.scale), t.inverse);
  return scaled < t.top ? scaled : t.top;
}

/// The code of v as a float (exact: 0…255). Nearest: ties go up. Stochastic: up
/// with probability P(u < t - floor(t)), u uniform in [0, 1) in steps of 2^-24.
template <bool stochastic>
QCOLL_HOST_DEVICE inline float code_of(float v, const table& t, float u) noexcept {
  const float place = position(v, t);
  const float code = static_cast<float>(static_cast<std::int32_t>(place));  // trunc; place >= 0
  const float fraction = sub(place, code);                                  // exact
  if constexpr (stochastic) return add(code, u < fraction ? 1.0f : 0.0f);
  else return add(code, fraction >= 0.5f ? 1.0f : 0.0f);
}

/// What code c decodes to: min + c * step, the multiply and the add rounded separately.
QCOLL_HOST_DEVICE inline float level(float min, float step, float code) noexcept {
  return add(min, mul(code, step));
}

// The random numbers of stochastic rounding. Value i of an encode call at
// encode_position {sequence, offset} has the global index n = offset + i (mod 2^64).
// Its number depends on (seed, sequence, n) only:
//   key  = splitmix64(splitmix64(splitmix64(seed) ^ sequence) ^ (n >> 32))
//   h    = lowbias32(lowbias32(uint32(n) ^ uint32(key)) ^ uint32(key >> 32))
//   u    = float(h >> 8) * 2^-24
// The key is constant over 2^32 consecutive indices, so it is computed once per run
// (in scalar code) and each value costs only 32-bit xor, shift and multiply.

/// splitmix64's output function (Steele, Lea, Flood 2014) applied to z + golden gamma.
QCOLL_HOST_DEVICE inline constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15u;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

/// Chris Wellons' lowbias32 integer hash (a bijection on 32 bits).
QCOLL_HOST_DEVICE inline constexpr std::uint32_t lowbias32(std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

struct random_key {
  std::uint32_t low = 0, high = 0;
};

QCOLL_HOST_DEVICE inline constexpr random_key make_key(std::uint64_t seed, std::uint64_t sequence, std::uint32_t index_high) noexcept {
  const std::uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ sequence) ^ index_high);
  return {static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)};
}

QCOLL_HOST_DEVICE inline constexpr std::uint32_t random_bits(random_key key, std::uint32_t index_low) noexcept {
  return lowbias32(lowbias32(index_low ^ key.low) ^ key.high);
}

/// 24 random bits as a float in [0, 1); the conversion and the scaling are exact.
QCOLL_HOST_DEVICE inline float uniform(std::uint32_t bits) noexcept {
  return mul(static_cast<float>(static_cast<std::int32_t>(bits >> 8)), 0x1p-24f);
}

/// The random numbers of one group. A group (at most 2^24 values) crosses at most
/// one multiple of 2^32 in the global index: values [0, split) use keys[0], the rest keys[1].
struct group_stream {
  std::uint32_t first_low = 0;  ///< low 32 bits of the global index of the group's value 0
  std::size_t split = 0;
  random_key keys[2];

  QCOLL_HOST_DEVICE std::uint32_t index_low(std::size_t i) const noexcept {
    return first_low + static_cast<std::uint32_t>(i);
  }
  QCOLL_HOST_DEVICE const random_key& key_at(std::size_t i) const noexcept { return keys[i < split ? 0 : 1]; }
  QCOLL_HOST_DEVICE float u(std::size_t i) const noexcept { return uniform(random_bits(key_at(i), index_low(i))); }
};

/// The stream of the g values starting at value `first` of an encode call at
/// `position`. (A key costs three splitmix64 calls, a few dozen instructions per
/// group of thousands of values.)
QCOLL_HOST_DEVICE inline group_stream make_group_stream(std::uint64_t seed, quantizers::encode_position position,
                                                        std::size_t first, std::size_t g) noexcept {
  const std::uint64_t start = position.offset + first;  // wraps modulo 2^64, like the index
  group_stream stream;
  stream.first_low = static_cast<std::uint32_t>(start);
  const std::uint64_t to_next_run = (std::uint64_t{1} << 32) - stream.first_low;
  stream.split = to_next_run < g ? static_cast<std::size_t>(to_next_run) : g;
  stream.keys[0] = make_key(seed, position.sequence, static_cast<std::uint32_t>(start >> 32));
  stream.keys[1] = stream.split < g
                       ? make_key(seed, position.sequence, static_cast<std::uint32_t>((start + to_next_run) >> 32))
                       : stream.keys[0];
  return stream;
}


/// Codes start after the table.
QCOLL_HOST_DEVICE inline std::byte* codes_of(std::byte* record) noexcept { return record + 2 * sizeof(float); }
QCOLL_HOST_DEVICE inline const std::byte* codes_of(const std::byte* record) noexcept {
  return record + 2 * sizeof(float);
}

QCOLL_HOST_DEVICE inline void store_table(std::byte* record, float min, float step) noexcept {
  store(record, min);
  store(record + sizeof(float), step);
}

/// The record of a group holding NaN or Inf: {NaN, NaN} and all codes 0.
inline void store_nonfinite(const quantizers::k_level_options& options, std::byte* record, std::size_t g) noexcept {
  store_table(record, nonfinite_value(), nonfinite_value());
  __builtin_memset(codes_of(record), 0, layout(options).codes_bytes(g));
}

/// Quantizes values [begin, end) of a group: the code of value i goes to
/// codes[i - begin], its new error to residual_out[i] (when there is a residual).
template <bool stochastic>
inline void encode_values(const float* x, const float* residual_in, float* residual_out, std::size_t begin,
                          std::size_t end, const table& t, const group_stream& stream, std::uint32_t* codes) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const float v = fed(x, residual_in, i);
    const float code = code_of<stochastic>(v, t, stochastic ? stream.u(i) : 0.0f);
    codes[i - begin] = static_cast<std::uint32_t>(code);
    if (residual_out) residual_out[i] = sub(v, level(t.min, t.step, code));
  }
}

/// y[j] = (or +=) the level of codes[j], j < count.
inline void decode_values(float min, float step, const std::uint32_t* codes, std::size_t count, float* y,
                          bool accumulate) noexcept {
  for (std::size_t j = 0; j < count; ++j) {
    const float value = level(min, step, static_cast<float>(codes[j]));
    y[j] = accumulate ? add(y[j], value) : value;
  }
}

// The driver. `Kernels` is the backend's arithmetic, a type with these static
// functions (QCOLL_KERNEL_INLINE, each called from one place below):
//   bool extremes(const float* x, const float* residual_in, std::size_t g, float& low, float& high)
//     the group's lowest and highest fed value, as lower() and higher() find them, and
//     whether every value is finite;
//   template <bool stochastic>
//   void encode_chunk(const float* x, const float* residual_in, float* residual_out, std::size_t first,
//                     std::size_t count, const table&, const group_stream&, std::uint32_t* codes)
//     encode_values<stochastic>(…, first, first + count, …, codes) (codes 64-byte aligned);
//   void decode_chunk(float min, float step, const std::uint32_t* codes, std::size_t count, float* y,
//                     bool accumulate)
//     decode_values(min, step, codes, count, y, accumulate) (codes 64-byte aligned).

/// Encodes one group of g values into its record.
template <class Kernels, bool stochastic>
QCOLL_KERNEL_INLINE void encode_group(const quantizers::k_level_options& options, const float* x,
                                      const float* residual_in, float* residual_out, std::size_t g,
                                      const group_stream& stream, std::byte* record) noexcept {
  const unsigned bits = code_bits(options.levels);
  float low, high;
  if (!Kernels::extremes(x, residual_in, g, low, high)) {
    keep_residual(residual_in, residual_out, g);
    store_nonfinite(options, record, g);
    return;
  }
  const table t = make_table(low, high, options.levels);
  store_table(record, t.min, t.step);
  alignas(64) std::uint32_t codes[chunk];
  for (std::size_t first = 0; first < g; first += chunk) {
    const std::size_t count = g - first < chunk ? g - first : chunk;
    Kernels::template encode_chunk<stochastic>(x, residual_in, residual_out, first, count, t, stream, codes);
    pack_codes(std::span<const std::uint32_t>(codes, count), bits, codes_of(record) + first * bits / 8);
  }
}

/// Encodes in.size() values into the records of a frame (header excluded), each
/// group with its random stream. The residuals are both empty (no error feedback)
/// or both as long as `in`, and either the same range or disjoint.
template <class Kernels>
void encode(const quantizers::k_level_options& options, std::span<const float> in,
            std::span<const float> residual_in, std::span<float> residual_out, quantizers::encode_position position,
            std::byte* records) noexcept {
  const bool stochastic = options.rounding == quantizers::rounding::stochastic;
  const bool feedback = !residual_out.empty();
  for_each_group(layout(options), in.size(), records, [&](std::size_t first, std::size_t g, std::byte* record) {
    const float* x = in.data() + first;
    const float* r_in = feedback ? residual_in.data() + first : nullptr;
    float* r_out = feedback ? residual_out.data() + first : nullptr;
    if (stochastic)
      encode_group<Kernels, true>(options, x, r_in, r_out, g, make_group_stream(options.seed, position, first, g), record);
    else
      encode_group<Kernels, false>(options, x, r_in, r_out, g, group_stream{}, record);
  });
}

/// out = decoded (accumulate false) or out += decoded (accumulate true).
template <class Kernels>
void decode(const quantizers::k_level_options& options, const std::byte* records, std::span<float> out,
            bool accumulate) noexcept {
  const auto records_layout = layout(options);
  const unsigned bits = records_layout.code_bits;
  alignas(64) std::uint32_t codes[chunk];
  for_each_group(records_layout, out.size(), records, [&](std::size_t start, std::size_t g, const std::byte* record) {
    const float min = load<float>(record);
    const float step = load<float>(record + sizeof(float));
    float* y = out.data() + start;
    for (std::size_t first = 0; first < g; first += chunk) {
      const std::size_t count = g - first < chunk ? g - first : chunk;
      unpack_codes(codes_of(record) + first * bits / 8, bits, std::span<std::uint32_t>(codes, count));
      Kernels::decode_chunk(min, step, codes, count, y + first, accumulate);
    }
  });
}

}  // namespace k_level_detail
QCOLL_KERNELS_END
