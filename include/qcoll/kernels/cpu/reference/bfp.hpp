#pragma once
/// @file
/// The bfp reference kernels: plain loops over the shared rules of kernels/group/bfp.hpp
/// that define the results every other backend must reproduce bit for bit.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/bfp.hpp>
#include <qcoll/kernels/group/codes.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

inline void bfp_encode_block(unsigned bits, const float* x, const float* residual_in, float* residual_out,
                             std::size_t g, std::byte* record) noexcept {
  using namespace bfp_detail;
  std::uint32_t max_magnitude = 0;
  for (std::size_t i = 0; i < g; ++i) {
    const std::uint32_t magnitude = magnitude_bits(fed(x, residual_in, i));
    max_magnitude = magnitude > max_magnitude ? magnitude : max_magnitude;
  }
  const block_scale block = decide(max_magnitude, bits);
  store<std::int8_t>(record, static_cast<std::int8_t>(block.exponent));
  std::byte* codes = record + layout(g, bits).table_bytes;
  if (block.nonfinite) {
    keep_residual(residual_in, residual_out, g);
    __builtin_memset(codes, 0, layout(g, bits).codes_bytes(g));
    return;
  }
  std::uint32_t mantissas[chunk];
  for (std::size_t first = 0; first < g; first += chunk) {
    const std::size_t c = g - first < chunk ? g - first : chunk;
    for (std::size_t j = 0; j < c; ++j) {
      const std::size_t i = first + j;
      const float v = fed(x, residual_in, i);
      const std::int32_t q = mantissa(v, block.scale, bits);
      mantissas[j] = static_cast<std::uint32_t>(q);
      if (residual_out) residual_out[i] = v - decoded(q, block.unit);
    }
    pack_codes(std::span<const std::uint32_t>(mantissas, c), bits, codes + first * bits / 8);
  }
}

/// Encodes in.size() values into the records of a frame (header excluded).
/// The residuals are both empty (no error feedback) or both as long as `in`, and
/// either the same range or disjoint.
inline void bfp_encode(const quantizers::bfp_options& options, std::span<const float> in,
                       std::span<const float> residual_in, std::span<float> residual_out,
                       std::byte* records) noexcept {
  const std::size_t block = bfp_detail::block_values(options, in.size());
  const auto records_layout = bfp_detail::layout(block, options.mantissa_bits);
  const bool feedback = !residual_out.empty();
  for_each_group(records_layout, in.size(), records, [&](std::size_t first, std::size_t g, auto* records) {
    bfp_encode_block(options.mantissa_bits, in.data() + first, feedback ? residual_in.data() + first : nullptr,
                     feedback ? residual_out.data() + first : nullptr, g, records);
  });
}

/// out = decoded (accumulate false) or out += decoded (accumulate true). The
/// records must have passed the quantizer's checks (exponents in range).
inline void bfp_decode(const quantizers::bfp_options& options, const std::byte* records, std::span<float> out,
                       bool accumulate) noexcept {
  using namespace bfp_detail;
  const unsigned bits = options.mantissa_bits;
  const std::size_t block = block_values(options, out.size());
  const auto records_layout = layout(block, bits);
  for_each_group(records_layout, out.size(), records, [&](std::size_t first, std::size_t g, auto* records) {
    const int exponent = load<std::int8_t>(records);
    const std::byte* codes = records + records_layout.table_bytes;
    float* y = out.data() + first;
    if (exponent == nonfinite_exponent) {
      // out + NaN is NaN: both modes store the one quiet NaN, whatever out held.
      for (std::size_t i = 0; i < g; ++i) y[i] = quiet_nan();
    } else {
      const float unit = pow2(exponent);
      std::uint32_t mantissas[chunk];
      for (std::size_t start = 0; start < g; start += chunk) {
        const std::size_t c = g - start < chunk ? g - start : chunk;
        unpack_codes(codes + start * bits / 8, bits, std::span<std::uint32_t>(mantissas, c));
        for (std::size_t j = 0; j < c; ++j) {
          const float value = decoded(sign_extend(mantissas[j], bits), unit);
          float& at = y[start + j];
          at = accumulate ? at + value : value;
        }
      }
    }
  });
}

}  // namespace reference
QCOLL_CPU_KERNELS_END
