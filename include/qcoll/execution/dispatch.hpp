#pragma once
/// @file
/// The execution layer: the one place that turns a call's backend and memory
/// space into the kernels it runs. Host memory runs on the CPU backend that
/// kernels/cpu/dispatch.hpp picked for this CPU's instruction sets; device memory
/// runs on the active device runtime (device/runtime.hpp): CUDA when the program
/// links it (target qcoll::cuda, which compiles src/cuda_kernels.cu with nvcc and
/// defines QCOLL_CUDA_KERNELS_COMPILED) and a GPU is present, or the emulated device
/// (QCOLL_DEVICE=emulated in a program that includes device/emulated/runtime.hpp, or
/// use_device). Quantizers, primitives and plans reach
/// kernels only through here.
///
/// Memory spaces are checked with the runtime's `locate` (CUDA: pointer attributes),
/// when a device runtime is active: one call per buffer per checked call, at the
/// door of a call. Without one, no device memory can reach qcoll through its API, and
/// every buffer is taken as host memory (no check, no cost).

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#if defined(QCOLL_CUDA_KERNELS_COMPILED)
namespace qcoll::device::compiled {
extern const runtime cuda;  // src/cuda_kernels.cu
}  // namespace qcoll::device::compiled
#endif

namespace qcoll::execution {

/// The CPU backend's kernels.
inline const kernels::cpu::kernel_table& cpu_kernels() { return kernels::cpu::active_kernels(); }

/// The CUDA runtime if this program links it (target qcoll::cuda), else nullptr.
inline const device::runtime* linked_cuda() noexcept {
#if defined(QCOLL_CUDA_KERNELS_COMPILED)
  return &device::compiled::cuda;
#else
  return nullptr;
#endif
}

namespace dispatch_detail {

/// What CUDA said when asked for its devices, once: how many (0 without it), and its
/// words when it refused (no driver, or one too old for this CUDA runtime).
struct cuda_census {
  int devices = 0;
  std::string refusal;
};
inline const cuda_census& cuda_devices() {
  static const cuda_census census = [] {
    cuda_census found;
    if (const device::runtime* cuda = linked_cuda())
      if (const int failed = cuda->device_count(&found.devices)) {
        found.devices = 0;
        found.refusal = detail::format("a call on device memory, but no CUDA device is usable: CUDA error {}: {}", failed,
                                       cuda->error_string(failed));
      }
    return found;
  }();
  return census;
}
inline int cuda_gpus() { return cuda_devices().devices; }

/// What QCOLL_DEVICE asks for: CUDA where it is linked and a GPU is present, unless
/// the variable says "emulated", "cuda" or "none". `refusal` says why a request
/// cannot be met (a device call then reports it).
inline const device::runtime* from_environment(const char*& refusal) {
  refusal = nullptr;
  const char* asked = std::getenv("QCOLL_DEVICE");
  const std::string_view wanted = asked ? asked : "";
  if (wanted == "emulated") {
    if (!device::included_emulated_device)
      refusal = "QCOLL_DEVICE=emulated, but this program does not include the emulated device "
                "(<qcoll/device/emulated/runtime.hpp>, a test double of the CUDA runtime)";
    return device::included_emulated_device;
  }
  if (wanted == "none") {
    refusal = "QCOLL_DEVICE=none";
    return nullptr;
  }
  if (wanted.empty() || wanted == "cuda") {
    if (!linked_cuda()) {
      refusal = "a call on device memory needs qcoll's CUDA runtime; link the target qcoll::cuda (a CUDA-enabled "
                "build of qcoll), or, to test device code on the CPU, include <qcoll/device/emulated/runtime.hpp> "
                "and set QCOLL_DEVICE=emulated";
      return nullptr;
    }
    if (cuda_gpus() == 0) {
      refusal = cuda_devices().refusal.empty() ? "a call on device memory, but no CUDA device is present"
                                               : cuda_devices().refusal.c_str();
      return nullptr;
    }
    return linked_cuda();
  }
  refusal = "QCOLL_DEVICE must be cuda, emulated or none";
  return nullptr;
}

struct choice {
  std::atomic<const device::runtime*> runtime{nullptr};
  std::atomic<const char*> refusal{nullptr};
  std::atomic<bool> made{false};
};

inline choice& the_choice() {
  static choice chosen;
  return chosen;
}

}  // namespace dispatch_detail

/// Makes `runtime` the device every device call runs on, in place of what
/// QCOLL_DEVICE chose (device::emulated(), say, in a test). Call it before any device
/// memory exists: memory one runtime allocated means nothing to another.
inline void use_device(const device::runtime& runtime) noexcept {
  dispatch_detail::choice& chosen = dispatch_detail::the_choice();
  chosen.runtime.store(&runtime);
  chosen.refusal.store(nullptr);
  chosen.made.store(true);
}

/// The device runtime device calls run on (use_device's, else QCOLL_DEVICE's: CUDA where
/// it is linked and a GPU is present, or the emulated device); null when there is none.
inline const device::runtime* active_device() {
  dispatch_detail::choice& chosen = dispatch_detail::the_choice();
  if (!chosen.made.load(std::memory_order_acquire)) {
    const char* refusal = nullptr;
    const device::runtime* found = dispatch_detail::from_environment(refusal);
    const device::runtime* expected = nullptr;
    chosen.refusal.store(refusal);
    chosen.runtime.compare_exchange_strong(expected, found);
    chosen.made.store(true, std::memory_order_release);
  }
  return chosen.runtime.load(std::memory_order_acquire);
}

/// The device runtime for a call on device memory named `what`.
/// @throws qcoll::error (invalid_argument) when there is none: no qcoll::cuda, no GPU, or QCOLL_DEVICE says so.
inline const device::runtime& device_runtime(const char* what) {
  const device::runtime* runtime = active_device();
  if (!runtime) {
    const char* refusal = dispatch_detail::the_choice().refusal.load();
    detail::throw_error(errc::invalid_argument, "{}: {}", what, refusal ? refusal : "no device runtime");
  }
  return *runtime;
}

/// Why there is no device runtime (for an error message), when there is none.
inline const char* device_refusal() {
  active_device();
  const char* refusal = dispatch_detail::the_choice().refusal.load();
  return refusal ? refusal : "no device runtime";
}

/// How many devices the active runtime has (0 without one).
inline int gpu_count() {
  const device::runtime* runtime = active_device();
  if (!runtime) return 0;
  if (runtime == linked_cuda()) return dispatch_detail::cuda_gpus();
  int devices = 0;
  runtime->device_count(&devices);
  return devices;
}

/// Throws errc::device_error quoting the runtime's words unless `code` is 0.
inline void check_device(const device::runtime& runtime, int code, const char* what) {
  if (code != 0)
    detail::throw_error(errc::device_error, "{}: {} error {}: {}", what, runtime.name, code, runtime.error_string(code));
}

/// The memory space of `data`: device memory only where a device runtime is active and
/// says so.
inline memory_space space_of(const void* data) {
  const device::runtime* runtime = data == nullptr ? nullptr : active_device();
  if (!runtime || gpu_count() == 0) return memory_space::host;
  device::pointer_facts facts;
  runtime->locate(data, &facts);
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
              "{} is in device memory; this call takes host memory (its device_stream form takes device memory: "
              "docs/gpu.md)", wrong->name);
}

