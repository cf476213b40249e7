// A qcoll communicator joined through PyTorch's store, behind group.hpp's interface.

#include "group.hpp"

#include <qcoll/detail/format.hpp>
#include <qcoll/detail/log.hpp>

// A build with CUDA also moves CUDA tensors GPU to GPU between the ranks of one host,
// over the CUDA peer transport (docs/pytorch.md, "CUDA tensors").
#ifndef QCOLL_TORCH_NO_CUDA_REASON
#define QCOLL_TORCH_CUDA_PEER 1
#include <qcoll/transports/cuda_peer.hpp>
#include <qcoll/transports/reference.hpp>
#endif

#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace qcoll_torch {

namespace {

using qcoll::errc;

/// Calls fn(span) with the tensor's storage as a span of its qcoll element type.
template <class Fn>
decltype(auto) with_span(const at::Tensor& tensor, Fn&& fn) {
  const std::size_t n = static_cast<std::size_t>(tensor.numel());
  switch (tensor.scalar_type()) {
    case at::kFloat: return fn(std::span<float>(tensor.data_ptr<float>(), n));
    case at::kDouble: return fn(std::span<double>(tensor.data_ptr<double>(), n));
    case at::kBFloat16:
      return fn(std::span<qcoll::bfloat16>(reinterpret_cast<qcoll::bfloat16*>(tensor.data_ptr<at::BFloat16>()), n));
    case at::kHalf:
      return fn(std::span<qcoll::float16>(reinterpret_cast<qcoll::float16*>(tensor.data_ptr<at::Half>()), n));
    default:
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll: tensors of {} are not supported (float32, float64, bfloat16, float16)",
                                 std::string(c10::toString(tensor.scalar_type())));
  }
}

/// The plans of one quantizer, kept per key; T the tensor's element type. CUDA tensors
/// go through plans on device memory (their residuals and frames on the GPU), kept
/// apart: a key names a DDP bucket, whose gradients stay on one device.
template <class Q, class T>
struct plans_of {
  using host_plan = qcoll::compressed_allreduce_plan<Q, T>;
  using device_plan = qcoll::compressed_allreduce_plan<Q, T, qcoll::execution::device_space>;
  struct on_device {
    std::unique_ptr<device_plan> plan;
    int device = -1;  // the CUDA device that holds its state
  };
  std::map<std::int64_t, std::unique_ptr<host_plan>> by_key;
  std::map<std::int64_t, on_device> on_device_by_key;
};

/// A quantizer's plans for each gradient type the hook takes.
template <class Q>
using plans_per_type = std::tuple<plans_of<Q, float>, plans_of<Q, qcoll::bfloat16>, plans_of<Q, qcoll::float16>>;

/// Calls fn(quantizer) with the quantizer the hook's settings name, from qcoll's list
/// (quantizers/by_name.hpp); `rank` seeds k_level's stochastic rounding (independent
/// per rank). The hook's bits and group_size have a default for every quantizer, so a
/// quantizer gets only those it reads.
template <class Fn>
void with_quantizer(const compression& settings, int rank, Fn&& fn) {
  namespace q = qcoll::quantizers;
  const q::quantizer_spec spec = q::only_what_it_reads(
      {.name = settings.quantizer, .bits = settings.bits, .group = settings.group_size,
       .seed = static_cast<std::uint64_t>(rank) + 1});
  q::with_quantizer(spec, std::forward<Fn>(fn));
}

/// The span of `tensor`'s values as T (the caller has checked the type).
template <class T>
std::span<const T> values_of(const at::Tensor& tensor) {
  return {reinterpret_cast<const T*>(tensor.data_ptr()), static_cast<std::size_t>(tensor.numel())};
}

template <class Transport>
class group_over final : public group {
 public:
  group_over(Transport transport, std::chrono::milliseconds timeout, const char* name, peer_policy peers,
             bool reproducible)
      : comm_(std::move(transport), qcoll::communicator_options{.timeout = timeout}), name_(name),
        peer_policy_(peers), reproducible_(reproducible) {}

  int rank() const override { return static_cast<int>(comm_.rank()); }
  int size() const override { return static_cast<int>(comm_.size()); }
  const char* transport_name() const override { return name_; }

