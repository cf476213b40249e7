#pragma once
/// @file
/// The 16-bit floating-point element types gradients are stored in: bfloat16 (8
/// exponent bits, as float, and 7 mantissa bits) and float16 (IEEE 754 binary16).
///
/// C++20 has no standard 16-bit float (std::bfloat16_t and std::float16_t are C++23,
/// and g++-12 and clang++-14 lack them); compiler extensions (__bf16, _Float16) differ
/// between compilers and versions. So qcoll defines both as storage types: 16 bits,
/// standard layout, trivially copyable, with explicit conversions to and from float.
/// They do no arithmetic: collectives widen them to float, reduce in float and round
/// once (docs/algorithms.md, "16-bit elements"). Their layout is that of
/// std::bfloat16_t/std::float16_t, CUDA's __nv_bfloat16/__half and PyTorch's
/// at::BFloat16/at::Half: a buffer of those is passed as a span of these with
/// reinterpret_cast, as PyTorch and CUDA interoperate (formally distinct types;
/// the kernels reach the memory through function pointers in their own translation
/// units); bit_cast for single values.
///
/// Conversions, identical in every backend (CPU reference, SIMD, CUDA):
/// - float → 16 bits rounds to nearest, ties to even; a value too large becomes ±Inf;
///   float16 keeps subnormals; NaN stays NaN, quieted, with the sign and the payload's
///   leading bits (as x86's vcvtps2ph and vcvtneps2bf16 do).
/// - The float arithmetic these rules use (float16's subnormals) assumes the default
///   rounding mode, round to nearest, as all of qcoll's kernels do.
/// - 16 bits → float is exact; a float16 NaN comes out quiet (as x86's vcvtph2ps
///   makes it), a bfloat16 NaN keeps its bits (the widening is a shift, as everywhere).

#include <qcoll/core/host_device.hpp>

#include <cstdint>
#include <cstring>

namespace qcoll {

namespace detail {

/// The conversions as bit manipulation. A template so that every kernel build gets
/// its own copy: kernels/cpu compiles them once per instruction set, each with a Tag
/// of its own (kernels/group/abi.hpp says why copies must not be shared).
template <class Tag = void>
struct half_bits {
  QCOLL_HOST_DEVICE static std::uint32_t bits_of(float value) noexcept {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
  }
  QCOLL_HOST_DEVICE static float float_from(std::uint32_t bits) noexcept {
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  QCOLL_HOST_DEVICE static std::uint16_t bf16_from_float(float value) noexcept {
    const std::uint32_t bits = bits_of(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // NaN
    // Adding 0x7fff plus the lowest kept bit carries exactly when the dropped half
    // rounds up; the largest floats carry into the exponent and become Inf.
    return static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
  QCOLL_HOST_DEVICE static float float_from_bf16(std::uint16_t bits) noexcept {
    return float_from(std::uint32_t{bits} << 16);
  }

  QCOLL_HOST_DEVICE static std::uint16_t f16_from_float(float value) noexcept {
    const std::uint32_t bits = bits_of(value);
    const std::uint32_t sign = (bits >> 16) & 0x8000u;
    const std::uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u)  // NaN
      return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u)  // ≥ 65520, half-way above the largest half (65504): Inf
      return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (magnitude >= 0x38800000u) {  // ≥ 2^-14: a normal half; rebias the exponent, round the mantissa
      const std::uint32_t rebased = magnitude - 0x38000000u;
      return static_cast<std::uint16_t>(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13));
    }
    // A subnormal half counts units of 2^-24. |value| · 2^24 is exact and below
    // 1024; adding 2^23 rounds it to an integer, to nearest even, in the float
    // addition itself, and leaves that integer in the low mantissa bits.
    const float units = float_from(magnitude) * 0x1p24f + 0x1p23f;
    return static_cast<std::uint16_t>(sign | (bits_of(units) - 0x4b000000u));
  }
  QCOLL_HOST_DEVICE static float float_from_f16(std::uint16_t bits) noexcept {
    const std::uint32_t sign = std::uint32_t{bits & 0x8000u} << 16;
    const std::uint32_t exponent = (bits >> 10) & 0x1fu;
    const std::uint32_t mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu)  // Inf; NaN quieted, as x86's vcvtph2ps does
      return float_from(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u));
    if (exponent != 0) return float_from(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    return float_from(sign | bits_of(static_cast<float>(mantissa) * 0x1p-24f));  // zero, subnormal: exact
  }
};

}  // namespace detail

/// bfloat16: the upper half of a float. Storage only; see the file comment.
struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;
  QCOLL_HOST_DEVICE explicit bfloat16(float value) noexcept : bits(detail::half_bits<>::bf16_from_float(value)) {}
  QCOLL_HOST_DEVICE explicit operator float() const noexcept { return detail::half_bits<>::float_from_bf16(bits); }
  QCOLL_HOST_DEVICE static bfloat16 from_bits(std::uint16_t raw) noexcept {
    bfloat16 value;
    value.bits = raw;
    return value;
  }
};

/// float16: IEEE 754 binary16. Storage only; see the file comment.
struct float16 {
  std::uint16_t bits;

  float16() = default;
  QCOLL_HOST_DEVICE explicit float16(float value) noexcept : bits(detail::half_bits<>::f16_from_float(value)) {}
  QCOLL_HOST_DEVICE explicit operator float() const noexcept { return detail::half_bits<>::float_from_f16(bits); }
  QCOLL_HOST_DEVICE static float16 from_bits(std::uint16_t raw) noexcept {
    float16 value;
    value.bits = raw;
    return value;
  }
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2);

}  // namespace qcoll
