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
/// kernels/. kernels/cpu/tables.hpp and dispatch.hpp sit above the backends. The
/// code here stays in namespace qcoll::kernels::cpu for now: the quantizers name
/// kernels::cpu::bfp_detail, k_level_detail and unpack_codes.

#include <qcoll/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#ifndef QCOLL_KERNEL_ABI
#define QCOLL_KERNEL_ABI native
#endif

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

QCOLL_CPU_KERNELS_BEGIN

/// Unaligned little-endian field access inside a frame's records.
template <class T>
inline void store(std::byte* at, T value) noexcept {
  __builtin_memcpy(at, &value, sizeof value);
}
template <class T>
inline T load(const std::byte* at) noexcept {
  T value;
  __builtin_memcpy(&value, at, sizeof value);
  return value;
}

/// Neither NaN nor ±Inf, from the bits (immune to -ffast-math).
inline bool is_finite(float value) noexcept {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof bits);
  return (bits & 0x7f800000u) != 0x7f800000u;
}

/// This build's own copy of the 16-bit float conversions (core/half.hpp): the tag
/// lives in the ABI namespace, so each instruction set's copy has its own symbols.
struct abi_tag {};
using half_bits = qcoll::detail::half_bits<abi_tag>;

QCOLL_CPU_KERNELS_END
