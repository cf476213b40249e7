#pragma once
/// @file
/// A cost model of allreduces on meshes and tori: adds up, per directed link and per
/// node, the bytes every message of a schedule puts on the grid, without running it.
/// It answers the spec's question (degraded-torus.md §3 note, §5): does a routing spread
/// its load, or does it pile traffic onto a few links and nodes ("hot spots")?
///
///  - Links are full duplex: a → b and b → a are counted apart. A message charges its
///    bytes to every link of its route (grid_schedule::hops).
///  - A node's bytes are those in and out of it: the sender's out, the receiver's in,
///    and in + out at every node the message is relayed through.
///  - Time is not modelled: a step's messages may share links, and the costs are
///    totals over the whole allreduce.
///
/// Two sources: cost_of(a grid_schedule), the router's allreduce; and
/// flat_ring_cost(…), the naive rerouting a library does when it rebuilds one ring
/// over the surviving nodes — the baseline the router should beat.

#include <qcoll/algorithms/grid_schedule.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/topologies/grid.hpp>

#include <cstddef>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::algorithms {

/// What one allreduce costs on the grid. Byte counts are totals over the allreduce.
struct grid_cost {
  std::size_t steps = 0;             ///< rounds of messages that run together
  std::size_t messages = 0;          ///< point-to-point messages (a relayed one counts once)
  std::size_t max_link_bytes = 0;    ///< the most any directed link carries
  std::size_t max_node_bytes = 0;    ///< the most in + out of any node, relaying included
  std::size_t total_link_bytes = 0;  ///< summed over directed links: bytes × hops
  std::size_t contributions = 0;     ///< nodes whose vector is in the result
  rank_t hottest_link_from = 0;      ///< the link that carries max_link_bytes (the first, by node id)
  rank_t hottest_link_to = 0;
  rank_t hottest_node = 0;  ///< the node with max_node_bytes (the first, by id)
};

/// The ledger: bytes per directed link and per node, charged one route at a time.
/// It keeps its own copy of the grid, so it outlives the routing it was made from.
class grid_traffic {
 public:
  explicit grid_traffic(topologies::grid g)
      : grid_(std::move(g)),
        slots_per_node_(2 * grid_.shape().dimensions()),
        link_(grid_.size() * slots_per_node_, 0),
        node_(grid_.size(), 0) {}

  /// Messages of `bytes` in all go from path.front() to path.back(), one link at a
  /// time: every link of the path carries them, every node on it passes them.
  /// @par Errors
  /// qcoll::error (invalid_argument) for a path of fewer than two nodes, or one that
  /// steps over a link that does not carry traffic (not neighbours, broken, degraded).
  void charge(std::span<const rank_t> path, std::size_t bytes) {
    if (path.size() < 2) detail::throw_error(errc::invalid_argument, "grid_traffic: a route of {} nodes", path.size());
    for (std::size_t h = 0; h + 1 < path.size(); ++h) {
      link_[slot(path[h], path[h + 1])] += bytes;
      node_[path[h]] += bytes;
      node_[path[h + 1]] += bytes;
    }
  }

  /// Bytes from `from` to its neighbour `to` (0 for any pair no route used).
  std::size_t link_bytes(rank_t from, rank_t to) const {
    const std::optional<std::size_t> s = find_slot(from, to);
    return s ? link_[*s] : 0;
  }
  std::size_t node_bytes(rank_t node) const noexcept { return node_[node]; }

  /// The link and node totals, with the counts only the caller knows.
  grid_cost cost(std::size_t steps, std::size_t messages, std::size_t contributions) const {
    grid_cost c;
    c.steps = steps;
    c.messages = messages;
    c.contributions = contributions;
    for (std::size_t s = 0; s < link_.size(); ++s) {
      c.total_link_bytes += link_[s];
      if (link_[s] > c.max_link_bytes) {
        c.max_link_bytes = link_[s];
        c.hottest_link_from = static_cast<rank_t>(s / slots_per_node_);
        c.hottest_link_to = *grid_.shape().neighbour(c.hottest_link_from, s % slots_per_node_ / 2, s % 2 ? -1 : +1);
      }
    }
    for (rank_t v = 0; v < node_.size(); ++v)
      if (node_[v] > c.max_node_bytes) c.max_node_bytes = node_[v], c.hottest_node = v;
    return c;
  }

 private:
  // Slot 2d + 0 is the link to the +1 neighbour along d, 2d + 1 to the −1 one; with
  // extent 2 on a torus both reach the same node over one link, which takes slot 2d.
  std::optional<std::size_t> find_slot(rank_t from, rank_t to) const {
    const topologies::grid_shape& shape = grid_.shape();
    const std::optional<std::size_t> d = shape.link_dimension(from, to);
    if (!d) return std::nullopt;
    const int direction = shape.neighbour(from, *d, +1) == to ? +1 : -1;
    if (grid_.usable_neighbour(from, *d, direction) != to) return std::nullopt;
    return from * slots_per_node_ + 2 * *d + (direction > 0 ? 0 : 1);
  }
  std::size_t slot(rank_t from, rank_t to) const {
    const std::optional<std::size_t> s = find_slot(from, to);
    if (!s)
      detail::throw_error(errc::invalid_argument, "grid_traffic: a route steps from {} to {} over no usable link",
                          grid_.shape().name(from), grid_.shape().name(to));
    return *s;
  }

