#pragma once
// CUDA tensors in the bridge: whether this process can run them, and the stream
// contract of a call on them (ProcessGroupNCCL's, as far as qcoll's device calls
// allow; docs/pytorch.md, "CUDA tensors").
//
// A call on CUDA tensors runs on a side stream of its device (one per device, per
// backend or hook communicator, from PyTorch's stream pool):
//   - at submission, on the caller's thread, an event is recorded on the caller's
//     current stream, and the call's tensors are recorded as used on the side stream
//     (the caching allocator's recordStream) besides being kept by the call;
//   - on the worker thread, the side stream waits for that event, then qcoll's
//     device_stream call runs on the side stream: it starts after the event, and it
//     returns on the host once the result is in place (qcoll's device calls are
//     blocking: the exchange itself runs on the host, over the transport), with the
//     side stream made to wait for it; an end event is then recorded on the side
//     stream, and the work's future is completed there (a CUDA-aware future: its
//     events are on the side stream);
//   - Work::wait() (Work::synchronize()) waits on the host until the worker has run
//     the call, then makes the caller's current stream wait for the end event.
//     ProcessGroupNCCL's wait() does not block the host: here the result exists only
//     once the host exchange has run, so no event could stand for it earlier.
//
// Everything goes through c10's device-generic interfaces (c10::Stream, c10::Event,
// the CUDA DeviceGuardImpl that libc10_cuda registers), so this file needs no CUDA
// headers; what a build without CUDA lacks is qcoll's CUDA runtime (qcoll::cuda), and
// cuda_refusal() says so.

#include "group.hpp"

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace qcoll_torch {

/// Whether this build links qcoll's CUDA runtime (qcoll::cuda).
bool cuda_built() noexcept;

/// Why CUDA tensors cannot run in this process (no CUDA build of the bridge, and
/// why; no GPU qcoll's CUDA runtime can use; QCOLL_DEVICE set otherwise), or nullopt
/// when they can.
std::optional<std::string> cuda_refusal();

/// The current CUDA device of the calling thread.
c10::DeviceIndex current_cuda_device();

/// Waits on the host for the work queued on the calling thread's current stream of CUDA device `device`.
void synchronize_current_stream(int device);

/// The side streams one backend (or the hook's communicator) runs its CUDA calls on:
/// one per device, taken from PyTorch's stream pool at the first call there.
class side_streams {
 public:
  c10::Stream on(c10::Device device);

 private:
  std::mutex mutex_;
  std::map<c10::DeviceIndex, c10::Stream> streams_;
};

/// The CUDA side of one call, from its submission to its work's end (see above).
class device_call {
 public:
  /// At submission, on the caller's thread: the call runs on `device`'s side stream
  /// after the work now queued on the caller's current stream of `device`; `tensors`
  /// (every tensor the call reads or writes) are recorded as used on the side stream.
  device_call(side_streams& streams, c10::Device device, const std::vector<at::Tensor>& tensors);
  device_call(const device_call&) = delete;
  device_call& operator=(const device_call&) = delete;

  c10::Device device() const noexcept { return device_; }
  /// What the group's calls take: the side stream's cudaStream_t, on the call's device.
  placement where() const;

  /// On the worker: `body` with the call's device and its side stream current, after
  /// the side stream has been made to wait for the submission's event; the end event
  /// is recorded on the side stream after it, also when it throws.
  void run(const std::function<void()>& body);
  /// `body` with the call's device and side stream current (the future is completed
  /// there, so that its events are recorded on the side stream).
  void on_side_stream(const std::function<void()>& body) const;
  /// The caller's current stream of the call's device waits for the end event
  /// (nothing when the end was never recorded).
  void block_current_stream() const;

 private:
  c10::Device device_;
  c10::Stream side_;
  c10::Event ready_;  // on the caller's stream, at submission
  c10::Event end_;    // on the side stream, after the call
};

}  // namespace qcoll_torch
