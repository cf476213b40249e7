#pragma once
/// @file
/// One backend's quantizer, conversion and reproducible-sum kernels, as plain function pointers, so the backend is
/// chosen once at run time (dispatch.hpp) and every quantizer call goes through
/// the same table. Kernels write and read a frame's group records only; the
/// quantizer classes own the header and the validation.
///
/// An encode reads the old residual from `residual_in` and writes the new one to
/// `residual_out`: both empty (no error feedback), or both in.size() long and
/// either the same range (in place) or disjoint. A group that keeps its residual
/// (NaN or Inf) copies residual_in to residual_out.

#include <qcoll/core/half.hpp>
#include <qcoll/core/quantizer_options.hpp>

#include <cstddef>
#include <span>

namespace qcoll::kernels::cpu {

struct kernel_table {
  const char* name;  ///< "reference", "sse2", "avx2", "avx512f", …

  void (*one_bit_encode)(const quantizers::one_bit_options&, std::span<const float> in,
                         std::span<const float> residual_in, std::span<float> residual_out,
                         std::span<const float> memory_in, std::span<float> memory_out, std::byte* records) noexcept;
  void (*one_bit_decode)(const quantizers::one_bit_options&, const std::byte* records, std::span<float> out,
                         bool accumulate) noexcept;

  void (*k_level_encode)(const quantizers::k_level_options&, std::span<const float> in,
                         std::span<const float> residual_in, std::span<float> residual_out,
                         quantizers::encode_position position, std::byte* records) noexcept;
  void (*k_level_decode)(const quantizers::k_level_options&, const std::byte* records, std::span<float> out,
                         bool accumulate) noexcept;

  void (*bfp_encode)(const quantizers::bfp_options&, std::span<const float> in,
                     std::span<const float> residual_in, std::span<float> residual_out,
                     std::byte* records) noexcept;
  void (*bfp_decode)(const quantizers::bfp_options&, const std::byte* records, std::span<float> out,
                     bool accumulate) noexcept;

  // Conversions between float and the 16-bit element types (core/half.hpp's rules);
  // `in` and `out` have the same size.
  void (*widen_bf16)(std::span<const bfloat16> in, std::span<float> out) noexcept;
  void (*narrow_bf16)(std::span<const float> in, std::span<bfloat16> out) noexcept;
  void (*widen_f16)(std::span<const float16> in, std::span<float> out) noexcept;
  void (*narrow_f16)(std::span<const float> in, std::span<float16> out) noexcept;

  // The reproducible sum's conversions of float addends (kernels/group/grid.hpp's rules),
  // per block of grid_detail::block values: raise each block's exponent to cover its
  // values; put the values onto their blocks' grids into `sums` (written if `first`, else
  // added); turn summed integers back into floats, out[i] in block (first_index + i) / block.
  void (*grid_cover)(std::span<const float> values, std::span<double> exponents) noexcept;
  void (*grid_add)(std::span<const float> values, std::span<const double> exponents, std::span<double> sums,
                   bool first) noexcept;
  void (*grid_round)(std::span<const double> sums, std::span<const double> exponents, double divide,
                     std::span<float> out, std::size_t first_index) noexcept;
};

}  // namespace qcoll::kernels::cpu
