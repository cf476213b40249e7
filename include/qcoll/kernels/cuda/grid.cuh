#pragma once
/// @file
/// The reproducible sum's conversions on the device (compile with nvcc): the rules of
/// kernels/group/grid.hpp, the code the CPU kernels run, compiled for the device — one
/// thread per value, and a block's exponent by one thread block per grid block (its
/// threads' covers, then a max over shared memory) — so the bits match the CPU's.

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/group/grid.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

namespace qcoll::kernels::cuda {

namespace grid_kernels_detail {

inline constexpr unsigned threads = static_cast<unsigned>(grid_detail::block);
inline constexpr std::size_t max_blocks = 65535;

inline unsigned blocks_for(std::size_t items, std::size_t per_block) noexcept {
  const std::size_t wanted = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(wanted < max_blocks ? (wanted > 0 ? wanted : 1) : max_blocks);
}

/// The block's exponent raised to cover value i (float-family values widened; doubles by
/// their own rule).
template <class In>
__device__ inline int covered_at(int e, const In* x, std::size_t i) {
  return grid_detail::covered(e, widened(x, i));
}
__device__ inline int covered_at(int e, const double* x, std::size_t i) { return grid_detail::covered_wide(e, x[i]); }

template <class In>
__global__ void cover(const In* x, std::size_t n, double* exponents) {
  __shared__ int largest[threads];
  const std::size_t blocks = (n + grid_detail::block - 1) / grid_detail::block;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t i = b * grid_detail::block + threadIdx.x;
    const int start = static_cast<int>(exponents[b]);
    largest[threadIdx.x] = i < n ? covered_at(start, x, i) : start;
    __syncthreads();
    for (unsigned half = threads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half && largest[threadIdx.x + half] > largest[threadIdx.x])
        largest[threadIdx.x] = largest[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) exponents[b] = static_cast<double>(largest[0]);
    __syncthreads();
  }
}

template <class In>
__global__ void add_values(const In* x, std::size_t n, const double* exponents, double* sums, bool first) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::is_same_v<In, double>) {  // two carriers: sums[i] and sums[n + i]
      const grid_detail::wide_carriers q = grid_detail::on_wide_grid(x[i], exponents[i / grid_detail::block]);
      sums[i] = first ? q.high : add(sums[i], q.high);
      sums[n + i] = first ? q.low : add(sums[n + i], q.low);
    } else {
      const double q = grid_detail::on_grid(widened(x, i), grid_detail::to_grid(exponents[i / grid_detail::block]));
      sums[i] = first ? q : add(sums[i], q);
    }
  }
}

__device__ inline void store_value(float* out, std::size_t i, float value) { out[i] = value; }
__device__ inline void store_value(bfloat16* out, std::size_t i, float value) {
  out[i] = bfloat16::from_bits(half_bits::bf16_from_float(value));
}
__device__ inline void store_value(float16* out, std::size_t i, float value) {
  out[i] = float16::from_bits(half_bits::f16_from_float(value));
}

template <class Out>
__global__ void round_values(const double* sums, const double* low, std::size_t n, const double* exponents,
                             std::size_t first_index, double divide, Out* out) {
  const std::size_t stride = std::size_t(blockDim.x) * gridDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double exponent = exponents[(first_index + i) / grid_detail::block];
    if constexpr (std::is_same_v<Out, double>)
      out[i] = grid_detail::rounded_wide(sums[i], low[i], exponent, divide);
    else
      store_value(out, i, grid_detail::rounded(sums[i], grid_detail::from_grid(exponent), divide));
  }
}

}  // namespace grid_kernels_detail

/// Raises exponents[b] to cover block b of x (device pointers), asynchronously on `stream`.
template <class In>
cudaError_t grid_cover(const In* x, std::size_t n, double* exponents, cudaStream_t stream = nullptr) {
  if (n == 0) return cudaSuccess;
  namespace d = grid_kernels_detail;
  d::cover<<<d::blocks_for(n, grid_detail::block), d::threads, 0, stream>>>(x, n, exponents);
  return cudaGetLastError();
}

/// sums[i] = (first) or += x[i] on its block's grid (doubles: sums[i] and sums[n + i]).
template <class In>
cudaError_t grid_add(const In* x, std::size_t n, const double* exponents, double* sums, bool first,
                     cudaStream_t stream = nullptr) {
  if (n == 0) return cudaSuccess;
  namespace d = grid_kernels_detail;
  d::add_values<<<d::blocks_for(n, d::threads), d::threads, 0, stream>>>(x, n, exponents, sums, first);
  return cudaGetLastError();
}

/// out[i] = sums[i] (doubles: with low[i]) back from the grid of block (first_index + i) /
/// block, divided by `divide`.
template <class Out>
cudaError_t grid_round(const double* sums, const double* low, std::size_t n, const double* exponents,
                       std::size_t first_index, double divide, Out* out, cudaStream_t stream = nullptr) {
  if (n == 0) return cudaSuccess;
  namespace d = grid_kernels_detail;
  d::round_values<<<d::blocks_for(n, d::threads), d::threads, 0, stream>>>(sums, low, n, exponents, first_index,
                                                                           divide, out);
  return cudaGetLastError();
}

}  // namespace qcoll::kernels::cuda
