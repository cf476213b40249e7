#pragma once
/// @file
/// A grid_routing laid out for a buffer: every message of one allreduce, in the
/// order they happen, with the values or frames each carries and its size.
/// compile_grid_allreduce (grid_allreduce.hpp) turns each rank's part of this list
/// into a quantized_schedule, which run_schedule runs; the cost model
/// (grid_cost.hpp) adds it up per link and per node. Non-template: only the
/// quantizer's group size and encoded sizes enter.
///
/// The phases, with the leaves of the routing (one per core node) cutting the buffer:
///   forward      stage by stage, every sub-network's tree sends its sums towards
///                the exits (deepest members first), and each exit to its receiver;
///   reduce       along each dimension of the order in turn, a ring reduce-scatter
///                on every core line (the core's healthy bandwidth-optimal part);
///   gather       the leaf owners' frames go round the same rings in reverse order;
///   distribute   stage by stage in reverse, receivers send every frame to their
///                exits, which pass them down their trees.
/// Values that move in `forward` and `reduce` are encoded (with error feedback) by
/// the sender and added by the receiver; every rank decodes the same leaf frames.

#include <qcoll/core/partition.hpp>
#include <qcoll/topologies/router.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <tuple>
#include <vector>

namespace qcoll::algorithms {

enum class grid_phase : std::uint8_t { forward, reduce, gather, distribute };

struct grid_transfer {
  std::size_t step = 0;  ///< transfers of one step run together; steps run in order
  grid_phase phase = grid_phase::forward;
  rank_t from = 0;  ///< nodes of the grid
  rank_t to = 0;
  std::size_t dimension = 0;  ///< the stage's (forward, distribute) or ring's dimension
  block_range values{};       ///< forward, reduce: the values encoded and added
  std::size_t first_leaf = 0;  ///< gather, distribute: the frames of leaves [first, last)
  std::size_t last_leaf = 0;
  std::size_t bytes = 0;
};

class grid_schedule {
 public:
  using encoded_size_function = std::function<std::size_t(std::size_t values)>;

  /// `unit`: values per quantizer group (leaves are cut at whole groups; 0 or 1: anywhere).
  grid_schedule(const topologies::grid_routing& routing, std::size_t count, std::size_t unit,
                const encoded_size_function& encoded_size)
      : routing_(&routing), count_(count) {
    unit_ = unit == 0 ? 1 : unit;
    lay_out_leaves(encoded_size);
    if (routing.leaves() == 0) return;  // nothing reaches a core: nobody is included
    for (const topologies::routing_stage& stage : routing.stages())
      for (const topologies::sub_network& s : stage.sub_networks)
        for (const topologies::forwarding_exit& e : s.exits) exit_routes_.push_back({{e.exit, e.receiver}, &e.path});
    std::sort(exit_routes_.begin(), exit_routes_.end(),
              [](const exit_route& a, const exit_route& b) { return a.key < b.key; });
    add_forward(encoded_size);
    add_reduce(encoded_size);
    add_gather();
    add_distribute();
  }

  const topologies::grid_routing& routing() const noexcept { return *routing_; }
  std::size_t count() const noexcept { return count_; }
  std::span<const grid_transfer> transfers() const noexcept { return transfers_; }
  std::size_t steps() const noexcept { return steps_; }

  std::size_t leaves() const noexcept { return leaf_values_.size(); }
  block_range leaf_values(std::size_t leaf) const noexcept { return leaf_values_[leaf]; }
  /// Byte offsets of the leaf frames laid end to end in leaf order, and the total.
  std::size_t frame_offset(std::size_t leaf) const noexcept { return frame_offset_[leaf]; }
  std::size_t total_frame_bytes() const noexcept { return frame_offset_.back(); }
  /// The leaves [first, last) under a core node's first `level` digits.
  std::pair<std::size_t, std::size_t> leaves_at(rank_t core_node, std::size_t level) const {
    const auto order = routing_->dimension_order();
    std::size_t span = routing_->leaves();
    std::size_t first = 0;
    for (std::size_t k = 0; k < level; ++k) {
      span /= routing_->core_indices(order[k]).size();
      first += routing_->index_along(core_node, order[k]) * span;
    }
    return {first, first + span};
  }

