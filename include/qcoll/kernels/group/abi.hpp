#pragma once
/// @file
/// Kernel code lives in an inline namespace named after the architecture it is
/// compiled for. src/kernels.cpp builds the kernels once per instruction set; without
/// this, the linker would keep one copy of each shared inline helper — possibly
/// the AVX-512 build of it — for every caller, and a CPU without AVX-512 would
/// crash. Kernel code therefore calls only functions inside this namespace,
/// compiler builtins and intrinsics (no std:: algorithms, no std::isfinite).
///
/// kernels/group/ is the bottom of the kernel layer: the arithmetic of one group
/// (or block) record and the code packing, which the scalar reference
/// (kernels/cpu/reference/) and the xsimd kernels (kernels/cpu/simd/) share as one
/// piece of code, so that they give the same bits, and each quantizer's driver —
/// the walk over a frame's records, the record fields, the non-finite case, the
/// chunking and code packing — written once as a template over the backend's
/// arithmetic (a policy type of static hooks); it includes nothing else of
/// kernels/. kernels/cpu/tables.hpp and dispatch.hpp sit above the CPU backends.
///
/// The per-value and per-group decisions here are QCOLL_HOST_DEVICE: the CUDA
/// kernels (kernels/simt/ run on kernels/cuda/) call the same functions, so the CPU
/// reference tests already cover their arithmetic. Such code uses only what device
/// code has: the helpers below instead of builtins and std:: functions, plain
/// arrays instead of std::array, constants from functions instead of
/// std::numeric_limits. The shared code lives in qcoll::kernels (QCOLL_KERNELS_BEGIN);
/// each backend's own in a namespace below it (qcoll::kernels::cpu, ::cuda).

#include <qcoll/core/half.hpp>
#include <qcoll/core/host_device.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifndef QCOLL_KERNEL_ABI
#define QCOLL_KERNEL_ABI native
#endif

/// The code every backend shares (this folder).
#define QCOLL_KERNELS_BEGIN   \
  namespace qcoll::kernels {  \
  inline namespace QCOLL_KERNEL_ABI {
#define QCOLL_KERNELS_END \
  }                       \
  }

/// The CPU backends' code (kernels/cpu/).
#define QCOLL_CPU_KERNELS_BEGIN    \
  namespace qcoll::kernels::cpu {  \
  inline namespace QCOLL_KERNEL_ABI {
#define QCOLL_CPU_KERNELS_END \
  }                           \
  }

/// The per-group hooks a backend hands to the shared drivers of kernels/group/
/// (bfp_detail::encode and the like). Each is called from one place in a driver;
/// forcing it inline keeps every driver instantiation the single loop nest it
/// would be if the backend had written the driver itself.
#if defined(__GNUC__) || defined(__clang__)
#define QCOLL_KERNEL_INLINE [[gnu::always_inline]] inline
#else
#define QCOLL_KERNEL_INLINE inline
#endif

QCOLL_KERNELS_BEGIN

