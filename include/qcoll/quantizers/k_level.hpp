#pragma once
/// @file
/// The k-level quantizer with error feedback (spec one-bit-exchange.md §2, §6): L
/// evenly spaced levels (2…256) over each group's range, codes of ceil(log2 L) bits.
/// At L = 16 and G = 2048 a group takes 4 bits per value + 64 bits, 7.9× smaller
/// than float32.
///
/// @par Semantics (every CPU backend gives the same bits)
/// For each group of G values (the last one possibly shorter):
/// - v = x + residual, or v = x without a residual (no + 0: -0 stays -0).
/// - If any v is NaN or ±Inf: the table is {NaN, NaN}, every code 0 (so the group
///   decodes to NaN) and the group's residual is left untouched (split residuals:
///   copied to residual_out).
/// - min, max = the exact extremes of v, -0 made +0 (order-independent).
///   step = (max - min) / (L - 1); if that overflows, max/(L-1) - min/(L-1); if
///   (L-1) * step overflows, FLT_MAX / (L-1); then step is lowered one ulp at a
///   time until min + (L-1) * step is finite, so every level is finite. (A range
///   wider than FLT_MAX is covered only up to min + FLT_MAX; larger values clamp.
///   A subnormal step is a multiple of 2^-149, so the top level may miss max by up
///   to (L-1) * 2^-150.)
/// - scale = 2^24 when 0 < step < FLT_MIN, else 1 (1/step would overflow below 2^-128);
///   inverse = 1 / (step * scale), or 0 when step = 0 (all values equal: every code
///   0, decoding exactly to min).
/// - t = min(((v - min) * scale) * inverse, L - 1) — the clamp is done on t, before
///   the integer conversion, which equals clamping the code to [0, L-1]; t >= 0.
///   c = trunc(t); nearest: c += (t - c >= 0.5) (ties go up); stochastic:
///   c += (u < t - c), with u below.
/// - level(c) = min + float(c) * step (multiply, then add, each rounded; no FMA).
///   residual = v - level(c). decode: out = level(c); decode_accumulate: out += level(c).
///
/// @par Random numbers of stochastic rounding (part of the reproducibility contract)
/// Value i of an encode at encode_position {sequence, offset} has the global index
/// n = offset + i (mod 2^64), and
///
///     splitmix64(z) = z += 0x9e3779b97f4a7c15; z = (z ^ z>>30) * 0xbf58476d1ce4e5b9;
///                     z = (z ^ z>>27) * 0x94d049bb133111eb; return z ^ z>>31
///     lowbias32(x)  = x ^= x>>16; x *= 0x7feb352d; x ^= x>>15; x *= 0x846ca68b; x ^= x>>16
///     key = splitmix64(splitmix64(splitmix64(seed) ^ sequence) ^ (n >> 32))
///     h   = lowbias32(lowbias32(uint32(n) ^ uint32(key)) ^ uint32(key >> 32))
///     u   = float(h >> 8) * 2^-24                      (in [0, 1), 24 random bits)
///
/// so a result depends on (seed, sequence, n) only: not on how the tensor was
/// chunked (cut at group boundaries), the thread count or the SIMD width.
///
/// @par Record of a group of g values
/// [min: f32][step: f32][ceil(g * b / 8) bytes: code i in bits [i*b, i*b + b), LSB-first]
/// Header: parameter a = L - 1, parameter b = rounding (0 nearest, 1 stochastic).
/// The seed is not sent: a receiver needs only the levels.
///
/// @par Thread safety
/// const and stateless: one object may encode and decode from many threads, each
/// with its own residual.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/kernels/group/k_level.hpp>
#include <qcoll/quantizers/framed.hpp>
#include <qcoll/quantizers/spec.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>

namespace qcoll::quantizers {

/// Quantizes float32 values to `levels` evenly spaced levels per group, with error
/// feedback through the caller's residual (see the file comment for the exact rules).
/// @par Complexity
/// encode: two passes over the values; decode: one. The frame is 24 bytes plus,
/// per group of g values, 8 + ceil(g * bits_per_value() / 8) bytes.
class k_level : public detail::framed<k_level, float> {
 public:
  static constexpr const char* name = "k_level";
  static constexpr bool keeps_residual = true;