  /// The nodes a transfer crosses, from the node that sends it to the node that
  /// receives it: the tree edge or the exit's route (forward, distribute), the path
  /// between the players of two core places (reduce, gather).
  std::vector<rank_t> hops(const grid_transfer& t) const {
    if (t.phase == grid_phase::reduce || t.phase == grid_phase::gather) return routing_->core_path(t.from, t.to, t.dimension);
    const bool forward = t.phase == grid_phase::forward;
    const auto found = std::lower_bound(exit_routes_.begin(), exit_routes_.end(),
                                        std::pair(forward ? t.from : t.to, forward ? t.to : t.from),
                                        [](const exit_route& e, std::pair<rank_t, rank_t> key) { return e.key < key; });
    if (found != exit_routes_.end() && found->key == std::pair(forward ? t.from : t.to, forward ? t.to : t.from)) {
      const std::vector<rank_t>& path = *found->path;
      return forward ? path : std::vector<rank_t>(path.rbegin(), path.rend());
    }
    return {t.from, t.to};  // a tree edge: neighbours
  }

 private:
  /// Leaf values: the buffer's groups split among the first dimension's core
  /// indices, each part among the second's, and so on (block_of at every level), so
  /// the values a node holds after each reduce-scatter are contiguous.
  void lay_out_leaves(const encoded_size_function& encoded_size) {
    const auto order = routing_->dimension_order();
    const std::size_t leaves = routing_->leaves();
    leaf_values_.assign(leaves, {});
    const std::size_t units = (count_ + unit_ - 1) / unit_;
    for (std::size_t leaf = 0; leaf < leaves; ++leaf) {
      block_range r{0, units};
      std::size_t rest = leaf, span = leaves;
      for (std::size_t d : order) {
        const std::size_t parts = routing_->core_indices(d).size();
        span /= parts;
        const block_range part = block_of(r.size, parts, rest / span);
        r = {r.offset + part.offset, part.size};
        rest %= span;
      }
      const std::size_t begin = std::min(count_, r.offset * unit_);
      const std::size_t end = std::min(count_, (r.offset + r.size) * unit_);
      leaf_values_[leaf] = {begin, end - begin};
    }
    frame_offset_.assign(leaves + 1, 0);
    for (std::size_t leaf = 0; leaf < leaves; ++leaf)
      frame_offset_[leaf + 1] = frame_offset_[leaf] + encoded_size(leaf_values_[leaf].size);
  }

  std::size_t frame_bytes(std::size_t first, std::size_t last) const {
    return frame_offset_[last] - frame_offset_[first];
  }

  void add(grid_transfer t) { transfers_.push_back(t); }

  void add_forward(const encoded_size_function& encoded_size) {
    const block_range all{0, count_};
    for (const topologies::routing_stage& stage : routing_->stages()) {
      std::size_t deepest = 0;
      for (const topologies::sub_network& s : stage.sub_networks)
        for (std::size_t depth : s.depth) deepest = std::max(deepest, depth);
      bool any = false;
      for (std::size_t level = deepest; level >= 1; --level) {
        for (const topologies::sub_network& s : stage.sub_networks) {
          if (!included(s)) continue;
          for (std::size_t i = 0; i < s.members.size(); ++i)
            if (s.depth[i] == level)
              add({steps_, grid_phase::forward, s.members[i], s.parent[i], stage.dimension, all, 0, 0,
                   encoded_size(count_)}),
                  any = true;
        }
        if (any) ++steps_, any = false;
      }
      for (const topologies::sub_network& s : stage.sub_networks) {
        if (!included(s)) continue;
        for (const topologies::forwarding_exit& e : s.exits)
          add({steps_, grid_phase::forward, e.exit, e.receiver, stage.dimension, all, 0, 0, encoded_size(count_)}),
              any = true;
      }
      if (any) ++steps_;
    }
  }

  bool included(const topologies::sub_network& s) const { return routing_->is_included(s.members.front()); }

  /// A ring of the core along the dimension of level `level`: its members in ring
  /// order and the leaves each ends up owning. On the first level only the nodes
  /// that play themselves are members; each owns the places from its own up to the
  /// next member's (the hosted ones after it, and before the first member, the
  /// first's), a contiguous run of leaves. Later levels ring every place.
  struct core_ring {
    std::vector<rank_t> members;
    std::vector<std::pair<std::size_t, std::size_t>> leaves;
  };

  std::vector<core_ring> rings_at(std::size_t level) const {
    const std::size_t d = routing_->dimension_order()[level];
    const auto indices = routing_->core_indices(d);
    std::vector<core_ring> rings;
    for (rank_t v : routing_->core()) {
      if (routing_->shape().coordinate(v, d) != indices.front()) continue;
      const std::vector<rank_t> line = routing_->core_line(v, d);
      core_ring ring;
      for (rank_t place : line)
        if (level != 0 || routing_->host_of(place) == place) ring.members.push_back(place);
      for (rank_t member : ring.members) {
        auto [first, last] = leaves_at(member, level + 1);
        if (level == 0) {
          // Extend over the hosted places it plays: they are contiguous along d.
          for (rank_t place : line)
            if (routing_->host_of(place) == member && place != member) {
              const auto [f, l] = leaves_at(place, level + 1);
              first = std::min(first, f), last = std::max(last, l);
            }
        }
        ring.leaves.emplace_back(first, last);
      }
      rings.push_back(std::move(ring));
    }
    return rings;
  }

