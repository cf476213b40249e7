#pragma once
/// @file
/// What differs between the xsimd versions qcoll supports, 8.1 to 14.x (the range
/// cmake/qcollDependencies.cmake checks), in one place, keyed on XSIMD_VERSION_MAJOR.
/// The kernels and the dispatch call these instead of the xsimd functions they wrap:
///  - xsimd 11 changed bitwise_cast<B>(x), B a batch type, to bitwise_cast<T>(x), T
///    the element type;
///  - xsimd 13 dropped the architectures' version() and the `best` field of
///    available_architectures(), and added its has(arch);
///  - xsimd 14 made min(a, b) std::min(a, b), b < a ? b : a, where on x86 it was
///    minps(a, b), a < b ? a : b (max likewise): they differ for a NaN and for -0
///    against +0, and the kernels must match the scalar reference bit for bit.

#include <qcoll/kernels/group/abi.hpp>

#include <xsimd/xsimd.hpp>

#if !defined(XSIMD_VERSION_MAJOR) || XSIMD_VERSION_MAJOR < 8 || (XSIMD_VERSION_MAJOR == 8 && XSIMD_VERSION_MINOR < 1) || \
    XSIMD_VERSION_MAJOR > 14
#error "qcoll supports xsimd 8.1 to 14.x"
#endif

#include <type_traits>

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

/// The bits of x as a batch of To, of the same width.
template <class To, class From, class Arch>
inline xsimd::batch<To, Arch> bit_cast(xsimd::batch<From, Arch> x) noexcept {
#if XSIMD_VERSION_MAJOR >= 11
  return xsimd::bitwise_cast<To>(x);
#else
  return xsimd::bitwise_cast<xsimd::batch<To, Arch>>(x);
#endif
}

/// a < b ? a : b in every lane, the scalar kernels' rule (x86's minps(a, b)).
template <class Arch>
inline xsimd::batch<float, Arch> lane_min(xsimd::batch<float, Arch> a, xsimd::batch<float, Arch> b) noexcept {
#if XSIMD_VERSION_MAJOR >= 14
  return xsimd::min(b, a);  // std::min(b, a): a < b ? a : b
#else
  return xsimd::min(a, b);
#endif
}

/// a > b ? a : b in every lane, the scalar kernels' rule (x86's maxps(a, b)).
template <class Arch>
inline xsimd::batch<float, Arch> lane_max(xsimd::batch<float, Arch> a, xsimd::batch<float, Arch> b) noexcept {
#if XSIMD_VERSION_MAJOR >= 14
  return xsimd::max(b, a);  // std::max(b, a): b < a ? a : b
#else
  return xsimd::max(a, b);
#endif
}

/// Whether xsimd finds that this CPU runs code built for Arch.
template <class Arch>
inline bool cpu_has() noexcept {
  const auto cpu = xsimd::available_architectures();
#if XSIMD_VERSION_MAJOR >= 13
  return cpu.has(Arch{});
#else
  if constexpr (std::is_base_of_v<xsimd::avx512f, Arch>) return cpu.avx512f;
  else if constexpr (std::is_base_of_v<xsimd::avx2, Arch>) return cpu.avx2;
  else if constexpr (std::is_base_of_v<xsimd::sse2, Arch>) return cpu.sse2;
  else return cpu.best >= Arch::version();
#endif
}

}  // namespace simd
QCOLL_CPU_KERNELS_END
