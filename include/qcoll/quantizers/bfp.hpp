#pragma once
/// @file
/// Block floating point (spec bfp-lazy-update.md §2): blocks of values share one
/// signed 8-bit exponent e, each value keeps a b-bit two's complement mantissa q,
/// and decodes to q · 2^e. With error feedback the rounding error of each value
/// goes into the caller's residual.
///
/// Blocks hold `block_size` values (default 32, as in the OCP MX formats; any
/// multiple of 8), or the whole encoded buffer (`bfp_options::whole_tensor`, the
/// spec's reading) — then a caller may cut buffers anywhere, and each piece gets
/// its own exponent.
///
/// @par Rules (kernels/group/bfp.hpp has them in code)
/// - v = x + residual (x alone without a residual); m = max |v| over the block.
/// - e = ceil(log2 m) − (b − 1), computed exactly from m's bits, clamped below at
///   −127; an all-zero block gets e = −127 and zero mantissas. Hence
///   e ∈ [−127, 129 − b]. Blocks whose values are all below 2^(b−129)/2, denormals
///   for instance, decode to 0 and keep their values in the residual.
/// - q = round half away from zero (v · 2^−e), saturated to ±(2^(b−1) − 1): an
///   exact power-of-two maximum would need 2^(b−1), one past the signed range.
/// - Decoded value: float(q) · 2^e. The error is at most 2^e / 2, except for a
///   saturated value (at most 2^e).
/// - A block holding NaN or ±Inf (in v) is sent as exponent −128 with zero
///   mantissas; it decodes to NaN (decode_accumulate stores NaN there too), and
///   its residual is left untouched (split residuals: copied to residual_out).
///
/// @par Record of a block of g values
/// [exponent: i8][ceil(g·b/8) bytes: mantissa i at bits [i·b, i·b + b), LSB-first]
/// The header carries b as parameter a, 0 as parameter b, and the block size as
/// the group size (0: whole tensor). At b = 8, block 32 a value takes 8.25 bits.
///
/// @par Thread safety
/// const and stateless: one object may encode and decode from many threads, each
/// with its own residual.

#include <qcoll/core/concepts.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/quantizers/framed.hpp>
#include <qcoll/quantizers/spec.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <span>
#include <system_error>

namespace qcoll::quantizers {

class bfp : public detail::framed<bfp, float> {
 public:
  static constexpr const char* name = "bfp";
  static constexpr bool keeps_residual = true;

  /// @throws qcoll::error (invalid_argument) for mantissa bits other than 2…16 or
  /// 32, or a block size that is neither `whole_tensor` nor a multiple of 8 in [8, 2^24].
  explicit bfp(bfp_options options = {}) : options_(options) {
    const unsigned b = options.mantissa_bits;
    if (!((b >= 2 && b <= 16) || b == 32))
      qcoll::detail::throw_error(errc::invalid_argument, "bfp: the mantissa bits must be 2 to 16 or 32, not {}", b);
    const std::size_t block = options.block_size;
    if (block != bfp_options::whole_tensor && (block % 8 != 0 || block > wire::max_group_size))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "bfp: the block size must be a multiple of 8 between 8 and {}, or "
                                 "bfp_options::whole_tensor (0), not {}",
                                 wire::max_group_size, block);
  }

  /// From a spec written "bfp<mantissa bits>[/block]" (quantizers/by_name.hpp).
  static constexpr spec_reads reads{.bits = true, .group = true};
  static bfp from_spec(const quantizer_spec& spec) {
    detail::refuse_unread(name, reads, spec);
    bfp_options options;
    if (spec.bits) options.mantissa_bits = *spec.bits;
    if (spec.group) options.block_size = *spec.group;
    return bfp(options);
  }

  /// The mantissa width; the exponent adds 8 bits per block.
  double bits_per_value() const noexcept { return options_.mantissa_bits; }
  /// The block size; 0 for whole-tensor blocks (any cut is a valid one).
  std::size_t group_size() const noexcept { return options_.block_size; }
  const bfp_options& options() const noexcept { return options_; }

 private:
  friend class detail::framed<bfp, float>;

