#pragma once
/// @file
/// What the reduction router (topologies/router.hpp) produces for a mesh or torus
/// with degraded nodes: a grid_routing, plain data that can be printed, checked and
/// costed without running it. Its stages say which groups along each dimension were
/// critical and how the nodes they removed forward what they hold (sub-networks,
/// their trees and exits, the routes to the core); then the core where the
/// per-dimension reduce-scatter / all-gather runs, who plays its places, the routes
/// between them, and which nodes are included or excluded and why. describe() puts
/// it in words, draw() draws a 2-D routing.

#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/grid_drawing.hpp>
#include <qcoll/topologies/grid_paths.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace qcoll::topologies {

/// How the nodes of forwarding groups reach the core (spec processes 800 and 900).
enum class forwarding : std::uint8_t {
  sub_networks,  ///< contiguous forwarding nodes sum along trees onto their exits first (process 900)
  per_node,      ///< every forwarding node sends its own vector to its nearest receiver (process 800)
};

/// An exit of a sub-network: `exit` sends the sum of its part of the sub-network
/// to `receiver`, a node of the stage's core, along `path` (exit … receiver).
struct forwarding_exit {
  rank_t exit = 0;
  rank_t receiver = 0;
  std::vector<rank_t> path;
};

/// Forwarding nodes of one stage that sum together before they forward. The
/// members form a forest over usable links, one tree per exit (each member joins
/// its nearest exit): a member sends the sum of its subtree to its parent, so each
/// link carries one vector and every contribution takes exactly one way out.
struct sub_network {
  std::vector<rank_t> members;  ///< ascending
  std::vector<forwarding_exit> exits;
  /// parent[i]: the neighbour members[i] sends to, members[i] itself for an exit.
  std::vector<rank_t> parent;
  /// depth[i]: hops from members[i] to its exit; deeper members send first.
  std::vector<std::size_t> depth;
};

/// One dimension's stage: which groups along it were critical, and how the nodes
/// it removed from the sub-network forward what they hold.
struct routing_stage {
  std::size_t dimension = 0;
  std::size_t critical_groups = 0;
  std::size_t forwarding_groups = 0;
  std::vector<sub_network> sub_networks;
};

/// A node whose contribution is not in the result, and why.
struct excluded_node {
  rank_t node = 0;
  std::string reason;
};

class grid_routing {
 public:
  const grid_shape& shape() const noexcept { return shape_; }
  /// The grid with its faults resolved, as routed for.
  const grid& links() const noexcept { return links_; }
  forwarding mode() const noexcept { return mode_; }
  /// The dimensions in the order the core reduces them (reduce-scatter along the
  /// first one first; all-gather in reverse).
  std::span<const std::size_t> dimension_order() const noexcept { return order_; }
  std::span<const routing_stage> stages() const noexcept { return stages_; }

  /// The core's indices along d, ascending.
  std::span<const std::size_t> core_indices(std::size_t d) const noexcept { return core_indices_[d]; }
  bool in_core(rank_t node) const noexcept { return core_position_[node] != npos; }
  /// The places of the core, ascending: every node of the product of core_indices,
  /// degraded ones included when they are hosted.
  std::span<const rank_t> core() const noexcept { return core_; }
  /// Who plays a core place: the node itself, or for a fully degraded one its host
  /// (the alive core node before it along the first dimension of the order).
  rank_t host_of(rank_t core_node) const noexcept { return host_[core_node]; }
  /// Core places a node other than themselves plays.
  std::size_t hosted() const noexcept {
    std::size_t count = 0;
    for (rank_t v : core_) count += host_[v] != v ? 1 : 0;
    return count;
  }

