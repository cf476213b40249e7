#pragma once
/// @file
/// Fills the CUDA kernel table (kernel_table.hpp) from the kernels of quantizers.cuh,
/// reduce.cuh and convert.cuh. Built once, by nvcc, in src/cuda_kernels.cu; a
/// program reaches it through the execution layer.

#include <qcoll/kernels/cuda/convert.cuh>
#include <qcoll/kernels/cuda/kernel_table.hpp>
#include <qcoll/kernels/cuda/quantizers.cuh>
#include <qcoll/kernels/cuda/reduce.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace qcoll::kernels::cuda::table_entries {

inline cudaStream_t stream_of(stream_handle stream) noexcept { return static_cast<cudaStream_t>(stream); }

/// Calls run(static_cast<const In*>(x)) for In the element type `type` names among
/// float, bfloat16 and float16; any other type is cudaErrorInvalidValue.
template <class Run>
int with_input(dtype type, const void* x, Run run) {
  switch (type) {
    case dtype::f32: return run(static_cast<const float*>(x));
    case dtype::bf16: return run(static_cast<const bfloat16*>(x));
    case dtype::f16: return run(static_cast<const float16*>(x));
    default: return cudaErrorInvalidValue;
  }
}

inline int one_bit_encode(const quantizers::one_bit_options& options, const quantizers::wire::frame_header& header,
                          dtype type, const void* x, std::size_t n, const float* residual_in, float* residual_out,
                          const float* memory_in, float* memory_out, std::byte* frame, stream_handle stream) {
  return with_input(type, x, [&](const auto* in) {
    return launch_tiles(one_bit_encode_kernel<std::remove_cvref_t<decltype(*in)>>, options.group_size, n,
                        stream_of(stream), options,
                        header, in, n, residual_in, residual_out, memory_in, memory_out, frame);
  });
}

inline int k_level_encode(const quantizers::k_level_options& options, const quantizers::wire::frame_header& header,
                          quantizers::encode_position position, dtype type, const void* x, std::size_t n,
                          const float* residual_in, float* residual_out, std::byte* frame, stream_handle stream) {
  return with_input(type, x, [&](const auto* in) {
    return launch_tiles(k_level_encode_kernel<std::remove_cvref_t<decltype(*in)>>, options.group_size, n,
                        stream_of(stream), options,
                        header, position, in, n, residual_in, residual_out, frame);
  });
}

inline int bfp_encode(const quantizers::bfp_options& options, const quantizers::wire::frame_header& header, dtype type,
                      const void* x, std::size_t n, const float* residual_in, float* residual_out, std::byte* frame,
                      stream_handle stream) {
  const std::size_t block = bfp_detail::block_values(options, n);
  return with_input(type, x, [&](const auto* in) {
    return launch_tiles(bfp_encode_kernel<std::remove_cvref_t<decltype(*in)>>, block, n, stream_of(stream), options,
                        header, in, n, residual_in, residual_out, frame);
  });
}

inline int identity_encode(const quantizers::wire::frame_header& header, dtype type, const void* x, std::size_t n,
                           std::byte* frame, stream_handle stream) {
  if (header.type == dtype::f64)
    return type == dtype::f64 ? launch_values(identity_encode_kernel<double, double>, n, stream_of(stream), header,
                                              static_cast<const double*>(x), n, frame)
                              : cudaErrorInvalidValue;
  return with_input(type, x, [&](const auto* in) {
    return launch_values(identity_encode_kernel<float, std::remove_cvref_t<decltype(*in)>>, n, stream_of(stream),
                         header, in, n, frame);
  });
}

inline int one_bit_decode(const quantizers::one_bit_options& options, const quantizers::wire::frame_header& expected,
                          const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                          std::uint32_t* status, stream_handle stream) {
  const quantizers::wire::record_layout layout = one_bit_detail::layout(options.group_size);
  return check_and_decode(expected, layout, frame, frame_bytes, n, out, accumulate, status, simt::always_valid{},
                          simt::always_valid{}, simt::one_bit_value{layout}, stream_of(stream));
}

inline int k_level_decode(const quantizers::k_level_options& options, const quantizers::wire::frame_header& expected,
                          const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                          std::uint32_t* status, stream_handle stream) {
  const quantizers::wire::record_layout layout = k_level_detail::layout(options);
  // Only a number of levels that is not a power of two leaves codes that name no level.
  if ((options.levels & (options.levels - 1)) == 0)
    return check_and_decode(expected, layout, frame, frame_bytes, n, out, accumulate, status, simt::always_valid{},
                            simt::always_valid{}, simt::k_level_value{layout}, stream_of(stream));
  return check_and_decode(expected, layout, frame, frame_bytes, n, out, accumulate, status,
                          simt::k_level_code_valid{layout, options.levels}, simt::always_valid{}, simt::k_level_value{layout},
                          stream_of(stream));
}

