// A qcoll communicator joined through PyTorch's store, behind group.hpp's interface.

#include "group.hpp"

#include <qcoll/detail/format.hpp>

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

/// Calls fn(quantizer) with the quantizer `settings` name, made from them; `rank` seeds
/// k_level's stochastic rounding (independent per rank). Settings a quantizer refuses
/// are refused here with the value given (k_level's bits are checked before they become
/// levels, so "bits=9" is named, not the levels it would overflow to).
template <class Fn>
void with_quantizer(const compression& settings, int rank, Fn&& fn) {
  namespace q = qcoll::quantizers;
  if (settings.quantizer == "one_bit") {
    fn(q::one_bit({.group_size = settings.group_size}));
  } else if (settings.quantizer == "k_level") {
    if (settings.bits < 1 || settings.bits > 8)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll: k_level takes bits from 1 to 8 (2 to 256 levels), not bits={}", settings.bits);
    q::k_level_options o = q::k_level_options::with_bits(settings.bits);
    o.group_size = settings.group_size;
    o.seed = static_cast<std::uint64_t>(rank) + 1;
    fn(q::k_level(o));
  } else if (settings.quantizer == "bfp") {
    fn(q::bfp({.mantissa_bits = settings.bits, .block_size = settings.group_size}));
  } else if (settings.quantizer == "identity") {
    fn(q::identity<float>());
  } else {
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll: unknown quantizer '{}' (one_bit, k_level, bfp, identity)",
                               settings.quantizer);
  }
}

/// The span of `tensor`'s values as T (the caller has checked the type).
template <class T>
std::span<const T> values_of(const at::Tensor& tensor) {
  return {reinterpret_cast<const T*>(tensor.data_ptr()), static_cast<std::size_t>(tensor.numel())};
}

template <class Transport>
class group_over final : public group {
 public:
  group_over(Transport transport, std::chrono::milliseconds timeout, const char* name)
      : comm_(std::move(transport), qcoll::communicator_options{.timeout = timeout}), name_(name) {}

  int rank() const override { return static_cast<int>(comm_.rank()); }
  int size() const override { return static_cast<int>(comm_.size()); }
  const char* transport_name() const override { return name_; }