  /// The core's members on `node`'s line along d, in ring order: consecutive members
  /// (and the last with the first) are joined by the path core_path gives.
  ///
  /// A ring with hosted places runs the other way round: its detours around them
  /// then take the directions of the neighbouring lines' links that those lines'
  /// own rings leave idle (each ring uses one direction of its links).
  std::vector<rank_t> core_line(rank_t node, std::size_t d) const {
    std::vector<rank_t> line;
    for (std::size_t c : core_indices_[d]) line.push_back(shape_.with_coordinate(node, d, c));
    rotate_after_break(line, d);
    if (reversed(node, d)) std::reverse(line.begin(), line.end());
    return line;
  }
  /// The nodes a message from core place `from` to core place `to` (neighbours on
  /// a core line along d) crosses, between the nodes that play them: along d the
  /// shorter way that is open; when both are cut (a hole, a broken link), round the
  /// cut through a neighbouring line, preferably one whose own ring runs the other
  /// way (so it uses the direction that ring leaves idle); else a shortest path.
  std::vector<rank_t> core_path(rank_t from, rank_t to, std::size_t d) const {
    const rank_t a = host_[from], b = host_[to];
    std::vector<rank_t> shorter;
    for (int direction : {+1, -1}) {
      std::vector<rank_t> path = straight(a, b, d, direction);
      if (!path.empty() && (shorter.empty() || path.size() < shorter.size())) shorter = std::move(path);
    }
    if (!shorter.empty()) return shorter;
    std::vector<rank_t> detour;
    bool detour_idle = false;
    const bool one_line = shape_.with_coordinate(a, d, shape_.coordinate(b, d)) == b;
    for (std::size_t e = 0; e < shape_.dimensions() && one_line; ++e) {
      if (e == d) continue;
      for (int side : {+1, -1}) {
        const std::optional<rank_t> a_side = links_.usable_neighbour(a, e, side);
        const std::optional<rank_t> b_side = links_.usable_neighbour(b, e, side);
        if (!a_side || !b_side || !links_.linked(*b_side, b)) continue;
        for (int direction : {+1, -1}) {
          const std::vector<rank_t> middle = straight(*a_side, *b_side, d, direction);
          if (middle.empty()) continue;
          // This ring's hops run `direction`; the other line's ring runs the other
          // way if exactly one of the two lines is reversed.
          const bool idle = reversed(a, d) != reversed(*a_side, d);
          const std::size_t hops = middle.size() + 1;
          if (detour.empty() || (idle && !detour_idle) || (idle == detour_idle && hops + 1 < detour.size())) {
            detour.assign(1, a);
            detour.insert(detour.end(), middle.begin(), middle.end());
            detour.push_back(b);
            detour_idle = idle;
          }
        }
      }
    }
    return detour.empty() ? links_.shortest_path(a, b) : detour;
  }

  /// Whether the ring of `node`'s core line along d runs backwards (it has hosted places).
  bool reversed(rank_t node, std::size_t d) const {
    for (std::size_t c : core_indices_[d]) {
      const rank_t place = shape_.with_coordinate(node, d, c);
      if (core_position_[place] != npos && host_[place] != place) return true;
    }
    return false;
  }

  /// From a to b along d in one direction over usable links (empty when cut).
  std::vector<rank_t> straight(rank_t a, rank_t b, std::size_t d, int direction) const {
    return straight_path(links_, a, b, d, direction);
  }

  /// The reduce-scatter leaves: leaf ℓ belongs to core place core_of_leaf(ℓ), played
  /// by host_of(that place). The first dimension of the order is the most
  /// significant digit, so the leaves a place holds after reducing along the first k
  /// dimensions are contiguous.
  std::size_t leaves() const noexcept { return core_.size(); }
  rank_t core_of_leaf(std::size_t leaf) const noexcept { return leaf_node_[leaf]; }
  std::size_t leaf_of(rank_t core_node) const noexcept { return core_position_[core_node]; }
  /// The position of a core node along d among core_indices(d).
  std::size_t index_along(rank_t core_node, std::size_t d) const {
    const auto& indices = core_indices_[d];
    return static_cast<std::size_t>(
        std::lower_bound(indices.begin(), indices.end(), shape_.coordinate(core_node, d)) - indices.begin());
  }

  /// Nodes whose contribution is in the result (and who receive it), ascending.
  std::span<const rank_t> included() const noexcept { return included_; }
  bool is_included(rank_t node) const noexcept { return included_flag_[node]; }
  /// Every other node, with the reason.
  std::span<const excluded_node> excluded() const noexcept { return excluded_; }
  /// What an average divides by: the number of included contributions.
  std::size_t divisor() const noexcept { return included_.size(); }

  /// Total forwarding hops (all routes of all stages): what the heuristics minimise
  /// after the core's size.
  std::size_t forwarding_hops() const noexcept {
    std::size_t hops = 0;
    for (const routing_stage& stage : stages_)
      for (const sub_network& s : stage.sub_networks)
        for (const forwarding_exit& e : s.exits) hops += e.path.size() - 1;
    return hops;
  }

