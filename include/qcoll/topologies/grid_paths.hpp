#pragma once
/// @file
/// Path queries over a grid's usable links, as the reduction router and its plans
/// ask them: straight walks along one dimension, the part of a line a node reaches,
/// and breadth-first walks (next hops towards the nearest of a set of nodes, a forest
/// rooted at several nodes, whether a set of nodes hangs together). grid itself has
/// shortest_path and largest_joined_part.

#include <qcoll/topologies/grid.hpp>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace qcoll::topologies {

/// From `from` to `to` (on one line along d) stepping along d in `direction` over
/// usable links, both ends included; empty when the walk is cut before it gets there.
inline std::vector<rank_t> straight_path(const grid& g, rank_t from, rank_t to, std::size_t d, int direction) {
  std::vector<rank_t> path{from};
  while (path.back() != to) {
    const std::optional<rank_t> next = g.usable_neighbour(path.back(), d, direction);
    if (!next || path.size() > g.shape().extent(d)) return {};
    path.push_back(*next);
  }
  return path;
}

/// Whether straight_path(g, from, to, d, direction) gets there, without building it.
inline bool straight_reaches(const grid& g, rank_t from, rank_t to, std::size_t d, int direction) {
  rank_t at = from;
  for (std::size_t hops = 0; at != to; ++hops) {
    const std::optional<rank_t> next = g.usable_neighbour(at, d, direction);
    if (!next || hops > g.shape().extent(d)) return false;
    at = *next;
  }
  return true;
}

/// The positions along d of `from`'s line that `from` reaches over usable links
/// along d, walking both ways (its own position included), by coordinate along d.
inline std::vector<bool> reached_along_line(const grid& g, rank_t from, std::size_t d) {
  const grid_shape& shape = g.shape();
  std::vector<bool> reached(shape.extent(d), false);
  reached[shape.coordinate(from, d)] = true;
  for (int direction : {+1, -1}) {
    rank_t at = from;
    for (std::size_t hops = 0; hops < shape.extent(d); ++hops) {
      const std::optional<rank_t> next = g.usable_neighbour(at, d, direction);
      if (!next) break;
      at = *next;
      reached[shape.coordinate(at, d)] = true;
    }
  }
  return reached;
}

/// What next_hops gives a node no target reaches.
inline constexpr rank_t no_next_hop = std::numeric_limits<rank_t>::max();

/// Multi-source breadth-first search from the nodes marked in `targets` over usable
/// links: each node's next hop towards its nearest target (a target's is itself;
/// no_next_hop where none is reached). Links along the other dimensions are tried
/// before those along `last_dimension`, so routes leave a line along it first.
inline std::vector<rank_t> next_hops(const grid& g, const std::vector<bool>& targets, std::size_t last_dimension) {
  const grid_shape& shape = g.shape();
  const std::size_t n = shape.size();
  std::vector<rank_t> next(n, no_next_hop);
  std::deque<rank_t> queue;
  for (rank_t v = 0; v < n; ++v)
    if (targets[v]) {
      next[v] = v;
      queue.push_back(v);
    }
  std::vector<std::size_t> dims;
  for (std::size_t d = 0; d < shape.dimensions(); ++d)
    if (d != last_dimension) dims.push_back(d);
  dims.push_back(last_dimension);
  while (!queue.empty()) {
    const rank_t v = queue.front();
    queue.pop_front();
    for (std::size_t d : dims)
      for (int direction : {+1, -1})
        if (auto w = g.usable_neighbour(v, d, direction); w && next[*w] == no_next_hop) {
          next[*w] = v;
          queue.push_back(*w);
        }
  }
  return next;
}

/// The path from `from` to its target along next_hops' answer `next`, both ends
/// included; `from` must have a next hop.
inline std::vector<rank_t> path_to_target(rank_t from, const std::vector<rank_t>& next) {
  std::vector<rank_t> path{from};
  while (next[path.back()] != path.back()) path.push_back(next[path.back()]);
  return path;
}

/// A forest over some of a grid's nodes: parent[i] and depth[i] belong to members[i].
struct walk_forest {
  /// The neighbour one hop nearer the root; the member itself for a root, and for a
  /// member no root reaches.
  std::vector<rank_t> parent;
  /// Hops to the member's root (0 for roots and for members no root reaches).
  std::vector<std::size_t> depth;
};

/// Every member joins its nearest root: a breadth-first search from all `roots` at
/// once over usable links between `members` (ascending; the roots are members).
/// Ties go as grid::for_each_usable_neighbour breaks them.
inline walk_forest nearest_root_forest(const grid& g, std::span<const rank_t> members, std::span<const rank_t> roots) {
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  walk_forest forest{std::vector<rank_t>(members.size(), none), std::vector<std::size_t>(members.size(), 0)};
  auto index = [&](rank_t v) {
    const auto it = std::lower_bound(members.begin(), members.end(), v);
    return it != members.end() && *it == v ? static_cast<std::size_t>(it - members.begin()) : none;
  };
  std::deque<std::size_t> queue;
  for (rank_t root : roots) {
    const std::size_t i = index(root);
    forest.parent[i] = root;
    queue.push_back(i);
  }
  while (!queue.empty()) {
    const std::size_t i = queue.front();
    queue.pop_front();
    g.for_each_usable_neighbour(members[i], [&](rank_t w) {
      const std::size_t j = index(w);
      if (j == none || forest.parent[j] != none) return;
      forest.parent[j] = members[i];
      forest.depth[j] = forest.depth[i] + 1;
      queue.push_back(j);
    });
  }
  for (std::size_t i = 0; i < members.size(); ++i)
    if (forest.parent[i] == none) forest.parent[i] = members[i];
  return forest;
}

/// Whether the nodes marked in `in_set` reach each other through marked nodes only,
/// stepping between neighbours of `shape` whatever their links (true for an empty set).
inline bool joined_in_shape(const grid_shape& shape, const std::vector<bool>& in_set) {
  const std::size_t n = shape.size();
  std::vector<rank_t> any;
  for (rank_t v = 0; v < n; ++v)
    if (in_set[v]) any.push_back(v);
  if (any.empty()) return true;
  std::vector<bool> seen(n, false);
  std::deque<rank_t> queue{any[0]};
  seen[any[0]] = true;
  std::size_t reached = 0;
  while (!queue.empty()) {
    const rank_t v = queue.front();
    queue.pop_front();
    ++reached;
    for (std::size_t d = 0; d < shape.dimensions(); ++d)
      for (int direction : {+1, -1})
        if (auto w = shape.neighbour(v, d, direction); w && in_set[*w] && !seen[*w]) {
          seen[*w] = true;
          queue.push_back(*w);
        }
  }
  return reached == any.size();
}

}  // namespace qcoll::topologies
