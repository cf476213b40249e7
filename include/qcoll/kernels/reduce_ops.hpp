#pragma once
/// @file
/// The element-wise reduce operators, shared by every backend (scalar, SIMD, CUDA) so
/// that their semantics are written once. Compiled by nvcc they are host and device code.

#include <qcoll/core/host_device.hpp>
#include <qcoll/core/types.hpp>

namespace qcoll::kernels::ops {

struct add {
  template <class T>
  QCOLL_HOST_DEVICE T operator()(T a, T b) const noexcept {
    return a + b;
  }
};

struct multiply {
  template <class T>
  QCOLL_HOST_DEVICE T operator()(T a, T b) const noexcept {
    return a * b;
  }
};

// `a != a` keeps a NaN in either operand: a NaN in b fails `a < b` and yields b.
struct minimum {
  template <class T>
  QCOLL_HOST_DEVICE T operator()(T a, T b) const noexcept {
    return (a < b || a != a) ? a : b;
  }
};

struct maximum {
  template <class T>
  QCOLL_HOST_DEVICE T operator()(T a, T b) const noexcept {
    return (a > b || a != a) ? a : b;
  }
};

/// The one place a runtime reduce_op becomes an operator type: calls fn(operator).
/// avg reduces as sum (the owner divides afterwards). Host code: it picks which
/// kernel to run (or launch); the operators themselves are host and device code.
template <class Fn>
decltype(auto) with_operator(reduce_op op, Fn&& fn) {
  switch (op) {
    case reduce_op::min: return fn(minimum{});
    case reduce_op::max: return fn(maximum{});
    case reduce_op::product: return fn(multiply{});
    case reduce_op::sum:
    case reduce_op::avg: break;
  }
  return fn(add{});
}

}  // namespace qcoll::kernels::ops
