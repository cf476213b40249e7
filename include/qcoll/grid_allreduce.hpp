#pragma once
/// @file
/// grid_allreduce_plan<Quantizer>: an allreduce over an N-D mesh or torus that keeps
/// reducing when nodes are degraded. A reduction_plan (topologies/planner.hpp) says
/// who forwards what where; this plan lays it out for one buffer on one rank, owns
/// the residuals of every encode (error feedback) and the frame buffers, and a
/// communicator runs it:
///
/// @code
/// namespace topo = qcoll::topologies;
/// topo::torus grid({4, 4}, {.nodes = {topo::degraded_node::fully(5)}});
/// const topo::reduction_plan schedule = topo::plan_reduction(grid);
/// qcoll::grid_allreduce_plan plan(comm, schedule, gradients.size(), qcoll::quantizers::one_bit{});
/// comm.allreduce(plan, std::span(gradients), qcoll::reduce_op::avg);
/// @endcode
///
/// docs/grid-allreduce.md explains the planner's rules, the phases and their cost.

#include <qcoll/algorithms/grid_allreduce.hpp>
#include <qcoll/algorithms/grid_schedule.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/plan_handle.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/topologies/planner.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace qcoll {

/// The grid node each communicator rank plays.
/// The default: rank r is node r when the communicator has a rank for every node;
/// when it has one rank per node that is not fully degraded (the survivors of a
/// failure, re-joined), rank r is the r-th of those nodes in node order.
struct grid_allreduce_options {
  std::vector<rank_t> node_of_rank = {};  ///< empty: the default above
};

