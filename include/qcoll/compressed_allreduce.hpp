#pragma once
/// @file
/// compressed_allreduce_plan<Quantizer>: the caller-owned state of a compressed
/// allreduce over one gradient buffer — its worker and server residuals (error
/// feedback), its frame buffers and its layout — and the handle of a call started
/// without waiting. A communicator runs it:
///
/// @code
/// qcoll::compressed_allreduce_plan plan(comm, gradients.size(), qcoll::quantizers::one_bit{});
/// comm.allreduce(plan, std::span(gradients), qcoll::reduce_op::avg);        // blocking
/// comm.start_allreduce(plan, std::span(gradients), qcoll::reduce_op::avg);  // or not:
/// compute_next_minibatch();
/// plan.wait();
///
/// // Many tensors (one per layer) in one call, each reduced where it lies:
/// std::vector<std::span<float>> layers = …;
/// qcoll::compressed_allreduce_plan fused(comm, qcoll::sizes_of(layers), qcoll::quantizers::one_bit{});
/// comm.allreduce(fused, std::span<const std::span<float>>(layers), qcoll::reduce_op::avg);
/// @endcode
///
/// docs/compressed-allreduce.md explains the algorithm, the bytes it sends and what
/// it guarantees.

#include <qcoll/algorithms/compressed_allreduce.hpp>
#include <qcoll/core/archetypes.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/optimizers/owner_update.hpp>
#include <qcoll/plan.hpp>
#include <qcoll/quantizers/identity.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace qcoll {

struct compressed_allreduce_options {
  /// Values per pipelined chunk, rounded up to whole quantizer groups. Each chunk is
  /// a frame of its own (24 bytes of header), encoded, sent and decoded while the
  /// next one moves. `automatic` (0, the default): host_chunk_values for a plan on host
  /// memory, device_chunk_values for one on device memory.
  std::size_t chunk_values = automatic;
  static constexpr std::size_t automatic = 0;
  // 256 Ki values (1 MiB of float32), from `collective_bench --job --compressed one_bit
  // --chunk 4K,…,1M,whole -b 64M` with 4 ranks in benchmarks/netlab at 1 Gbit/s (2 vCPU
  // EPYC): 128 Ki–1 Mi is a plateau (median 9.7–10.7× the exact allreduce over 4 runs;
  // 64 Ki 8.2×, 4 Ki 1.9×, one chunk per stripe 9.3×); loopback is flat from 64 Ki to
  // 1 Mi. 256 Ki still gives 4 chunks per stripe at 16 MiB. docs/compressed-performance.md.
  static constexpr std::size_t host_chunk_values = std::size_t{1} << 18;
  // 4 Mi values on a GPU: every chunk costs the device a few launches and a host round
  // trip (~15 µs on an H200), which a GPU's kernels do not hide the way a CPU's encode
  // time does. 2 processes on one H200 (MPS), 64 MiB, one_bit: 256 Ki 8.7 GB/s (3.8× the
  // exact allreduce), 1 Mi 24.8, 4 Mi 45.9, one chunk per stripe 48.1 (docs/gpu.md).
  // Encoding 4 Mi values takes ~40 µs there, sending their 1-bit frame 4 ms at 1 Gbit/s:
  // pipelining finer gains nothing even where the network is slow.
  static constexpr std::size_t device_chunk_values = std::size_t{1} << 22;
  /// Each stripe's owner sums the decoded contributions on a shared grid
  /// (docs/reproducibility.md) instead of adding them in arrival order: the result is
  /// then the same bits whatever the route (direct or any ring), the transport, the
  /// chunking and the ranks' order. Costs the owner (n − 1) scratch copies of its
  /// stripe's values and the grid's conversions; chunks become whole grid blocks (a
  /// multiple of reproducible_block values too). Every rank's plan must agree (a rank
  /// whose plan does not fails the call on every rank). See Reproducible sums below.
  bool reproducible = false;
};

