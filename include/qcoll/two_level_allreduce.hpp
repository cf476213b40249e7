#pragma once
/// @file
/// two_level_allreduce: the allreduce multi-node training needs — exact inside each
/// node, where links are fast (shared memory, the CUDA peer transport), compressed
/// between nodes, where the network is slow:
///
/// @code
/// // world: every rank of the job (tcp); node: the ranks on this host (shm, cuda_peer,
/// // or world.split(node index, local rank)).
/// qcoll::two_level_allreduce bucket(node, world, gradients.size(), qcoll::quantizers::one_bit{});
/// bucket.allreduce(std::span(gradients), qcoll::reduce_op::avg);
/// @endcode
///
/// With L ranks on each of N nodes, a call (the default exchange, `shards`):
///   1. reduce_scatter inside the node, exactly: local rank l holds shard l of its node's sum;
///   2. a compressed_allreduce_plan between the N ranks of local rank l, one per node,
///      on shard l (error feedback per shard: each rank keeps its shard's residuals);
///   3. all_gather inside the node, exactly.
/// The `leaders` exchange instead allreduces inside the node, runs the compressed
/// allreduce between local ranks 0 on the whole buffer and broadcasts inside the node.
/// Both cross the slow link with the same bytes per node (up to a frame header per
/// chunk); shards spreads the encoding over L cores and L links. docs/compressed-
/// allreduce.md, "Two levels", has the picture and the measurements.
///
/// The node and world communicators may be of different types (a CUDA peer node inside a
/// TCP world): a failure in either aborts the other, so every rank of the job fails the
/// call within its deadline. A failed call leaves the residuals as they were.

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/memory.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qcoll {

/// Who runs the compressed allreduce between the nodes.
enum class two_level_exchange : std::uint8_t {
  shards,   ///< every rank, on its shard of the node's sum, with the same local rank of every node
  leaders,  ///< local rank 0 of every node, on the whole node sum
};

struct two_level_options {
  two_level_exchange exchange = two_level_exchange::shards;
  compressed_allreduce_options compressed{};  ///< the plan between the nodes
};

/// Where a rank sits, as every rank of the job sees it.
struct node_layout {
  std::size_t nodes = 0;
  std::size_t ranks_per_node = 0;
  std::size_t node = 0;        ///< nodes are numbered by their local rank 0's world rank, ascending
  std::size_t local_rank = 0;  ///< the rank in the node communicator
};

namespace detail {

/// Each world rank's (leader's world rank, local rank, node size), gathered on every
/// rank, checked to be a partition of the world into nodes of one size; the same
/// verdict on every rank, so a bad layout fails everywhere alike without aborting.
inline node_layout node_layout_of(std::span<const double> table, rank_t world_rank) {
  const std::size_t n = table.size() / 3;
  auto leader = [&](std::size_t r) { return static_cast<std::size_t>(table[3 * r]); };
  auto local = [&](std::size_t r) { return static_cast<std::size_t>(table[3 * r + 1]); };
  auto size = [&](std::size_t r) { return static_cast<std::size_t>(table[3 * r + 2]); };
  const std::size_t per_node = size(0);
  std::vector<std::size_t> leaders;
  for (std::size_t r = 0; r < n; ++r) {
    if (size(r) != per_node)
      throw_error(errc::invalid_argument,
                  "two_level_allreduce: nodes of different sizes (world rank 0's has {} ranks, world rank {}'s {}); "
                  "both exchanges need nodes of one size",
                  per_node, r, size(r));
    if (local(r) == 0) leaders.push_back(r);
    if (leader(r) >= n || local(leader(r)) != 0 || leader(leader(r)) != leader(r))
      throw_error(errc::invalid_argument,
                  "two_level_allreduce: world rank {}'s node communicator is not a node of this world (its local rank "
                  "0 is world rank {})",
                  r, leader(r));
  }
  if (leaders.size() * per_node != n)
    throw_error(errc::invalid_argument,
                "two_level_allreduce: {} nodes of {} ranks do not make the world's {} ranks: the node communicators "
                "must partition the world",
                leaders.size(), per_node, n);
  for (const std::size_t first : leaders) {
    std::vector<bool> seen(per_node, false);
    for (std::size_t r = 0; r < n; ++r)
      if (leader(r) == first) {
        if (local(r) >= per_node || seen[local(r)])
          throw_error(errc::invalid_argument,
                      "two_level_allreduce: the node of world rank {} has local rank {} twice or out of range", first,
                      local(r));
        seen[local(r)] = true;
      }
  }
  const std::size_t mine = leader(world_rank);
  return {leaders.size(), per_node,
          static_cast<std::size_t>(std::find(leaders.begin(), leaders.end(), mine) - leaders.begin()),
          local(world_rank)};
}

}  // namespace detail

/// An allreduce of `count` values over every rank of `world`, exact inside each node
/// (`node`: this rank's node, a communicator over a subset of world's ranks) and
/// compressed through Q between the nodes. Space: host buffers, or device buffers
/// (made with a device_stream; calls take one): the node's steps then run on the
/// device (directly over cuda_peer), the plan encodes on the device.
///
/// @par What a call computes
/// out = Σ over the nodes of Q's compressed sum of each node's exact sum (op sum), or
/// that divided by the ranks (avg: inside the node by L, between the nodes by N —
/// exact when both are powers of two), bitwise identical on every rank. Error feedback
/// as compressed_allreduce_plan's, per shard: Σ_t out_t = Σ_t Σ_ranks in_t − the mass
/// the residuals hold (add_residual_mass).
///
/// @par Failure
/// A failure in either level aborts the other communicator too, so every rank's call
/// fails within the communicators' timeout; the residuals are then as before the call
/// (in place, `out` may hold partial results). roll_back_last_call() undoes a call that
/// succeeded here but failed elsewhere, as the plans' does.
///
/// @par Limits
/// Blocking calls only; nodes of one size; sum and avg. The communicators must
/// outlive it, and only this object calls on them while a call runs.
template <class NodeComm, class WorldComm, quantizer Q, plan_element<Q> T = typename Q::value_type,
          execution::memory_space_tag Space = execution::host_space>
class two_level_allreduce {
 public:
  using value_type = T;
  using residual_type = typename Q::value_type;
  using plan_type = compressed_allreduce_plan<Q, T, Space>;
  static constexpr bool on_device = std::same_as<Space, execution::device_space>;
  static_assert(on_device || !moves_device_memory<typename NodeComm::transport_type>,
                "a node communicator over device memory (cuda_peer) takes device buffers: make the two_level_allreduce "
                "with a device_stream");

  /// Collective over `world` (and `node`): finds the layout, splits off the
  /// communicator between the nodes and makes the plan on it.
  /// @throws qcoll::error (invalid_argument) on every rank when the node communicators
  /// do not partition the world into nodes of one size; what split and the plan throw.
  two_level_allreduce(NodeComm& node, WorldComm& world, std::size_t count, Q quantizer = Q{},
                      two_level_options options = {})
    requires(!on_device)
      : two_level_allreduce(node, world, count, std::move(quantizer), options, std::nullopt) {}

  /// On device memory: the plan's state on `where`'s device; calls take buffers there.
  two_level_allreduce(execution::device_stream_if<Space> where, NodeComm& node, WorldComm& world, std::size_t count,
                      Q quantizer = Q{}, two_level_options options = {})
      : two_level_allreduce(node, world, count, std::move(quantizer), options,
                            std::optional<execution::device_stream>(where)) {}

  two_level_allreduce(const two_level_allreduce&) = delete;
  two_level_allreduce& operator=(const two_level_allreduce&) = delete;

  std::size_t count() const noexcept { return count_; }
  const node_layout& layout() const noexcept { return layout_; }
  two_level_exchange exchange() const noexcept { return exchange_; }
  /// The values this rank reduces between the nodes: its shard (shards), the whole
  /// buffer (a leader) or none.
  block_range between_nodes() const noexcept { return between_; }
  /// The plan between the nodes, on the ranks that run one (every rank with shards,
  /// local ranks 0 with leaders); nullptr elsewhere. Its residuals are this rank's.
  const plan_type* between_nodes_plan() const noexcept { return plan_ ? &*plan_ : nullptr; }
  /// What this rank sent to other nodes in the last call (0 where no plan runs).
  call_statistics last_call() const noexcept { return plan_ ? plan_->last_call() : call_statistics{}; }
  /// Payload bytes this rank sends to other nodes per call (the plan's formula).
  std::size_t bytes_between_nodes_per_call() const noexcept { return plan_ ? plan_->bytes_sent_per_call() : 0; }

  /// out = the two-level sum (or average) on every rank; `in` and `out` have count()
  /// values and are the same range or disjoint.
  /// @par Errors
  /// invalid_argument (aborting both communicators, so every rank fails) for a wrong
  /// size, overlapping ranges or an op other than sum or avg; the collectives' and the
  /// plan's errors, on every rank.
  void allreduce(std::span<const T> in, std::span<T> out, reduce_op op)
    requires(!on_device)
  {
    run(in, out, op, {});
  }
  void allreduce(std::span<T> data, reduce_op op)
    requires(!on_device)
  {
    run(data, data, op, {});
  }
  /// On device memory: `in` and `out` on the device of `where`'s stream, ordered on it as
  /// communicator's device calls are.
  void allreduce(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op)
    requires on_device
  {
    run(in, out, op, where);
  }
  void allreduce(execution::device_stream where, std::span<T> data, reduce_op op)
    requires on_device
  {
    run(data, data, op, where);
  }

  /// Puts this rank's residuals back as before the last successful call (see the
  /// plans' roll_back_last_call); nothing on a rank without a plan.
  void roll_back_last_call() {
    if (plan_) plan_->roll_back_last_call();
  }
  void reset_residuals() {
    if (plan_) plan_->reset_residuals();
  }

  /// Adds to `into` (count() values, in the input's units for `op`) the gradient mass
  /// this rank's residuals hold: Σ_t out_t = Σ_t Σ_ranks in_t − Σ_ranks mass (avg: the
  /// same divided by the ranks). What a new bucket needs to take this one over.
  void add_residual_mass(std::span<residual_type> into, reduce_op op = reduce_op::sum) const
    requires(!on_device)
  {
    if (into.size() != count_)
      detail::throw_error(errc::invalid_argument, "two_level_allreduce::add_residual_mass: {} values for {}",
                          into.size(), count_);
    if (!plan_) return;
    std::vector<residual_type> mass(between_.size);
    plan_->add_residual_mass(std::span<residual_type>(mass), op);
    // The plan's input is the node's sum, or under avg its average: L ranks' worth.
    const residual_type scale =
        op == reduce_op::avg ? static_cast<residual_type>(layout_.ranks_per_node) : residual_type{1};
    for (std::size_t i = 0; i < mass.size(); ++i) into[between_.offset + i] += scale * mass[i];
  }

 private:
  two_level_allreduce(NodeComm& node, WorldComm& world, std::size_t count, Q quantizer, two_level_options options,
                      std::optional<execution::device_stream> where)
      : node_(node), world_(world), count_(count), exchange_(options.exchange) {
    const std::vector<double> table = gather_layout(where);
    layout_ = detail::node_layout_of(table, world.rank());
    std::vector<std::size_t> members(layout_.ranks_per_node);
    for (std::size_t r = 0; r < world.size(); ++r)
      if (table[3 * r] == table[3 * world.rank()]) members[static_cast<std::size_t>(table[3 * r + 1])] = r;
    for (std::size_t l = 0; l < members.size(); ++l)
      node_ranks_ += qcoll::detail::format("{}node rank {} is world rank {}", l == 0 ? "" : ", ", l, members[l]);
    // Between the nodes, rank k is node k's rank of this local rank (the leader's).
    // Nodes are numbered by their local rank 0's world rank: the leaders in ascending order.
    const double between_local = options.exchange == two_level_exchange::shards ? table[3 * world.rank() + 1] : 0.0;
    std::size_t named = 0;
    for (std::size_t leader = 0; leader < world.size() && named < 8; ++leader) {
      if (table[3 * leader + 1] != 0) continue;
      for (std::size_t r = 0; r < world.size(); ++r)
        if (table[3 * r] == static_cast<double>(leader) && table[3 * r + 1] == between_local) {
          between_ranks_ += qcoll::detail::format("{}rank {} between the nodes is world rank {}",
                                                  named == 0 ? "" : ", ", named, r);
          ++named;
        }
    }
    if (layout_.nodes > named) between_ranks_ += ", …";
    const bool shards = exchange_ == two_level_exchange::shards;
    const auto local = static_cast<std::int64_t>(layout_.local_rank);
    cross_ = world.split(shards ? local : (local == 0 ? 0 : no_color), static_cast<std::int64_t>(layout_.node));
    if (shards)
      between_ = block_of(count, layout_.ranks_per_node, layout_.local_rank);
    else
      between_ = local == 0 ? block_range{0, count} : block_range{0, 0};
    if (!cross_) return;
    if constexpr (on_device)
      plan_.emplace(*where, *cross_, between_.size, std::move(quantizer), options.compressed);
    else
      plan_.emplace(*cross_, between_.size, std::move(quantizer), options.compressed);
  }

  /// Every rank's (its node's local rank 0's world rank, local rank, node size): the first by a
  /// broadcast inside the node (through device memory when the node moves it).
  std::vector<double> gather_layout(std::optional<execution::device_stream> where) {
    std::array<double, 3> mine{static_cast<double>(world_.rank()), static_cast<double>(node_.rank()),
                               static_cast<double>(node_.size())};
    broadcast_on(node_, std::span<double>(mine).first(1), where);
    std::vector<double> table(3 * world_.size());
    if constexpr (moves_device_memory<typename WorldComm::transport_type>) {
      execution::device_memory<double> in(3), out(table.size());
      in.upload(mine);
      world_.all_gather(*where, std::span<const double>(in.span()), out.span());
      out.download(table);
    } else {
      world_.all_gather(std::span<const double>(mine), std::span<double>(table));
    }
    return table;
  }

  template <class Comm>
  static void broadcast_on(Comm& comm, std::span<double> value, std::optional<execution::device_stream> where) {
    if constexpr (moves_device_memory<typename Comm::transport_type>) {
      execution::device_memory<double> staged(value.size());
      staged.upload(value);
      comm.broadcast(*where, staged.span(), 0);
      staged.download(value);
    } else {
      comm.broadcast(value, 0);
    }
  }

  void run(std::span<const T> in, std::span<T> out, reduce_op op, execution::device_stream where) {
    if (in.size() != count_ || out.size() != count_ || (op != reduce_op::sum && op != reduce_op::avg) ||
        (!detail::same_range(in, out) && detail::overlaps(in, out)))
      refuse(qcoll::detail::format(
          "two_level_allreduce::allreduce on world rank {}: {} and {} values for a bucket of {}, op {} (sum or avg; "
          "input and output the same range or disjoint)",
          world_.rank(), in.size(), out.size(), count_, to_string(op)));
    if (exchange_ == two_level_exchange::shards) {
      const std::span<T> shard = between_.of(out);
      inside_node("reduce_scatter", [&] {
        if constexpr (on_device) node_.reduce_scatter(where, in, shard, op);
        else node_.reduce_scatter(in, shard, op);
      });
      between_nodes([&] {
        if constexpr (on_device) cross_->allreduce(where, *plan_, shard, op);
        else cross_->allreduce(*plan_, shard, op);
      });
      finish_inside_node("all_gather", true, [&] {
        if constexpr (on_device) node_.all_gather(where, std::span<const T>(shard), out);
        else node_.all_gather(std::span<const T>(shard), out);
      });
    } else {
      inside_node("allreduce", [&] {
        if constexpr (on_device) node_.allreduce(where, in, out, op);
        else node_.allreduce(in, out, op);
      });
      if (plan_)
        between_nodes([&] {
          if constexpr (on_device) cross_->allreduce(where, *plan_, out, op);
          else cross_->allreduce(*plan_, out, op);
        });
      finish_inside_node("broadcast", plan_.has_value(), [&] {
        if constexpr (on_device) node_.broadcast(where, out, 0);
        else node_.broadcast(out, 0);
      });
    }
  }

  /// A step inside the node; when it fails, the world hears of it (a node over another
  /// transport than the world's would otherwise leave the other nodes waiting).
  template <class Step>
  void inside_node(std::string_view what, Step&& step) {
    guarded(qcoll::detail::format("the node's {}", what), world_, node_ranks_, step);
  }
  /// The last step: when it fails after this rank's plan committed, the plan rolls
  /// back, so a failed call leaves every residual as it was.
  template <class Step>
  void finish_inside_node(std::string_view what, bool plan_committed, Step&& step) {
    try {
      inside_node(what, step);
    } catch (...) {
      if (plan_committed) plan_->roll_back_last_call();
      throw;
    }
  }
  /// The plan's step between the nodes; when it fails, the node hears of it.
  template <class Step>
  void between_nodes(Step&& step) {
    guarded("the compressed allreduce between nodes", node_, between_ranks_, step);
  }

  /// step(); when it fails, `other` is aborted saying why, and the error goes on with
  /// `ranks` ("node rank 1 is world rank 3, …") added: a level's errors name its own ranks.
  template <class Other, class Step>
  static void guarded(const std::string& what, Other& other, const std::string& ranks, Step& step) {
    try {
      step();
    } catch (const qcoll::error& e) {
      std::string_view message = e.what();  // without the code's text, which qcoll::error adds again
      const std::string code = ": " + e.code().message();
      if (message.ends_with(code)) message.remove_suffix(code.size());
      const std::string named = qcoll::detail::format("{} ({})", message, ranks);
      abort_quietly(other, qcoll::detail::format("{} failed: {}", what, named));
      throw qcoll::error(e.code(), named);
    } catch (const std::exception& e) {
      abort_quietly(other, qcoll::detail::format("{} failed: {}", what, e.what()));
      throw;
    }
  }

  [[noreturn]] void refuse(const std::string& why) {
    abort_quietly(node_, why);
    abort_quietly(world_, why);
    detail::throw_error(errc::invalid_argument, "{}", why);
  }

  template <class Comm>
  static void abort_quietly(Comm& comm, const std::string& why) noexcept {
    try {
      if (!comm.aborted()) comm.abort(qcoll::detail::format("two_level_allreduce: {}", why));
    } catch (...) {  // the original failure is the one to report
    }
  }

  NodeComm& node_;
  WorldComm& world_;
  std::size_t count_;
  two_level_exchange exchange_;
  node_layout layout_;
  block_range between_;
  std::optional<WorldComm> cross_;  // the ranks of this rank's local rank (shards) or the leaders
  std::optional<plan_type> plan_;
  std::string node_ranks_;     // "node rank 0 is world rank 4, …", for the node's errors
  std::string between_ranks_;  // the same between the nodes
};

template <class NodeComm, class WorldComm, quantizer Q, class... Rest>
two_level_allreduce(NodeComm&, WorldComm&, std::size_t, Q, Rest&&...) -> two_level_allreduce<NodeComm, WorldComm, Q>;
template <class NodeComm, class WorldComm, quantizer Q, class... Rest>
two_level_allreduce(execution::device_stream, NodeComm&, WorldComm&, std::size_t, Q, Rest&&...)
    -> two_level_allreduce<NodeComm, WorldComm, Q, typename Q::value_type, execution::device_space>;

}  // namespace qcoll
