#pragma once
/// @file
/// CUDA reduce kernels (compile with nvcc; opt-in, not part of qcoll.hpp). Same
/// operators as the scalar reference (kernels/reduce_ops.hpp), so results match it
/// bit for bit — except NaN payloads, which the GPU canonicalises; NaN stays NaN.

#include <qcoll/core/types.hpp>
#include <qcoll/kernels/reduce_ops.hpp>

#include <cuda_runtime.h>

#include <cstddef>

namespace qcoll::kernels::cuda {

namespace detail {

template <class T, class Op>
__global__ void combine(const T* a, const T* b, T* out, std::size_t n, Op op) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = op(a[i], b[i]);
}

template <class T, class Op>
cudaError_t launch(const T* a, const T* b, T* out, std::size_t n, Op op, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr unsigned threads = 256;
  // Enough blocks to fill the GPU; the grid-stride loop covers any n.
  const std::size_t wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  combine<<<blocks, threads, 0, stream>>>(a, b, out, n, op);
  return cudaGetLastError();
}

template <class T>
__global__ void divide_by(T* values, std::size_t n, T divisor) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    values[i] = values[i] / divisor;  // IEEE division, as the CPU's finish_avg (no --use_fast_math)
}

}  // namespace detail

/// out[i] = a[i] ⊕ b[i] for device pointers; `out` may equal `a` or `b`. Asynchronous on `stream`.
/// avg reduces as sum, as in the scalar kernel.
template <arithmetic_element T>
cudaError_t reduce(reduce_op op, const T* a, const T* b, T* out, std::size_t n, cudaStream_t stream = nullptr) {
  return ops::with_operator(op, [&](auto combine_op) { return detail::launch(a, b, out, n, combine_op, stream); });
}

/// values[i] /= divisor on device memory (an average's last step), rounded as the
/// CPU's finish_avg rounds it. Asynchronous on `stream`.
template <arithmetic_element T>
cudaError_t divide(T* values, std::size_t n, std::size_t divisor, cudaStream_t stream = nullptr) {
  if (n == 0) return cudaSuccess;
  constexpr unsigned threads = 256;
  const std::size_t wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  detail::divide_by<<<blocks, threads, 0, stream>>>(values, n, static_cast<T>(divisor));
  return cudaGetLastError();
}

}  // namespace qcoll::kernels::cuda
