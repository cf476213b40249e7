#pragma once
/// @file
/// join for a program on GPUs: `fn` takes the host transports join gives, or — the job
/// says QCOLL_TRANSPORT=cuda_peer (`qcoll-run --transport cuda_peer`) — a
/// transports::cuda_peer::transport over shm, each rank on device LOCAL_RANK mod the
/// devices it sees (as torchrun's and Open MPI's users expect; narrow what a rank sees
/// with CUDA_VISIBLE_DEVICES, or set join_options::cuda_peer.device). Its device calls
/// then move GPU memory GPU to GPU, and its host calls are refused (docs/transports.md).
/// A header of its own, so that only such programs compile the transport and `fn` for it.
///
///     qcoll::launch::join_devices_from_environment([](auto transport) {  // shm, tcp or cuda_peer
///       qcoll::communicator comm(std::move(transport));
///       comm.allreduce(qcoll::execution::device_stream{stream}, gradients, qcoll::reduce_op::avg);
///       return 0;
///     });

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/transports/cuda_peer.hpp>

#include <utility>

namespace qcoll::launch {

namespace detail {

/// join_with's Devices for join_devices: the CUDA peer transport over `control`, on
/// LOCAL_RANK mod the devices unless the options name one.
struct device_transports {
  template <class Control>
  static transports::cuda_peer::transport<Control> join(const rendezvous::job& j, Control control,
                                                        transports::cuda_peer::options settings) {
    const device::runtime& runtime = execution::device_runtime("QCOLL_TRANSPORT=cuda_peer");
    if (settings.device < 0) {
      int devices = 0;
      execution::check_device(runtime, runtime.device_count(&devices), "counting the devices");
      if (devices < 1) qcoll::detail::throw_error(errc::invalid_argument, "qcoll rank {}: cuda_peer: no device", j.rank);
      settings.device = static_cast<int>(j.local_rank % static_cast<rank_t>(devices));
    }
    execution::check_device(runtime, runtime.set_device(settings.device), "choosing the rank's device");
    return transports::cuda_peer::transport<Control>(std::move(control), settings);
  }
};

}  // namespace detail

/// join, whose fn(transport) also takes the CUDA peer transport. Collective; errors as
/// join's, and the device's.
template <class Fn>
decltype(auto) join_devices(const rendezvous::job& j, Fn&& fn, const join_options& opts = {}) {
  return detail::join_with<detail::device_transports>(j, nullptr, {}, std::forward<Fn>(fn), opts);
}

/// join_devices(job_from_environment(), fn, opts).
template <class Fn>
decltype(auto) join_devices_from_environment(Fn&& fn, const join_options& opts = {}) {
  return join_devices(rendezvous::job_from_environment(), std::forward<Fn>(fn), opts);
}

}  // namespace qcoll::launch
