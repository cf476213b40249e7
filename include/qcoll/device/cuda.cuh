#pragma once
/// @file
/// The CUDA instance of the device runtime (device/runtime.hpp): the kernels of
/// kernels/cuda/ (quantizers.cuh, reduce.cuh, convert.cuh) and the CUDA runtime's
/// memory, streams, events and IPC handles. Built once, by nvcc, in
/// src/cuda_kernels.cu; a program reaches it through the execution layer.

#include <qcoll/device/runtime.hpp>
#include <qcoll/kernels/cuda/convert.cuh>
#include <qcoll/kernels/cuda/grid.cuh>
#include <qcoll/kernels/cuda/quantizers.cuh>
#include <qcoll/kernels/cuda/reduce.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace qcoll::device::cuda_entries {

// The kernels and their launchers (kernels/cuda/), and the shared code they use (kernels/group/, simt/).
using namespace qcoll::kernels;
using namespace qcoll::kernels::cuda;

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

inline int divide(dtype type, void* values, std::size_t n, std::size_t divisor, stream_handle stream) {
  switch (type) {
    case dtype::f32: return cuda::divide(static_cast<float*>(values), n, divisor, stream_of(stream));
    case dtype::f64: return cuda::divide(static_cast<double*>(values), n, divisor, stream_of(stream));
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

/// Runs `launch(values)` with `values` the typed pointer of a f32, bf16, f16 or f64 buffer.
template <class Pointer, class Launch>
int with_float_type(dtype type, Pointer values, Launch&& launch) {
  using byte_pointer = std::remove_pointer_t<Pointer>;
  constexpr bool readonly = std::is_const_v<byte_pointer>;
  switch (type) {
    case dtype::f32: return launch(static_cast<std::conditional_t<readonly, const float*, float*>>(values));
    case dtype::bf16: return launch(static_cast<std::conditional_t<readonly, const bfloat16*, bfloat16*>>(values));
    case dtype::f16: return launch(static_cast<std::conditional_t<readonly, const float16*, float16*>>(values));
    case dtype::f64: return launch(static_cast<std::conditional_t<readonly, const double*, double*>>(values));
    default: return cudaErrorInvalidValue;
  }
}

inline int grid_cover(dtype in, const void* x, std::size_t n, double* exponents, stream_handle stream) {
  return with_float_type(in, x, [&](auto values) { return cuda::grid_cover(values, n, exponents, stream_of(stream)); });
}
inline int grid_add(dtype in, const void* x, std::size_t n, const double* exponents, double* sums, bool first,
                    stream_handle stream) {
  return with_float_type(
      in, x, [&](auto values) { return cuda::grid_add(values, n, exponents, sums, first, stream_of(stream)); });
}
inline int grid_round(dtype out_type, const double* sums, const double* low, std::size_t n, const double* exponents,
                      std::size_t first_index, double divide, void* out, stream_handle stream) {
  if (n > 0 && (out_type == dtype::f64) != (low != nullptr)) return cudaErrorInvalidValue;
  return with_float_type(out_type, out, [&](auto values) {
    return cuda::grid_round(sums, low, n, exponents, first_index, divide, values, stream_of(stream));
  });
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

inline int current_device(int* ordinal) { return cudaGetDevice(ordinal); }
inline int set_device(int ordinal) { return cudaSetDevice(ordinal); }
inline int allocate(std::size_t bytes, void** pointer) { return cudaMalloc(pointer, bytes); }
/// CUDA refuses a process a handle it exported itself, so ranks that are threads of one
/// process (the cuda_peer transport's) could not open each other's memory: this process's
/// exports are remembered, and opening one gives its base address (closing it: nothing).
struct own_exports {
  std::mutex mutex;
  std::vector<std::pair<ipc_handle, void*>> exported;
  std::vector<void*> opened;  ///< own bases handed out by open_memory, once per open
  static own_exports& of_process() {
    static own_exports registry;
    return registry;
  }
};
inline int release(void* pointer) {
  {
    own_exports& own = own_exports::of_process();
    std::lock_guard lock(own.mutex);
    std::erase_if(own.exported, [&](const auto& e) { return e.second == pointer; });
  }
  return cudaFree(pointer);
}
inline int allocate_host(std::size_t bytes, void** pointer) { return cudaMallocHost(pointer, bytes); }
inline int release_host(void* pointer) { return cudaFreeHost(pointer); }
inline int copy(void* to, const void* from, std::size_t bytes, stream_handle stream) {
  return cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream_of(stream));
}
inline int fill(void* to, int byte, std::size_t bytes, stream_handle stream) {
  return cudaMemsetAsync(to, byte, bytes, stream_of(stream));
}
inline int synchronize(stream_handle stream) { return cudaStreamSynchronize(stream_of(stream)); }
inline int stream_create(stream_handle* stream) {
  cudaStream_t created = nullptr;
  const cudaError_t result = cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
  *stream = created;
  return result;
}
inline int stream_destroy(stream_handle stream) { return cudaStreamDestroy(stream_of(stream)); }
inline int stream_device(stream_handle stream, int* ordinal) { return cudaStreamGetDevice(stream_of(stream), ordinal); }
inline cudaEvent_t event_of(event_handle event) noexcept { return static_cast<cudaEvent_t>(event); }
inline int event_create(event_handle* event, bool interprocess) {
  cudaEvent_t created = nullptr;
  const unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0u);
  const cudaError_t result = cudaEventCreateWithFlags(&created, flags);
  *event = created;
  return result;
}
inline int event_destroy(event_handle event) { return cudaEventDestroy(event_of(event)); }
inline int event_record(event_handle event, stream_handle stream) {
  return cudaEventRecord(event_of(event), stream_of(stream));
}
inline int stream_wait(stream_handle stream, event_handle event) {
  return cudaStreamWaitEvent(stream_of(stream), event_of(event), 0);
}
inline int event_query(event_handle event) { return cudaEventQuery(event_of(event)); }
inline int event_synchronize(event_handle event) { return cudaEventSynchronize(event_of(event)); }

static_assert(sizeof(cudaIpcMemHandle_t) <= sizeof(ipc_handle) && sizeof(cudaIpcEventHandle_t) <= sizeof(ipc_handle));
inline int export_memory(void* base, ipc_handle* handle) {
  cudaIpcMemHandle_t exported{};
  const cudaError_t result = cudaIpcGetMemHandle(&exported, base);
  *handle = {};
  std::memcpy(handle->bytes, &exported, sizeof exported);
  if (result == cudaSuccess) {
    own_exports& own = own_exports::of_process();
    std::lock_guard lock(own.mutex);
    own.exported.emplace_back(*handle, base);
  }
  return result;
}
inline int open_memory(const ipc_handle* handle, void** pointer) {
  {
    own_exports& own = own_exports::of_process();
    std::lock_guard lock(own.mutex);
    for (const auto& [exported, base] : own.exported)
      if (std::memcmp(exported.bytes, handle->bytes, sizeof handle->bytes) == 0) {
        own.opened.push_back(base);
        *pointer = base;
        return cudaSuccess;
      }
  }
  cudaIpcMemHandle_t opened{};
  std::memcpy(&opened, handle->bytes, sizeof opened);
  return cudaIpcOpenMemHandle(pointer, opened, cudaIpcMemLazyEnablePeerAccess);
}
inline int close_memory(void* pointer) {
  {
    own_exports& own = own_exports::of_process();
    std::lock_guard lock(own.mutex);
    if (const auto found = std::find(own.opened.begin(), own.opened.end(), pointer); found != own.opened.end()) {
      own.opened.erase(found);
      return cudaSuccess;
    }
  }
  return cudaIpcCloseMemHandle(pointer);
}
inline int export_event(event_handle event, ipc_handle* handle) {
  cudaIpcEventHandle_t exported{};
  const cudaError_t result = cudaIpcGetEventHandle(&exported, event_of(event));
  *handle = {};
  std::memcpy(handle->bytes, &exported, sizeof exported);
  return result;
}
inline int open_event(const ipc_handle* handle, event_handle* event) {
  cudaIpcEventHandle_t opened{};
  std::memcpy(&opened, handle->bytes, sizeof opened);
  cudaEvent_t created = nullptr;
  const cudaError_t result = cudaIpcOpenEventHandle(&created, opened);
  *event = created;
  return result;
}
inline const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

}  // namespace qcoll::device::cuda_entries

