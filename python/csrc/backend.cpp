// The torch.distributed backend "qcoll" and the DDP hook's communicator (backend.hpp).

#include "backend.hpp"

#include <qcoll/detail/format.hpp>

#include <ATen/core/ivalue.h>
#include <Python.h>

#include <limits>
#include <set>
#include <stdexcept>
#include <utility>

namespace qcoll_torch {

using qcoll::errc;

// ---- work and worker

work::work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::unique_ptr<device_call> device)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      device_(std::move(device)),
      // A call on CUDA tensors has a CUDA-aware future (its device's events), as
      // ProcessGroupNCCL's: whoever waits on it, or chains a callback to it, is ordered
      // after the call's side stream.
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()),
          device_ ? std::vector<c10::Device>{device_->device()} : std::vector<c10::Device>{})) {}

void work::complete(std::exception_ptr error) {
  finish(error);  // Work::wait() returns or throws from here on
  const auto settle = [&] {
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
  };
  if (!device_) return settle();
  try {
    device_->on_side_stream(settle);  // the future's events are recorded on the side stream
  } catch (...) {
    if (!future_->completed()) future_->setError(std::current_exception());
  }
}

void work::synchronize() {
  if (!device_) return;
  // qcoll's device calls are blocking: the result is in place once the worker has run
  // the call, and not before, so the host waits for that first (ProcessGroupNCCL's
  // synchronize only queues the stream wait). Then the caller's current stream waits
  // for the call's end on the side stream, as ProcessGroupNCCL's does.
  future_->wait();
  device_->block_current_stream();
}

namespace {

/// The live workers, for stop_all.
std::mutex workers_mutex;
std::set<worker*>& live_workers() {
  static std::set<worker*> workers;
  return workers;
}

}  // namespace

worker::worker(std::unique_ptr<group> owned) : group_(std::move(owned)), thread_([this] { run(); }) {
  std::lock_guard lock(workers_mutex);
  live_workers().insert(this);
}

worker::~worker() {
  {
    std::lock_guard lock(workers_mutex);
    live_workers().erase(this);
  }
  stop();
}

void worker::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopping_ = true;
  }
  ready_.notify_all();
  // The worker may need the GIL to finish its last call (completing a future runs and
  // drops Python callbacks), and the thread stopping it may hold the GIL (Python freeing
  // the hook's state or a process group): joining with it held would deadlock.
  PyThreadState* released = PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  thread_.join();
  if (released) PyEval_RestoreThread(released);
  std::lock_guard lock(mutex_);
  stopped_ = true;
}

void worker::stop_all() {
  std::lock_guard lock(workers_mutex);
  for (worker* each : live_workers()) each->stop();
}

c10::intrusive_ptr<work> worker::submit(c10d::OpType type, std::vector<at::Tensor> outputs, std::string what,
                                        const call_device& where,
                                        std::function<void(group&, const placement&)> task) {
  // A CUDA call is ordered after the caller's current stream here, at submission.
  std::unique_ptr<device_call> device = where.cuda ? std::make_unique<device_call>(streams_, *where.cuda, where.used)
                                                   : nullptr;
  auto done = c10::make_intrusive<work>(group_->rank(), type, std::move(outputs), std::move(device));
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      queue_.push_back({done, std::move(what), std::move(task)});
      ready_.notify_one();
      return done;
    }
  }
  done->complete(std::make_exception_ptr(
      std::runtime_error(qcoll::detail::format("qcoll {} failed: the process is shutting down", what))));
  return done;
}

void worker::run() {
  for (;;) {
    job next;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    run_one(next);
  }
}

void worker::run_one(job& next) {
  std::exception_ptr error;
  const auto failed = [&](const std::exception& e) {
    // The words PyTorch shows: which call, then qcoll's, which name the rank and peer.
    if (!error)
      error = std::make_exception_ptr(std::runtime_error(qcoll::detail::format("qcoll {} failed: {}", next.what, e.what())));
  };
  device_call* device = next.done->device();
  const auto body = [&] {
    try {
      next.task(*group_, device ? device->where() : placement{});
    } catch (const std::exception& e) {
      failed(e);
    }
    next.task = nullptr;  // the call's tensors go here, before the caller can move on
  };
  if (!device) {
    body();
  } else {
    try {
      device->run(body);  // on the side stream, after the submission's event; the end event after it
    } catch (const std::exception& e) {
      failed(e);  // the stream could not be ordered, or the end not recorded
      next.task = nullptr;
    }
  }
  next.done->complete(error);
}