  // Each call: qcoll's host form, or its device_stream form on the placement's stream.
  void allreduce(at::Tensor& tensor, qcoll::reduce_op op, const placement& where) override {
    with_span(tensor, [&](auto data) {
      if (where.on_device()) comm_.allreduce(*where.stream, data, op);
      else comm_.allreduce(data, op);
    });
  }
  void broadcast(at::Tensor& tensor, int root, const placement& where) override {
    with_span(tensor, [&](auto data) {
      const auto from = static_cast<qcoll::rank_t>(root);
      if (where.on_device()) comm_.broadcast(*where.stream, data, from);
      else comm_.broadcast(data, from);
    });
  }
  void all_gather(const at::Tensor& in, at::Tensor& out, const placement& where) override {
    with_span(out, [&](auto all) {
      const auto mine = values_of<typename decltype(all)::element_type>(in);
      if (where.on_device()) comm_.all_gather(*where.stream, mine, all);
      else comm_.all_gather(mine, all);
    });
  }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, qcoll::reduce_op op, const placement& where) override {
    with_span(out, [&](auto mine) {
      const auto all = values_of<typename decltype(mine)::element_type>(in);
      if (where.on_device()) comm_.reduce_scatter(*where.stream, all, mine, op);
      else comm_.reduce_scatter(all, mine, op);
    });
  }
  void barrier(const placement& where) override {
    if (where.on_device()) comm_.barrier(*where.stream);
    else comm_.barrier();
  }
  void send(const at::Tensor& tensor, int to, const placement& where) override {
    with_span(tensor, [&](auto data) {
      using T = typename decltype(data)::element_type;
      const auto peer = static_cast<qcoll::rank_t>(to);
      if (where.on_device()) comm_.send(*where.stream, std::span<const T>(data), peer);
      else comm_.send(std::span<const T>(data), peer);
    });
  }
  void recv(at::Tensor& tensor, int from, const placement& where) override {
    with_span(tensor, [&](auto data) {
      const auto peer = static_cast<qcoll::rank_t>(from);
      if (where.on_device()) comm_.recv(*where.stream, data, peer);
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
          run<Q, T>(plans_for<Q>(), key, data, op, settings, where, quantizer);
        });
      }
    });
  }

  std::uint64_t bytes_sent() override { return comm_.transport().bytes_written(); }

  void abort(const std::string& reason) override { comm_.abort(reason); }

 private:
  template <class Q, class T, class Plans>
  void run(Plans& plans, std::int64_t key, std::span<T> data, qcoll::reduce_op op, const compression& settings,
           const placement& where, const Q& quantizer) {
    auto& kept = std::get<plans_of<Q, T>>(plans);
    if (where.on_device()) {
      // A plan on device memory: made on the placement's stream (its state on that
      // stream's GPU), encoding and decoding there; only frames cross to the host.
      auto& [plan, device] = kept.on_device_by_key[key];
      if (!plan || plan->count() != data.size() || device != where.device) {
        plan.reset();  // the old plan's device memory goes before the new plan's is taken
        plan = std::make_unique<typename plans_of<Q, T>::device_plan>(*where.stream, comm_, data.size(), quantizer);
        device = where.device;
      }
      if (!settings.error_feedback) plan->reset_residuals();
      comm_.allreduce(*where.stream, *plan, data, op);
      return;
    }
    auto& plan = kept.by_key[key];
    if (!plan || plan->count() != data.size())
      plan = std::make_unique<typename plans_of<Q, T>::host_plan>(comm_, data.size(), quantizer);
    if (!settings.error_feedback) plan->reset_residuals();
    comm_.allreduce(*plan, data, op);
  }

  template <class Q>
  auto& plans_for() {
    namespace q = qcoll::quantizers;
    if constexpr (std::is_same_v<Q, q::one_bit>) return one_bits_;
    else if constexpr (std::is_same_v<Q, q::k_level>) return k_levels_;
    else if constexpr (std::is_same_v<Q, q::bfp>) return bfps_;
    else return identities_;
  }

  qcoll::communicator<Transport> comm_;
  const char* name_;
  std::tuple<plans_of<qcoll::quantizers::one_bit, float>, plans_of<qcoll::quantizers::one_bit, qcoll::bfloat16>,
             plans_of<qcoll::quantizers::one_bit, qcoll::float16>>
      one_bits_;
  std::tuple<plans_of<qcoll::quantizers::k_level, float>, plans_of<qcoll::quantizers::k_level, qcoll::bfloat16>,
             plans_of<qcoll::quantizers::k_level, qcoll::float16>>
      k_levels_;
  std::tuple<plans_of<qcoll::quantizers::bfp, float>, plans_of<qcoll::quantizers::bfp, qcoll::bfloat16>,
             plans_of<qcoll::quantizers::bfp, qcoll::float16>>
      bfps_;
  std::tuple<plans_of<qcoll::quantizers::identity<float>, float>,
             plans_of<qcoll::quantizers::identity<float>, qcoll::bfloat16>,
             plans_of<qcoll::quantizers::identity<float>, qcoll::float16>>
      identities_;
};

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace

void check(const compression& settings) {
  with_quantizer(settings, 0, [](const auto&) {});
}

qcoll::rendezvous::transport_kind transport_from_environment() {
  const char* value = std::getenv("QCOLL_TRANSPORT");
  const std::string_view name = value ? value : "";
  if (name.empty() || name == "auto") return qcoll::rendezvous::transport_kind::automatic;
  if (name == "shm") return qcoll::rendezvous::transport_kind::shm;
  if (name == "tcp") return qcoll::rendezvous::transport_kind::tcp;
  qcoll::detail::throw_error(errc::invalid_argument, "qcoll: QCOLL_TRANSPORT={} is not one of shm, tcp, auto", name);
}

std::unique_ptr<group> join_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                  const group_settings& settings) {
  torch_store rendezvous(std::move(store));
  qcoll::rendezvous::job job;
  job.rank = static_cast<qcoll::rank_t>(rank);
  job.size = static_cast<qcoll::rank_t>(size);
  job.transport = settings.transport;
  job.timeout = settings.timeout;
  job.launcher = "torch";
  if (const char* secret = std::getenv("QCOLL_SECRET"); secret && *secret) job.secret = secret;
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

  const qcoll::rendezvous::transport_kind kind = qcoll::launch::agree_on_transport(job, rendezvous, until);
  std::unique_ptr<group> joined;
  if (kind == qcoll::rendezvous::transport_kind::shm)
    joined = std::make_unique<group_over<qcoll::transports::shm::transport>>(
        qcoll::transports::shm::transport::join(job, rendezvous), settings.timeout, "shm");
  else
    joined = std::make_unique<group_over<qcoll::transports::tcp::transport>>(
        qcoll::transports::tcp::transport::join(job, rendezvous), settings.timeout, "tcp");
  // Every rank through the join before any leaves: the last reads of the store are done.
  rendezvous.set(qcoll::detail::format("qcoll/joined/{}", rank), "1");
  rendezvous.wait_all("qcoll/joined/", job.size, until);
  return joined;
}

}  // namespace qcoll_torch
