#pragma once
/// @file
/// grid_allreduce_plan<Quantizer>: an allreduce over an N-D mesh or torus that keeps
/// reducing when nodes are degraded. A grid_routing (topologies/router.hpp) says
/// who forwards what where; this plan lays it out for one buffer on one rank, owns
/// the residuals of every encode (error feedback) and the frame buffers, and a
/// communicator runs it:
///
/// @code
/// namespace topo = qcoll::topologies;
/// topo::torus grid({4, 4}, {.nodes = {topo::degraded_node::fully(5)}});
/// const topo::grid_routing routing = topo::route_grid(grid);
/// qcoll::grid_allreduce_plan plan(comm, routing, gradients.size(), qcoll::quantizers::one_bit{});
/// comm.allreduce(plan, std::span(gradients), qcoll::reduce_op::avg);
/// @endcode
///
/// docs/grid-allreduce.md explains the router's rules, the phases and their cost.

#include <qcoll/algorithms/grid_allreduce.hpp>
#include <qcoll/algorithms/grid_schedule.hpp>
#include <qcoll/core/archetypes.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/plan.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/topologies/router.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <concepts>
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
/// out = the sum (or average) of the contributions of the routing's included nodes;
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
template <quantizer Q = quantizers::identity<float>, plan_element<Q> T = typename Q::value_type,
          execution::memory_space_tag Space = execution::host_space>
class grid_allreduce_plan : public plan_handle<Q, T, Space> {
  using base = plan_handle<Q, T, Space>;
  using base::state_;

 public:
  using quantizer_type = Q;
  using value_type = T;
  using residual_type = typename Q::value_type;
  static constexpr collective collective_kind = collective::grid_allreduce;

  /// A plan for this rank of `comm`.
  template <class Communicator>
  grid_allreduce_plan(const Communicator& comm, const topologies::grid_routing& routing, std::size_t count,
                      Q quantizer = Q{}, grid_allreduce_options options = {})
      : grid_allreduce_plan(comm.rank(), comm.size(), routing, count, std::move(quantizer), std::move(options)) {}

  /// A plan on device memory (Space execution::device_space), its state on the device
  /// of `where`'s stream, as compressed_allreduce_plan's device form.
  template <class Communicator>
  grid_allreduce_plan(execution::device_stream_if<Space> where, const Communicator& comm, const topologies::grid_routing& routing,
                      std::size_t count, Q quantizer = Q{}, grid_allreduce_options options = {})
      : grid_allreduce_plan(comm.rank(), comm.size(), routing, count, std::move(quantizer), std::move(options), where) {}

