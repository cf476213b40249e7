#pragma once
/// @file
/// N-D meshes and tori (spec degraded-torus.md §1–2): nodes on a grid of any number
/// of dimensions and extents, each linked to its neighbours along every dimension —
/// on a torus also across the wraparound — with a set of faults: nodes degraded
/// fully or only along some dimensions, and broken links.
///
/// Node ids are row-major with the last dimension fastest, so on a 2-D grid node
/// `row · columns + column` is "b3" for row b, column 3 (the spec's names). A group
/// along dimension d is the line of nodes whose other coordinates are equal: on a
/// 2-D grid the groups along dimension 1 are the rows, along dimension 0 the columns.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace qcoll::topologies {

/// The extents of an N-D grid and whether it wraps around (a torus).
class grid_shape {
 public:
  grid_shape() = default;
  grid_shape(std::vector<std::size_t> extents, bool wraparound) : extents_(std::move(extents)), wraps_(wraparound) {
    if (extents_.empty() || extents_.size() > 64)
      detail::throw_error(errc::invalid_argument, "grid: {} dimensions (1 to 64 are supported)", extents_.size());
    stride_.assign(extents_.size(), 1);
    std::size_t size = 1;
    for (std::size_t d = extents_.size(); d-- > 0;) {
      if (extents_[d] == 0) detail::throw_error(errc::invalid_argument, "grid: dimension {} has extent 0", d);
      stride_[d] = size;
      if (size > (std::size_t{1} << 40) / extents_[d])
        detail::throw_error(errc::invalid_argument, "grid: more than 2^40 nodes");
      size *= extents_[d];
    }
    size_ = size;
  }

  std::size_t dimensions() const noexcept { return extents_.size(); }
  std::size_t extent(std::size_t d) const noexcept { return extents_[d]; }
  std::span<const std::size_t> extents() const noexcept { return extents_; }
  std::size_t size() const noexcept { return size_; }
  bool wraps() const noexcept { return wraps_; }

  std::size_t coordinate(rank_t node, std::size_t d) const noexcept { return node / stride_[d] % extents_[d]; }
  /// The node whose coordinate along d is `c`, the others as `node`'s.
  rank_t with_coordinate(rank_t node, std::size_t d, std::size_t c) const noexcept {
    return node - coordinate(node, d) * stride_[d] + c * stride_[d];
  }

  /// The neighbour one step along d (direction +1 or −1), if there is a link: none
  /// at a mesh's edge or along an extent of 1. With extent 2 on a torus both
  /// directions reach the same node over the one link between them.
  std::optional<rank_t> neighbour(rank_t node, std::size_t d, int direction) const noexcept {
    const std::size_t k = extents_[d];
    const std::size_t c = coordinate(node, d);
    if (k == 1) return std::nullopt;
    if (direction > 0) {
      if (c + 1 < k) return with_coordinate(node, d, c + 1);
      return wraps_ ? std::optional(with_coordinate(node, d, 0)) : std::nullopt;
    }
    if (c > 0) return with_coordinate(node, d, c - 1);
    return wraps_ ? std::optional(with_coordinate(node, d, k - 1)) : std::nullopt;
  }

  /// The dimension along which a and b are neighbours, if they are.
  std::optional<std::size_t> link_dimension(rank_t a, rank_t b) const noexcept {
    if (a >= size_ || b >= size_ || a == b) return std::nullopt;
    for (std::size_t d = 0; d < dimensions(); ++d)
      for (int direction : {+1, -1})
        if (neighbour(a, d, direction) == b) return d;
    return std::nullopt;
  }

  /// "b3" on a 2-D grid of at most 26 rows (the spec's names), "(1,2,0)" otherwise.
  std::string name(rank_t node) const {
    if (dimensions() == 2 && extents_[0] <= 26)
      return qcoll::detail::format("{}{}", static_cast<char>('a' + coordinate(node, 0)), coordinate(node, 1) + 1);
    std::string text = "(";
    for (std::size_t d = 0; d < dimensions(); ++d) text += qcoll::detail::format("{}{}", d ? "," : "", coordinate(node, d));
    return text + ")";
  }

  friend bool operator==(const grid_shape&, const grid_shape&) = default;

 private:
  std::vector<std::size_t> extents_;
  std::vector<std::size_t> stride_;
  std::size_t size_ = 0;
  bool wraps_ = false;
};