/// Unaligned little-endian field access inside a frame's records.
template <class T>
QCOLL_HOST_DEVICE inline void store(std::byte* at, T value) noexcept {
  std::memcpy(at, &value, sizeof value);
}
template <class T>
QCOLL_HOST_DEVICE inline T load(const std::byte* at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

/// This build's own copy of the 16-bit float conversions (core/half.hpp): the tag
/// lives in the ABI namespace, so each instruction set's copy has its own symbols.
struct abi_tag {};
using half_bits = qcoll::detail::half_bits<abi_tag>;

QCOLL_HOST_DEVICE inline std::uint32_t bits_of(float value) noexcept { return half_bits::bits_of(value); }
QCOLL_HOST_DEVICE inline float float_of(std::uint32_t bits) noexcept { return half_bits::float_from(bits); }

/// Neither NaN nor ±Inf, from the bits (immune to -ffast-math).
QCOLL_HOST_DEVICE inline bool is_finite(float value) noexcept { return (bits_of(value) & 0x7f800000u) != 0x7f800000u; }

/// The quiet NaN the kernels write (0x7fc00000), and the infinity.
QCOLL_HOST_DEVICE inline float quiet_nan() noexcept { return float_of(0x7fc00000u); }
QCOLL_HOST_DEVICE inline float infinity() noexcept { return float_of(0x7f800000u); }

// Arithmetic that rounds each operation on its own, to nearest. On the CPU the
// kernels' translation units are compiled with -ffp-contract=off; on the GPU these
// are the intrinsics nvcc never contracts into a fused multiply-add, whatever its
// flags, and whose division is the IEEE one even under -prec-div=false.
// count_leading_zeros takes a nonzero value.
QCOLL_HOST_DEVICE inline float add(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
QCOLL_HOST_DEVICE inline float sub(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
QCOLL_HOST_DEVICE inline float mul(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
QCOLL_HOST_DEVICE inline float divide(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
QCOLL_HOST_DEVICE inline double add(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
QCOLL_HOST_DEVICE inline double sub(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
QCOLL_HOST_DEVICE inline double mul(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
QCOLL_HOST_DEVICE inline double divide(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
QCOLL_HOST_DEVICE inline float next_toward_zero(float value) noexcept {
#if defined(__CUDA_ARCH__)
  return nextafterf(value, 0.0f);
#else
  return __builtin_nextafterf(value, 0.0f);
#endif
}
QCOLL_HOST_DEVICE inline int count_leading_zeros(std::uint32_t value) noexcept {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(value));
#else
  return __builtin_clz(value);
#endif
}
QCOLL_HOST_DEVICE inline int count_leading_zeros(std::uint64_t value) noexcept {
#if defined(__CUDA_ARCH__)
  return __clzll(static_cast<long long>(value));
#else
  return __builtin_clzll(value);
#endif
}
QCOLL_HOST_DEVICE inline float magnitude(float value) noexcept {
#if defined(__CUDA_ARCH__)
  return fabsf(value);
#else
  return __builtin_fabsf(value);
#endif
}

/// out + value for a decode that accumulates, with the CPU's NaN payloads on the
/// GPU too: x86 returns a NaN operand quieted (the first, if both are) and, for
/// Inf - Inf, its "indefinite" 0xffc00000; a GPU would return its canonical
/// 0x7fffffff. (On the CPU, the addition itself.)
QCOLL_HOST_DEVICE inline float accumulate(float out, float value) noexcept {
  const float sum = add(out, value);
#if defined(__CUDA_ARCH__)
  if (sum != sum) {
    if (out != out) return float_of(bits_of(out) | 0x00400000u);
    if (value != value) return float_of(bits_of(value) | 0x00400000u);
    return float_of(0xffc00000u);
  }
#endif
  return sum;
}


/// Value i of an input of type In, as float (16-bit values widen exactly).
QCOLL_HOST_DEVICE inline float widened(const float* x, std::size_t i) noexcept { return x[i]; }
QCOLL_HOST_DEVICE inline float widened(const bfloat16* x, std::size_t i) noexcept {
  return half_bits::float_from_bf16(x[i].bits);
}
QCOLL_HOST_DEVICE inline float widened(const float16* x, std::size_t i) noexcept {
  return half_bits::float_from_f16(x[i].bits);
}

/// The value fed to a quantizer: x + residual_in, or x alone without error feedback
/// (null; adding 0 would turn -0 into +0). Every read of a residual is of
/// residual_in, the old one; kernels write the new one to residual_out, the same
/// array (in place) or a disjoint one.
template <class In>
QCOLL_HOST_DEVICE inline float fed(const In* x, const float* residual_in, std::size_t i) noexcept {
  return residual_in ? add(widened(x, i), residual_in[i]) : widened(x, i);
}

/// fed's rule for a value already widened and, with error feedback, its residual
/// held in a register (the GPU's staging loads them as vectors).
QCOLL_HOST_DEVICE inline float fed_value(float x, bool feedback, float residual) noexcept {
  return feedback ? add(x, residual) : x;
}

/// Whether any fed value of [begin, end) is NaN or Inf.
template <class In>
QCOLL_HOST_DEVICE inline bool has_nonfinite(const In* x, const float* residual_in, std::size_t begin,
                                            std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i)
    if (!is_finite(fed(x, residual_in, i))) return true;
  return false;
}

QCOLL_KERNELS_END