  topologies::grid grid_;
  std::size_t slots_per_node_;
  std::vector<std::size_t> link_;
  std::vector<std::size_t> node_;
};

/// Every transfer of `schedule` charged along its route (grid_schedule::hops).
/// @par Complexity
/// O(transfers × route length × dimensions).
inline grid_traffic traffic_of(const grid_schedule& schedule) {
  grid_traffic traffic(schedule.routing().links());
  for (const grid_transfer& t : schedule.transfers()) traffic.charge(schedule.hops(t), t.bytes);
  return traffic;
}

/// The cost of running `schedule`: its steps and messages, and traffic_of's totals.
inline grid_cost cost_of(const grid_schedule& schedule) {
  return traffic_of(schedule).cost(schedule.steps(), schedule.transfers().size(), schedule.routing().included().size());
}

/// The flat ring's members: the alive nodes in snake (boustrophedon) order — row-major,
/// each dimension's direction reversed whenever the position of the coordinates
/// before it is odd, so consecutive members are neighbours on a healthy grid. Only the
/// largest set of alive nodes connected over usable links takes part (the first by
/// node id on a tie): the others cannot reach it.
inline std::vector<rank_t> flat_ring_order(const topologies::grid& g) {
  const topologies::grid_shape& shape = g.shape();
  const std::size_t n = g.size();
  const std::vector<bool> joined = g.largest_joined_part();
  std::vector<rank_t> order;
  for (std::size_t position = 0; position < n; ++position) {
    // The digits of `position` (row-major), each flipped when the prefix before it is odd.
    rank_t node = 0;
    std::size_t prefix = 0, rest = position, span = n;
    for (std::size_t d = 0; d < shape.dimensions(); ++d) {
      span /= shape.extent(d);
      const std::size_t digit = rest / span;
      rest %= span;
      const std::size_t coordinate = prefix % 2 ? shape.extent(d) - 1 - digit : digit;
      node = shape.with_coordinate(node, d, coordinate);
      prefix = prefix * shape.extent(d) + digit;
    }
    if (joined[node]) order.push_back(node);
  }
  return order;
}

}  // namespace qcoll::algorithms

namespace qcoll::detail {

/// The ring's traffic. Position q sends, in the reduce-scatter, every block but its
/// own (it ends holding block q) and, in the all-gather, every block but block q + 1
/// (which it receives last), so the edge q → q + 1 carries 2·(all blocks) − block q −
/// block q + 1 over its 2(N − 1) steps: one charge per edge, not one per message.
inline algorithms::grid_traffic grid_ring_traffic(
    const topologies::grid& g, std::span<const rank_t> ring, std::size_t count,
    const algorithms::grid_schedule::encoded_size_function& encoded_size) {
  algorithms::grid_traffic traffic(g);
  const std::size_t m = ring.size();
  if (m < 2) return traffic;
  std::vector<std::size_t> block_bytes(m);
  std::size_t all_blocks = 0;
  for (std::size_t q = 0; q < m; ++q) all_blocks += block_bytes[q] = encoded_size(block_of(count, m, q).size);
  for (std::size_t q = 0; q < m; ++q) {
    const rank_t from = ring[q], to = ring[(q + 1) % m];
    const std::size_t bytes = 2 * all_blocks - block_bytes[q] - block_bytes[(q + 1) % m];
    if (g.linked(from, to)) {
      const rank_t hop[] = {from, to};
      traffic.charge(hop, bytes);
    } else {
      traffic.charge(g.shortest_path(from, to), bytes);
    }
  }
  return traffic;
}

}  // namespace qcoll::detail

namespace qcoll::algorithms {

/// The naive-rerouting baseline's traffic (see flat_ring_cost).
inline grid_traffic flat_ring_traffic(const topologies::grid& g, std::size_t count,
                                      const grid_schedule::encoded_size_function& encoded_size) {
  return detail::grid_ring_traffic(g, flat_ring_order(g), count, encoded_size);
}

/// The naive-rerouting baseline: what a library does when it rebuilds one ring over
/// the surviving nodes. The ring runs over flat_ring_order(g) (the alive nodes in
/// snake order) and closes from the last back to the first; it is a ring
/// reduce-scatter then a ring all-gather of `count` values: 2(N − 1) steps in which
/// every member sends one block (block_of(count, N, ·): count / N values,
/// encoded_size(block) bytes) to the next. Each ring edge is routed over its direct
/// link when the two are linked, else over a shortest route of usable links
/// (breadth-first, dimensions in order, +1 before −1), through any node.
/// @par Complexity
/// O(nodes × dimensions) plus one breadth-first search per ring edge whose two
/// members are not linked (a 32×32×16 torus with 1 % of nodes down: milliseconds).
inline grid_cost flat_ring_cost(const topologies::grid& g, std::size_t count,
                                const grid_schedule::encoded_size_function& encoded_size) {
  const std::vector<rank_t> ring = flat_ring_order(g);
  const std::size_t m = ring.size();
  const std::size_t steps = m < 2 ? 0 : 2 * (m - 1);
  return detail::grid_ring_traffic(g, ring, count, encoded_size).cost(steps, steps * m, m);
}

}  // namespace qcoll::algorithms
