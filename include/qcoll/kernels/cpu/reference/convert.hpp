#pragma once
/// @file
/// The reference conversions between float and the 16-bit element types: the
/// per-value rules of core/half.hpp, one value at a time. Every other backend
/// matches these bit for bit.

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/group/abi.hpp>

#include <cstddef>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

struct convert_kernels {
  static void widen_bf16(std::span<const bfloat16> in, std::span<float> out) noexcept {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = half_bits::float_from_bf16(in[i].bits);
  }
  static void narrow_bf16(std::span<const float> in, std::span<bfloat16> out) noexcept {
    for (std::size_t i = 0; i < in.size(); ++i) out[i].bits = half_bits::bf16_from_float(in[i]);
  }
  static void widen_f16(std::span<const float16> in, std::span<float> out) noexcept {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = half_bits::float_from_f16(in[i].bits);
  }
  static void narrow_f16(std::span<const float> in, std::span<float16> out) noexcept {
    for (std::size_t i = 0; i < in.size(); ++i) out[i].bits = half_bits::f16_from_float(in[i]);
  }
};

}  // namespace reference
QCOLL_CPU_KERNELS_END