/// A node that cannot take full part (spec §2): `along` holds one bit per
/// dimension whose links it cannot use; 0 means every dimension and also that it
/// has no contribution (fully degraded: a dead process, a failed chip).
struct degraded_node {
  rank_t node = 0;
  std::uint64_t along = 0;

  static degraded_node fully(rank_t node) { return {node, 0}; }
  static degraded_node along_dimensions(rank_t node, std::initializer_list<std::size_t> dimensions) {
    std::uint64_t mask = 0;
    for (std::size_t d : dimensions) mask |= std::uint64_t{1} << d;
    return {node, mask};
  }
  bool is_fully() const noexcept { return along == 0; }
};

/// What is wrong with a grid.
struct grid_faults {
  std::vector<degraded_node> nodes = {};
  std::vector<std::pair<rank_t, rank_t>> broken_links = {};  ///< between neighbours
  /// Treat every partially degraded node as fully degraded (spec §2's option).
  bool partial_as_full = false;
};

/// A mesh or torus with its faults, resolved: which node contributes, which link
/// carries traffic. Also a qcoll topology (linked = a usable link).
class grid {
 public:
  static constexpr std::size_t max_fan_out = std::dynamic_extent;

  grid(grid_shape shape, grid_faults faults = {}) : shape_(std::move(shape)), faults_(std::move(faults)) { resolve(); }

  const grid_shape& shape() const noexcept { return shape_; }
  const grid_faults& faults() const noexcept { return faults_; }
  rank_t size() const noexcept { return shape_.size(); }

  /// The node has a contribution (it is not fully degraded).
  bool alive(rank_t node) const noexcept { return alive_[node]; }
  /// The node cannot use its links along d (fully degraded, degraded along d, or
  /// marked by the neighbour rule).
  bool degraded_along(rank_t node, std::size_t d) const noexcept {
    return !alive_[node] || (degraded_mask_[node] >> d & 1u);
  }
  bool healthy(rank_t node) const noexcept { return alive_[node] && degraded_mask_[node] == 0; }
  /// Nodes the neighbour rule marked degraded along a dimension they were given
  /// healthy: every neighbour along it is degraded or unreachable (spec §2).
  std::span<const std::pair<rank_t, std::size_t>> marked_by_neighbour_rule() const noexcept { return marked_; }

  /// a and b are neighbours and the link between them carries traffic.
  bool linked(rank_t a, rank_t b) const noexcept {
    const std::optional<std::size_t> d = shape_.link_dimension(a, b);
    return d && usable(a, b, *d);
  }
  /// The link from `node` one step along d in `direction`, if it carries traffic.
  std::optional<rank_t> usable_neighbour(rank_t node, std::size_t d, int direction) const noexcept {
    const std::optional<rank_t> next = shape_.neighbour(node, d, direction);
    if (!next || !usable(node, *next, d)) return std::nullopt;
    return next;
  }

  /// Calls visit(neighbour) for every usable link of `node`: dimensions in order,
  /// +1 before −1 (breadth-first searches over the grid break ties this way).
  template <class Visit>
  void for_each_usable_neighbour(rank_t node, Visit&& visit) const {
    for (std::size_t d = 0; d < shape_.dimensions(); ++d)
      for (int direction : {+1, -1})
        if (const std::optional<rank_t> next = usable_neighbour(node, d, direction)) visit(*next);
  }

  /// A shortest path from `from` to `to` over usable links, both ends included
  /// (breadth-first, ties as for_each_usable_neighbour); empty when there is none.
  std::vector<rank_t> shortest_path(rank_t from, rank_t to) const {
    constexpr rank_t unseen = std::numeric_limits<rank_t>::max();
    std::vector<rank_t> parent(size(), unseen);
    std::vector<rank_t> queue{from};
    parent[from] = from;
    for (std::size_t i = 0; i < queue.size() && parent[to] == unseen; ++i)
      for_each_usable_neighbour(queue[i], [&](rank_t w) {
        if (parent[w] == unseen) parent[w] = queue[i], queue.push_back(w);
      });
    if (parent[to] == unseen) return {};
    std::vector<rank_t> path{to};
    while (path.back() != from) path.push_back(parent[path.back()]);
    return {path.rbegin(), path.rend()};
  }