/// The sizes of `tensors`, for a fused plan over them.
template <class T>
std::vector<std::size_t> sizes_of(std::span<const std::span<T>> tensors) {
  std::vector<std::size_t> sizes;
  sizes.reserve(tensors.size());
  for (const std::span<T>& t : tensors) sizes.push_back(t.size());
  return sizes;
}
template <class T>
std::vector<std::size_t> sizes_of(const std::vector<std::span<T>>& tensors) {
  return sizes_of(std::span<const std::span<T>>(tensors));
}

/// State and handle of a compressed allreduce of `count` values on one rank.
///
/// @par Fused plans
/// A plan made for a list of tensor sizes reduces that many tensors (say, one per
/// layer) in one call, comm.allreduce(plan, tensors, op), in place: the stripes are
/// laid across the tensors end to end, each chunk is one message, and a chunk is cut
/// where a tensor ends into pieces encoded and decoded where they lie — no staging
/// copy. count() is the total; residuals, stripes and offsets refer to the tensors
/// end to end, and a flat buffer of count() values is taken too (the same result).
/// The guarantees are those of a single buffer.
///
/// @par The owner's update rule
/// With an owner_update (optimizers::momentum, optimizers::adagrad, or any rule),
/// each stripe's owner applies it to the summed (avg: averaged) gradient of its
/// stripe before re-encoding it, and every rank gets the rule's output (say, the
/// momentum velocity) instead of the gradient. Its state lives only at the owner,
/// for its stripe (owner_state()), and is committed and rolled back with the residuals.
///
/// @par Element types
/// T is Q's own type, or bfloat16 or float16 for a quantizer that works in float:
/// the call widens the input, runs the float plan on it and rounds the result once,
/// so every rank gets the same bits — the float plan's on the widened inputs, rounded
/// once — and residuals stay float (residual_type). plan_handle says more.
///
/// @par Residuals
/// The worker residual holds this rank's quantization error for every value; the
/// server residual holds the error of re-encoding the sums of the stripe this rank
/// owns. Both start at zero and persist from call to call. A call that fails leaves
/// both exactly as they were (and the stochastic-rounding sequence too), so it can
/// be repeated on a new communicator without losing gradient mass; a rank whose
/// call succeeded while another's failed can roll_back_last_call() to join the retry.
///
/// @par Reproducible sums
/// With options.reproducible, what every rank decodes is a function of the multiset of
/// the ranks' decoded contributions, summed on a grid of one power of two per block of
/// reproducible_block values (from each stripe's start, cut where a tensor ends), so it
/// does not depend on the route, transport, chunk size or which rank holds which
/// addends (stochastic rounding is keyed by seed and value, not rank: give every rank the
/// same seed). It does depend on the
/// number of ranks: each rank encodes its own partial sum with its own residual, so 8
/// ranks holding 8 micro-batches each encode differently from 64 ranks holding one (the
/// exact reproducible sums, qcoll/reproducible.hpp, do not). The grid rounds each decoded
/// contribution to 2^(e − 30) (e: its block's largest exponent); that rounding is not fed
/// back into a residual — it is below the quantizer's own error by far.
///
/// @par Thread safety
/// A plan is used by one thread at a time, and by one call at a time: starting a
/// plan that is in flight is an error. Different plans may be in flight together on
/// one communicator; they run in the order they were started.
template <quantizer Q, plan_element<Q> T = typename Q::value_type,
          execution::memory_space_tag Space = execution::host_space>
class compressed_allreduce_plan : public plan_handle<Q, T, Space> {
  using base = plan_handle<Q, T, Space>;
  using base::state_;

 public:
  using quantizer_type = Q;
  using value_type = T;
  using residual_type = typename Q::value_type;
  static constexpr collective collective_kind = collective::compressed_allreduce;

