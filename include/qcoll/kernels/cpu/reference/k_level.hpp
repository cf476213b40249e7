#pragma once
/// @file
/// The k_level reference kernels: plain loops that define the results every other
/// backend must reproduce bit for bit (quantizers/k_level.hpp states the semantics).
/// The driver around them (k_level_detail::encode, decode) is the one every
/// backend runs.

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/k_level.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

/// The arithmetic k_level_detail::encode and decode run on (see there).
struct k_level_kernels {
  QCOLL_KERNEL_INLINE static bool extremes(const float* x, const float* residual_in, std::size_t g, float& low,
                                           float& high) noexcept {
    low = std::numeric_limits<float>::infinity();
    high = -std::numeric_limits<float>::infinity();
    return k_level_detail::widen_extremes(x, residual_in, 0, g, low, high);
  }

  template <bool stochastic>
  QCOLL_KERNEL_INLINE static void encode_chunk(const float* x, const float* residual_in, float* residual_out,
                                               std::size_t first, std::size_t count, const k_level_detail::table& t,
                                               const k_level_detail::group_stream& stream,
                                               std::uint32_t* codes) noexcept {
    k_level_detail::encode_values<stochastic>(x, residual_in, residual_out, first, first + count, t, stream, codes);
  }

  QCOLL_KERNEL_INLINE static void decode_chunk(float min, float step, const std::uint32_t* codes, std::size_t count,
                                               float* y, bool accumulate) noexcept {
    k_level_detail::decode_values(min, step, codes, count, y, accumulate);
  }
};

}  // namespace reference
QCOLL_CPU_KERNELS_END