// ---- tensors

namespace {

/// The one tensor of a call.
const at::Tensor& only_tensor(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1)
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll {}: one tensor per call, not {}", what, tensors.size());
  return tensors.front();
}

/// Where the tensors of a call named `what` are, checked at its submission: all CPU
/// tensors, or all CUDA tensors of one device — the current one (`current_only`),
/// dense, and only where this process can run them (cuda_refusal). Anything else is a
/// clear error on this rank, before the call is queued.
call_device device_of(const char* what, std::vector<at::Tensor> tensors, bool current_only = true) {
  const at::Tensor* on_cpu = nullptr;
  const at::Tensor* on_cuda = nullptr;
  for (const at::Tensor& tensor : tensors) {
    const c10::Device device = tensor.device();
    if (device.is_cpu()) {
      if (!on_cpu) on_cpu = &tensor;
    } else if (!device.is_cuda()) {
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll {}: a tensor on {}: the qcoll backend takes CPU and CUDA tensors", what,
                                 device.str());
    } else if (!on_cuda) {
      on_cuda = &tensor;
    } else if (device != on_cuda->device()) {
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll {}: tensors on {} and {}: the tensors of one call are on one device", what,
                                 on_cuda->device().str(), device.str());
    }
  }
  call_device found;
  if (!on_cuda) {
    found.used = std::move(tensors);
    return found;
  }
  const c10::Device device = on_cuda->device();
  if (on_cpu)
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll {}: a tensor on {} and one on the CPU: the tensors of one call are all CPU "
                               "tensors or all CUDA tensors of one device",
                               what, device.str());
  if (const std::optional<std::string> refused = cuda_refusal())
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll {}: a tensor on {}, but CUDA tensors cannot run here: {}",
                               what, device.str(), *refused);
  if (current_only)
    if (const c10::DeviceIndex current = current_cuda_device(); current != device.index())
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll {}: a tensor on {}, but the current device is cuda:{}: a call on CUDA tensors "
                                 "is ordered on the current stream of their device, which must be the current device "
                                 "(torch.cuda.set_device({}))",
                                 what, device.str(), static_cast<int>(current), static_cast<int>(device.index()));
  for (const at::Tensor& tensor : tensors)
    if (!tensor.is_contiguous())
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll {}: a non-contiguous tensor on {}: CUDA tensors must be contiguous, as with "
                                 "ProcessGroupNCCL (pass tensor.contiguous(), and copy the result back)",
                                 what, device.str());
  found.cuda = device;
  found.used = std::move(tensors);
  return found;
}

bool is_float(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kBFloat16:
    case at::kHalf: return true;
    default: return false;
  }
}

/// The list form's tensors (all_gather's outputs, reduce_scatter's inputs): one list
/// of `ranks` tensors, each of `like`'s size and type; `role` names them.
std::vector<at::Tensor> tensor_per_rank(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& like,
                                        int ranks, const char* what, const char* role) {
  if (lists.size() != 1 || lists.front().size() != static_cast<std::size_t>(ranks))
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll {}: one list of {} {} tensors", what, ranks, role);
  for (const at::Tensor& each : lists.front())
    if (each.numel() != like.numel() || each.scalar_type() != like.scalar_type())
      qcoll::detail::throw_error(errc::invalid_argument, "qcoll {}: every {} tensor must be of the {}'s size and type",
                                 what, role, std::string_view(role) == "input" ? "output" : "input");
  return lists.front();
}

/// `first`, then `rest`: a call's tensors, for device_of.
std::vector<at::Tensor> together(const at::Tensor& first, const std::vector<at::Tensor>& rest) {
  std::vector<at::Tensor> all{first};
  all.insert(all.end(), rest.begin(), rest.end());
  return all;
}

