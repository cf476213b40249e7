#pragma once
// The torch.distributed backend "qcoll" (c10d::Backend) and the communicator the DDP
// hook uses: both run their calls, in the order they were issued, on one worker
// thread that owns a qcoll group (group.hpp), and return c10d::Work objects whose
// futures complete when the call has. Calls on CUDA tensors follow device.hpp's
// stream contract.

#include "device.hpp"
#include "group.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace qcoll_torch {

/// A call's outcome: done when the worker has run it; its future holds the output
/// tensors, or the error. A call on CUDA tensors (`device`) has a CUDA-aware future,
/// completed on the call's side stream, and synchronize() — which Work::wait() calls
/// once the call is done — makes the caller's current stream wait for the call's end.
class work final : public c10d::Work {
 public:
  work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::unique_ptr<device_call> device);
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override;
  void complete(std::exception_ptr error);
  /// The call's CUDA side; null for CPU tensors.
  device_call* device() noexcept { return device_.get(); }

 private:
  std::vector<at::Tensor> outputs_;
  std::unique_ptr<device_call> device_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// Where a call's tensors are, found and checked at submission: CPU, or one CUDA device.
struct call_device {
  std::optional<c10::Device> cuda;  ///< the CUDA device of every tensor; none: CPU tensors
  std::vector<at::Tensor> used;     ///< every tensor the call reads or writes
};

/// One thread that owns a group and runs the calls given to it in order. A call that
/// fails completes its work with the error (qcoll aborted the communicator, so every
/// rank's pending call fails too); later calls fail at once with the same cause.
class worker {
 public:
  explicit worker(std::unique_ptr<group> owned);
  ~worker();
  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Queues `task` (a call named `what`) and returns its work at once. A call on
  /// CUDA tensors (`where.cuda`) is ordered after the caller's current stream now, and
  /// runs on the device's side stream (device.hpp); `task` gets the placement to pass on.
  c10::intrusive_ptr<work> submit(c10d::OpType type, std::vector<at::Tensor> outputs, std::string what,
                                  const call_device& where, std::function<void(group&, const placement&)> task);
  group& members() noexcept { return *group_; }

  /// Stops every worker's thread once its queued calls have run (later calls fail).
  /// qcoll.torch calls it at exit (atexit), while the interpreter still runs: a worker
  /// thread drops tensors, which takes the GIL, and taking the GIL during the
  /// interpreter's finalization ends the thread with an unwind that aborts the process.
  static void stop_all();

 private:
  void stop();
  struct job {
    c10::intrusive_ptr<work> done;
    std::string what;
    std::function<void(group&, const placement&)> task;
  };
  void run();
  void run_one(job& next);

  std::unique_ptr<group> group_;
  side_streams streams_;  // the CUDA calls' side streams, one per device
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<job> queue_;
  bool stopping_ = false;
  bool stopped_ = false;  // the thread is joined; submit fails
  std::thread thread_;  // last: starts once the rest exists
};

/// The process group backend: CPU and CUDA tensors (docs/pytorch.md).
class backend final : public c10d::Backend {
 public:
  backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const group_settings& settings);

  const std::string getBackendName() const override { return "qcoll"; }
  const char* transport_name() { return worker_.members().transport_name(); }
  std::uint64_t bytes_sent() { return worker_.members().bytes_sent(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int to, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int from, int tag) override;

 private:
  worker worker_;
};

/// What the DDP hook sends its buckets through: a qcoll group of its own, joined
/// once through the process group's store.
class compressed_communicator {
 public:
  compressed_communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                          const group_settings& settings);
  /// The compressed allreduce (avg) of `tensor` in place, through the plan kept under
  /// `key`: a host plan for a CPU tensor, a plan on device memory for a CUDA tensor
  /// (ordered on the tensor's device's current stream, as the backend's calls).
  c10::intrusive_ptr<c10d::Work> allreduce(std::int64_t key, const at::Tensor& tensor, const compression& settings);
  /// The exact average of `tensor` in place, as the group's all_reduce with AVG: the
  /// reproducible sum when the communicator was joined with settings.reproducible.
  c10::intrusive_ptr<c10d::Work> average(const at::Tensor& tensor);
  int rank() { return worker_.members().rank(); }
  int size() { return worker_.members().size(); }
  const char* transport_name() { return worker_.members().transport_name(); }
  std::uint64_t bytes_sent() { return worker_.members().bytes_sent(); }

 private:
  worker worker_;
};

}  // namespace qcoll_torch