/// Why a buffer of a call on device `ordinal` does not belong there: it is host memory,
/// or on another device. Null when every buffer does.
struct device_misfit {
  const named_buffer* buffer = nullptr;
  int ordinal = -1;  ///< where it is (−1: host memory)
};
inline device_misfit misplaced_on_device(const device::runtime& runtime, int ordinal,
                                         std::initializer_list<named_buffer> buffers) {
  for (const named_buffer& buffer : buffers) {
    if (buffer.bytes == 0) continue;
    device::pointer_facts facts;
    runtime.locate(buffer.data, &facts);
    if (!facts.device || facts.ordinal != ordinal) return {&buffer, facts.device ? facts.ordinal : -1};
  }
  return {};
}

/// For device collectives and plans: fails `step` (aborting, so every rank hears of it)
/// unless every buffer lives in device memory of `ordinal`, the device of the call's stream.
template <class Step>
void require_device(Step& step, const device::runtime& runtime, int ordinal,
                    std::initializer_list<named_buffer> buffers) {
  const device_misfit misfit = misplaced_on_device(runtime, ordinal, buffers);
  if (!misfit.buffer) return;
  if (misfit.ordinal < 0)
    step.fail(errc::invalid_argument,
              "{} is in host memory; a call on device memory (device_stream) takes device pointers", misfit.buffer->name);
  step.fail(errc::invalid_argument, "{} is on device {}, but the call's stream is on device {}", misfit.buffer->name,
            misfit.ordinal, ordinal);
}

}  // namespace qcoll::execution