/// Tensors a reduction takes: the four float types, reduced by qcoll in their own
/// type, and integers and bool, reduced in float64 (exact within ±2^53: narrow_exactly
/// says when a result was not).
void check_reducible(const at::Tensor& tensor, const char* what) {
  if (is_float(tensor) || at::isIntegralType(tensor.scalar_type(), /*includeBool=*/true)) return;
  qcoll::detail::throw_error(errc::invalid_argument,
                             "qcoll {}: tensors of {} cannot be reduced (float32, float64, bfloat16, float16, "
                             "integers, bool)",
                             what, std::string(c10::toString(tensor.scalar_type())));
}

qcoll::reduce_op reduce_op_of(const c10d::ReduceOp& op, const at::Tensor& tensor, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return qcoll::reduce_op::sum;
    case c10d::ReduceOp::AVG:
      if (!is_float(tensor))
        qcoll::detail::throw_error(errc::invalid_argument, "qcoll {}: the average of {} values is not supported", what,
                                   std::string(c10::toString(tensor.scalar_type())));
      return qcoll::reduce_op::avg;
    case c10d::ReduceOp::PRODUCT: return qcoll::reduce_op::product;
    case c10d::ReduceOp::MIN: return qcoll::reduce_op::min;
    case c10d::ReduceOp::MAX: return qcoll::reduce_op::max;
    default:
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll {}: reduce op {} is not supported (sum, avg, product, min, max)", what,
                                 static_cast<int>(op.op_));
  }
}

/// Runs `use(dense)` on `tensor`, or on a contiguous copy written back afterwards
/// (CPU tensors only: CUDA tensors are contiguous, device_of checked).
template <class Use>
void on_dense(at::Tensor& tensor, Use&& use) {
  if (tensor.is_contiguous()) return use(tensor);
  at::Tensor dense = tensor.contiguous();
  use(dense);
  tensor.copy_(dense);
}

constexpr double exact_in_float64 = 9007199254740992.0;  // 2^53: every integer up to it is a double

/// How large an integer input may be for `op` over `ranks` ranks to be reduced in float64
/// exactly: min and max only compare; a sum of `ranks` values of at most 2^53 / ranks
/// never leaves ±2^53; a product's partial results are no larger than its result (or it
/// is 0), which narrow_exactly checks.
double exact_input_limit(qcoll::reduce_op op, int ranks) {
  if (op == qcoll::reduce_op::min || op == qcoll::reduce_op::max) return exact_in_float64;
  return exact_in_float64 / ranks;
}

// On the worker, a CUDA call's tensor operations below (conversions, copies, padding)
// run on its side stream, the current stream there (device_call::run): in order with
// qcoll's device call on that stream.

/// `values` (integers or bool) in float64, or all NaN when one exceeds `limit`: the NaN
/// reaches every rank's result, so every rank fails alike in narrow_exactly.
at::Tensor widened(const at::Tensor& values, double limit) {
  at::Tensor wide = values.to(at::kDouble);
  if (wide.numel() != 0 && wide.abs().max().item<double>() > limit) wide.fill_(std::numeric_limits<double>::quiet_NaN());
  return wide;
}

/// Writes a float64 result back into integer or bool `values`, or fails when it is not exact.
void narrow_exactly(at::Tensor& values, const at::Tensor& wide, int ranks, const char* what) {
  if (wide.numel() != 0 && (wide.isnan().any().item<bool>() || wide.abs().max().item<double>() > exact_in_float64))
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll {}: {} values are reduced in float64 and must stay within ±2^53 (a sum's inputs "
                               "within ±2^53 / {} ranks); some did not",
                               what, std::string(c10::toString(values.scalar_type())), ranks);
  values.copy_(values.scalar_type() == at::kBool ? wide.ne(0) : wide.to(values.scalar_type()));
}

/// An all_reduce of `values` (dense) in place: float types as they are, integers and
/// bool in float64.
void allreduce_exactly(group& g, at::Tensor& values, qcoll::reduce_op op, int ranks, const placement& where) {
  if (is_float(values)) return g.allreduce(values, op, where);
  at::Tensor wide = widened(values, exact_input_limit(op, ranks));
  g.allreduce(wide, op, where);
  narrow_exactly(values, wide, ranks, "all_reduce");
}