inline int bfp_decode(const quantizers::bfp_options& options, const quantizers::wire::frame_header& expected,
                      const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                      std::uint32_t* status, stream_handle stream) {
  const quantizers::wire::record_layout layout =
      bfp_detail::layout(bfp_detail::block_values(options, n), options.mantissa_bits);
  return check_and_decode(expected, layout, frame, frame_bytes, n, out, accumulate, status, simt::bfp_mantissa_valid{layout},
                          simt::bfp_exponent_valid{layout}, simt::bfp_value{layout}, stream_of(stream));
}

inline int identity_decode(const quantizers::wire::frame_header& expected, dtype type, const std::byte* frame,
                           std::size_t frame_bytes, std::size_t n, void* out, bool accumulate, std::uint32_t* status,
                           stream_handle stream) {
  auto run = [&](auto* values) -> int {
    using T = std::remove_cvref_t<decltype(*values)>;
    const quantizers::wire::record_layout layout{.group = 1, .table_bytes = 0, .code_bits = 8 * sizeof(T)};
    if (const cudaError_t failed = cudaMemsetAsync(status, 0, sizeof *status, stream_of(stream))) return failed;
    if (const int failed = launch_values(check_kernel<simt::always_valid, simt::always_valid>, 1, stream_of(stream), expected,
                                         layout, frame, frame_bytes, n, status, simt::always_valid{}, simt::always_valid{}))
      return failed;
    if (n == 0) return cudaSuccess;
    return launch_values(identity_decode_kernel<T>, n, stream_of(stream), frame, n, values, accumulate,
                         static_cast<const std::uint32_t*>(status));
  };
  switch (type) {
    case dtype::f32: return run(static_cast<float*>(out));
    case dtype::f64: return run(static_cast<double*>(out));
    default: return cudaErrorInvalidValue;
  }
}

inline int reduce(reduce_op op, dtype type, const void* a, const void* b, void* out, std::size_t n,
                  stream_handle stream) {
  switch (type) {
    case dtype::f32:
      return cuda::reduce<float>(op, static_cast<const float*>(a), static_cast<const float*>(b),
                                 static_cast<float*>(out), n, stream_of(stream));
    case dtype::f64:
      return cuda::reduce<double>(op, static_cast<const double*>(a), static_cast<const double*>(b),
                                  static_cast<double*>(out), n, stream_of(stream));
    default: return cudaErrorInvalidValue;
  }
}

inline int widen(dtype from, const void* in, float* out, std::size_t n, stream_handle stream) {
  switch (from) {
    case dtype::bf16: return cuda::widen(static_cast<const bfloat16*>(in), out, n, stream_of(stream));
    case dtype::f16: return cuda::widen(static_cast<const float16*>(in), out, n, stream_of(stream));
    default: return cudaErrorInvalidValue;
  }
}

inline int narrow(dtype to, const float* in, void* out, std::size_t n, stream_handle stream) {
  switch (to) {
    case dtype::bf16: return cuda::narrow(in, static_cast<bfloat16*>(out), n, stream_of(stream));
    case dtype::f16: return cuda::narrow(in, static_cast<float16*>(out), n, stream_of(stream));
    default: return cudaErrorInvalidValue;
  }
}

inline int device_count(int* count) {
  const cudaError_t result = cudaGetDeviceCount(count);
  if (result != cudaSuccess) {
    *count = 0;
    cudaGetLastError();  // a machine without a driver is not an error to keep
  }
  return result;
}

inline int locate(const void* pointer, pointer_facts* facts) {
  cudaPointerAttributes attributes{};
  const cudaError_t result = cudaPointerGetAttributes(&attributes, pointer);
  if (result != cudaSuccess) {
    cudaGetLastError();
    *facts = {};
    return result;
  }
  facts->device = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  facts->ordinal = facts->device ? attributes.device : -1;
  return cudaSuccess;
}

inline int allocate(std::size_t bytes, void** pointer) { return cudaMalloc(pointer, bytes); }
inline int release(void* pointer) { return cudaFree(pointer); }
inline int copy(void* to, const void* from, std::size_t bytes, stream_handle stream) {
  return cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream_of(stream));
}
inline int synchronize(stream_handle stream) { return cudaStreamSynchronize(stream_of(stream)); }
inline const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace qcoll::kernels::cuda::table_entries

namespace qcoll::kernels::cuda {

inline constexpr kernel_table make_kernel_table() noexcept {
  return {
      .name = "cuda",
      .one_bit_encode = &table_entries::one_bit_encode,
      .k_level_encode = &table_entries::k_level_encode,
      .bfp_encode = &table_entries::bfp_encode,
      .identity_encode = &table_entries::identity_encode,
      .one_bit_decode = &table_entries::one_bit_decode,
      .k_level_decode = &table_entries::k_level_decode,
      .bfp_decode = &table_entries::bfp_decode,
      .identity_decode = &table_entries::identity_decode,
      .reduce = &table_entries::reduce,
      .widen = &table_entries::widen,
      .narrow = &table_entries::narrow,
      .device_count = &table_entries::device_count,
      .locate = &table_entries::locate,
      .allocate = &table_entries::allocate,
      .release = &table_entries::release,
      .copy = &table_entries::copy,
      .synchronize = &table_entries::synchronize,
      .error_string = &table_entries::error_string,
  };
}

}  // namespace qcoll::kernels::cuda
