#pragma once
/// @file
/// Scalar reduce kernels: the reference (the test oracle) for every other backend.

#include <qcoll/core/types.hpp>
#include <qcoll/kernels/reduce_ops.hpp>

#include <cstddef>
#include <span>

namespace qcoll::kernels::cpu {

namespace detail {

template <class T, class Op>
void combine(std::span<const T> a, std::span<const T> b, std::span<T> out, Op op) noexcept {
  const T* pa = a.data();
  const T* pb = b.data();
  T* po = out.data();
  for (std::size_t i = 0; i < out.size(); ++i) po[i] = op(pa[i], pb[i]);
}

}  // namespace detail

/// out[i] = a[i] ⊕ b[i]. `out` may be `a` or `b` (element-wise in place); all three
/// have out.size() elements. avg reduces as sum: dividing is finish_avg's job.
template <arithmetic_element T>
void reduce(reduce_op op, std::span<const T> a, std::span<const T> b, std::span<T> out) noexcept {
  ops::with_operator(op, [&](auto combine_op) { detail::combine(a, b, out, combine_op); });
}

/// Turns a sum over `contributions` ranks into their average (x / n, not x * (1/n),
/// so the result is the correctly rounded quotient).
template <arithmetic_element T>
void finish_avg(std::span<T> values, std::size_t contributions) noexcept {
  const T divisor = static_cast<T>(contributions);
  for (T& v : values) v /= divisor;
}

}  // namespace qcoll::kernels::cpu