/// A tensor's bytes as a float type the collectives move unchanged, for calls that only
/// move data (broadcast, all_gather, send, recv) of any dtype: the same memory as
/// float64, float32 or bfloat16, whichever unit divides the byte count, or for an odd
/// number of bytes a zero-padded copy.
struct units {
  at::Tensor tensor;  // what the collective moves
  at::Tensor bytes;   // the tensor's own bytes (uint8), to copy a padded result back to
  bool padded = false;
};

units as_units(const at::Tensor& dense) {
  const at::Tensor flat = dense.reshape({-1});
  if (is_float(dense)) return {flat, {}, false};
  const at::Tensor bytes = flat.view(at::kByte);
  if (bytes.numel() % 8 == 0) return {bytes.view(at::kDouble), bytes, false};
  if (bytes.numel() % 4 == 0) return {bytes.view(at::kFloat), bytes, false};
  if (bytes.numel() % 2 == 0) return {bytes.view(at::kBFloat16), bytes, false};
  at::Tensor padded = at::zeros({bytes.numel() + 1}, bytes.options());
  padded.narrow(0, 0, bytes.numel()).copy_(bytes);
  return {padded.view(at::kBFloat16), bytes, true};
}

/// Writes a padded copy's result back into the tensor's bytes.
void unpad(const units& moved) {
  if (moved.padded) moved.bytes.copy_(moved.tensor.view(at::kByte).narrow(0, 0, moved.bytes.numel()));
}

/// Each rank's bytes out of an all_gather of units: rank r's are the first `bytes` of
/// its block.
at::Tensor block_bytes(const at::Tensor& all_units, std::int64_t units_per_rank, int r, std::int64_t bytes) {
  return all_units.narrow(0, r * units_per_rank, units_per_rank).view(at::kByte).narrow(0, 0, bytes);
}

/// reduce_scatter of `all` into `mine` (dense), integers and bool in float64.
void scatter_exactly(group& g, const at::Tensor& all, at::Tensor& mine, qcoll::reduce_op op, int ranks,
                     const placement& where) {
  if (is_float(mine)) return g.reduce_scatter(all, mine, op, where);
  // Every rank's whole input is checked, not only its own block.
  const at::Tensor wide_all = widened(all, exact_input_limit(op, ranks));
  at::Tensor wide_mine = at::empty(mine.sizes(), mine.options().dtype(at::kDouble));
  g.reduce_scatter(wide_all, wide_mine, op, where);
  narrow_exactly(mine, wide_mine, ranks, "reduce_scatter");
}

/// The CUDA device a barrier is asked to wait on: BarrierOptions' device where the
/// caller set one, else the first of its device_ids (what dist.barrier(device_ids=[i])
/// passes through PyTorch's dispatcher), else none: a barrier of the host.
std::optional<c10::Device> barrier_device(const c10d::BarrierOptions& opts) {
  if (opts.device && opts.device->is_cuda()) {
    if (opts.device->has_index()) return *opts.device;
    return c10::Device(c10::DeviceType::CUDA, current_cuda_device());
  }
  if (!opts.device && !opts.device_ids.empty())
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(opts.device_ids.front()));
  return std::nullopt;
}

}  // namespace

// ---- the backend

backend::backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const group_settings& settings)
    : c10d::Backend(rank, size), worker_(join_group(store, rank, size, settings)) {}

c10::intrusive_ptr<c10d::Work> backend::allreduce(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) {
  at::Tensor tensor = only_tensor(tensors, "all_reduce");
  const call_device where = device_of("all_reduce", {tensor});
  check_reducible(tensor, "all_reduce");
  const qcoll::reduce_op op = reduce_op_of(opts.reduceOp, tensor, "all_reduce");
  const int ranks = getSize();
  return worker_.submit(c10d::OpType::ALLREDUCE, {tensor}, "all_reduce", where,
                        [tensor, op, ranks](group& g, const placement& on) mutable {
                          on_dense(tensor, [&](at::Tensor& dense) { allreduce_exactly(g, dense, op, ranks, on); });
                        });
}

c10::intrusive_ptr<c10d::Work> backend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor tensor = only_tensor(tensors, "broadcast");
  const call_device where = device_of("broadcast", {tensor});
  const int root = static_cast<int>(opts.rootRank);
  return worker_.submit(c10d::OpType::BROADCAST, {tensor}, "broadcast", where,
                        [tensor, root](group& g, const placement& on) mutable {
                          on_dense(tensor, [&](at::Tensor& dense) {
                            units moved = as_units(dense);
                            g.broadcast(moved.tensor, root, on);
                            unpad(moved);
                          });
                        });
}