namespace qcoll::device {

/// The CUDA runtime as a device runtime table.
inline constexpr runtime make_cuda_runtime() noexcept {
  namespace e = cuda_entries;
  return {
      .name = "cuda",
      .one_bit_encode = &e::one_bit_encode,
      .k_level_encode = &e::k_level_encode,
      .bfp_encode = &e::bfp_encode,
      .identity_encode = &e::identity_encode,
      .one_bit_decode = &e::one_bit_decode,
      .k_level_decode = &e::k_level_decode,
      .bfp_decode = &e::bfp_decode,
      .identity_decode = &e::identity_decode,
      .reduce = &e::reduce,
      .divide = &e::divide,
      .widen = &e::widen,
      .narrow = &e::narrow,
      .grid_cover = &e::grid_cover,
      .grid_add = &e::grid_add,
      .grid_round = &e::grid_round,
      .device_count = &e::device_count,
      .current_device = &e::current_device,
      .set_device = &e::set_device,
      .locate = &e::locate,
      .allocate = &e::allocate,
      .release = &e::release,
      .allocate_host = &e::allocate_host,
      .release_host = &e::release_host,
      .copy = &e::copy,
      .fill = &e::fill,
      .synchronize = &e::synchronize,
      .stream_create = &e::stream_create,
      .stream_destroy = &e::stream_destroy,
      .stream_device = &e::stream_device,
      .event_create = &e::event_create,
      .event_destroy = &e::event_destroy,
      .event_record = &e::event_record,
      .stream_wait = &e::stream_wait,
      .event_query = &e::event_query,
      .event_synchronize = &e::event_synchronize,
      .export_memory = &e::export_memory,
      .open_memory = &e::open_memory,
      .close_memory = &e::close_memory,
      .export_event = &e::export_event,
      .open_event = &e::open_event,
      .error_string = &e::error_string,
      .not_ready = cudaErrorNotReady,
  };
}

}  // namespace qcoll::device
