#pragma once
/// @file
/// The 1-bit threshold quantizer with error feedback (spec one-bit-exchange.md §3–5).
///
/// Values are cut into groups of G (default 2048). Within a group every value v
/// (input + residual) becomes one bit: 1 when v >= τ (τ = 0, or the group mean).
/// Two reconstruction values per group travel with the bits: the mean of the values
/// in each bin (default; an empty bin gives 0) or the group's min and max. At
/// G = 2048 a group takes 2048 bits + 64 bits, 31.0× smaller than float32.
///
/// @par Record of a group of g values
/// [bin 0 value: f32][bin 1 value: f32][ceil(g/8) bytes, value i at bit i%8 of byte i/8]
///
/// @par Thread safety
/// const and stateless: one object may encode and decode from many threads, each
/// with its own residual.

#include <qcoll/core/concepts.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/quantizers/framed.hpp>

#include <cstddef>
#include <span>
#include <system_error>

namespace qcoll::quantizers {

class one_bit : public detail::framed<one_bit, float> {
 public:
  static constexpr const char* name = "one_bit";
  static constexpr bool keeps_residual = true;

  /// @throws qcoll::error (invalid_argument) for a group size that is not a multiple of 8 in [8, 2^24].
  explicit one_bit(one_bit_options options = {}) : options_(options) {
    detail::check_group_size(name, options.group_size);
  }

  constexpr double bits_per_value() const noexcept { return 1.0; }
  std::size_t group_size() const noexcept { return options_.group_size; }
  const one_bit_options& options() const noexcept { return options_; }

 private:
  friend class detail::framed<one_bit, float>;

  wire::frame_header header() const noexcept {
    return {.scheme = wire::scheme::one_bit,
            .type = dtype::f32,
            .parameter_a = static_cast<std::uint8_t>(options_.threshold),
            .parameter_b = static_cast<std::uint8_t>(options_.reconstruction),
            .group_size = static_cast<std::uint32_t>(options_.group_size)};
  }
  wire::record_layout layout(std::size_t) const noexcept {
    return wire::one_bit_layout(options_.group_size);
  }
  void encode_records(std::span<const float> in, std::span<const float> residual_in,
                      std::span<float> residual_out, encode_position, std::byte* records) const noexcept {
    kernels::cpu::active_kernels().one_bit_encode(options_, in, residual_in, residual_out, records);
  }
  /// Any bits and any reconstruction values are a valid group; only the padding
  /// bits after the last value must be zero.
  std::error_code check_records(const std::byte* records, std::size_t n) const noexcept {
    if (n % options_.group_size == 0) return {};
    const wire::record_layout records_layout = layout(n);
    const std::byte* last = records + (n / options_.group_size) * records_layout.full_record_bytes();
    if (!wire::padding_is_zero(last + records_layout.table_bytes, n % options_.group_size, 1))
      return make_error_code(errc::protocol_error);
    return {};
  }
  void decode_records(const std::byte* records, std::span<float> out, bool accumulate) const noexcept {
    kernels::cpu::active_kernels().one_bit_decode(options_, records, out, accumulate);
  }

  one_bit_options options_;
};

static_assert(quantizer<one_bit>);

}  // namespace qcoll::quantizers
