#pragma once
/// @file
/// The execution layer: the one place that turns a call's backend and memory
/// space into the kernels it runs. Host memory runs on the CPU backend that
/// kernels/cpu/dispatch.hpp picked for this CPU's instruction sets; device memory
/// runs on the CUDA backend (kernels/cuda/kernel_table.hpp) when the program links
/// it — target qcoll::cuda, which compiles src/cuda_kernels.cu with nvcc and defines
/// QCOLL_CUDA_KERNELS_COMPILED. Quantizers, primitives and plans reach kernels only
/// through here.
///
/// Memory spaces are checked with the CUDA runtime's pointer attributes, when the
/// CUDA backend is linked and a GPU is present (asked once): one
/// cudaPointerGetAttributes per buffer per checked call. Without it, no device
/// memory can reach qcoll through its API, and every buffer is taken as host memory.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/kernels/cuda/kernel_table.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#if defined(QCOLL_CUDA_KERNELS_COMPILED)
namespace qcoll::kernels::cuda::compiled {
extern const kernel_table table;  // src/cuda_kernels.cu
}  // namespace qcoll::kernels::cuda::compiled
#endif

namespace qcoll::execution {

/// The CPU backend's kernels.
inline const kernels::cpu::kernel_table& cpu_kernels() { return kernels::cpu::active_kernels(); }

/// The CUDA backend if this program links it, else nullptr.
inline const kernels::cuda::kernel_table* linked_cuda_kernels() noexcept {
#if defined(QCOLL_CUDA_KERNELS_COMPILED)
  return &kernels::cuda::compiled::table;
#else
  return nullptr;
#endif
}

/// How many GPUs the CUDA backend sees (0 without it, or without a driver); asked once.
inline int gpu_count() {
  static const int count = [] {
    const kernels::cuda::kernel_table* cuda = linked_cuda_kernels();
    int devices = 0;
    if (cuda) cuda->device_count(&devices);
    return devices;
  }();
  return count;
}

/// The CUDA backend for a call on device memory named `what`.
/// @throws qcoll::error (invalid_argument) when the program does not link it or no GPU is present.
inline const kernels::cuda::kernel_table& cuda_kernels(const char* what) {
  const kernels::cuda::kernel_table* cuda = linked_cuda_kernels();
  if (!cuda)
    detail::throw_error(errc::invalid_argument,
                        "{}: a call on device memory needs qcoll's CUDA kernels; link the target qcoll::cuda "
                        "(a CUDA-enabled build of qcoll)",
                        what);
  if (gpu_count() == 0)
    detail::throw_error(errc::invalid_argument, "{}: a call on device memory, but no CUDA device is present", what);
  return *cuda;
}

/// Throws errc::device_error quoting CUDA's words unless `code` is 0 (cudaSuccess).
inline void check_cuda(const kernels::cuda::kernel_table& cuda, int code, const char* what) {
  if (code != 0)
    detail::throw_error(errc::device_error, "{}: CUDA error {}: {}", what, code, cuda.error_string(code));
}

/// The memory space of `data`: device memory only where the CUDA backend is linked,
/// a GPU is present and the runtime says so.
inline memory_space space_of(const void* data) {
  if (data == nullptr || gpu_count() == 0) return memory_space::host;
  kernels::cuda::pointer_facts facts;
  linked_cuda_kernels()->locate(data, &facts);
  return facts.device ? memory_space::device : memory_space::host;
}

/// A buffer a call names in its checks.
struct named_buffer {
  const char* name;
  const void* data;
  std::size_t bytes;

  template <class T>
  named_buffer(const char* label, std::span<T> span) noexcept
      : name(label), data(static_cast<const void*>(span.data())), bytes(span.size_bytes()) {}
};

/// The first non-empty buffer of `buffers` that does not live in `expected`, or nullptr.
inline const named_buffer* misplaced(memory_space expected, std::initializer_list<named_buffer> buffers) {
  if (gpu_count() == 0) {  // no device memory exists: every buffer is host memory
    if (expected == memory_space::host) return nullptr;
    for (const named_buffer& buffer : buffers)
      if (buffer.bytes != 0) return &buffer;
    return nullptr;
  }
  for (const named_buffer& buffer : buffers)
    if (buffer.bytes != 0 && space_of(buffer.data) != expected) return &buffer;
  return nullptr;
}

/// Throws invalid_argument for `what` unless every buffer lives in `expected`.
inline void require_space(const char* what, memory_space expected, std::initializer_list<named_buffer> buffers) {
  if (const named_buffer* wrong = misplaced(expected, buffers))
    detail::throw_error(errc::invalid_argument, "{}: {} is not in {} memory{}", what, wrong->name, to_string(expected),
                        expected == memory_space::host ? " (a device pointer given to a host call)"
                                                       : " (a call on device memory takes device pointers)");
}

/// For collectives and plans: fails `step` — aborting the call, so every rank hears
/// of it — unless every buffer lives in host memory, where their kernels run.
template <class Step>
void require_host(Step& step, std::initializer_list<named_buffer> buffers) {
  if (const named_buffer* wrong = misplaced(memory_space::host, buffers))
    step.fail(errc::invalid_argument,
              "{} is in device memory; this call takes host memory (device buffers: docs/gpu.md)", wrong->name);
}

}  // namespace qcoll::execution
