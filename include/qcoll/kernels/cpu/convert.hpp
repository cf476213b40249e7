#pragma once
/// @file
/// Converting buffers between float and the 16-bit element types with the kernels
/// the dispatch chose (the rules of core/half.hpp, identical in every backend).

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>

#include <span>

namespace qcoll::kernels::cpu {

/// out[i] = float(in[i]), exactly. `out` has in.size() elements.
inline void widen(std::span<const bfloat16> in, std::span<float> out) noexcept {
  active_kernels().widen_bf16(in, out.first(in.size()));
}
inline void widen(std::span<const float16> in, std::span<float> out) noexcept {
  active_kernels().widen_f16(in, out.first(in.size()));
}

/// out[i] = in[i] rounded to nearest even. `out` has in.size() elements.
inline void narrow(std::span<const float> in, std::span<bfloat16> out) noexcept {
  active_kernels().narrow_bf16(in, out.first(in.size()));
}
inline void narrow(std::span<const float> in, std::span<float16> out) noexcept {
  active_kernels().narrow_f16(in, out.first(in.size()));
}

}  // namespace qcoll::kernels::cpu
