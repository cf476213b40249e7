#pragma once
/// @file
/// The quantizers' CUDA kernels: every encoder runs kernels/simt/'s code with one
/// group per half warp (tile.cuh), from a stage in shared memory where the group
/// fits (simt::encode_groups); decoders and checks run eight values per thread.
/// The launchers below take device pointers and a stream and return at once; they
/// are what src/cuda_kernels.cu puts in the device kernel table (table.cuh).
///
/// A frame on the device is written whole by the encoder (the header by the first
/// thread). A decode first checks the frame on the device (check_*: the header, then
/// every record, the quantizer's own check_records rules) into a status word, and
/// the decoder touches nothing unless the status is 0 — so a bad frame leaves `out`
/// as it was, as on the CPU, without a round trip to the host in between.

#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/cuda/tile.cuh>
#include <qcoll/kernels/simt/bfp.hpp>
#include <qcoll/kernels/simt/k_level.hpp>
#include <qcoll/kernels/simt/one_bit.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && (defined(__USE_FAST_MATH__) || defined(__CUDA_FTZ))
#error "qcoll's CUDA kernels match the CPU bit for bit only without --use_fast_math and -ftz=true"
#endif

namespace qcoll::kernels::cuda {

inline constexpr unsigned threads_per_block = 256;
inline constexpr unsigned tiles_per_block = threads_per_block / simt::tile_lanes;
/// Encoders that stage: small blocks, so that shared memory (a stage per tile), not
/// the block size, sets how many tiles an SM runs, and the blocks' phases (loading a
/// span, encoding it from the stage) interleave.
inline constexpr unsigned staged_threads_per_block = 64;
inline constexpr unsigned staged_tiles_per_block = staged_threads_per_block / simt::tile_lanes;
/// Floats from one tile's stage to the next: a multiple of 32 and 16 more, so that the
/// two tiles of a warp read different banks, and the stage stays 16-byte aligned.
__host__ __device__ inline constexpr std::size_t stage_stride(std::size_t stage_values) noexcept {
  return (stage_values + 31) / 32 * 32 + 16;
}
static_assert(staged_tiles_per_block * stage_stride(simt::stage_capacity) * sizeof(float) <= 48 * 1024,
              "more would need cudaFuncSetAttribute");
/// Grids stop growing here (grid-stride loops cover the rest): enough blocks to
/// fill any current GPU many times over.
inline constexpr std::size_t max_blocks = 65535;

inline unsigned blocks_for(std::size_t items, std::size_t per_block) noexcept {
  const std::size_t wanted = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(wanted < max_blocks ? (wanted > 0 ? wanted : 1) : max_blocks);
}

/// This thread's tile and how many tiles the grid has.
__device__ inline std::size_t tile_index() noexcept {
  return (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / simt::tile_lanes;
}
__device__ inline std::size_t tile_count() noexcept { return std::size_t(gridDim.x) * blockDim.x / simt::tile_lanes; }
__device__ inline std::size_t thread_index() noexcept { return std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline std::size_t thread_count() noexcept { return std::size_t(gridDim.x) * blockDim.x; }

/// This tile's stage of stage_values floats in the block's shared memory, or null
/// where the groups do not fit one (stage_values 0: launched without it).
__device__ inline float* tile_stage(std::size_t stage_values) noexcept {
  extern __shared__ float4 shared_words[];  // float4: the stage is 16-byte aligned
  if (stage_values == 0) return nullptr;
  return reinterpret_cast<float*>(shared_words) + threadIdx.x / simt::tile_lanes * stage_stride(stage_values);
}

/// The first thread writes the frame's header.
__device__ inline void write_header_once(const quantizers::wire::frame_header& header, std::byte* frame) noexcept {
  if (blockIdx.x == 0 && threadIdx.x == 0) quantizers::wire::write_header(header, frame);
}

// ---- encoders: one group per tile, the grid's tiles striding over the groups

template <class In>
__global__ void one_bit_encode_kernel(std::size_t stage_values, quantizers::one_bit_options options,
                                      quantizers::wire::frame_header header, const In* x, std::size_t n,
                                      const float* residual_in, float* residual_out, const float* memory_in,
                                      float* memory_out, std::byte* frame) {
  write_header_once(header, frame);
  simt::one_bit_encode(half_warp(), tile_index(), tile_count(), options, x, n, residual_in, residual_out, memory_in,
                       memory_out, frame + quantizers::wire::header_size, tile_stage(stage_values), stage_values);
}

template <class In>
__global__ void k_level_encode_kernel(std::size_t stage_values, quantizers::k_level_options options,
                                      quantizers::wire::frame_header header, quantizers::encode_position position,
                                      const In* x, std::size_t n, const float* residual_in, float* residual_out,
                                      std::byte* frame) {
  write_header_once(header, frame);
  simt::k_level_encode(half_warp(), tile_index(), tile_count(), options, position, x, n, residual_in, residual_out,
                       frame + quantizers::wire::header_size, tile_stage(stage_values), stage_values);
}

template <class In>
__global__ void bfp_encode_kernel(std::size_t stage_values, quantizers::bfp_options options,
                                  quantizers::wire::frame_header header, const In* x, std::size_t n,
                                  const float* residual_in, float* residual_out, std::byte* frame) {
  write_header_once(header, frame);
  simt::bfp_encode(half_warp(), tile_index(), tile_count(), options, x, n, residual_in, residual_out,
                   frame + quantizers::wire::header_size, tile_stage(stage_values), stage_values);
}

/// identity: the values themselves after the header, as Out (16-bit inputs widen to float).
template <class Out, class In>
__global__ void identity_encode_kernel(quantizers::wire::frame_header header, const In* x, std::size_t n,
                                       std::byte* frame) {
  write_header_once(header, frame);
  std::byte* out = frame + quantizers::wire::header_size;
  for (std::size_t i = thread_index(); i < n; i += thread_count()) {
    if constexpr (std::is_same_v<In, Out>) store<Out>(out + i * sizeof(Out), x[i]);
    else store<Out>(out + i * sizeof(Out), widened(x, i));
  }
}

// ---- checks: the header, then each quantizer's record rules, into *status

/// The first nonzero verdict wins; later ones (always protocol_error here) change nothing.
__device__ inline void report(std::uint32_t* status, int verdict) noexcept {
  if (verdict != 0) atomicCAS(status, 0u, static_cast<std::uint32_t>(verdict));
}

template <class ValueValid, class GroupValid>
__global__ void check_kernel(quantizers::wire::frame_header expected, quantizers::wire::record_layout layout,
                             const std::byte* frame, std::size_t frame_bytes, std::size_t n, std::uint32_t* status,
                             ValueValid value_valid, GroupValid group_valid) {
  // Every thread reads the header (24 bytes, cached) and stops if it is wrong; the first reports it.
  const int verdict = quantizers::wire::header_verdict(frame, frame_bytes, expected, layout.frame_bytes(n));
  if (verdict != 0) {
    if (thread_index() == 0) report(status, verdict);
    return;
  }
  if (!simt::records_valid(thread_index(), thread_count(), layout, frame + quantizers::wire::header_size, n,
                           value_valid, group_valid))
    report(status, static_cast<int>(errc::protocol_error));
}

// ---- decoders: a run of eight values per thread, nothing done unless the check passed

template <class Value>
__global__ void decode_kernel(const std::byte* frame, std::size_t n, float* out, bool accumulate,
                              const std::uint32_t* status, Value value_of) {
  if (*status != 0) return;
  simt::decode_values(thread_index(), thread_count(), frame + quantizers::wire::header_size, n, out, accumulate,
                      value_of);
}

/// identity keeps its element type: out = or += the frame's values.
template <class T>
__global__ void identity_decode_kernel(const std::byte* frame, std::size_t n, T* out, bool accumulate_into,
                                       const std::uint32_t* status) {
  if (*status != 0) return;
  const std::byte* records = frame + quantizers::wire::header_size;
  for (std::size_t i = thread_index(); i < n; i += thread_count()) {
    const T value = load<T>(records + i * sizeof(T));
    if constexpr (std::is_same_v<T, float>) out[i] = accumulate_into ? accumulate(out[i], value) : value;
    else out[i] = accumulate_into ? add(out[i], value) : value;
  }
}

// ---- launchers

/// An encoder over n values in groups of `group`: staged, a tile per span of whole
/// groups (simt::stage_values_for), where a group fits a stage; else a tile per group.
template <class Kernel, class... Args>
cudaError_t launch_tiles(Kernel kernel, std::size_t group, std::size_t n, cudaStream_t stream, Args... args) {
  const std::size_t stage_values = simt::stage_values_for(group);
  if (stage_values != 0) {
    const std::size_t span = stage_values / group * group;
    kernel<<<blocks_for((n + span - 1) / span, staged_tiles_per_block), staged_threads_per_block,
             staged_tiles_per_block * stage_stride(stage_values) * sizeof(float), stream>>>(stage_values, args...);
  } else {
    kernel<<<blocks_for((n + group - 1) / group, tiles_per_block), threads_per_block, 0, stream>>>(0, args...);
  }
  return cudaGetLastError();
}
template <class Kernel, class... Args>
cudaError_t launch_values(Kernel kernel, std::size_t items, cudaStream_t stream, Args... args) {
  kernel<<<blocks_for(items, threads_per_block), threads_per_block, 0, stream>>>(args...);
  return cudaGetLastError();
}

/// Sets *status to 0, checks the frame into it, then decodes unless it failed.
template <class ValueValid, class GroupValid, class Value>
cudaError_t check_and_decode(const quantizers::wire::frame_header& expected,
                             const quantizers::wire::record_layout& layout, const std::byte* frame,
                             std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                             std::uint32_t* status, ValueValid value_valid, GroupValid group_valid, Value value_of,
                             cudaStream_t stream) {
  if (const cudaError_t failed = cudaMemsetAsync(status, 0, sizeof *status, stream)) return failed;
  // A thread per run of values and per group; one block when nothing but the header and
  // the last padding can be wrong (one_bit, k_level with a power of two levels).
  constexpr bool header_only =
      std::is_same_v<ValueValid, simt::always_valid> && std::is_same_v<GroupValid, simt::always_valid>;
  const std::size_t runs = (n + simt::run_values - 1) / simt::run_values, groups = layout.groups(n);
  if (const cudaError_t failed =
          launch_values(check_kernel<ValueValid, GroupValid>, header_only ? 1 : (runs > groups ? runs : groups), stream,
                        expected, layout, frame, frame_bytes, n, status, value_valid, group_valid))
    return failed;
  if (n == 0) return cudaSuccess;
  return launch_values(decode_kernel<Value>, runs, stream, frame, n, out, accumulate,
                       static_cast<const std::uint32_t*>(status), value_of);
}

}  // namespace qcoll::kernels::cuda