  block_range values_of(std::pair<std::size_t, std::size_t> leaves) const {
    if (leaves.first == leaves.second) return {0, 0};
    const block_range first = leaf_values_[leaves.first], last = leaf_values_[leaves.second - 1];
    return {first.offset, last.offset + last.size - first.offset};
  }

  /// The steps of one ring phase at `level`: at step s, position q of every ring
  /// sends position q + 1 what `what(ring, q, s)` gives (values or frames).
  template <class What>
  void add_ring_steps(std::size_t level, grid_phase phase, What&& what) {
    const auto rings = rings_at(level);
    std::size_t steps = 0;
    for (const core_ring& ring : rings) steps = std::max(steps, ring.members.size());
    for (std::size_t s = 0; s + 1 < steps; ++s) {
      for (const core_ring& ring : rings) {
        const std::size_t m = ring.members.size();
        if (s + 1 >= m) continue;
        for (std::size_t q = 0; q < m; ++q) {
          grid_transfer t = what(ring, q, s);
          t.step = steps_;
          t.phase = phase;
          t.from = ring.members[q];
          t.to = ring.members[(q + 1) % m];
          t.dimension = routing_->dimension_order()[level];
          add(t);
        }
      }
      ++steps_;
    }
  }

  void add_reduce(const encoded_size_function& encoded_size) {
    // Position q sends the partial of what position q − 1 − s will own.
    for (std::size_t level = 0; level < routing_->dimension_order().size(); ++level)
      add_ring_steps(level, grid_phase::reduce, [&](const core_ring& ring, std::size_t q, std::size_t s) {
        const std::size_t m = ring.members.size();
        grid_transfer t;
        t.values = values_of(ring.leaves[(q + 2 * m - 1 - s) % m]);
        t.bytes = encoded_size(t.values.size);
        return t;
      });
  }

  void add_gather() {
    // Position q sends the frames position q − s owns.
    for (std::size_t level = routing_->dimension_order().size(); level-- > 0;)
      add_ring_steps(level, grid_phase::gather, [&](const core_ring& ring, std::size_t q, std::size_t s) {
        const std::size_t m = ring.members.size();
        grid_transfer t;
        std::tie(t.first_leaf, t.last_leaf) = ring.leaves[(q + m - s) % m];
        t.bytes = frame_bytes(t.first_leaf, t.last_leaf);
        return t;
      });
  }

  void add_distribute() {
    const std::size_t all = routing_->leaves();
    const auto stages = routing_->stages();
    for (std::size_t k = stages.size(); k-- > 0;) {
      const topologies::routing_stage& stage = stages[k];
      bool any = false;
      std::size_t deepest = 0;
      for (const topologies::sub_network& s : stage.sub_networks) {
        if (!included(s)) continue;
        for (const topologies::forwarding_exit& e : s.exits)
          add({steps_, grid_phase::distribute, e.receiver, e.exit, stage.dimension, {}, 0, all, total_frame_bytes()}),
              any = true;
        for (std::size_t depth : s.depth) deepest = std::max(deepest, depth);
      }
      if (any) ++steps_, any = false;
      for (std::size_t level = 1; level <= deepest; ++level) {
        for (const topologies::sub_network& s : stage.sub_networks) {
          if (!included(s)) continue;
          for (std::size_t i = 0; i < s.members.size(); ++i)
            if (s.depth[i] == level)
              add({steps_, grid_phase::distribute, s.parent[i], s.members[i], stage.dimension, {}, 0, all,
                   total_frame_bytes()}),
                  any = true;
        }
        if (any) ++steps_, any = false;
      }
    }
  }

  struct exit_route {
    std::pair<rank_t, rank_t> key;  // (exit, receiver)
    const std::vector<rank_t>* path;
  };

  const topologies::grid_routing* routing_;
  std::vector<exit_route> exit_routes_;  // sorted: hops() finds a route in log time
  std::size_t count_ = 0;
  std::size_t unit_ = 1;
  std::vector<block_range> leaf_values_;
  std::vector<std::size_t> frame_offset_;
  std::vector<grid_transfer> transfers_;
  std::size_t steps_ = 0;
};

}  // namespace qcoll::algorithms