  wire::frame_header header() const noexcept {
    return {.scheme = wire::scheme::bfp,
            .type = dtype::f32,
            .parameter_a = static_cast<std::uint8_t>(options_.mantissa_bits),
            .parameter_b = 0,
            .group_size = static_cast<std::uint32_t>(options_.block_size)};
  }
  /// Whole-tensor blocks: one block of n values (at least 1, so the arithmetic holds for n = 0).
  wire::record_layout layout(std::size_t n) const noexcept {
    const std::size_t block = options_.block_size != bfp_options::whole_tensor ? options_.block_size
                                                                                : std::max<std::size_t>(n, 1);
    return wire::bfp_layout(block, options_.mantissa_bits);
  }
  void encode_records(std::span<const float> in, std::span<const float> residual_in,
                      std::span<float> residual_out, encode_position, std::byte* records) const noexcept {
    execution::cpu_kernels().bfp_encode(options_, in, residual_in, residual_out, records);
  }
  int encode_on(const device::runtime& device, const wire::frame_header& header, dtype type, const void* in,
                std::size_t n, const float* residual_in, float* residual_out, encode_position, std::byte* frame,
                void* stream) const {
    return device.bfp_encode(options_, header, type, in, n, residual_in, residual_out, frame, stream);
  }
  int decode_on(const device::runtime& device, const wire::frame_header& expected, const std::byte* frame,
                std::size_t frame_bytes, std::size_t n, float* out, bool accumulate, std::uint32_t* status,
                void* stream) const {
    return device.bfp_decode(options_, expected, frame, frame_bytes, n, out, accumulate, status, stream);
  }

  /// Accepts only what the encoder writes: an exponent in [−127, 129 − b], or −128
  /// (non-finite) with all mantissas 0; no mantissa −2^(b−1); zero padding bits.
  std::error_code check_records(const std::byte* records, std::size_t n) const noexcept {
    const unsigned b = options_.mantissa_bits;
    const wire::record_layout records_layout = layout(n);
    const std::size_t block = records_layout.group;
    const int max_exponent = 129 - static_cast<int>(b);
    const std::uint32_t mask = b == 32 ? ~std::uint32_t{0} : (std::uint32_t{1} << b) - 1;
    const std::uint32_t most_negative = std::uint32_t{1} << (b - 1);  // the field of −2^(b−1)
    constexpr std::size_t chunk = 256;  // a multiple of 8: chunks start on whole bytes
    std::array<std::uint32_t, chunk> fields;
    for (std::size_t first = 0; first < n; first += block) {
      const std::size_t g = std::min(block, n - first);
      const int exponent = wire::detail::load<std::int8_t>(records);
      const bool nonfinite = exponent == -128;
      if (!nonfinite && exponent > max_exponent) return make_error_code(errc::protocol_error);
      const std::byte* codes = records + records_layout.table_bytes;
      if (b == 8 && !nonfinite) {
        // Byte codes, the common case: one memchr for the forbidden 0x80 instead of an
        // unpack per value (this check took 43 % of an 8-bit compressed allreduce).
        if (g != 0 && std::memchr(codes, 0x80, g) != nullptr) return make_error_code(errc::protocol_error);
        records += records_layout.record_bytes(g);
        continue;
      }
      for (std::size_t start = 0; start < g; start += chunk) {
        const std::size_t c = std::min(chunk, g - start);
        kernels::unpack_codes(codes + start * b / 8, b, std::span(fields.data(), c));
        for (std::size_t j = 0; j < c; ++j) {
          const std::uint32_t field = fields[j] & mask;
          if (field == most_negative || (nonfinite && field != 0)) return make_error_code(errc::protocol_error);
        }
      }
      if (!wire::padding_is_zero(codes, g, b)) return make_error_code(errc::protocol_error);
      records += records_layout.record_bytes(g);
    }
    return {};
  }

  void decode_records(const std::byte* records, std::span<float> out, bool accumulate) const noexcept {
    execution::cpu_kernels().bfp_decode(options_, records, out, accumulate);
  }

  bfp_options options_;
};

static_assert(quantizer<bfp>);

}  // namespace qcoll::quantizers