  /// A plan for this rank of `comm`: its route follows the communicator's topology
  /// (direct when every pair of ranks is linked, otherwise along its ring).
  template <class Communicator>
  compressed_allreduce_plan(const Communicator& comm, std::size_t count, Q quantizer = Q{},
                            compressed_allreduce_options options = {}, owner_update<residual_type> update = {})
      : compressed_allreduce_plan(comm.rank(), comm.topology(), std::span<const std::size_t>(&count, 1),
                                  std::move(quantizer), options, std::move(update)) {}

  /// A fused plan: calls take tensors of these sizes (see Fused plans).
  template <class Communicator>
  compressed_allreduce_plan(const Communicator& comm, std::span<const std::size_t> tensor_sizes, Q quantizer = Q{},
                            compressed_allreduce_options options = {}, owner_update<residual_type> update = {})
      : compressed_allreduce_plan(comm.rank(), comm.topology(), tensor_sizes, std::move(quantizer), options,
                                  std::move(update)) {}

  /// A plan on device memory (Space execution::device_space): its residuals, frames and
  /// scratch live on the device of `where`'s stream, allocated here, and its calls take
  /// a device_stream and buffers on that device (communicator::allreduce(where, plan, …);
  /// docs/gpu.md). The same results, bit for bit, as the host plan's. No owner update
  /// rule: rules run on the host.
  /// @par Errors
  /// As the host plan, and invalid_argument without a device runtime or for a stream not
  /// of it; device_error when the device memory cannot be had.
  template <class Communicator>
  compressed_allreduce_plan(execution::device_stream_if<Space> where, const Communicator& comm, std::size_t count,
                            Q quantizer = Q{}, compressed_allreduce_options options = {})
      : compressed_allreduce_plan(comm.rank(), comm.topology(), std::span<const std::size_t>(&count, 1),
                                  std::move(quantizer), options, {}, where) {}
  /// A fused plan on device memory.
  template <class Communicator>
  compressed_allreduce_plan(execution::device_stream_if<Space> where, const Communicator& comm,
                            std::span<const std::size_t> tensor_sizes, Q quantizer = Q{},
                            compressed_allreduce_options options = {})
      : compressed_allreduce_plan(comm.rank(), comm.topology(), tensor_sizes, std::move(quantizer), options, {}, where) {}

  /// The same for rank `rank` of `topology`, without a communicator at hand (`where`:
  /// the stream whose device keeps a device plan's state; a host plan ignores it).
  /// @par Errors
  /// qcoll::error (invalid_argument) for a rank outside the topology.
  template <ring_topology Topology>
  compressed_allreduce_plan(rank_t rank, const Topology& topology, std::size_t count, Q quantizer,
                            compressed_allreduce_options options = {}, owner_update<residual_type> update = {},
                            execution::device_stream where = {})
      : compressed_allreduce_plan(rank, topology, std::span<const std::size_t>(&count, 1), std::move(quantizer), options,
                                  std::move(update), where) {}

  template <ring_topology Topology>
  compressed_allreduce_plan(rank_t rank, const Topology& topology, std::span<const std::size_t> tensor_sizes,
                            Q quantizer, compressed_allreduce_options options = {},
                            owner_update<residual_type> update = {}, execution::device_stream where = {})
      : base("compressed_allreduce_plan", tensor_sizes, where) {
    if (rank >= topology.size())
      qcoll::detail::throw_error(errc::invalid_argument, "compressed_allreduce_plan: rank {} of a {}-rank topology",
                                 rank, topology.size());
    if (options.chunk_values == compressed_allreduce_options::automatic)
      options.chunk_values = std::is_same_v<Space, execution::device_space> ? compressed_allreduce_options::device_chunk_values
                                                                            : compressed_allreduce_options::host_chunk_values;
    static_assert(reproducible_element<residual_type>, "a quantizer's values (float, double) have a grid");
    if (options.reproducible) {
      // Chunks of whole grid blocks, so the chunk size does not move the blocks.
      const std::size_t unit = std::lcm(std::max<std::size_t>(quantizer.group_size(), 1), reproducible_block);
      options.chunk_values = options.chunk_values / unit * unit + (options.chunk_values % unit != 0 ? unit : 0);
    }
    reproducible_ = options.reproducible;
    rank_ = rank;
    size_ = topology.size();
    route_ = algorithms::route_for(topology);
    const std::span<const rank_t> order = topology.ring_order();
    ring_order_.assign(order.begin(), order.end());
    layout_ = algorithms::stripe_layout(quantizer, tensor_sizes, size_, options.chunk_values);
    state_.quantizer = std::move(quantizer);
    const bool updates = static_cast<bool>(update);
    const std::size_t state_per_value = update.state_per_value();
    state_.update = std::move(update);
    this->install(
        algorithms::compressed_schedule_builder(layout_, rank_, route_, ring_order_, updates, state_per_value,
                                                reproducible_)
            .build());
  }