  /// A stable 32-bit digest of the schedule: ranks that run different plans are told
  /// so on their first message instead of waiting for each other.
  std::uint32_t fingerprint() const noexcept {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) h = (h ^ (v >> (8 * i) & 0xff)) * 1099511628211ull;
    };
    mix(shape_.size());
    mix(shape_.wraps());
    for (std::size_t d : order_) mix(d);
    for (rank_t v : core_) mix(v * 31 + host_[v]);
    for (const routing_stage& stage : stages_)
      for (const sub_network& s : stage.sub_networks) {
        for (rank_t m : s.members) mix(m);
        for (const forwarding_exit& e : s.exits) mix(e.exit * 31 + e.receiver);
      }
    return static_cast<std::uint32_t>(h ^ h >> 32);
  }

  /// The schedule in words: order, stages, sub-networks with their routes, the core,
  /// who is excluded and why.
  std::string describe() const {
    std::string text = qcoll::detail::format("{} {} of {} nodes, {} forwarding; dimension order:",
                                   shape_.wraps() ? "torus" : "mesh", extents_text(), shape_.size(),
                                   mode_ == forwarding::sub_networks ? "by sub-network" : "per node");
    for (std::size_t d : order_) text += qcoll::detail::format(" {}", d);
    text += "\n";
    for (const routing_stage& stage : stages_) {
      text += qcoll::detail::format("stage along dimension {}: {} critical, {} forwarding groups\n", stage.dimension,
                          stage.critical_groups, stage.forwarding_groups);
      for (const sub_network& s : stage.sub_networks) {
        text += "  sub-network {";
        for (std::size_t i = 0; i < s.members.size(); ++i) text += qcoll::detail::format("{}{}", i ? " " : "", shape_.name(s.members[i]));
        text += "}:";
        for (std::size_t i = 0; i < s.members.size(); ++i)
          if (s.parent[i] != s.members[i])
            text += qcoll::detail::format(" {}→{} (tree);", shape_.name(s.members[i]), shape_.name(s.parent[i]));
        for (const forwarding_exit& e : s.exits) {
          text += qcoll::detail::format(" {}→{} via", shape_.name(e.exit), shape_.name(e.receiver));
          for (rank_t v : e.path) text += qcoll::detail::format(" {}", shape_.name(v));
          text += ";";
        }
        if (s.exits.empty()) text += " no route to the core;";
        text.back() = '\n';
      }
    }
    text += qcoll::detail::format("core: {} places", core_.size());
    for (std::size_t d = 0; d < shape_.dimensions(); ++d)
      text += qcoll::detail::format(", {} of {} along {}", core_indices_[d].size(), shape_.extent(d), d);
    if (hosted() != 0) {
      text += qcoll::detail::format("; {} hosted:", hosted());
      for (rank_t v : core_)
        if (host_[v] != v) text += qcoll::detail::format(" {} by {}", shape_.name(v), shape_.name(host_[v]));
    }
    text += qcoll::detail::format("\nincluded: {} of {} contributions (avg divides by {})\n", included_.size(), shape_.size(),
                        divisor());
    for (const excluded_node& e : excluded_) text += qcoll::detail::format("excluded {}: {}\n", shape_.name(e.node), e.reason);
    return text;
  }

  /// A 2-D routing as a picture: rows a, b, … top to bottom, columns 1, 2, … left to
  /// right. `#` core, `A`, `B`, … forwarding sub-networks (per stage, in order),
  /// `X` fully degraded (describe() says who hosts its place), `?` alive but
  /// excluded; `-` and `|` usable links, blank a broken one; `<` `>` `^` `v` the hops
  /// of forwarding routes; arrows at the border are wraparound hops along a row
  /// (those along a column have no room: describe() lists them). Other dimension
  /// counts get describe(). The layout is grid_drawing's.
  std::string draw() const {
    if (shape_.dimensions() != 2) return describe();
    grid_drawing picture(links_);
    for (rank_t v = 0; v < shape_.size(); ++v)
      picture.cell(v) = !links_.alive(v) ? 'X' : !included_flag_[v] ? '?' : in_core(v) ? '#' : 'o';
    char letter = 'A';
    for (const routing_stage& stage : stages_)
      for (const sub_network& s : stage.sub_networks) {
        for (rank_t m : s.members)
          if (included_flag_[m]) picture.cell(m) = letter;
        letter = letter == 'Z' ? 'a' : static_cast<char>(letter + 1);
        for (std::size_t i = 0; i < s.members.size(); ++i)
          if (s.parent[i] != s.members[i]) picture.hop(s.members[i], s.parent[i]);
        for (const forwarding_exit& e : s.exits)
          for (std::size_t h = 0; h + 1 < e.path.size(); ++h) picture.hop(e.path[h], e.path[h + 1]);
      }
    return picture.text();
  }

 private:
  friend class router;

  std::string extents_text() const {
    std::string text;
    for (std::size_t d = 0; d < shape_.dimensions(); ++d) text += qcoll::detail::format("{}{}", d ? "×" : "", shape_.extent(d));
    return text;
  }

  /// On a torus line whose ring is cut somewhere (a broken link, a degraded relay),
  /// the ring starts after the cut so that only the closing hop goes back.
  void rotate_after_break(std::vector<rank_t>& line, std::size_t d) const {
    if (line.size() < 2) return;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const rank_t from = line[i], to = line[(i + 1) % line.size()];
      if (!straight_reaches(links_, from, to, d, +1)) {
        std::rotate(line.begin(), line.begin() + static_cast<std::ptrdiff_t>((i + 1) % line.size()), line.end());
        return;
      }
    }
  }

  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  grid_shape shape_;
  grid links_{grid_shape({1}, false)};
  forwarding mode_ = forwarding::sub_networks;
  std::vector<std::size_t> order_;
  std::vector<routing_stage> stages_;
  std::vector<std::vector<std::size_t>> core_indices_;
  std::vector<rank_t> core_;
  std::vector<rank_t> host_;                // who plays each core place, npos elsewhere
  std::vector<std::size_t> core_position_;  // leaf of each core node, npos elsewhere
  std::vector<rank_t> leaf_node_;
  std::vector<rank_t> included_;
  std::vector<bool> included_flag_;
  std::vector<excluded_node> excluded_;
};

}  // namespace qcoll::topologies
