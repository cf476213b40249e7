#pragma once
/// @file
/// CUDA conversions between float and the 16-bit element types (compile with nvcc;
/// opt-in, not part of qcoll.hpp): core/half.hpp's rule, the same code the CPU
/// kernels run, compiled for the device, so the bits match the CPU's.

#include <qcoll/core/half.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace qcoll::kernels::cuda {

namespace detail {

struct device_tag {};
using half_bits = qcoll::detail::half_bits<device_tag>;

template <class Convert, class In, class Out>
__global__ void convert_each(const In* in, Out* out, std::size_t n, Convert convert) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = convert(in[i]);
}

template <class Convert, class In, class Out>
cudaError_t launch_convert(const In* in, Out* out, std::size_t n, Convert convert, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr unsigned threads = 256;
  const std::size_t wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  convert_each<<<blocks, threads, 0, stream>>>(in, out, n, convert);
  return cudaGetLastError();
}

struct widen_bf16 {
  __device__ float operator()(bfloat16 v) const { return half_bits::float_from_bf16(v.bits); }
};
struct widen_f16 {
  __device__ float operator()(float16 v) const { return half_bits::float_from_f16(v.bits); }
};
struct narrow_bf16 {
  __device__ bfloat16 operator()(float v) const { return bfloat16::from_bits(half_bits::bf16_from_float(v)); }
};
struct narrow_f16 {
  __device__ float16 operator()(float v) const { return float16::from_bits(half_bits::f16_from_float(v)); }
};

}  // namespace detail

/// out[i] = float(in[i]) for device pointers, asynchronously on `stream`.
inline cudaError_t widen(const bfloat16* in, float* out, std::size_t n, cudaStream_t stream = nullptr) {
  return detail::launch_convert(in, out, n, detail::widen_bf16{}, stream);
}
inline cudaError_t widen(const float16* in, float* out, std::size_t n, cudaStream_t stream = nullptr) {
  return detail::launch_convert(in, out, n, detail::widen_f16{}, stream);
}

/// out[i] = in[i] rounded to nearest even, for device pointers, asynchronously on `stream`.
inline cudaError_t narrow(const float* in, bfloat16* out, std::size_t n, cudaStream_t stream = nullptr) {
  return detail::launch_convert(in, out, n, detail::narrow_bf16{}, stream);
}
inline cudaError_t narrow(const float* in, float16* out, std::size_t n, cudaStream_t stream = nullptr) {
  return detail::launch_convert(in, out, n, detail::narrow_f16{}, stream);
}

}  // namespace qcoll::kernels::cuda
