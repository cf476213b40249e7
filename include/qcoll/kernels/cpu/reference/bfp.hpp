#pragma once
/// @file
/// The bfp reference kernels: the shared scalar loops of kernels/group/bfp.hpp over
/// whole blocks, which define the results every other backend must reproduce bit
/// for bit. The driver around them (bfp_detail::encode, decode) is the one every
/// backend runs.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/bfp.hpp>

#include <cstddef>
#include <cstdint>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

/// The arithmetic bfp_detail::encode and decode run on (see there).
struct bfp_kernels {
  QCOLL_KERNEL_INLINE static std::uint32_t max_magnitude(const float* x, const float* residual_in,
                                                         std::size_t g) noexcept {
    return bfp_detail::largest_magnitude(x, residual_in, 0, g, 0);
  }

  QCOLL_KERNEL_INLINE static void encode_chunk(const bfp_detail::block_scale& block, unsigned bits, const float* x,
                                               const float* residual_in, float* residual_out, std::size_t first,
                                               std::size_t count, std::uint32_t* mantissas) noexcept {
    bfp_detail::encode_values(block, bits, x, residual_in, residual_out, first, first + count, mantissas);
  }

  QCOLL_KERNEL_INLINE static void encode_bytes(const bfp_detail::block_scale& block, const float* x,
                                               const float* residual_in, float* residual_out, std::size_t first,
                                               std::size_t count, std::int8_t* codes) noexcept {
    bfp_detail::encode_values(block, 8, x, residual_in, residual_out, first, first + count, codes);
  }

  QCOLL_KERNEL_INLINE static void fill_nan(float* y, std::size_t g) noexcept {
    for (std::size_t i = 0; i < g; ++i) y[i] = kernels::quiet_nan();
  }

  QCOLL_KERNEL_INLINE static void decode_chunk(const std::uint32_t* fields, std::size_t count, unsigned bits,
                                               float unit, float* y, bool accumulate) noexcept {
    bfp_detail::decode_values(fields, count, bits, unit, y, accumulate);
  }

  QCOLL_KERNEL_INLINE static void decode_bytes(const std::int8_t* codes, std::size_t count, float unit, float* y,
                                               bool accumulate) noexcept {
    bfp_detail::decode_byte_values(codes, count, unit, y, accumulate);
  }
};

}  // namespace reference
QCOLL_CPU_KERNELS_END
