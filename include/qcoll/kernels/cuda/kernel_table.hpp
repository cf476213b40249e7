#pragma once
/// @file
/// The CUDA backend as plain function pointers, as kernels/cpu/kernel_table.hpp is
/// the CPU's: host code built by any compiler reaches the GPU through the execution
/// layer (execution/dispatch.hpp) without CUDA's headers, and src/cuda_kernels.cu,
/// compiled once by nvcc, fills the table (kernels/cuda/table.cuh).
///
/// Every entry takes device pointers and a stream (a cudaStream_t, type-erased),
/// queues its work there and returns at once with a cudaError_t as int (0: queued).
/// Encoders write the whole frame, header included. Decoders first check the frame
/// on the device into *status (a device word: 0, or the errc the CPU's decode would
/// return) and touch `out` only if it is 0.

#include <qcoll/core/encode_position.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/core/wire.hpp>

#include <cstddef>
#include <cstdint>

namespace qcoll::kernels::cuda {

/// A cudaStream_t; null is the legacy default stream.
using stream_handle = void*;

/// What the CUDA runtime says of a pointer.
struct pointer_facts {
  bool device = false;  ///< device (or managed) memory a kernel may use
  int ordinal = -1;     ///< its device, when `device`
};

struct kernel_table {
  const char* name;  ///< "cuda"

  // Encoders: n values of type `in` (f32, bf16 or f16; identity: its own type).
  int (*one_bit_encode)(const quantizers::one_bit_options&, const quantizers::wire::frame_header&, dtype in,
                        const void* x, std::size_t n, const float* residual_in, float* residual_out,
                        const float* memory_in, float* memory_out, std::byte* frame, stream_handle);
  int (*k_level_encode)(const quantizers::k_level_options&, const quantizers::wire::frame_header&,
                        quantizers::encode_position, dtype in, const void* x, std::size_t n, const float* residual_in,
                        float* residual_out, std::byte* frame, stream_handle);
  int (*bfp_encode)(const quantizers::bfp_options&, const quantizers::wire::frame_header&, dtype in, const void* x,
                    std::size_t n, const float* residual_in, float* residual_out, std::byte* frame, stream_handle);
  int (*identity_encode)(const quantizers::wire::frame_header&, dtype in, const void* x, std::size_t n,
                         std::byte* frame, stream_handle);

  // Decoders: check `frame` (frame_bytes long) against `expected` (count included)
  // into *status, then out = (or +=) its n values.
  int (*one_bit_decode)(const quantizers::one_bit_options&, const quantizers::wire::frame_header& expected,
                        const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                        std::uint32_t* status, stream_handle);
  int (*k_level_decode)(const quantizers::k_level_options&, const quantizers::wire::frame_header& expected,
                        const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                        std::uint32_t* status, stream_handle);
  int (*bfp_decode)(const quantizers::bfp_options&, const quantizers::wire::frame_header& expected,
                    const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                    std::uint32_t* status, stream_handle);
  int (*identity_decode)(const quantizers::wire::frame_header& expected, dtype out_type, const std::byte* frame,
                         std::size_t frame_bytes, std::size_t n, void* out, bool accumulate, std::uint32_t* status,
                         stream_handle);

  // out[i] = a[i] ⊕ b[i] (avg as sum), `out` may be `a` or `b`; f32 or f64.
  int (*reduce)(reduce_op, dtype, const void* a, const void* b, void* out, std::size_t n, stream_handle);
  // 16-bit values (bf16, f16) to float and back (core/half.hpp's rules).
  int (*widen)(dtype from, const void* in, float* out, std::size_t n, stream_handle);
  int (*narrow)(dtype to, const float* in, void* out, std::size_t n, stream_handle);

  // The runtime, for the execution layer.
  int (*device_count)(int* count);
  int (*locate)(const void* pointer, pointer_facts* facts);
  int (*allocate)(std::size_t bytes, void** pointer);
  int (*release)(void* pointer);
  int (*copy)(void* to, const void* from, std::size_t bytes, stream_handle);  ///< any direction (unified addressing)
  int (*synchronize)(stream_handle);
  const char* (*error_string)(int code);
};

}  // namespace qcoll::kernels::cuda
