#pragma once
/// @file
/// Where a call's buffers live. A call takes host memory unless its first argument
/// says otherwise: `qcoll::execution::device_stream{stream}` makes it a call on GPU
/// memory, its kernels queued on `stream`. The memory space is thus part of the
/// call's type — chosen at compile time, never guessed from a pointer — and the
/// execution layer (dispatch.hpp) checks the claim against the pointers' attributes,
/// so a device pointer given to a host call, or a host pointer to a device call, is
/// errc::invalid_argument naming the buffer, not a crash (docs/gpu.md).

#include <cstdint>

namespace qcoll::execution {

enum class memory_space : std::uint8_t { host, device };

inline constexpr const char* to_string(memory_space space) noexcept {
  return space == memory_space::host ? "host" : "device";
}

/// A call on GPU memory, ordered on a CUDA stream as NCCL's calls are: its work
/// starts after what was queued on `stream` before it, and what is queued after it
/// sees its results. `stream` is a cudaStream_t (null: the legacy default stream);
/// `device_stream{stream}` takes one as it is.
struct device_stream {
  void* stream = nullptr;
};

}  // namespace qcoll::execution
