#pragma once
/// @file
/// Conversions between float and the 16-bit element types over xsimd batches: the
/// rules of core/half.hpp as lane-wise integer operations (and, for float16's
/// subnormals, the same float multiply-add the scalar rule uses), each case
/// computed in every lane and the right one selected. Values past the last whole
/// register go through the scalar rule, so results match the reference bit for bit.

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/cpu/simd/xsimd_compat.hpp>
#include <qcoll/kernels/group/abi.hpp>

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

template <class Arch>
struct convert_kernels {
  using batch = xsimd::batch<float, Arch>;
  using ints = xsimd::batch<std::int32_t, Arch>;
  static constexpr std::size_t width = batch::size;

  static ints bf16_from_float(batch value) noexcept {
    const ints bits = bit_cast<std::int32_t>(value);
    const ints upper = (bits >> 16) & ints(0xffff);
    const ints rounded = ((bits + ints(0x7fff) + (upper & ints(1))) >> 16) & ints(0xffff);
    const ints magnitude = bits & ints(0x7fffffff);
    return xsimd::select(magnitude > ints(0x7f800000), upper | ints(0x0040), rounded);
  }

  static ints f16_from_float(batch value) noexcept {
    const ints bits = bit_cast<std::int32_t>(value);
    const ints sign = (bits >> 16) & ints(0x8000);
    const ints magnitude = bits & ints(0x7fffffff);
    const ints quiet_nan = sign | ints(0x7e00) | ((magnitude >> 13) & ints(0x3ff));
    const ints rebased = magnitude - ints(0x38000000);
    const ints normal = sign | ((rebased + ints(0xfff) + ((rebased >> 13) & ints(1))) >> 13);
    const batch units = bit_cast<float>(magnitude) * batch(0x1p24f) + batch(0x1p23f);
    const ints subnormal = sign | (bit_cast<std::int32_t>(units) - ints(0x4b000000));
    ints result = xsimd::select(magnitude >= ints(0x38800000), normal, subnormal);
    result = xsimd::select(magnitude >= ints(0x477ff000), sign | ints(0x7c00), result);
    return xsimd::select(magnitude > ints(0x7f800000), quiet_nan, result);
  }

  static batch float_from_f16(ints half) noexcept {
    const ints sign = (half & ints(0x8000)) << 16;
    const ints exponent = (half >> 10) & ints(0x1f);
    const ints mantissa = half & ints(0x3ff);
    const ints normal = sign | ((exponent + ints(112)) << 23) | (mantissa << 13);
    const ints special = sign | ints(0x7f800000) | (mantissa << 13) |
                         xsimd::select(mantissa != ints(0), ints(0x00400000), ints(0));  // NaN quieted
    const ints subnormal = sign | bit_cast<std::int32_t>(xsimd::batch_cast<float>(mantissa) * batch(0x1p-24f));
    const ints result = xsimd::select(exponent == ints(0x1f), special,
                                      xsimd::select(exponent == ints(0), subnormal, normal));
    return bit_cast<float>(result);
  }

  // 16-bit values are computed in the low half of 32-bit lanes. They move between
  // memory and lanes through a chunk of int32 in L1, in plain loops the compiler
  // vectorises into the instruction set's widening and narrowing moves (a lane-by-
  // lane copy per register ran at a third of the scalar reference's speed).
  static constexpr std::size_t chunk = 512;
  static_assert(chunk % width == 0);

  /// Widens whole registers with `lanes` and the values past the last one with
  /// `value`, the scalar rule.
  template <class Half, class Lanes, class Value>
  static void widen_with(std::span<const Half> in, std::span<float> out, Lanes lanes_rule, Value value) noexcept {
    alignas(64) std::int32_t lanes[chunk];
    const std::size_t body = in.size() / width * width;
    for (std::size_t start = 0; start < body; start += chunk) {
      const std::size_t m = body - start < chunk ? body - start : chunk;
      const Half* from = in.data() + start;
      for (std::size_t j = 0; j < m; ++j) lanes[j] = from[j].bits;
      for (std::size_t j = 0; j < m; j += width)
        lanes_rule(ints::load_aligned(lanes + j)).store_unaligned(out.data() + start + j);
    }
    for (std::size_t i = body; i < in.size(); ++i) out[i] = value(in[i].bits);
  }

  /// Narrows whole registers with `lanes` and the values past the last one with
  /// `value`, the scalar rule.
  template <class Half, class Lanes, class Value>
  static void narrow_with(std::span<const float> in, std::span<Half> out, Lanes lanes_rule, Value value) noexcept {
    alignas(64) std::int32_t lanes[chunk];
    const std::size_t body = in.size() / width * width;
    for (std::size_t start = 0; start < body; start += chunk) {
      const std::size_t m = body - start < chunk ? body - start : chunk;
      for (std::size_t j = 0; j < m; j += width)
        lanes_rule(batch::load_unaligned(in.data() + start + j)).store_aligned(lanes + j);
      Half* to = out.data() + start;
      for (std::size_t j = 0; j < m; ++j) to[j].bits = static_cast<std::uint16_t>(lanes[j]);
    }
    for (std::size_t i = body; i < in.size(); ++i) out[i].bits = value(in[i]);
  }

  static void widen_bf16(std::span<const bfloat16> in, std::span<float> out) noexcept {
    widen_with(in, out, [](ints half) { return bit_cast<float>(half << 16); }, &half_bits::float_from_bf16);
  }
  static void narrow_bf16(std::span<const float> in, std::span<bfloat16> out) noexcept {
    narrow_with(in, out, [](batch value) { return bf16_from_float(value); }, &half_bits::bf16_from_float);
  }
  static void widen_f16(std::span<const float16> in, std::span<float> out) noexcept {
    widen_with(in, out, [](ints half) { return float_from_f16(half); }, &half_bits::float_from_f16);
  }
  static void narrow_f16(std::span<const float> in, std::span<float16> out) noexcept {
    narrow_with(in, out, [](batch value) { return f16_from_float(value); }, &half_bits::f16_from_float);
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
