#pragma once
/// @file
/// Converting buffers between float and the 16-bit element types with the kernels
/// the dispatch chose (the rules of core/half.hpp, identical in every backend).

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>

#include <cstddef>
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

/// out[i] = a[i] ⊕ float(b[i]), the 16-bit values widened a piece at a time on the
/// stack, so no widened copy goes to memory. `out` may be `a`.
template <half_element Half>
void reduce_widened(reduce_op op, std::span<const float> a, std::span<const Half> b, std::span<float> out) noexcept {
  constexpr std::size_t piece = 2048;  // 8 KiB of floats: stays in L1 between the two passes
  alignas(64) float wide[piece];
  for (std::size_t i = 0; i < out.size(); i += piece) {
    const std::size_t m = out.size() - i < piece ? out.size() - i : piece;
    widen(b.subspan(i, m), std::span<float>(wide, m));
    reduce<float>(op, a.subspan(i, m), std::span<const float>(wide, m), out.subspan(i, m));
  }
}

}  // namespace qcoll::kernels::cpu
