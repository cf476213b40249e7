#pragma once
/// @file
/// Builds a kernel_table from the reference kernels or from the xsimd kernels of
/// one architecture: each entry is a quantizer's one driver (kernels/group/)
/// instantiated with the backend's arithmetic. A table for an architecture can only be built in a
/// translation unit compiled for it (xsimd 8 exposes an architecture's batches
/// only when its instruction set is enabled): src/kernels.cpp does that once per
/// architecture; a header-only build gets the one its own flags enable.

#include <qcoll/kernels/cpu/kernel_table.hpp>
#include <qcoll/kernels/cpu/reference/bfp.hpp>
#include <qcoll/kernels/cpu/reference/convert.hpp>
#include <qcoll/kernels/cpu/reference/grid.hpp>
#include <qcoll/kernels/cpu/reference/k_level.hpp>
#include <qcoll/kernels/cpu/reference/one_bit.hpp>
#include <qcoll/kernels/cpu/simd/bfp.hpp>
#include <qcoll/kernels/cpu/simd/convert.hpp>
#include <qcoll/kernels/cpu/simd/grid.hpp>
#include <qcoll/kernels/cpu/simd/k_level.hpp>
#include <qcoll/kernels/cpu/simd/one_bit.hpp>
#include <qcoll/kernels/group/abi.hpp>

#include <xsimd/xsimd.hpp>

QCOLL_CPU_KERNELS_BEGIN

inline constexpr kernel_table make_reference_table() noexcept {
  return {
      .name = "reference",
      .one_bit_encode = &one_bit_detail::encode<reference::one_bit_kernels>,
      .one_bit_decode = &one_bit_detail::decode<reference::one_bit_kernels>,
      .k_level_encode = &k_level_detail::encode<reference::k_level_kernels>,
      .k_level_decode = &k_level_detail::decode<reference::k_level_kernels>,
      .bfp_encode = &bfp_detail::encode<reference::bfp_kernels>,
      .bfp_decode = &bfp_detail::decode<reference::bfp_kernels>,
      .widen_bf16 = &reference::convert_kernels::widen_bf16,
      .narrow_bf16 = &reference::convert_kernels::narrow_bf16,
      .widen_f16 = &reference::convert_kernels::widen_f16,
      .narrow_f16 = &reference::convert_kernels::narrow_f16,
      .grid_cover = &reference::grid_kernels::cover,
      .grid_add = &reference::grid_kernels::add,
      .grid_round = &reference::grid_kernels::round,
  };
}

template <class Arch>
constexpr kernel_table make_simd_table() noexcept {
  return {
      .name = Arch::name(),
      .one_bit_encode = &one_bit_detail::encode<simd::one_bit_kernels<Arch>>,
      .one_bit_decode = &one_bit_detail::decode<simd::one_bit_kernels<Arch>>,
      .k_level_encode = &k_level_detail::encode<simd::k_level_kernels<Arch>>,
      .k_level_decode = &k_level_detail::decode<simd::k_level_kernels<Arch>>,
      .bfp_encode = &bfp_detail::encode<simd::bfp_kernels<Arch>>,
      .bfp_decode = &bfp_detail::decode<simd::bfp_kernels<Arch>>,
      .widen_bf16 = &simd::convert_kernels<Arch>::widen_bf16,
      .narrow_bf16 = &simd::convert_kernels<Arch>::narrow_bf16,
      .widen_f16 = &simd::convert_kernels<Arch>::widen_f16,
      .narrow_f16 = &simd::convert_kernels<Arch>::narrow_f16,
      .grid_cover = &simd::grid_kernels<Arch>::cover,
      .grid_add = &simd::grid_kernels<Arch>::add,
      .grid_round = &simd::grid_kernels<Arch>::round,
  };
}

QCOLL_CPU_KERNELS_END