  /// @throws qcoll::error (invalid_argument) for levels outside 2…256, a group size
  /// that is not a multiple of 8 in [8, 2^24], or an unknown rounding.
  explicit k_level(k_level_options options = {})
      : options_(options), code_bits_(kernels::k_level_detail::code_bits(options.levels)) {
    if (options.levels < 2 || options.levels > 256)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: the levels must be between 2 and 256, not {}", name,
                                 options.levels);
    detail::check_group_size(name, options.group_size);
    if (options.rounding != rounding::nearest && options.rounding != rounding::stochastic)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: unknown rounding {}", name,
                                 static_cast<unsigned>(options.rounding));
  }

  /// From a spec written "k_level<bits>[/group]" (2^bits levels; quantizers/by_name.hpp);
  /// its seed keys the stochastic rounding.
  static constexpr spec_reads reads{.bits = true, .group = true};
  static k_level from_spec(const quantizer_spec& spec) {
    detail::refuse_unread(name, reads, spec);
    k_level_options options;
    if (spec.bits) {
      if (*spec.bits < 1 || *spec.bits > 8)  // named before with_bits turns it into levels
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "{} takes 1 to 8 bits (2 to 256 levels), not bits={}", name, *spec.bits);
      options = k_level_options::with_bits(*spec.bits);
    }
    if (spec.group) options.group_size = *spec.group;
    options.seed = spec.seed;
    return k_level(options);
  }

  /// The code width, ceil(log2(levels)); the table adds 64 bits per group.
  double bits_per_value() const noexcept { return code_bits_; }
  std::size_t group_size() const noexcept { return options_.group_size; }
  unsigned levels() const noexcept { return options_.levels; }
  const k_level_options& options() const noexcept { return options_; }

 private:
  friend class detail::framed<k_level, float>;

  wire::frame_header header() const noexcept {
    return {.scheme = wire::scheme::k_level,
            .type = dtype::f32,
            .parameter_a = static_cast<std::uint8_t>(options_.levels - 1),
            .parameter_b = static_cast<std::uint8_t>(options_.rounding),
            .group_size = static_cast<std::uint32_t>(options_.group_size)};
  }
  wire::record_layout layout(std::size_t) const noexcept {
    return wire::k_level_layout(options_.group_size, code_bits_);
  }
  void encode_records(std::span<const float> in, std::span<const float> residual_in,
                      std::span<float> residual_out, encode_position position, std::byte* records) const noexcept {
    execution::cpu_kernels().k_level_encode(options_, in, residual_in, residual_out, position, records);
  }
  int encode_on(const device::runtime& device, const wire::frame_header& header, dtype type, const void* in,
                std::size_t n, const float* residual_in, float* residual_out, encode_position position,
                std::byte* frame, void* stream) const {
    return device.k_level_encode(options_, header, position, type, in, n, residual_in, residual_out, frame, stream);
  }
  int decode_on(const device::runtime& device, const wire::frame_header& expected, const std::byte* frame,
                std::size_t frame_bytes, std::size_t n, float* out, bool accumulate, std::uint32_t* status,
                void* stream) const {
    return device.k_level_decode(options_, expected, frame, frame_bytes, n, out, accumulate, status, stream);
  }
  /// Any table is valid (NaN marks a non-finite group). Codes must name a level —
  /// only checked when L is not a power of two, the one case a code can exceed it —
  /// and the padding bits after the last code must be zero.
  std::error_code check_records(const std::byte* records, std::size_t n) const noexcept {
    const wire::record_layout records_layout = layout(n);
    const std::size_t group = options_.group_size;
    if ((options_.levels & (options_.levels - 1)) != 0) {
      // A plain array: nvcc 13's front end prints this size as a std::array argument
      // the host compiler cannot parse ("unsigned long((256))").
      constexpr std::size_t chunk = kernels::k_level_detail::chunk;
      std::uint32_t codes[chunk];
      const std::byte* record = records;
      for (std::size_t start = 0; start < n; start += group) {
        const std::size_t g = n - start < group ? n - start : group;
        const std::byte* packed = record + records_layout.table_bytes;
        for (std::size_t first = 0; first < g; first += chunk) {
          const std::size_t count = g - first < chunk ? g - first : chunk;
          kernels::unpack_codes(packed + first * code_bits_ / 8, code_bits_,
                                     std::span<std::uint32_t>(codes, count));
          for (std::size_t j = 0; j < count; ++j)
            if (codes[j] >= options_.levels) return make_error_code(errc::protocol_error);
        }
        record += records_layout.record_bytes(g);
      }
    }
    if (n % group != 0) {
      const std::byte* last = records + (n / group) * records_layout.full_record_bytes();
      if (!wire::padding_is_zero(last + records_layout.table_bytes, n % group, code_bits_))
        return make_error_code(errc::protocol_error);
    }
    return {};
  }
  void decode_records(const std::byte* records, std::span<float> out, bool accumulate) const noexcept {
    execution::cpu_kernels().k_level_decode(options_, records, out, accumulate);
  }

  k_level_options options_;
  unsigned code_bits_;
};

static_assert(quantizer<k_level>);

}  // namespace qcoll::quantizers
