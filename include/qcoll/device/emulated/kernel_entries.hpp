#pragma once
/// @file
/// The emulated device's kernel entries of the device runtime's table (encode, decode,
/// reduce, divide, widen, narrow, the reproducible sum's grid conversions): each checks its arguments as the CUDA launcher does
/// and queues its kernels.hpp work on the stream, naming the memory it touches so that
/// memory.hpp's registry refuses a range outside an allocation. A new quantizer's
/// emulated kernels go here and in kernels.hpp; runtime.hpp fills the table with them.

#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/device/emulated/codes.hpp>
#include <qcoll/device/emulated/kernels.hpp>
#include <qcoll/device/emulated/state.hpp>
#include <qcoll/device/runtime.hpp>

#include <cstddef>
#include <cstdint>

namespace qcoll::device::emulated_detail {

/// Bytes of n values of `type`.
inline std::size_t bytes_of(dtype type, std::size_t n) noexcept { return n * size_of(type); }

inline int one_bit_encode(const quantizers::one_bit_options& options, const quantizers::wire::frame_header& header,
                          dtype type, const void* x, std::size_t n, const float* residual_in, float* residual_out,
                          const float* memory_in, float* memory_out, std::byte* frame, stream_handle stream) {
  if (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16) return invalid_value;
  const std::size_t residual = residual_in ? n * sizeof(float) : 0;
  const std::size_t memory =
      memory_in ? (n + options.group_size - 1) / options.group_size * quantizers::one_bit_memory_per_group * sizeof(float) : 0;
  return queue(stream, emulated_fault::kernel,
               {{x, bytes_of(type, n)}, {residual_in, residual}, {residual_out, residual}, {memory_in, memory},
                {memory_out, memory}, {frame, quantizers::wire::one_bit_layout(options.group_size).frame_bytes(n)}},
               [=] {
                 kernel_work::one_bit_encode(options, header, type, x, n, residual_in, residual_out, memory_in,
                                             memory_out, frame);
               });
}

inline int k_level_encode(const quantizers::k_level_options& options, const quantizers::wire::frame_header& header,
                          quantizers::encode_position position, dtype type, const void* x, std::size_t n,
                          const float* residual_in, float* residual_out, std::byte* frame, stream_handle stream) {
  if (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16) return invalid_value;
  const std::size_t residual = residual_in ? n * sizeof(float) : 0;
  return queue(stream, emulated_fault::kernel,
               {{x, bytes_of(type, n)}, {residual_in, residual}, {residual_out, residual},
                {frame, kernels::k_level_detail::layout(options).frame_bytes(n)}},
               [=] { kernel_work::k_level_encode(options, header, position, type, x, n, residual_in, residual_out, frame); });
}

inline int bfp_encode(const quantizers::bfp_options& options, const quantizers::wire::frame_header& header, dtype type,
                      const void* x, std::size_t n, const float* residual_in, float* residual_out, std::byte* frame,
                      stream_handle stream) {
  if (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16) return invalid_value;
  const std::size_t residual = residual_in ? n * sizeof(float) : 0;
  const std::size_t frame_bytes =
      kernels::bfp_detail::layout(kernels::bfp_detail::block_values(options, n), options.mantissa_bits).frame_bytes(n);
  return queue(stream, emulated_fault::kernel,
               {{x, bytes_of(type, n)}, {residual_in, residual}, {residual_out, residual}, {frame, frame_bytes}},
               [=] { kernel_work::bfp_encode(options, header, type, x, n, residual_in, residual_out, frame); });
}

inline int identity_encode(const quantizers::wire::frame_header& header, dtype type, const void* x, std::size_t n,
                           std::byte* frame, stream_handle stream) {
  const bool as_double = header.type == dtype::f64;
  if (as_double ? type != dtype::f64 : (type != dtype::f32 && type != dtype::bf16 && type != dtype::f16))
    return invalid_value;
  return queue(stream, emulated_fault::kernel,
               {{x, bytes_of(type, n)}, {frame, quantizers::wire::header_size + bytes_of(header.type, n)}},
               [=] { kernel_work::identity_encode(header, type, x, n, frame); });
}

inline int one_bit_decode(const quantizers::one_bit_options& options, const quantizers::wire::frame_header& expected,
                          const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                          std::uint32_t* status, stream_handle stream) {
  return queue(stream, emulated_fault::kernel,
               {{frame, frame_bytes}, {out, n * sizeof(float)}, {status, sizeof *status}},
               [=] { kernel_work::one_bit_decode(options, expected, frame, frame_bytes, n, out, accumulate, status); });
}

inline int k_level_decode(const quantizers::k_level_options& options, const quantizers::wire::frame_header& expected,
                          const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                          std::uint32_t* status, stream_handle stream) {
  return queue(stream, emulated_fault::kernel,
               {{frame, frame_bytes}, {out, n * sizeof(float)}, {status, sizeof *status}},
               [=] { kernel_work::k_level_decode(options, expected, frame, frame_bytes, n, out, accumulate, status); });
}

inline int bfp_decode(const quantizers::bfp_options& options, const quantizers::wire::frame_header& expected,
                      const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                      std::uint32_t* status, stream_handle stream) {
  return queue(stream, emulated_fault::kernel,
               {{frame, frame_bytes}, {out, n * sizeof(float)}, {status, sizeof *status}},
               [=] { kernel_work::bfp_decode(options, expected, frame, frame_bytes, n, out, accumulate, status); });
}

inline int identity_decode(const quantizers::wire::frame_header& expected, dtype type, const std::byte* frame,
                           std::size_t frame_bytes, std::size_t n, void* out, bool accumulate, std::uint32_t* status,
                           stream_handle stream) {
  if (type != dtype::f32 && type != dtype::f64) return invalid_value;
  return queue(stream, emulated_fault::kernel, {{frame, frame_bytes}, {out, bytes_of(type, n)}, {status, sizeof *status}},
               [=] {
                 if (type == dtype::f32)
                   kernel_work::identity_decode(expected, frame, frame_bytes, n, static_cast<float*>(out), accumulate, status);
                 else
                   kernel_work::identity_decode(expected, frame, frame_bytes, n, static_cast<double*>(out), accumulate,
                                                status);
               });
}

inline int reduce(reduce_op op, dtype type, const void* a, const void* b, void* out, std::size_t n,
                  stream_handle stream) {
  if (type != dtype::f32 && type != dtype::f64) return invalid_value;
  const std::size_t bytes = bytes_of(type, n);
  return queue(stream, emulated_fault::kernel, {{a, bytes}, {b, bytes}, {out, bytes}}, [=] {
    if (type == dtype::f32) kernel_work::reduce<float>(op, a, b, out, n);
    else kernel_work::reduce<double>(op, a, b, out, n);
  });
}

inline int divide(dtype type, void* values, std::size_t n, std::size_t divisor, stream_handle stream) {
  if ((type != dtype::f32 && type != dtype::f64) || divisor == 0) return invalid_value;
  return queue(stream, emulated_fault::kernel, {{values, bytes_of(type, n)}}, [=] {
    if (type == dtype::f32) kernel_work::divide<float>(values, n, divisor);
    else kernel_work::divide<double>(values, n, divisor);
  });
}

inline int widen(dtype from, const void* in, float* out, std::size_t n, stream_handle stream) {
  if (from != dtype::bf16 && from != dtype::f16) return invalid_value;
  return queue(stream, emulated_fault::kernel, {{in, bytes_of(from, n)}, {out, n * sizeof(float)}}, [=] {
    if (from == dtype::bf16) kernel_work::widen<bfloat16>(in, out, n);
    else kernel_work::widen<float16>(in, out, n);
  });
}

inline int narrow(dtype to, const float* in, void* out, std::size_t n, stream_handle stream) {
  if (to != dtype::bf16 && to != dtype::f16) return invalid_value;
  return queue(stream, emulated_fault::kernel, {{in, n * sizeof(float)}, {out, bytes_of(to, n)}}, [=] {
    if (to == dtype::bf16) kernel_work::narrow<bfloat16>(in, out, n);
    else kernel_work::narrow<float16>(in, out, n);
  });
}

/// Bytes of the exponents of n values' blocks.
inline std::size_t exponent_bytes(std::size_t n) noexcept {
  return (n + kernels::grid_detail::block - 1) / kernels::grid_detail::block * sizeof(double);
}

inline int grid_cover(dtype in, const void* x, std::size_t n, double* exponents, stream_handle stream) {
  return queue(stream, emulated_fault::kernel, {{x, bytes_of(in, n)}, {exponents, exponent_bytes(n)}},
               [=] { kernel_work::grid_cover(in, x, n, exponents); });
}

inline int grid_add(dtype in, const void* x, std::size_t n, const double* exponents, double* sums, bool first,
                    stream_handle stream) {
  const std::size_t carriers = in == dtype::f64 ? 2 : 1;
  return queue(stream, emulated_fault::kernel,
               {{x, bytes_of(in, n)}, {exponents, exponent_bytes(n)}, {sums, carriers * n * sizeof(double)}},
               [=] { kernel_work::grid_add(in, x, n, exponents, sums, first); });
}

inline int grid_round(dtype out_type, const double* sums, const double* low, std::size_t n, const double* exponents,
                      std::size_t first_index, double divide, void* out, stream_handle stream) {
  if (n > 0 && (out_type == dtype::f64) != (low != nullptr)) return invalid_value;
  constexpr std::size_t block = kernels::grid_detail::block;
  const double* first_exponent = exponents + first_index / block;  // the blocks out's values fall in
  const std::size_t blocks = n == 0 ? 0 : (first_index + n - 1) / block - first_index / block + 1;
  return queue(stream, emulated_fault::kernel,
               {{sums, n * sizeof(double)}, {low, low ? n * sizeof(double) : 0}, {first_exponent, blocks * sizeof(double)},
                {out, bytes_of(out_type, n)}},
               [=] { kernel_work::grid_round(out_type, sums, low, n, exponents, first_index, divide, out); });
}

}  // namespace qcoll::device::emulated_detail