  std::size_t count() const noexcept { return layout_.count(); }
  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }
  stripe_route route() const noexcept { return route_; }
  /// Whether the owners sum on a shared grid (options.reproducible).
  bool reproducible() const noexcept { return reproducible_; }
  /// Values per chunk, after rounding to whole groups.
  std::size_t chunk_values() const noexcept { return layout_.chunk_values(); }
  /// The values rank `owner` sums and re-encodes (whole groups; empty when there
  /// are fewer groups than ranks).
  block_range stripe(rank_t owner) const { return layout_.stripe(checked_rank(owner)); }

  /// This rank's quantization error for every value (empty when Q keeps none; device
  /// memory for a plan on device memory).
  std::span<const residual_type> worker_residual() const noexcept {
    return state_.committed_residual().first(Q::keeps_residual ? count() : 0);
  }
  /// The error of re-encoding this rank's stripe (empty when Q keeps none).
  std::span<const residual_type> server_residual() const noexcept {
    return state_.committed_residual().subspan(Q::keeps_residual ? count() : 0);
  }

  /// Adds to `into` (count() values), value by value, the quantization error this rank
  /// still owes, in the units of its input: its worker residual, plus, over its own
  /// stripe, its server residual times what `op` divides by (the world size for avg, 1
  /// for sum). Over calls with reduce_op::sum the result telescopes:
  ///   Σ_t out_t = Σ_t Σ_ranks in_t − Σ_ranks mass   (avg: the same, divided by n)
  /// so after a new world (a new plan starts with zero residuals), adding the old plan's
  /// mass to this rank's next contribution keeps that gradient mass (docs/recovery.md).
  /// @par Errors qcoll::error (invalid_argument) for a wrong size, an op other than
  /// sum or avg, or a call in flight.
  void add_residual_mass(std::span<residual_type> into, reduce_op op = reduce_op::sum) const
    requires std::same_as<Space, execution::host_space>
  {
    if (into.size() != count() || (op != reduce_op::sum && op != reduce_op::avg))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "compressed_allreduce_plan::add_residual_mass: {} values for {}, op {}", into.size(),
                                 count(), to_string(op));
    this->require_idle("add_residual_mass");
    if constexpr (Q::keeps_residual) {
      const std::span<const residual_type> worker = worker_residual(), server = server_residual();
      for (std::size_t i = 0; i < worker.size(); ++i) into[i] += worker[i];
      const residual_type scale = op == reduce_op::avg ? static_cast<residual_type>(size_) : residual_type{1};
      const std::size_t first = layout_.stripe(rank_).offset;
      for (std::size_t i = 0; i < server.size(); ++i) into[first + i] += scale * server[i];
    }
  }

  /// Payload bytes this rank sends in one call (docs/compressed-allreduce.md), with
  /// E(j) the bytes of stripe j's frames (the encoded sizes of its chunks):
  ///   direct: Σ_{j≠r} E(j) + (n − 1)·E(r)
  ///   ring:   Σ_{k=1}^{n−1} (n − k)·E(p + k) + Σ_j E(j) − E(p + 1)
  ///           (p + k: the rank k places after this one on the ring)
  std::size_t bytes_sent_per_call() const noexcept {
    const auto& l = layout_;
    const std::size_t n = size_;
    std::size_t total = 0;
    if (route_ == stripe_route::direct) {
      for (std::size_t j = 0; j < n; ++j) total += (j == rank_ ? n - 1 : 1) * l.stripe_frame_bytes(j);
      return total;
    }
    if (n == 1) return 0;
    const algorithms::ring_view ring(ring_order_, rank_);
    for (std::size_t k = 1; k < n; ++k) total += (n - k) * l.stripe_frame_bytes(ring.rank_at(static_cast<std::ptrdiff_t>(k)));
    return total + l.total_frame_bytes() - l.stripe_frame_bytes(ring.next());
  }

  // ---- what a communicator uses (allreduce_plan) ----

  /// Every message says whether its plan sums on the grid: ranks that disagree fail the
  /// call on its first message.
  std::uint32_t header_root() const noexcept { return reproducible_ ? 1 : 0; }
  void refuse_if_excluded(const group_view&) const noexcept {}
  /// Fails the call when the plan was made for another rank, size or topology.
  template <transport Transport>
  void check(algorithms::primitives<Transport>& step, const group_view& group) const {
    if (rank_ != group.rank || size_ != group.size)
      step.fail(errc::invalid_argument, "the plan was made for rank {} of {}", rank_, size_);
    if (!std::equal(group.ring_order.begin(), group.ring_order.end(), ring_order_.begin(), ring_order_.end()) ||
        (route_ == stripe_route::direct) != group.fully_linked)
      step.fail(errc::invalid_argument, "the plan was made for another topology");
  }

 private:
  rank_t checked_rank(rank_t r) const {
    if (r >= size_)
      qcoll::detail::throw_error(errc::invalid_argument, "compressed_allreduce_plan: rank {} of {}", r, size_);
    return r;
  }

  algorithms::stripe_layout layout_;
  rank_t rank_ = 0;
  rank_t size_ = 1;
  stripe_route route_ = stripe_route::direct;
  bool reproducible_ = false;
  std::vector<rank_t> ring_order_;  // the ring the frames travel (route::ring)
};
static_assert(allreduce_plan<compressed_allreduce_plan<quantizers::identity<float>>, archetypes::transport>);
static_assert(allreduce_plan<compressed_allreduce_plan<quantizers::identity<float>, bfloat16>, archetypes::transport>);