/// State and handle of a grid allreduce of `count` values on one rank.
///
/// @par What a call computes
/// out = the sum (or average) of the contributions of the plan's included nodes;
/// excluded nodes' ranks take no part (their call fails at once, saying why) and
/// nobody waits for them. The result is bitwise identical on every included rank.
/// Quantizers: every value that crosses a link while being reduced is encoded with
/// error feedback (each encode has its own residual) and added by the receiver;
/// every sum is encoded once by its leaf's core node and those bits go everywhere.
/// With quantizers::identity the result is exact up to float summation order.
///
/// @par Residuals, failure, threads
/// As compressed_allreduce_plan: residuals persist from call to call and a failed
/// call leaves them as they were; roll_back_last_call() undoes a successful one; one
/// call at a time; start_allreduce runs it on the communicator's progress thread.
template <quantizer Q = quantizers::identity<float>>
class grid_allreduce_plan
    : public detail::plan_handle<algorithms::grid_allreduce_state<Q>, typename Q::value_type> {
  using base = detail::plan_handle<algorithms::grid_allreduce_state<Q>, typename Q::value_type>;
  using base::state_;

 public:
  using quantizer_type = Q;
  using value_type = typename Q::value_type;
  static constexpr collective collective_kind = collective::grid_allreduce;

  /// A plan for this rank of `comm`.
  template <class Communicator>
  grid_allreduce_plan(const Communicator& comm, const topologies::reduction_plan& plan, std::size_t count,
                      Q quantizer = Q{}, grid_allreduce_options options = {})
      : grid_allreduce_plan(comm.rank(), comm.size(), plan, count, std::move(quantizer), std::move(options)) {}

  /// The same for rank `rank` of `size`, without a communicator at hand.
  /// @par Errors
  /// qcoll::error (invalid_argument) when the ranks do not map onto the grid: a
  /// rank outside `size`, a node_of_rank of the wrong length, naming a node twice or
  /// outside the grid, or an included node without a rank.
  grid_allreduce_plan(rank_t rank, rank_t size, const topologies::reduction_plan& plan, std::size_t count,
                      Q quantizer = Q{}, grid_allreduce_options options = {})
      : base("grid_allreduce_plan") {
    if (rank >= size)
      qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan: rank {} of {}", rank, size);
    const std::vector<rank_t> node_of_rank = map_ranks(plan, size, std::move(options.node_of_rank));
    std::vector<rank_t> rank_of_node(plan.shape().size(), npos);
    for (rank_t r = 0; r < size; ++r) rank_of_node[node_of_rank[r]] = r;
    for (rank_t node : plan.included())
      if (rank_of_node[node] == npos)
        qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan: node {} is included but no rank plays it",
                                   plan.shape().name(node));
    state_.quantizer = std::move(quantizer);
    state_.rank = rank;
    state_.size = size;
    state_.node = node_of_rank[rank];
    state_.included = plan.is_included(state_.node);
    if (!state_.included) {
      state_.exclusion = fmt::format("it plays node {}, which the plan excludes", plan.shape().name(state_.node));
      for (const topologies::excluded_node& e : plan.excluded())
        if (e.node == state_.node) state_.exclusion += ": " + e.reason;
    }
    const algorithms::grid_schedule schedule(plan, count, state_.quantizer.group_size(),
                                             [&](std::size_t values) { return state_.quantizer.encoded_size(values); });
    state_.build(schedule, rank_of_node);
  }

  std::size_t count() const noexcept { return state_.count; }
  rank_t rank() const noexcept { return state_.rank; }
  rank_t size() const noexcept { return state_.size; }
  const Q& quantizer() const noexcept { return state_.quantizer; }
  /// The grid node this rank plays.
  rank_t node() const noexcept { return state_.node; }
  /// Whether this rank's contribution is in the result (and it receives the result).
  bool included() const noexcept { return state_.included; }
  const std::string& exclusion_reason() const noexcept { return state_.exclusion; }
  /// What avg divides by: the number of included contributions.
  std::size_t divisor() const noexcept { return state_.divisor; }

  /// Payload bytes this rank sends in one call, from its operations.
  std::size_t bytes_sent_per_call() const noexcept {
    std::size_t total = 0;
    for (const algorithms::grid_op& op : state_.ops)
      if (op.kind == algorithms::grid_op_kind::encode_send || op.kind == algorithms::grid_op_kind::send_frames)
        total += op.bytes;
    return total;
  }
  /// What the last call moved, as counted while it ran (a failed one: until it failed).
  const compressed_allreduce_statistics& last_call() const noexcept { return state_.last_call; }

  /// Adds to `into` (count() values), value by value, the quantization error this
  /// rank still owes: the sum of its residuals over that value. Over calls the
  /// result telescopes: Σ_t out_t = Σ_t exact_t − Σ_ranks residual mass (for sum).
  /// After a re-plan (a new plan starts with zero residuals), adding the old plan's
  /// mass to the next contribution keeps that gradient mass.
  void add_residual_mass(std::span<value_type> into) const {
    if (into.size() != state_.count)
      qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan::add_residual_mass: {} values for {}",
                                 into.size(), state_.count);
    if constexpr (Q::keeps_residual) {
      const std::vector<value_type>& residual = state_.residual[state_.committed];
      for (const algorithms::grid_op& op : state_.ops)
        if (op.kind == algorithms::grid_op_kind::encode_send || op.kind == algorithms::grid_op_kind::finish_leaf)
          for (std::size_t i = 0; i < op.values.size; ++i)
            into[op.values.offset + i] += residual[op.residual_offset + i];
    }
  }

  /// Forgets every residual (say, after the model was reloaded).
  void reset_residuals() {
    this->require_idle("reset_residuals");
    for (auto& r : state_.residual) std::fill(r.begin(), r.end(), value_type{});
    this->forget_last_call();
  }

 private:
  template <transport Transport, ring_topology Topology>
  friend class communicator;

  static constexpr rank_t npos = std::numeric_limits<rank_t>::max();

  static std::vector<rank_t> map_ranks(const topologies::reduction_plan& plan, rank_t size,
                                       std::vector<rank_t> node_of_rank) {
    const std::size_t nodes = plan.shape().size();
    if (node_of_rank.empty()) {
      if (size == nodes) {
        for (rank_t r = 0; r < size; ++r) node_of_rank.push_back(r);
      } else {
        const topologies::grid& links = plan.links();
        for (rank_t v = 0; v < nodes; ++v)
          if (links.alive(v)) node_of_rank.push_back(v);
        if (node_of_rank.size() != size)
          qcoll::detail::throw_error(errc::invalid_argument,
                                     "grid_allreduce_plan: {} ranks play neither every one of the grid's {} nodes nor "
                                     "its {} nodes that are not fully degraded; give options.node_of_rank",
                                     size, nodes, node_of_rank.size());
      }
    }
    if (node_of_rank.size() != size)
      qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan: node_of_rank names {} nodes for {} ranks",
                                 node_of_rank.size(), size);
    std::vector<bool> taken(nodes, false);
    for (rank_t node : node_of_rank) {
      if (node >= nodes || taken[node])
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "grid_allreduce_plan: node_of_rank names node {} {}", node,
                                   node >= nodes ? "outside the grid" : "twice");
      taken[node] = true;
    }
    return node_of_rank;
  }
};

template <class Communicator, class Q>
grid_allreduce_plan(const Communicator&, const topologies::reduction_plan&, std::size_t, Q,
                    grid_allreduce_options = {}) -> grid_allreduce_plan<Q>;

}  // namespace qcoll