c10::intrusive_ptr<c10d::Work> backend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  const at::Tensor input = only_tensor(inputs, "all_gather");
  std::vector<at::Tensor> slots = tensor_per_rank(outputs, input, getSize(), "all_gather", "output");
  const call_device where = device_of("all_gather", together(input, slots));
  return worker_.submit(c10d::OpType::ALLGATHER, slots, "all_gather", where,
                        [input, slots](group& g, const placement& on) {
                          const units mine = as_units(input.contiguous());
                          const std::int64_t per_rank = mine.tensor.numel();
                          at::Tensor all = at::empty({static_cast<std::int64_t>(slots.size()) * per_rank},
                                                     mine.tensor.options());
                          g.all_gather(mine.tensor, all, on);
                          const std::int64_t bytes = input.numel() * input.element_size();
                          for (std::size_t r = 0; r < slots.size(); ++r) {
                            at::Tensor slot = slots[r];
                            on_dense(slot, [&](at::Tensor& dense) {
                              dense.reshape({-1}).view(at::kByte).copy_(
                                  block_bytes(all, per_rank, static_cast<int>(r), bytes));
                            });
                          }
                        });
}

c10::intrusive_ptr<c10d::Work> backend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                        const c10d::AllgatherOptions&) {
  const call_device where = device_of("all_gather_into_tensor", {input, output});
  if (output.numel() != getSize() * input.numel() || output.scalar_type() != input.scalar_type())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll all_gather_into_tensor: the output holds {} values, not {} × {} of the input's type",
                               output.numel(), getSize(), input.numel());
  const int ranks = getSize();
  return worker_.submit(c10d::OpType::_ALLGATHER_BASE, {output}, "all_gather_into_tensor", where,
                        [input, output, ranks](group& g, const placement& on) mutable {
                          const units mine = as_units(input.contiguous());
                          on_dense(output, [&](at::Tensor& dense) {
                            if (!mine.padded) {
                              units all = as_units(dense);
                              return g.all_gather(mine.tensor, all.tensor, on);
                            }
                            const std::int64_t per_rank = mine.tensor.numel();
                            at::Tensor all = at::empty({ranks * per_rank}, mine.tensor.options());
                            g.all_gather(mine.tensor, all, on);
                            const std::int64_t bytes = input.numel() * input.element_size();
                            const at::Tensor out_bytes = dense.reshape({-1}).view(at::kByte);
                            for (int r = 0; r < ranks; ++r)
                              out_bytes.narrow(0, r * bytes, bytes).copy_(block_bytes(all, per_rank, r, bytes));
                          });
                        });
}

c10::intrusive_ptr<c10d::Work> backend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ReduceScatterOptions& opts) {
  at::Tensor output = only_tensor(outputs, "reduce_scatter");
  std::vector<at::Tensor> pieces = tensor_per_rank(inputs, output, getSize(), "reduce_scatter", "input");
  const call_device where = device_of("reduce_scatter", together(output, pieces));
  check_reducible(output, "reduce_scatter");
  const qcoll::reduce_op op = reduce_op_of(opts.reduceOp, output, "reduce_scatter");
  const int ranks = getSize();
  return worker_.submit(c10d::OpType::REDUCE_SCATTER, {output}, "reduce_scatter", where,
                        [output, pieces, op, ranks](group& g, const placement& on) mutable {
                          std::vector<at::Tensor> flat;
                          for (const at::Tensor& piece : pieces) flat.push_back(piece.reshape({-1}));
                          const at::Tensor all = at::cat(flat);
                          on_dense(output, [&](at::Tensor& mine) { scatter_exactly(g, all, mine, op, ranks, on); });
                        });
}

