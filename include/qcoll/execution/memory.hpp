#pragma once
/// @file
/// Where a call's buffers live. A call takes host memory unless its first argument
/// says otherwise: `qcoll::execution::device_stream{stream}` makes it a call on GPU
/// memory, its kernels queued on `stream`. The memory space is thus part of the
/// call's type — chosen at compile time, never guessed from a pointer — and the
/// execution layer (dispatch.hpp) checks the claim against the pointers' attributes,
/// so a device pointer given to a host call, or a host pointer to a device call, is
/// errc::invalid_argument naming the buffer, not a crash (docs/gpu.md).

#include <concepts>
#include <cstdint>
#include <type_traits>

namespace qcoll::execution {

enum class memory_space : std::uint8_t { host, device };

inline constexpr const char* to_string(memory_space space) noexcept {
  return space == memory_space::host ? "host" : "device";
}

/// Memory spaces as types, for what keeps state in one (a plan's residuals and frames:
/// a plan over device_space keeps them in device memory and takes device buffers).
struct host_space {
  static constexpr memory_space value = memory_space::host;
};
struct device_space {
  static constexpr memory_space value = memory_space::device;
};
template <class S>
concept memory_space_tag = std::same_as<S, host_space> || std::same_as<S, device_space>;

/// A call on GPU memory, ordered on a CUDA stream as NCCL's calls are: its work
/// starts after what was queued on `stream` before it, and what is queued after it
/// sees its results. `stream` is a cudaStream_t (null: the legacy default stream);
/// `device_stream{stream}` takes one as it is.
struct device_stream {
  void* stream = nullptr;
};

namespace memory_detail {
struct no_device_form {
  no_device_form() = delete;  // nothing converts to it: a host plan has no device constructor
};
}  // namespace memory_detail

/// The first parameter of a plan's device constructors: device_stream in a plan of
/// `Space` device_space, an unconstructible type in a host plan. (A `requires` on the
/// constructor instead breaks class template argument deduction with clang++ 14 when
/// the class's template parameters are constrained: it deduces the host plan.)
template <memory_space_tag Space>
using device_stream_if =
    std::conditional_t<std::same_as<Space, device_space>, device_stream, memory_detail::no_device_form>;

/// How a collective on device buffers enters: its caller's stream, and for a call
/// started without waiting the event recorded on that stream when it was started
/// (the call runs after it) and the stream's device, found in the caller's thread.
struct device_entry {
  device_stream where;
  void* ready = nullptr;  ///< an event (device::event_handle); null: record one on `where` now
  int ordinal = -1;       ///< the stream's device; −1: ask the stream
};

}  // namespace qcoll::execution
