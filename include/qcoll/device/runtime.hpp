#pragma once
/// @file
/// The device runtime: everything qcoll asks of a GPU, as one table of plain
/// function pointers — the quantizers' and collectives' kernels, memory, streams,
/// events, copies and process-shared handles — so host code built by any compiler
/// reaches a device without its headers, and so the device can be swapped.
///
/// Two implementations fill it: **CUDA** (device/cuda.cuh, compiled once by nvcc in
/// src/cuda_kernels.cu, target qcoll::cuda) and the **emulated device**
/// (device/emulated/runtime.hpp), a test double that runs on any CPU so that every device path
/// is tested where there is no GPU (docs/gpu.md). The execution layer
/// (execution/dispatch.hpp) picks one; nothing else names either.
///
/// Every entry returns an int: 0 on success, else the implementation's error code
/// (error_string words it; CUDA's own codes for CUDA). Work on a stream is queued and
/// the call returns at once: it has not necessarily run, and may fail later, at the
/// next synchronisation.
///
/// Kernels take device pointers. Encoders write the whole frame, header included.
/// Decoders first check the frame on the device into *status (a device word: 0, or the
/// errc the CPU's decode would return) and touch `out` only if it is 0.

#include <qcoll/core/encode_position.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/core/wire.hpp>

#include <cstddef>
#include <cstdint>

namespace qcoll::device {

/// A stream (cudaStream_t); null is the device's default stream.
using stream_handle = void*;
/// An event (cudaEvent_t).
using event_handle = void*;

/// What the runtime says of a pointer.
struct pointer_facts {
  bool device = false;  ///< device (or managed) memory a kernel may use
  int ordinal = -1;     ///< its device, when `device`
};

/// A handle another process of the node opens to reach this one's device memory or
/// event (cudaIpcMemHandle_t, cudaIpcEventHandle_t: 64 bytes each). Plain bytes, so
/// it travels through a rendezvous store.
struct ipc_handle {
  std::byte bytes[64] = {};
};

struct runtime {
  const char* name;  ///< "cuda", "emulated"

  // ---- kernels, queued on a stream

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
  // values[i] /= divisor (an average's last step, as the CPU's finish_avg); f32 or f64.
  int (*divide)(dtype, void* values, std::size_t n, std::size_t divisor, stream_handle);
  // 16-bit values (bf16, f16) to float and back (core/half.hpp's rules).
  int (*widen)(dtype from, const void* in, float* out, std::size_t n, stream_handle);
  int (*narrow)(dtype to, const float* in, void* out, std::size_t n, stream_handle);
  // The reproducible sum's conversions (kernels/group/grid.hpp's rules) of n values of
  // type f32, bf16, f16 or f64: raise exponents[b] to cover block b of x; sums[i] =
  // (first) or += x[i] on its block's grid (f64: two carriers, sums[i] and sums[n + i]);
  // out[i] = sums[i] (f64: with low[i]; else low is null) back from the grid of block
  // (first_index + i) / block, divided by `divide`, rounded into out_type.
  int (*grid_cover)(dtype in, const void* x, std::size_t n, double* exponents, stream_handle);
  int (*grid_add)(dtype in, const void* x, std::size_t n, const double* exponents, double* sums, bool first,
                  stream_handle);
  int (*grid_round)(dtype out_type, const double* sums, const double* low, std::size_t n, const double* exponents,
                    std::size_t first_index, double divide, void* out, stream_handle);

  // ---- devices and memory

  int (*device_count)(int* count);
  int (*current_device)(int* ordinal);  ///< of the calling thread
  int (*set_device)(int ordinal);       ///< of the calling thread
  int (*locate)(const void* pointer, pointer_facts* facts);
  int (*allocate)(std::size_t bytes, void** pointer);  ///< device memory on the current device
  int (*release)(void* pointer);
  int (*allocate_host)(std::size_t bytes, void** pointer);  ///< pinned host memory, for copies that overlap
  int (*release_host)(void* pointer);

  // ---- streams, copies, events

  int (*copy)(void* to, const void* from, std::size_t bytes, stream_handle);  ///< any direction (unified addressing)
  int (*fill)(void* to, int byte, std::size_t bytes, stream_handle);          ///< every byte = `byte`
  int (*synchronize)(stream_handle);  ///< waits for everything queued on the stream
  int (*stream_create)(stream_handle* stream);  ///< on the current device; not ordered with the default stream
  int (*stream_destroy)(stream_handle stream);
  int (*stream_device)(stream_handle stream, int* ordinal);
  int (*event_create)(event_handle* event, bool interprocess);  ///< no timing; interprocess: exportable
  int (*event_destroy)(event_handle event);
  int (*event_record)(event_handle event, stream_handle stream);  ///< completes when what is queued before it has run
  int (*stream_wait)(stream_handle stream, event_handle event);  ///< later work on `stream` waits for the last record
  int (*event_query)(event_handle event);  ///< 0: complete (or never recorded); not_ready; an error
  int (*event_synchronize)(event_handle event);

  // ---- between processes of one node

  int (*export_memory)(void* base, ipc_handle* handle);  ///< base: the start of an allocation
  int (*open_memory)(const ipc_handle* handle, void** pointer);
  int (*close_memory)(void* pointer);  ///< what open_memory mapped
  int (*export_event)(event_handle event, ipc_handle* handle);  ///< an interprocess event
  int (*open_event)(const ipc_handle* handle, event_handle* event);

  const char* (*error_string)(int code);
  /// The code event_query returns for an event whose work has not run yet.
  int not_ready;
};

/// The emulated device's table in a program that includes device/emulated/runtime.hpp
/// (its translation units set this as they start), else null: what QCOLL_DEVICE=emulated
/// finds. The emulation is a test double: a program opts in with that include, and no
/// other translation unit compiles it (compiled into every user of the execution layer,
/// it doubled the build of the ci preset).
inline const runtime* included_emulated_device = nullptr;

}  // namespace qcoll::device
