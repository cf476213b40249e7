#pragma once
// What the PyTorch bridge runs: a qcoll communicator joined through PyTorch's store,
// over the shm or the TCP transport, behind one interface (the transport is chosen
// at run time, like qcoll-run's --transport), with tensors turned into spans: host
// spans for CPU tensors, device spans with a CUDA stream for CUDA tensors (qcoll's
// device_stream forms, docs/gpu.md) — over the CUDA peer transport, on shm, where the
// build has CUDA and the group's ranks share a host.

#include "store.hpp"

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/quantizers/by_name.hpp>
#include <qcoll/reproducible.hpp>
#include <qcoll/transports/shm.hpp>
#include <qcoll/transports/tcp.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace qcoll_torch {

/// How a group is joined: the transport (QCOLL_TRANSPORT's values) and the deadline
/// of setup and of every step.
struct group_settings {
  qcoll::rendezvous::transport_kind transport = qcoll::rendezvous::transport_kind::automatic;
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  /// all_reduce's and reduce_scatter's sum and avg of floating-point tensors through
  /// qcoll's reproducible sums (the same bits whatever the algorithm and the order of the
  /// ranks; docs/reproducibility.md), CPU and CUDA tensors.
  bool reproducible = false;
};

/// Whether a group's calls on CUDA tensors go GPU to GPU over the CUDA peer transport
/// (builds with CUDA, groups whose ranks share one host over shm): `required` for
/// QCOLL_TRANSPORT=cuda_peer, `automatic` for auto (staged through host memory if it
/// cannot start), `never` for shm and tcp named (staged).
enum class peer_policy { never, automatic, required };

/// The hook's quantizer and its settings.
struct compression {
  std::string quantizer = "one_bit";  ///< a name from qcoll::quantizers::named_quantizers
  std::size_t group_size = 2048;      ///< one_bit and k_level groups, bfp blocks
  unsigned bits = 4;                  ///< k_level: 2^bits levels; bfp: mantissa bits
  bool error_feedback = true;
  bool reproducible = false;  ///< owners sum on the shared grid (compressed_allreduce_options)
};

/// Where a call's tensors live. Host memory (no stream): qcoll's host calls. Device
/// memory: qcoll's device_stream calls, ordered on `stream` (a cudaStream_t on CUDA
/// device `device`, which holds every tensor of the call): they run after the work
/// queued on it before them, return on the host once the result is in place, and
/// make the stream wait for it.
struct placement {
  std::optional<qcoll::execution::device_stream> stream;
  int device = -1;
  bool on_device() const noexcept { return stream.has_value(); }
};

/// Collective calls on tensors, for one rank of one group. Not thread-safe: one
/// thread (the backend's worker) calls it at a time. Errors are qcoll::error, naming
/// the call, this rank and the failed peer.
class group {
 public:
  virtual ~group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transport_name() const = 0;

  // Every tensor of a call is dense and lives where `where` says.
  virtual void allreduce(at::Tensor& tensor, qcoll::reduce_op op, const placement& where) = 0;
  virtual void broadcast(at::Tensor& tensor, int root, const placement& where) = 0;
  virtual void all_gather(const at::Tensor& in, at::Tensor& out, const placement& where) = 0;
  virtual void reduce_scatter(const at::Tensor& in, at::Tensor& out, qcoll::reduce_op op, const placement& where) = 0;
  /// On device memory: no rank returns before every rank's work queued on its stream
  /// before the call has run.
  virtual void barrier(const placement& where) = 0;
  virtual void send(const at::Tensor& tensor, int to, const placement& where) = 0;
  virtual void recv(at::Tensor& tensor, int from, const placement& where) = 0;
  /// The compressed allreduce of `tensor` (sum or avg) through the plan kept under
  /// `key` (a DDP bucket's index): made at the first call, or again when the
  /// tensor's size changes (DDP rebuilt its buckets), residuals starting at zero. A
  /// CUDA tensor goes through a plan on device memory (its residuals on the tensor's
  /// GPU), kept apart from the host plans and made anew when the device changes.
  virtual void compressed_allreduce(std::int64_t key, at::Tensor& tensor, qcoll::reduce_op op,
                                    const compression& settings, const placement& where) = 0;
  /// Bytes this rank's transport has sent so far.
  virtual std::uint64_t bytes_sent() = 0;
  virtual void abort(const std::string& reason) = 0;
};

/// The reproducible sum (or mean) of `addends` (CPU tensors of one floating-point dtype
/// and one size, contiguous) on this process alone: the bits a group with
/// reproducible=True gives when its ranks hold these tensors, whichever rank holds which.
at::Tensor reproducible_sum(const std::vector<at::Tensor>& addends, qcoll::reduce_op op);

/// Throws qcoll::error (invalid_argument), naming the value, for settings the
/// quantizer refuses: an unknown name, k_level bits outside 1…8, bfp mantissa bits
/// outside 2…16 and 32, a group size that is not a multiple of 8 in range
/// (each quantizer's from_spec, quantizers/by_name.hpp).
void check(const compression& settings);

/// Joins the group of `size` ranks through `store` (collective: every rank calls it).
std::unique_ptr<group> join_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                  const group_settings& settings);

/// The transport named in QCOLL_TRANSPORT (auto when unset).
qcoll::rendezvous::transport_kind transport_from_environment();

}  // namespace qcoll_torch