  /// The same for rank `rank` of `size`, without a communicator at hand (`where`: the
  /// stream whose device keeps a device plan's state; a host plan ignores it).
  /// @par Errors
  /// qcoll::error (invalid_argument) when the ranks do not map onto the grid: a
  /// rank outside `size`, a node_of_rank of the wrong length, naming a node twice or
  /// outside the grid, or an included node without a rank.
  grid_allreduce_plan(rank_t rank, rank_t size, const topologies::grid_routing& routing, std::size_t count,
                      Q quantizer = Q{}, grid_allreduce_options options = {}, execution::device_stream where = {})
      : base("grid_allreduce_plan", std::span<const std::size_t>(&count, 1), where) {
    if (rank >= size)
      qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan: rank {} of {}", rank, size);
    const std::vector<rank_t> node_of_rank = map_ranks(routing, size, std::move(options.node_of_rank));
    std::vector<rank_t> rank_of_node(routing.shape().size(), npos);
    for (rank_t r = 0; r < size; ++r) rank_of_node[node_of_rank[r]] = r;
    for (rank_t node : routing.included())
      if (rank_of_node[node] == npos)
        qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan: node {} is included but no rank plays it",
                                   routing.shape().name(node));
    rank_ = rank;
    size_ = size;
    count_ = count;
    node_ = node_of_rank[rank];
    included_ = routing.is_included(node_);
    fingerprint_ = routing.fingerprint();
    if (!included_) {
      exclusion_ = qcoll::detail::format("it plays node {}, which the routing excludes", routing.shape().name(node_));
      for (const topologies::excluded_node& e : routing.excluded())
        if (e.node == node_) exclusion_ += ": " + e.reason;
    }
    const algorithms::grid_schedule schedule(routing, count, quantizer.group_size(),
                                             [&](std::size_t values) { return quantizer.encoded_size(values); });
    state_.quantizer = std::move(quantizer);
    this->install(algorithms::compile_grid_allreduce(schedule, rank_of_node, node_));
  }

  std::size_t count() const noexcept { return count_; }
  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }
  /// The grid node this rank plays.
  rank_t node() const noexcept { return node_; }
  /// Whether this rank's contribution is in the result (and it receives the result).
  bool included() const noexcept { return included_; }
  const std::string& exclusion_reason() const noexcept { return exclusion_; }
  /// What avg divides by: the number of included contributions.
  std::size_t divisor() const noexcept { return state_.schedule.divisor; }

  /// Payload bytes this rank sends in one call, from its schedule.
  std::size_t bytes_sent_per_call() const noexcept { return state_.schedule.bytes_sent(); }

  /// Adds to `into` (count() values), value by value, the quantization error this
  /// rank still owes: the sum of its residuals over that value. Over calls the
  /// result telescopes: Σ_t out_t = Σ_t exact_t − Σ_ranks residual mass (for sum).
  /// After a new routing (a new plan starts with zero residuals), adding the old plan's
  /// mass to the next contribution keeps that gradient mass.
  void add_residual_mass(std::span<residual_type> into) const
    requires std::same_as<Space, execution::host_space>
  {
    if (into.size() != count_)
      qcoll::detail::throw_error(errc::invalid_argument, "grid_allreduce_plan::add_residual_mass: {} values for {}",
                                 into.size(), count_);
    if constexpr (Q::keeps_residual) {
      const std::span<const residual_type> residual = state_.committed_residual();
      for (const algorithms::schedule_step& s : state_.schedule.steps)
        if (s.verb == algorithms::step_verb::encode)
          for (std::size_t i = 0; i < s.values.size; ++i) into[s.values.offset + i] += residual[s.residual_offset + i];
    }
  }

  // ---- what a communicator uses (allreduce_plan) ----

  /// Ranks that run different plans disagree on the first message.
  std::uint32_t header_root() const noexcept { return fingerprint_; }
  /// A rank the routing excludes takes no part: it is told why (without aborting the
  /// communicator), and nobody waits for it.
  void refuse_if_excluded(const group_view& group) const {
    if (rank_ == group.rank && size_ == group.size && !included_)
      qcoll::detail::throw_error(errc::invalid_argument, "qcoll grid allreduce on rank {} of {}: {}", group.rank,
                                 group.size, exclusion_);
  }
  /// Fails the call when the plan was made for another rank or size.
  template <transport Transport>
  void check(algorithms::primitives<Transport>& step, const group_view& group) const {
    if (rank_ != group.rank || size_ != group.size)
      step.fail(errc::invalid_argument, "the plan was made for rank {} of {}", rank_, size_);
  }

 private:
  static constexpr rank_t npos = std::numeric_limits<rank_t>::max();

  static std::vector<rank_t> map_ranks(const topologies::grid_routing& routing, rank_t size,
                                       std::vector<rank_t> node_of_rank) {
    const std::size_t nodes = routing.shape().size();
    if (node_of_rank.empty()) {
      if (size == nodes) {
        for (rank_t r = 0; r < size; ++r) node_of_rank.push_back(r);
      } else {
        const topologies::grid& links = routing.links();
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

  rank_t rank_ = 0;
  rank_t size_ = 1;
  std::size_t count_ = 0;
  rank_t node_ = 0;
  bool included_ = false;
  std::string exclusion_;  // why not, when not included
  std::uint32_t fingerprint_ = 0;
};
static_assert(allreduce_plan<grid_allreduce_plan<quantizers::identity<float>>, archetypes::transport>);

template <class Communicator, class Q>
grid_allreduce_plan(const Communicator&, const topologies::grid_routing&, std::size_t, Q,
                    grid_allreduce_options = {}) -> grid_allreduce_plan<Q>;
template <class Communicator, class Q>
grid_allreduce_plan(execution::device_stream, const Communicator&, const topologies::grid_routing&, std::size_t, Q,
                    grid_allreduce_options = {}) -> grid_allreduce_plan<Q, typename Q::value_type, execution::device_space>;

}  // namespace qcoll