template <class Communicator, class Q, class... Rest>
compressed_allreduce_plan(const Communicator&, std::size_t, Q, Rest&&...) -> compressed_allreduce_plan<Q>;
template <class Communicator, class Q, class... Rest>
compressed_allreduce_plan(const Communicator&, std::span<const std::size_t>, Q, Rest&&...)
    -> compressed_allreduce_plan<Q>;
template <class Communicator, class Q, class... Rest>
compressed_allreduce_plan(const Communicator&, const std::vector<std::size_t>&, Q, Rest&&...)
    -> compressed_allreduce_plan<Q>;
template <class Communicator, class Q>
compressed_allreduce_plan(execution::device_stream, const Communicator&, std::size_t, Q,
                          compressed_allreduce_options = {})
    -> compressed_allreduce_plan<Q, typename Q::value_type, execution::device_space>;
template <class Communicator, class Q>
compressed_allreduce_plan(execution::device_stream, const Communicator&, std::span<const std::size_t>, Q,
                          compressed_allreduce_options = {})
    -> compressed_allreduce_plan<Q, typename Q::value_type, execution::device_space>;
template <class Communicator, class Q>
compressed_allreduce_plan(execution::device_stream, const Communicator&, const std::vector<std::size_t>&, Q,
                          compressed_allreduce_options = {})
    -> compressed_allreduce_plan<Q, typename Q::value_type, execution::device_space>;

}  // namespace qcoll