  // Each call: qcoll's host form, or its device_stream form on the placement's stream.
  void allreduce(at::Tensor& tensor, qcoll::reduce_op op, const placement& where) override {
    if (reproducible_ && (op == qcoll::reduce_op::sum || op == qcoll::reduce_op::avg)) {
      return with_span(tensor, [&](auto data) {
        if (!where.on_device()) return qcoll::reproducible_allreduce(comm_, data, op);
        on_device(where, true, [&](auto& comm) { qcoll::reproducible_allreduce(comm, *where.stream, data, op); });
      });
    }
    with_span(tensor, [&](auto data) {
      if (where.on_device()) on_device(where, true, [&](auto& comm) { comm.allreduce(*where.stream, data, op); });
      else comm_.allreduce(data, op);
    });
  }
  void broadcast(at::Tensor& tensor, int root, const placement& where) override {
    with_span(tensor, [&](auto data) {
      const auto from = static_cast<qcoll::rank_t>(root);
      if (where.on_device()) on_device(where, true, [&](auto& comm) { comm.broadcast(*where.stream, data, from); });
      else comm_.broadcast(data, from);
    });
  }
  void all_gather(const at::Tensor& in, at::Tensor& out, const placement& where) override {
    with_span(out, [&](auto all) {
      const auto mine = values_of<typename decltype(all)::element_type>(in);
      if (where.on_device()) on_device(where, true, [&](auto& comm) { comm.all_gather(*where.stream, mine, all); });
      else comm_.all_gather(mine, all);
    });
  }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, qcoll::reduce_op op, const placement& where) override {
    if (reproducible_ && (op == qcoll::reduce_op::sum || op == qcoll::reduce_op::avg)) {
      return with_span(out, [&](auto mine) {
        const auto all = values_of<typename decltype(mine)::element_type>(in);
        if (!where.on_device()) return qcoll::reproducible_reduce_scatter(comm_, all, mine, op);
        on_device(where, true,
                  [&](auto& comm) { qcoll::reproducible_reduce_scatter(comm, *where.stream, all, mine, op); });
      });
    }
    with_span(out, [&](auto mine) {
      const auto all = values_of<typename decltype(mine)::element_type>(in);
      if (where.on_device())
        on_device(where, true, [&](auto& comm) { comm.reduce_scatter(*where.stream, all, mine, op); });
      else comm_.reduce_scatter(all, mine, op);
    });
  }
  void barrier(const placement& where) override {
    if (where.on_device()) on_device(where, true, [&](auto& comm) { comm.barrier(*where.stream); });
    else comm_.barrier();
  }
  void send(const at::Tensor& tensor, int to, const placement& where) override {
    with_span(tensor, [&](auto data) {
      using T = typename decltype(data)::element_type;
      const auto peer = static_cast<qcoll::rank_t>(to);
      if (where.on_device())
        on_device(where, false, [&](auto& comm) { comm.send(*where.stream, std::span<const T>(data), peer); });
      else comm_.send(std::span<const T>(data), peer);
    });
  }
  void recv(at::Tensor& tensor, int from, const placement& where) override {
    with_span(tensor, [&](auto data) {
      const auto peer = static_cast<qcoll::rank_t>(from);
      if (where.on_device()) on_device(where, false, [&](auto& comm) { comm.recv(*where.stream, data, peer); });
      else comm_.recv(data, peer);
    });
  }

  void compressed_allreduce(std::int64_t key, at::Tensor& tensor, qcoll::reduce_op op, const compression& settings,
                            const placement& where) override {
    with_span(tensor, [&](auto data) {
      using T = typename decltype(data)::element_type;
      if constexpr (std::is_same_v<T, double>) {
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "qcoll: the compressed allreduce takes float32, bfloat16 or float16 gradients, "
                                   "not float64");
      } else {
        with_quantizer(settings, rank(), [&]<class Q>(const Q& quantizer) {
          run<Q, T>(std::get<plans_per_type<Q>>(plans_), key, data, op, settings, where, quantizer);
        });
      }
    });
  }

  std::uint64_t bytes_sent() override { return comm_.transport().bytes_written(); }

  void abort(const std::string& reason) override {
#ifdef QCOLL_TORCH_CUDA_PEER
    if (peers_ && !peers_->aborted()) peers_->abort(reason);
#endif
    comm_.abort(reason);
  }

 private:
  /// fn(communicator) for a call on CUDA tensors: the CUDA peer communicator where the
  /// group has one on the call's device (the tensors then move GPU to GPU), else the
  /// group's own (staged through pinned host memory). `collective`: every rank makes
  /// this call, so the CUDA peer transport may start here (its connect is collective).
  template <class Fn>
  void on_device(const placement& where, bool collective, Fn&& fn) {
#ifdef QCOLL_TORCH_CUDA_PEER
    if (auto* peers = peers_for(where, collective)) return fn(*peers);
#else
    (void)collective;
#endif
    fn(comm_);
  }

