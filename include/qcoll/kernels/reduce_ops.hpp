#pragma once
/// @file
/// The element-wise reduce operators, shared by every backend (scalar, SIMD, CUDA) so
/// that their semantics are written once. Compiled by nvcc they are host and device code.

#if defined(__CUDACC__)
#define QCOLL_HOST_DEVICE __host__ __device__
#else
#define QCOLL_HOST_DEVICE
#endif

namespace qcoll::kernels::ops {

struct add {
  template <class T>
  QCOLL_HOST_DEVICE T operator()(T a, T b) const noexcept {
    return a + b;
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

}  // namespace qcoll::kernels::ops