c10::intrusive_ptr<c10d::Work> backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::ReduceScatterOptions& opts) {
  const call_device where = device_of("reduce_scatter_tensor", {input, output});
  check_reducible(input, "reduce_scatter_tensor");
  if (input.numel() != getSize() * output.numel() || output.scalar_type() != input.scalar_type())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll reduce_scatter_tensor: the input holds {} values, not {} × {} of the output's type",
                               input.numel(), getSize(), output.numel());
  const qcoll::reduce_op op = reduce_op_of(opts.reduceOp, output, "reduce_scatter_tensor");
  const int ranks = getSize();
  return worker_.submit(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, "reduce_scatter_tensor", where,
                        [input, output, op, ranks](group& g, const placement& on) mutable {
                          const at::Tensor dense = input.contiguous();
                          on_dense(output, [&](at::Tensor& mine) { scatter_exactly(g, dense, mine, op, ranks, on); });
                        });
}

c10::intrusive_ptr<c10d::Work> backend::barrier(const c10d::BarrierOptions& opts) {
  const std::optional<c10::Device> device = barrier_device(opts);
  if (!device)
    return worker_.submit(c10d::OpType::BARRIER, {}, "barrier", {},
                          [](group& g, const placement&) { g.barrier(placement{}); });
  // On a device (dist.barrier(device_ids=…); ProcessGroupNCCL's barrier is an
  // allreduce there): no rank returns before every rank's work queued on its current
  // stream before the call has run. It moves no tensor, so where qcoll's CUDA runtime
  // is missing the host waits for the side stream (ordered after the caller's) and
  // runs the host barrier: the same guarantee.
  call_device where;
  where.cuda = *device;
  const bool qcoll_runs_cuda = !cuda_refusal();
  return worker_.submit(c10d::OpType::BARRIER, {}, "barrier", where, [qcoll_runs_cuda](group& g, const placement& on) {
    if (qcoll_runs_cuda) return g.barrier(on);
    synchronize_current_stream(on.device);
    g.barrier(placement{});
  });
}

c10::intrusive_ptr<c10d::Work> backend::send(std::vector<at::Tensor>& tensors, int to, int) {
  const at::Tensor tensor = only_tensor(tensors, "send");
  const call_device where = device_of("send", {tensor});
  return worker_.submit(c10d::OpType::SEND, {tensor}, "send", where, [tensor, to](group& g, const placement& on) {
    g.send(as_units(tensor.contiguous()).tensor, to, on);
  });
}

c10::intrusive_ptr<c10d::Work> backend::recv(std::vector<at::Tensor>& tensors, int from, int) {
  at::Tensor tensor = only_tensor(tensors, "recv");
  const call_device where = device_of("recv", {tensor});
  return worker_.submit(c10d::OpType::RECV, {tensor}, "recv", where, [tensor, from](group& g, const placement& on) mutable {
    on_dense(tensor, [&](at::Tensor& dense) {
      units moved = as_units(dense);
      g.recv(moved.tensor, from, on);
      unpad(moved);
    });
  });
}

// ---- the hook's communicator

compressed_communicator::compressed_communicator(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                 const group_settings& settings)
    : worker_(join_group(store, rank, size, settings)) {}

c10::intrusive_ptr<c10d::Work> compressed_communicator::allreduce(std::int64_t key, const at::Tensor& tensor,
                                                                  const compression& settings) {
  // A DDP bucket lives on its model's device, whatever the hook's thread has current
  // (autograd runs it on the device's own thread): its device's current stream orders it.
  const call_device where = device_of("compressed allreduce", {tensor}, /*current_only=*/false);
  if (!tensor.is_contiguous())
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll compressed allreduce: the bucket must be contiguous");
  return worker_.submit(c10d::OpType::ALLREDUCE, {tensor}, "compressed allreduce", where,
                        [key, tensor = at::Tensor(tensor), settings](group& g, const placement& on) mutable {
                          g.compressed_allreduce(key, tensor, qcoll::reduce_op::avg, settings, on);
                        });
}

c10::intrusive_ptr<c10d::Work> compressed_communicator::average(const at::Tensor& tensor) {
  const call_device where = device_of("average", {tensor}, /*current_only=*/false);
  if (!tensor.is_contiguous())
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll average: the bucket must be contiguous");
  return worker_.submit(c10d::OpType::ALLREDUCE, {tensor}, "average", where,
                        [tensor = at::Tensor(tensor)](group& g, const placement& on) mutable {
                          g.allreduce(tensor, qcoll::reduce_op::avg, on);
                        });
}

}  // namespace qcoll_torch