#ifdef QCOLL_TORCH_CUDA_PEER
  using peer_transport = qcoll::transports::cuda_peer::transport<qcoll::transports::reference<Transport>>;
  using peer_communicator = qcoll::communicator<peer_transport>;

  /// The CUDA peer communicator for a call on `where`, started at the first collective
  /// call on CUDA tensors, on that call's device, with the group's transport as its
  /// control; null where the policy or the device says staged. Under `automatic` a
  /// transport that cannot start (every rank fails alike: a window no peer can open)
  /// leaves the group staged, saying why once; under `required` it fails the call.
  peer_communicator* peers_for(const placement& where, bool collective) {
    if (peer_policy_ == peer_policy::never) return nullptr;
    if (!peers_tried_ && collective) {
      peers_tried_ = true;
      try {
        auto settings = qcoll::transports::cuda_peer::options::from_environment();
        settings.device = where.device;
        settings.timeout = comm_.options().timeout;
        peers_.emplace(peer_transport(qcoll::transports::reference<Transport>(comm_.transport()), settings),
                       comm_.options());
        peers_device_ = where.device;
      } catch (const qcoll::error& e) {
        if (peer_policy_ == peer_policy::required) throw;
        qcoll::detail::log_warning("qcoll: rank {}: CUDA tensors go through host memory: the CUDA peer transport "
                                   "did not start: {}",
                                   rank(), e.what());
      }
    }
    if (peers_ && where.device == peers_device_) return &*peers_;
    if (peer_policy_ == peer_policy::required) {
      if (peers_)
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "qcoll rank {}: QCOLL_TRANSPORT=cuda_peer started on cuda:{}; this call's tensors "
                                   "are on cuda:{} (one device per rank)",
                                   rank(), peers_device_, where.device);
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll rank {}: QCOLL_TRANSPORT=cuda_peer starts at the group's first collective "
                                 "on CUDA tensors (every rank makes it); this send or recv came first",
                                 rank());
    }
    return nullptr;
  }
#endif

  static qcoll::compressed_allreduce_options options_of(const compression& settings) {
    qcoll::compressed_allreduce_options options;
    options.reproducible = settings.reproducible;
    return options;
  }

  template <class Q, class T, class Plans>
  void run(Plans& plans, std::int64_t key, std::span<T> data, qcoll::reduce_op op, const compression& settings,
           const placement& where, const Q& quantizer) {
    auto& kept = std::get<plans_of<Q, T>>(plans);
    if (where.on_device()) {
      // A plan on device memory: made on the placement's stream (its state on that
      // stream's GPU), encoding and decoding there; only frames cross to the host.
      auto& [plan, device] = kept.on_device_by_key[key];
      if (!plan || plan->count() != data.size() || device != where.device ||
          plan->reproducible() != settings.reproducible) {
        plan.reset();  // the old plan's device memory goes before the new plan's is taken
        plan = std::make_unique<typename plans_of<Q, T>::device_plan>(*where.stream, comm_, data.size(), quantizer,
                                                                      options_of(settings));
        device = where.device;
      }
      if (!settings.error_feedback) plan->reset_residuals();
      comm_.allreduce(*where.stream, *plan, data, op);
      return;
    }
    auto& plan = kept.by_key[key];
    if (!plan || plan->count() != data.size() || plan->reproducible() != settings.reproducible)
      plan = std::make_unique<typename plans_of<Q, T>::host_plan>(comm_, data.size(), quantizer, options_of(settings));
    if (!settings.error_feedback) plan->reset_residuals();
    comm_.allreduce(*plan, data, op);
  }

  qcoll::communicator<Transport> comm_;
  const char* name_;
  qcoll::quantizers::each_quantizer<plans_per_type> plans_;  // one tuple of plans per listed quantizer
  peer_policy peer_policy_;
  bool reproducible_;
#ifdef QCOLL_TORCH_CUDA_PEER
  std::optional<peer_communicator> peers_;  // after comm_: it goes first, its control still there
  bool peers_tried_ = false;
  int peers_device_ = -1;
#endif
};

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace

