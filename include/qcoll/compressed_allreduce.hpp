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
/// @endcode
///
/// docs/compressed-allreduce.md explains the algorithm, the bytes it sends and what
/// it guarantees.

#include <qcoll/algorithms/compressed_allreduce.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/plan_handle.hpp>
#include <qcoll/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll {

template <transport Transport, ring_topology Topology>
class communicator;

struct compressed_allreduce_options {
  /// Values per pipelined chunk, rounded up to whole quantizer groups. Each chunk is
  /// a frame of its own (24 bytes of header), encoded, sent and decoded while the
  /// next one moves.
  // 256 Ki values (1 MiB of float32), from `collective_bench --job --compressed one_bit
  // --chunk 4K,…,1M,whole -b 64M` with 4 ranks in benchmarks/netlab at 1 Gbit/s (2 vCPU
  // EPYC): 128 Ki–1 Mi is a plateau (median 9.7–10.7× the exact allreduce over 4 runs;
  // 64 Ki 8.2×, 4 Ki 1.9×, one chunk per stripe 9.3×); loopback is flat from 64 Ki to
  // 1 Mi. 256 Ki still gives 4 chunks per stripe at 16 MiB. docs/compressed-performance.md.
  std::size_t chunk_values = std::size_t{1} << 18;
};

/// State and handle of a compressed allreduce of `count` values on one rank.
///
/// @par Residuals
/// The worker residual holds this rank's quantization error for every value; the
/// server residual holds the error of re-encoding the sums of the stripe this rank
/// owns. Both start at zero and persist from call to call. A call that fails leaves
/// both exactly as they were (and the stochastic-rounding sequence too), so it can
/// be repeated on a new communicator without losing gradient mass; a rank whose
/// call succeeded while another's failed can roll_back_last_call() to join the retry.
///
/// @par Thread safety
/// A plan is used by one thread at a time, and by one call at a time: starting a
/// plan that is in flight is an error. Different plans may be in flight together on
/// one communicator; they run in the order they were started.
template <quantizer Q>
class compressed_allreduce_plan
    : public detail::plan_handle<algorithms::compressed_allreduce_state<Q>, typename Q::value_type> {
  using base = detail::plan_handle<algorithms::compressed_allreduce_state<Q>, typename Q::value_type>;
  using base::state_;

 public:
  using quantizer_type = Q;
  using value_type = typename Q::value_type;
  static constexpr collective collective_kind = collective::compressed_allreduce;

  /// A plan for this rank of `comm`: its route follows the communicator's topology
  /// (direct when every pair of ranks is linked, otherwise along its ring).
  template <class Communicator>
  compressed_allreduce_plan(const Communicator& comm, std::size_t count, Q quantizer = Q{},
                            compressed_allreduce_options options = {})
      : compressed_allreduce_plan(comm.rank(), comm.topology(), count, std::move(quantizer), options) {}

  /// The same for rank `rank` of `topology`, without a communicator at hand.
  /// @par Errors
  /// qcoll::error (invalid_argument) for a rank outside the topology or chunk_values 0.
  template <ring_topology Topology>
  compressed_allreduce_plan(rank_t rank, const Topology& topology, std::size_t count, Q quantizer,
                            compressed_allreduce_options options = {})
      : base("compressed_allreduce_plan") {
    if (rank >= topology.size())
      qcoll::detail::throw_error(errc::invalid_argument, "compressed_allreduce_plan: rank {} of a {}-rank topology",
                                 rank, topology.size());
    if (options.chunk_values == 0)
      qcoll::detail::throw_error(errc::invalid_argument, "compressed_allreduce_plan: chunk_values must be positive");
    state_.quantizer = std::move(quantizer);
    state_.rank = rank;
    state_.size = topology.size();
    state_.route = algorithms::route_for(topology);
    const std::span<const rank_t> order = topology.ring_order();
    state_.ring_order.assign(order.begin(), order.end());
    state_.build(count, options.chunk_values);
  }

  std::size_t count() const noexcept { return state_.layout.count(); }
  rank_t rank() const noexcept { return state_.rank; }
  rank_t size() const noexcept { return state_.size; }
  const Q& quantizer() const noexcept { return state_.quantizer; }
  stripe_route route() const noexcept { return state_.route; }
  /// Values per chunk, after rounding to whole groups.
  std::size_t chunk_values() const noexcept { return state_.layout.chunk_values(); }
  /// The values rank `owner` sums and re-encodes (whole groups; empty when there
  /// are fewer groups than ranks).
  block_range stripe(rank_t owner) const { return state_.layout.stripe(checked_rank(owner)); }

  /// This rank's quantization error for every value (empty when Q keeps none).
  std::span<const value_type> worker_residual() const noexcept { return state_.worker_residual[state_.committed]; }
  /// The error of re-encoding this rank's stripe (empty when Q keeps none).
  std::span<const value_type> server_residual() const noexcept { return state_.server_residual[state_.committed]; }
  /// Forgets both residuals (say, after the model was reloaded).
  void reset_residuals() {
    this->require_idle("reset_residuals");
    for (auto* residuals : {&state_.worker_residual, &state_.server_residual})
      for (auto& r : *residuals) std::fill(r.begin(), r.end(), value_type{});
    this->forget_last_call();
  }

  /// Payload bytes this rank sends in one call (docs/compressed-allreduce.md), with
  /// E(j) the bytes of stripe j's frames (the encoded sizes of its chunks):
  ///   direct: Σ_{j≠r} E(j) + (n − 1)·E(r)
  ///   ring:   Σ_{k=1}^{n−1} (n − k)·E(p + k) + Σ_j E(j) − E(p + 1)
  ///           (p + k: the rank k places after this one on the ring)
  std::size_t bytes_sent_per_call() const noexcept {
    const auto& l = state_.layout;
    const std::size_t n = state_.size;
    std::size_t total = 0;
    if (state_.route == stripe_route::direct) {
      for (std::size_t j = 0; j < n; ++j) total += (j == state_.rank ? n - 1 : 1) * l.stripe_frame_bytes(j);
      return total;
    }
    if (n == 1) return 0;
    const algorithms::ring_view ring = state_.ring();
    for (std::size_t k = 1; k < n; ++k) total += (n - k) * l.stripe_frame_bytes(ring.rank_at(static_cast<std::ptrdiff_t>(k)));
    return total + l.total_frame_bytes() - l.stripe_frame_bytes(ring.next());
  }

  /// What the last call moved, as counted while it ran (a failed one: until it failed).
  const compressed_allreduce_statistics& last_call() const noexcept { return state_.last_call; }

 private:
  template <transport Transport, ring_topology Topology>
  friend class communicator;

  rank_t checked_rank(rank_t r) const {
    if (r >= state_.size)
      qcoll::detail::throw_error(errc::invalid_argument, "compressed_allreduce_plan: rank {} of {}", r, state_.size);
    return r;
  }
};

template <class Communicator, class Q>
compressed_allreduce_plan(const Communicator&, std::size_t, Q, compressed_allreduce_options = {})
    -> compressed_allreduce_plan<Q>;

}  // namespace qcoll