  /// The largest set of alive nodes that usable links join (the one with the lowest
  /// node id on a tie): where a reduction can include everyone.
  std::vector<bool> largest_joined_part() const {
    const std::size_t n = size();
    constexpr rank_t none = std::numeric_limits<rank_t>::max();
    std::vector<rank_t> part(n, none);
    rank_t largest = none;
    std::size_t largest_size = 0;
    for (rank_t start = 0; start < n; ++start) {
      if (!alive(start) || part[start] != none) continue;
      std::vector<rank_t> queue{start};
      part[start] = start;
      for (std::size_t i = 0; i < queue.size(); ++i)
        for_each_usable_neighbour(queue[i], [&](rank_t w) {
          if (part[w] == none) part[w] = start, queue.push_back(w);
        });
      if (queue.size() > largest_size) largest = start, largest_size = queue.size();
    }
    std::vector<bool> joined(n, false);
    for (rank_t v = 0; v < n; ++v) joined[v] = largest != none && part[v] == largest;
    return joined;
  }

  /// Exact collectives run over ranks in their natural order (every transport
  /// links every pair of ranks; grid_allreduce_plan is what follows the grid).
  std::span<const rank_t> ring_order() const noexcept { return order_; }

 private:
  bool usable(rank_t a, rank_t b, std::size_t d) const noexcept {
    if (degraded_along(a, d) || degraded_along(b, d)) return false;
    return !std::binary_search(broken_.begin(), broken_.end(), std::pair<rank_t, rank_t>(std::minmax(a, b)));
  }

  void resolve() {
    const std::size_t n = shape_.size();
    alive_.assign(n, true);
    degraded_mask_.assign(n, 0);
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), rank_t{0});
    const std::uint64_t all = shape_.dimensions() == 64 ? ~std::uint64_t{0}
                                                        : (std::uint64_t{1} << shape_.dimensions()) - 1;
    for (const degraded_node& f : faults_.nodes) {
      if (f.node >= n) detail::throw_error(errc::invalid_argument, "grid: degraded node {} of {}", f.node, n);
      if (f.along & ~all)
        detail::throw_error(errc::invalid_argument, "grid: node {} degraded along a dimension the grid lacks",
                            shape_.name(f.node));
      if (f.is_fully() || faults_.partial_as_full) alive_[f.node] = false;
      degraded_mask_[f.node] |= f.is_fully() ? all : f.along;
    }
    for (auto [a, b] : faults_.broken_links) {
      if (!shape_.link_dimension(a, b))
        detail::throw_error(errc::invalid_argument, "grid: broken link {}–{} joins no neighbours", a, b);
      broken_.emplace_back(std::minmax(a, b));
    }
    std::sort(broken_.begin(), broken_.end());
    // The neighbour rule, to a fixed point: marking a node removes its links along d,
    // which may leave another node without any.
    for (bool changed = true; changed;) {
      changed = false;
      for (rank_t v = 0; v < n; ++v)
        for (std::size_t d = 0; d < shape_.dimensions(); ++d) {
          if (degraded_along(v, d) || shape_.extent(d) == 1) continue;
          if (usable_neighbour(v, d, +1) || usable_neighbour(v, d, -1)) continue;
          degraded_mask_[v] |= std::uint64_t{1} << d;
          marked_.emplace_back(v, d);
          changed = true;
        }
    }
  }

  grid_shape shape_;
  grid_faults faults_;
  std::vector<bool> alive_;
  std::vector<std::uint64_t> degraded_mask_;
  std::vector<std::pair<rank_t, rank_t>> broken_;
  std::vector<std::pair<rank_t, std::size_t>> marked_;
  std::vector<rank_t> order_;
};

/// An N-D mesh: no wraparound links.
class mesh : public grid {
 public:
  explicit mesh(std::vector<std::size_t> extents, grid_faults faults = {})
      : grid(grid_shape(std::move(extents), false), std::move(faults)) {}
};

/// An N-D torus: a mesh plus the wraparound links of every dimension.
class torus : public grid {
 public:
  explicit torus(std::vector<std::size_t> extents, grid_faults faults = {})
      : grid(grid_shape(std::move(extents), true), std::move(faults)) {}
};

static_assert(ring_topology<grid>);

}  // namespace qcoll::topologies