at::Tensor reproducible_sum(const std::vector<at::Tensor>& addends, qcoll::reduce_op op) {
  if (addends.empty()) qcoll::detail::throw_error(errc::invalid_argument, "qcoll: reproducible_sum of no tensors");
  const at::Tensor& first = addends.front();
  for (const at::Tensor& t : addends)
    if (!t.device().is_cpu() || !t.is_contiguous() || t.scalar_type() != first.scalar_type() ||
        t.numel() != first.numel())
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll: reproducible_sum takes contiguous CPU tensors of one dtype and size");
  at::Tensor out = at::empty_like(first);
  with_span(out, [&](auto result) {
    using T = typename decltype(result)::element_type;
    qcoll::reproducible_accumulator<T> sum(result.size());
    for (const at::Tensor& t : addends) sum.add(values_of<T>(t));
    sum.sum(result, op);
  });
  return out;
}

void check(const compression& settings) {
  with_quantizer(settings, 0, [](const auto&) {});
}

qcoll::rendezvous::transport_kind transport_from_environment() {
  const char* value = std::getenv("QCOLL_TRANSPORT");
  const std::string_view name = value ? value : "";
  if (name.empty()) return qcoll::rendezvous::transport_kind::automatic;
  if (const auto kind = qcoll::rendezvous::parse_transport(name)) return *kind;
  qcoll::detail::throw_error(errc::invalid_argument, "qcoll: QCOLL_TRANSPORT={} is not one of {}", name,
                             qcoll::rendezvous::transport_names());
}

std::unique_ptr<group> join_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                  const group_settings& settings) {
  torch_store rendezvous(std::move(store));
  qcoll::rendezvous::job job;
  job.rank = static_cast<qcoll::rank_t>(rank);
  job.size = static_cast<qcoll::rank_t>(size);
  // QCOLL_TRANSPORT=cuda_peer: shm, and CUDA tensors over the CUDA peer transport on
  // top of it (required); auto: the same when shm is chosen, staged if it cannot start.
  job.transport = settings.transport == qcoll::rendezvous::transport_kind::cuda_peer
                      ? qcoll::rendezvous::transport_kind::shm
                      : settings.transport;
  job.timeout = settings.timeout;
  job.launcher = "torch";
  if (const char* secret = std::getenv("QCOLL_SECRET"); secret && *secret) job.secret = secret;
  qcoll::rendezvous::detail::read_tls([](const char* name) -> const char* { return std::getenv(name); }, job);
  if (const char* bind = std::getenv("QCOLL_BIND"); bind && *bind) job.bind_address = bind;
  const qcoll::deadline until = qcoll::clock::now() + settings.timeout;

  // The group's identity on this host (shm segment names): rank 0's random number.
  if (rank == 0) {
    std::random_device entropy;
    rendezvous.set("qcoll/job", qcoll::detail::format("torch-{:08x}{:08x}", entropy(), entropy()));
  }
  job.job_id = rendezvous.get("qcoll/job", until);
  // Which ranks share this host: each names its host, every rank reads them all.
  const std::string here = host_name();
  rendezvous.set(qcoll::detail::format("qcoll/host/{}", rank), here);
  rendezvous.wait_all("qcoll/host/", job.size, until);
  job.local_size = 0;
  for (int r = 0; r < size; ++r)
    if (rendezvous.get(qcoll::detail::format("qcoll/host/{}", r), until) == here) {
      if (r == rank) job.local_rank = job.local_size;
      ++job.local_size;
    }

  // qcoll's join over PyTorch's store: the ranks agree on the transport, join it, and
  // are all through with the store before any returns.
  if (settings.transport == qcoll::rendezvous::transport_kind::cuda_peer && !job.all_local())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll rank {}: QCOLL_TRANSPORT=cuda_peer needs every rank of the group on one host, "
                               "but {} of {} are on this one; use auto or tcp",
                               rank, job.local_size, size);
  return qcoll::launch::join_through(job, rendezvous, [&](auto transport) -> std::unique_ptr<group> {
    const bool shm = transport.kind() == qcoll::rendezvous::transport_kind::shm;
    const peer_policy peers = settings.transport == qcoll::rendezvous::transport_kind::cuda_peer ? peer_policy::required
                              : settings.transport == qcoll::rendezvous::transport_kind::automatic && shm
                                  ? peer_policy::automatic
                                  : peer_policy::never;
    const std::string_view name =
        peers == peer_policy::required ? "cuda_peer" : qcoll::rendezvous::to_string(transport.kind());
    return std::make_unique<group_over<decltype(transport)>>(std::move(transport), settings.timeout, name.data(),
                                                             peers, settings.reproducible);
  });
}

}  // namespace qcoll_torch
