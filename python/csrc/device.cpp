// CUDA tensors in the bridge (device.hpp).

#include "device.hpp"

#include <qcoll/detail/format.hpp>
#include <qcoll/execution/dispatch.hpp>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdlib>
#include <string_view>

#ifndef QCOLL_TORCH_NO_CUDA_REASON
#define QCOLL_TORCH_NO_CUDA_REASON "it was built without it"
#endif

namespace qcoll_torch {

namespace {

const c10::impl::DeviceGuardImplInterface& cuda_guard() { return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA); }

}  // namespace

bool cuda_built() noexcept { return qcoll::execution::linked_cuda() != nullptr; }

std::optional<std::string> cuda_refusal() {
  if (!cuda_built())
    return std::string("this build of qcoll's PyTorch bridge has no CUDA support (" QCOLL_TORCH_NO_CUDA_REASON
                       "); rebuild it with CUDA (a CUDA build of torch, nvcc found, QCOLL_TORCH_CUDA not OFF): "
                       "pip install --no-build-isolation --force-reinstall ./python (docs/pytorch.md)");
  const qcoll::device::runtime* runtime = qcoll::execution::active_device();
  if (!runtime)
    return qcoll::detail::format("qcoll's CUDA runtime cannot run them: {}", qcoll::execution::device_refusal());
  if (runtime != qcoll::execution::linked_cuda()) {
    const char* asked = std::getenv("QCOLL_DEVICE");
    return qcoll::detail::format("qcoll's device calls run on its {} device (QCOLL_DEVICE={}), which cannot reach "
                                 "PyTorch's CUDA memory; unset QCOLL_DEVICE or set it to cuda",
                                 runtime->name, asked ? asked : "");
  }
  return std::nullopt;
}

c10::DeviceIndex current_cuda_device() { return cuda_guard().getDevice().index(); }

void synchronize_current_stream(int device) {
  const c10::impl::DeviceGuardImplInterface& guard = cuda_guard();
  guard.synchronizeStream(guard.getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))));
}

c10::Stream side_streams::on(c10::Device device) {
  std::lock_guard lock(mutex_);
  auto found = streams_.find(device.index());
  if (found == streams_.end())
    found = streams_.emplace(device.index(), cuda_guard().getStreamFromGlobalPool(device, /*isHighPriority=*/false)).first;
  return found->second;
}

device_call::device_call(side_streams& streams, c10::Device device, const std::vector<at::Tensor>& tensors)
    : device_(device), side_(streams.on(device)), ready_(c10::DeviceType::CUDA), end_(c10::DeviceType::CUDA) {
  const c10::impl::DeviceGuardImplInterface& guard = cuda_guard();
  // As ProcessGroupNCCL: the call is ordered after what the caller queued so far...
  ready_.record(guard.getStream(device));
  // ... and its tensors are not handed to another stream's allocations before the
  // side stream's work on them has run (the call also keeps them until it ends).
  for (const at::Tensor& tensor : tensors)
    if (tensor.defined() && tensor.has_storage()) guard.recordDataPtrOnStream(tensor.storage().data_ptr(), side_);
}

placement device_call::where() const {
  return placement{qcoll::execution::device_stream{side_.native_handle()}, static_cast<int>(device_.index())};
}

void device_call::run(const std::function<void()>& body) {
  c10::StreamGuard current(side_);
  ready_.block(side_);
  try {
    body();
  } catch (...) {
    end_.record(side_);
    throw;
  }
  end_.record(side_);
}

void device_call::on_side_stream(const std::function<void()>& body) const {
  c10::StreamGuard current(side_);
  body();
}

void device_call::block_current_stream() const { end_.block(cuda_guard().getStream(device_)); }

}  // namespace qcoll_torch
