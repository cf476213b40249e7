#pragma once
/// @file
/// The planner for reductions on meshes and tori with degraded nodes (spec
/// degraded-torus.md §3–7): (grid, faults) → an explicit schedule that can be
/// printed, checked and costed without running it. docs/grid-allreduce.md has the
/// rules with drawn examples; in short:
///
///  - Dimensions are taken one at a time in an order chosen by the spec's heuristics
///    (or given). At the stage of dimension d every group (line) along d of the
///    current sub-network is a *critical* group if all its nodes are alive, none is
///    degraded along d, and they are connected along the line; otherwise it is a
///    *forwarding* group. Removing forwarding groups (the indices of the other
///    dimensions they sit at) leaves a smaller sub-network that is again a Cartesian
///    product of index sets: the **core**, where the bandwidth-optimal per-dimension
///    reduce-scatter / all-gather runs.
///  - The alive nodes a stage removes forward what they hold to the core of that
///    stage: each sub-network of contiguous forwarding nodes (or each node alone, with
///    forwarding::per_node) sums internally onto its *exits*, the members nearest to
///    the core. Every member joins exactly one exit (its nearest, along a tree of
///    usable links), and each exit sends the sum of its tree to one receiver. So every
///    contribution is counted exactly once, however many receivers a sub-network has
///    (the spec's Figs. 6 and 7 send one internal vector to several: a gap, §7.1).
///  - Routes are shortest paths over usable links, moving orthogonally to the group
///    first; they never cross a degraded node or a broken link. A node with no route
///    to the core is excluded, and so is what it carried; both are reported.
///  - The result goes back along the same routes to every included node, and the
///    divisor of an average is the number of included contributions.
///  - Hosting (qcoll's addition, planner_options::host_degraded): a fully degraded
///    node may keep its place in the core, played by a neighbour, instead of making
///    its groups forward; by default when the faults are scattered.

#include <qcoll/core/partition.hpp>
#include <qcoll/topologies/grid.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace qcoll::topologies {

/// How the nodes of forwarding groups reach the core (spec processes 800 and 900).
enum class forwarding : std::uint8_t {
  sub_networks,  ///< contiguous forwarding nodes sum along trees onto their exits first (process 900)
  per_node,      ///< every forwarding node sends its own vector to its nearest receiver (process 800)
};

/// What becomes of a fully degraded node's place in the core.
enum class hosting : std::uint8_t {
  /// hosted when the degraded set is not contiguous (scattered faults), forwarded
  /// when it is (a failed region): measured, each is the better one there
  /// (docs/grid-allreduce.md, benchmarks/grid_plan_bench)
  automatic,
  always,  ///< played by the alive node before it along the first dimension (its host)
  never,   ///< its groups forward, as in the spec's process (its figures)
};

struct planner_options {
  /// The dimensions in the order they are reduced; empty: the spec's heuristics (see
  /// plan_reduction).
  std::vector<std::size_t> dimension_order = {};
  forwarding mode = forwarding::sub_networks;
  /// Keep a fully degraded node's place in the core, played by the alive node before
  /// it along the first dimension (its *host*), instead of making its whole group
  /// forward. Scattered faults then cost a few hosts some extra work instead of a
  /// smaller core; a failed region is cheaper forwarded. `never` gives the spec's
  /// process exactly (its figures).
  hosting host_degraded = hosting::automatic;
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
struct plan_stage {
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

class reduction_plan {
 public:
  const grid_shape& shape() const noexcept { return shape_; }
  /// The grid with its faults resolved, as planned for.
  const grid& links() const noexcept { return links_; }
  forwarding mode() const noexcept { return mode_; }
  /// The dimensions in the order the core reduces them (reduce-scatter along the
  /// first one first; all-gather in reverse).
  std::span<const std::size_t> dimension_order() const noexcept { return order_; }
  std::span<const plan_stage> stages() const noexcept { return stages_; }

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
    std::vector<rank_t> path{a};
    while (path.back() != b) {
      const std::optional<rank_t> next = links_.usable_neighbour(path.back(), d, direction);
      if (!next || path.size() > shape_.extent(d)) return {};
      path.push_back(*next);
    }
    return path;
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
    for (const plan_stage& stage : stages_)
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
    for (const plan_stage& stage : stages_)
      for (const sub_network& s : stage.sub_networks) {
        for (rank_t m : s.members) mix(m);
        for (const forwarding_exit& e : s.exits) mix(e.exit * 31 + e.receiver);
      }
    return static_cast<std::uint32_t>(h ^ h >> 32);
  }

  /// The schedule in words: order, stages, sub-networks with their routes, the core,
  /// who is excluded and why.
  std::string describe() const {
    std::string text = fmt::format("{} {} of {} nodes, {} forwarding; dimension order:",
                                   shape_.wraps() ? "torus" : "mesh", extents_text(), shape_.size(),
                                   mode_ == forwarding::sub_networks ? "by sub-network" : "per node");
    for (std::size_t d : order_) text += fmt::format(" {}", d);
    text += "\n";
    for (const plan_stage& stage : stages_) {
      text += fmt::format("stage along dimension {}: {} critical, {} forwarding groups\n", stage.dimension,
                          stage.critical_groups, stage.forwarding_groups);
      for (const sub_network& s : stage.sub_networks) {
        text += "  sub-network {";
        for (std::size_t i = 0; i < s.members.size(); ++i) text += fmt::format("{}{}", i ? " " : "", shape_.name(s.members[i]));
        text += "}:";
        for (std::size_t i = 0; i < s.members.size(); ++i)
          if (s.parent[i] != s.members[i])
            text += fmt::format(" {}→{} (tree);", shape_.name(s.members[i]), shape_.name(s.parent[i]));
        for (const forwarding_exit& e : s.exits) {
          text += fmt::format(" {}→{} via", shape_.name(e.exit), shape_.name(e.receiver));
          for (rank_t v : e.path) text += fmt::format(" {}", shape_.name(v));
          text += ";";
        }
        if (s.exits.empty()) text += " no route to the core;";
        text.back() = '\n';
      }
    }
    text += fmt::format("core: {} places", core_.size());
    for (std::size_t d = 0; d < shape_.dimensions(); ++d)
      text += fmt::format(", {} of {} along {}", core_indices_[d].size(), shape_.extent(d), d);
    if (hosted() != 0) {
      text += fmt::format("; {} hosted:", hosted());
      for (rank_t v : core_)
        if (host_[v] != v) text += fmt::format(" {} by {}", shape_.name(v), shape_.name(host_[v]));
    }
    text += fmt::format("\nincluded: {} of {} contributions (avg divides by {})\n", included_.size(), shape_.size(),
                        divisor());
    for (const excluded_node& e : excluded_) text += fmt::format("excluded {}: {}\n", shape_.name(e.node), e.reason);
    return text;
  }

  /// A 2-D plan as a picture: rows a, b, … top to bottom, columns 1, 2, … left to
  /// right. `#` core, `A`, `B`, … forwarding sub-networks (per stage, in order),
  /// `X` fully degraded (describe() says who hosts its place), `?` alive but
  /// excluded; `-` and `|` usable links, blank a broken one; `<` `>` `^` `v` the hops
  /// of forwarding routes; arrows at the border are wraparound hops. Other dimension
  /// counts get describe().
  std::string draw() const {
    if (shape_.dimensions() != 2) return describe();
    const std::size_t rows = shape_.extent(0), columns = shape_.extent(1);
    const std::size_t height = 2 * rows, width = 4 * columns + 4;
    std::vector<std::string> canvas(height, std::string(width, ' '));
    auto cell = [&](rank_t v) -> char& {
      return canvas[1 + 2 * shape_.coordinate(v, 0)][4 + 4 * shape_.coordinate(v, 1)];
    };
    for (std::size_t c = 0; c < columns; ++c) {
      const std::string label = std::to_string(c + 1);
      canvas[0].replace(4 + 4 * c, label.size(), label);
    }
    for (std::size_t r = 0; r < rows; ++r) canvas[1 + 2 * r][0] = static_cast<char>(r < 26 ? 'a' + r : '*');
    for (rank_t v = 0; v < shape_.size(); ++v) {
      cell(v) = !links_.alive(v) ? 'X' : !included_flag_[v] ? '?' : in_core(v) ? '#' : 'o';
      if (auto right = shape_.neighbour(v, 1, +1); right && *right > v && links_.linked(v, *right))
        canvas[1 + 2 * shape_.coordinate(v, 0)][6 + 4 * shape_.coordinate(v, 1)] = '-';
      if (auto down = shape_.neighbour(v, 0, +1); down && *down > v && links_.linked(v, *down))
        canvas[2 + 2 * shape_.coordinate(v, 0)][4 + 4 * shape_.coordinate(v, 1)] = '|';
    }
    char letter = 'A';
    for (const plan_stage& stage : stages_)
      for (const sub_network& s : stage.sub_networks) {
        for (rank_t m : s.members)
          if (included_flag_[m]) cell(m) = letter;
        letter = letter == 'Z' ? 'a' : static_cast<char>(letter + 1);
        for (std::size_t i = 0; i < s.members.size(); ++i)
          if (s.parent[i] != s.members[i]) draw_hop(canvas, s.members[i], s.parent[i]);
        for (const forwarding_exit& e : s.exits)
          for (std::size_t h = 0; h + 1 < e.path.size(); ++h) draw_hop(canvas, e.path[h], e.path[h + 1]);
      }
    std::string text;
    for (const std::string& line : canvas) {
      const std::size_t end = line.find_last_not_of(' ');
      if (end != std::string::npos) text.append(line, 0, end + 1);
      text += '\n';
    }
    return text;
  }

 private:
  friend class planner;

  std::string extents_text() const {
    std::string text;
    for (std::size_t d = 0; d < shape_.dimensions(); ++d) text += fmt::format("{}{}", d ? "×" : "", shape_.extent(d));
    return text;
  }

  /// On a torus line whose ring is cut somewhere (a broken link, a degraded relay),
  /// the ring starts after the cut so that only the closing hop goes back.
  void rotate_after_break(std::vector<rank_t>& line, std::size_t d) const {
    if (line.size() < 2) return;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const rank_t from = line[i], to = line[(i + 1) % line.size()];
      if (!forward_open(from, to, d)) {
        std::rotate(line.begin(), line.begin() + static_cast<std::ptrdiff_t>((i + 1) % line.size()), line.end());
        return;
      }
    }
  }
  bool forward_open(rank_t from, rank_t to, std::size_t d) const {
    rank_t at = from;
    for (std::size_t hops = 0; at != to; ++hops) {
      const std::optional<rank_t> next = links_.usable_neighbour(at, d, +1);
      if (!next || hops > shape_.extent(d)) return false;
      at = *next;
    }
    return true;
  }

  void draw_hop(std::vector<std::string>& canvas, rank_t from, rank_t to) const {
    const std::size_t fr = shape_.coordinate(from, 0), fc = shape_.coordinate(from, 1);
    const std::size_t tr = shape_.coordinate(to, 0), tc = shape_.coordinate(to, 1);
    if (fr == tr) {
      const bool right = tc == fc + 1 || (fc + 1 == shape_.extent(1) && tc == 0);
      const bool wraps = (right && tc < fc) || (!right && tc > fc);
      const std::size_t column = wraps ? (right ? 4 * shape_.extent(1) + 2 : 2) : 4 + 4 * std::min(fc, tc) + 2;
      canvas[1 + 2 * fr][column] = right ? '>' : '<';
    } else {
      const bool down = tr == fr + 1 || (fr + 1 == shape_.extent(0) && tr == 0);
      const bool wraps = (down && tr < fr) || (!down && tr > fr);
      if (wraps) return;  // no room above row a or below the last row: describe() lists it
      canvas[2 + 2 * std::min(fr, tr)][4 + 4 * fc] = down ? 'v' : '^';
    }
  }

  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  grid_shape shape_;
  grid links_{grid_shape({1}, false)};
  forwarding mode_ = forwarding::sub_networks;
  std::vector<std::size_t> order_;
  std::vector<plan_stage> stages_;
  std::vector<std::vector<std::size_t>> core_indices_;
  std::vector<rank_t> core_;
  std::vector<rank_t> host_;                // who plays each core place, npos elsewhere
  std::vector<std::size_t> core_position_;  // leaf of each core node, npos elsewhere
  std::vector<rank_t> leaf_node_;
  std::vector<rank_t> included_;
  std::vector<bool> included_flag_;
  std::vector<excluded_node> excluded_;
};

/// Builds plans; plan_reduction() is the entry point.
class planner {
 public:
  planner(const grid& g, planner_options options)
      : g_(g), shape_(g.shape()), options_(std::move(options)), contiguous_(degraded_set_contiguous()) {}

  reduction_plan run() {
    if (!options_.dimension_order.empty()) return plan_in(checked_order(options_.dimension_order));
    // The spec's heuristics decide the first dimension; the rest, and ties, go to
    // the order that keeps the largest core (then includes the most nodes, then
    // forwards over the fewest hops). Up to 5 dimensions every order is tried.
    std::vector<std::size_t> order(shape_.dimensions());
    std::iota(order.begin(), order.end(), std::size_t{0});
    const std::vector<std::size_t> keys = heuristic_keys();
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return keys[a] != keys[b] ? keys[a] < keys[b] : a > b;
    });
    if (order.size() > 5) return plan_in(order);
    std::optional<reduction_plan> best;
    std::vector<std::size_t> candidate = order;
    std::sort(candidate.begin(), candidate.end());
    do {
      if (keys[candidate[0]] != keys[order[0]]) continue;
      reduction_plan p = plan_in(candidate);
      if (!best || better(p, *best)) best = std::move(p);
    } while (std::next_permutation(candidate.begin(), candidate.end()));
    return std::move(*best);
  }

 private:
  static bool better(const reduction_plan& a, const reduction_plan& b) {
    const std::size_t a_core = a.core().size() - a.hosted(), b_core = b.core().size() - b.hosted();
    if (a_core != b_core) return a_core > b_core;
    if (a.included().size() != b.included().size()) return a.included().size() > b.included().size();
    return a.forwarding_hops() < b.forwarding_hops();
  }

  std::vector<std::size_t> checked_order(const std::vector<std::size_t>& order) const {
    std::vector<bool> seen(shape_.dimensions(), false);
    for (std::size_t d : order) {
      if (d >= shape_.dimensions() || seen[d])
        detail::throw_error(errc::invalid_argument,
                            "plan_reduction: dimension_order must be a permutation of 0..{}", shape_.dimensions() - 1);
      seen[d] = true;
    }
    if (order.size() != shape_.dimensions())
      detail::throw_error(errc::invalid_argument, "plan_reduction: dimension_order names {} of {} dimensions",
                          order.size(), shape_.dimensions());
    return order;
  }

  /// Spec §2: every degraded node (along any dimension) reaches every other through
  /// degraded nodes only.
  bool degraded_set_contiguous() const {
    const std::size_t n = shape_.size();
    std::vector<bool> degraded(n, false);
    std::vector<rank_t> any;
    for (rank_t v = 0; v < n; ++v) {
      for (std::size_t d = 0; d < shape_.dimensions(); ++d)
        if (g_.degraded_along(v, d)) degraded[v] = true;
      if (degraded[v]) any.push_back(v);
    }
    if (any.empty()) return true;
    std::vector<bool> seen(n, false);
    std::deque<rank_t> queue{any[0]};
    seen[any[0]] = true;
    std::size_t reached = 0;
    while (!queue.empty()) {
      const rank_t v = queue.front();
      queue.pop_front();
      ++reached;
      for (std::size_t d = 0; d < shape_.dimensions(); ++d)
        for (int direction : {+1, -1})
          if (auto w = shape_.neighbour(v, d, direction); w && degraded[*w] && !seen[*w]) {
            seen[*w] = true;
            queue.push_back(*w);
          }
    }
    return reached == any.size();
  }

  /// Spec §4's order: a dimension with no clean group goes last when the degraded
  /// set is not contiguous; then fewer nodes degraded along it first. Extent-1
  /// dimensions are trivial and go last.
  std::vector<std::size_t> heuristic_keys() const {
    const std::size_t n = shape_.size();
    const bool contiguous = contiguous_;
    std::vector<std::size_t> keys(shape_.dimensions());
    for (std::size_t d = 0; d < shape_.dimensions(); ++d) {
      std::size_t along = 0;
      for (rank_t v = 0; v < n; ++v) along += g_.degraded_along(v, d) ? 1 : 0;
      bool clean_group = false;
      for (rank_t v = 0; v < n && !clean_group; ++v) {
        if (shape_.coordinate(v, d) != 0) continue;
        bool clean = true;
        for (std::size_t c = 0; c < shape_.extent(d) && clean; ++c)
          clean = !g_.degraded_along(shape_.with_coordinate(v, d, c), d);
        clean_group = clean;
      }
      const std::size_t no_clean_group = !contiguous && !clean_group ? 1 : 0;
      const std::size_t trivial = shape_.extent(d) == 1 ? 1 : 0;
      keys[d] = (trivial << 62) | (no_clean_group << 61) | along;
    }
    return keys;
  }

  // ---- one order ----

  /// The core's nodes: the product of keep_[d] over all dimensions.
  bool in_product(rank_t v) const {
    for (std::size_t d = 0; d < shape_.dimensions(); ++d)
      if (!keep_[d][shape_.coordinate(v, d)]) return false;
    return true;
  }

  /// A line along d (through `v`) is critical when its kept nodes are alive, not
  /// degraded along d (unless alone), and connected over the line's usable links.
  ///
  /// With hosting, a line is critical when every member is alive or hosted (on the
  /// first dimension: has an alive member to host it) and one is alive: its ring
  /// goes along the line where that is open and by shortest paths around holes,
  /// broken links and nodes degraded along d. (Alive, with hosting, means in the
  /// grid's largest joined part, so such a path always exists.)
  bool critical(rank_t v, std::size_t d) const {
    std::vector<std::size_t> members, holes;
    for (std::size_t c = 0; c < shape_.extent(d); ++c)
      if (keep_[d][c]) {
        const rank_t node = shape_.with_coordinate(v, d, c);
        if (hosting_ && !alive(node) && (d == first_dimension_ || host_[node] != npos))
          holes.push_back(c);
        else
          members.push_back(c);
      }
    if (members.empty()) return false;
    if (hosting_) {
      for (std::size_t c : members)
        if (!alive(shape_.with_coordinate(v, d, c))) return false;
      return true;
    }
    if (members.size() == 1) return alive(shape_.with_coordinate(v, d, members[0]));
    for (std::size_t c : members)
      if (g_.degraded_along(shape_.with_coordinate(v, d, c), d)) return false;
    // Walk the usable links from the first member both ways; every member must be met.
    std::vector<bool> reached(shape_.extent(d), false);
    for (int direction : {+1, -1}) {
      rank_t at = shape_.with_coordinate(v, d, members[0]);
      reached[members[0]] = true;
      for (std::size_t hops = 0; hops < shape_.extent(d); ++hops) {
        const std::optional<rank_t> next = g_.usable_neighbour(at, d, direction);
        if (!next) break;
        at = *next;
        reached[shape_.coordinate(at, d)] = true;
      }
    }
    for (std::size_t c : members)
      if (!reached[c]) return false;
    return true;
  }

  /// The stage of dimension d: drops the indices (of other dimensions) of the
  /// forwarding groups, greedily the index that removes the most of them (in 2-D
  /// exactly the forwarding groups). When no other dimension has an index to
  /// spare, the line itself shrinks to its usable part.
  void classify(std::size_t d, plan_stage& stage) {
    for (bool first = true;; first = false) {
      std::vector<rank_t> lines;  // one node per line along d of the product (coordinate 0 along d)
      for (rank_t v = 0; v < shape_.size(); ++v) {
        if (shape_.coordinate(v, d) != 0) continue;
        bool kept = true;
        for (std::size_t e = 0; e < shape_.dimensions() && kept; ++e)
          if (e != d) kept = keep_[e][shape_.coordinate(v, e)];
        if (kept) lines.push_back(v);
      }
      std::vector<rank_t> forwarding_lines;
      for (rank_t v : lines)
        if (!critical(v, d)) forwarding_lines.push_back(v);
      if (first) {
        stage.forwarding_groups = forwarding_lines.size();
        stage.critical_groups = lines.size() - forwarding_lines.size();
      }
      if (forwarding_lines.empty() || lines.empty()) return;
      std::size_t best_e = 0, best_c = 0, best_count = 0, best_cost = 0;
      for (std::size_t e = 0; e < shape_.dimensions(); ++e) {
        // With hosting, first-dimension indices stay: a host may sit at any of them.
        if (e == d || kept_count(e) < 2 || (hosting_ && e == first_dimension_)) continue;
        std::vector<std::size_t> count(shape_.extent(e), 0);
        for (rank_t v : forwarding_lines) ++count[shape_.coordinate(v, e)];
        const std::size_t cost = product_size() / kept_count(e);  // nodes an index of e removes
        for (std::size_t c = 0; c < shape_.extent(e); ++c)
          if (count[c] > best_count || (count[c] == best_count && count[c] > 0 && cost < best_cost)) {
            best_e = e, best_c = c, best_count = count[c], best_cost = cost;
          }
      }
      if (best_count > 0) {
        keep_[best_e][best_c] = false;
        continue;
      }
      const std::vector<bool> unchanged = keep_[d];
      shrink_line(d);
      if (keep_[d] == unchanged) {  // nothing usable is left: no core
        keep_[d].assign(shape_.extent(d), false);
        return;
      }
    }
  }

  /// The last resort of a stage: keep the positions along d where every remaining
  /// line has a contribution, then the largest set of them every line connects.
  void shrink_line(std::size_t d) {
    auto lines = [&] {
      std::vector<rank_t> result;
      for (rank_t v = 0; v < shape_.size(); ++v) {
        if (shape_.coordinate(v, d) != 0) continue;
        bool kept = true;
        for (std::size_t e = 0; e < shape_.dimensions() && kept; ++e)
          if (e != d) kept = keep_[e][shape_.coordinate(v, e)];
        if (kept) result.push_back(v);
      }
      return result;
    }();
    // Positions where some line has no contribution go; a position degraded along d
    // can still stay alone (a line of one needs no link).
    for (std::size_t c = 0; c < shape_.extent(d); ++c)
      for (rank_t v : lines)
        if (!alive(shape_.with_coordinate(v, d, c))) keep_[d][c] = false;
    for (rank_t v : lines) {
      while (kept_count(d) > 0 && !critical(v, d)) {
        // Keep the largest set of members joined along this line; drop the rest.
        std::vector<std::size_t> best;
        std::vector<bool> seen(shape_.extent(d), false);
        for (std::size_t c = 0; c < shape_.extent(d); ++c) {
          if (!keep_[d][c] || seen[c]) continue;
          std::vector<std::size_t> component{c};
          seen[c] = true;
          for (int direction : {+1, -1}) {
            rank_t at = shape_.with_coordinate(v, d, c);
            for (std::size_t hops = 0; hops < shape_.extent(d); ++hops) {
              const std::optional<rank_t> next = g_.usable_neighbour(at, d, direction);
              if (!next) break;
              at = *next;
              const std::size_t p = shape_.coordinate(at, d);
              if (keep_[d][p] && !seen[p]) {
                seen[p] = true;
                component.push_back(p);
              }
            }
          }
          if (component.size() > best.size()) best = component;
        }
        std::vector<bool> keep(shape_.extent(d), false);
        for (std::size_t c : best) keep[c] = true;
        keep_[d] = keep;
        if (best.size() <= 1) break;
      }
    }
  }

  std::size_t kept_count(std::size_t d) const {
    return static_cast<std::size_t>(std::count(keep_[d].begin(), keep_[d].end(), true));
  }
  std::size_t product_size() const {
    std::size_t size = 1;
    for (std::size_t d = 0; d < shape_.dimensions(); ++d) size *= kept_count(d);
    return size;
  }

  /// Multi-source breadth-first search from the stage's sub-network (`target`)
  /// over usable links through alive nodes: each node's next hop towards its nearest
  /// target node. Links orthogonal to the stage's dimension are tried first.
  std::vector<rank_t> next_hops(const std::vector<bool>& target, std::size_t stage_dimension) const {
    const std::size_t n = shape_.size();
    std::vector<rank_t> next(n, npos);
    std::deque<rank_t> queue;
    for (rank_t v = 0; v < n; ++v)
      if (target[v]) {
        next[v] = v;
        queue.push_back(v);
      }
    std::vector<std::size_t> dims;
    for (std::size_t d = 0; d < shape_.dimensions(); ++d)
      if (d != stage_dimension) dims.push_back(d);
    dims.push_back(stage_dimension);
    while (!queue.empty()) {
      const rank_t v = queue.front();
      queue.pop_front();
      for (std::size_t d : dims)
        for (int direction : {+1, -1})
          if (auto w = g_.usable_neighbour(v, d, direction); w && next[*w] == npos) {
            next[*w] = v;
            queue.push_back(*w);
          }
    }
    return next;
  }

  std::vector<rank_t> path_to_target(rank_t from, const std::vector<rank_t>& next) const {
    std::vector<rank_t> path{from};
    while (next[path.back()] != path.back()) path.push_back(next[path.back()]);
    return path;
  }

  /// The forwarding of one stage: the alive nodes in `leaving` go to the nodes of
  /// `staying` (the stage's sub-network).
  void forward(plan_stage& stage, const std::vector<bool>& leaving, const std::vector<bool>& staying) {
    const std::size_t n = shape_.size();
    const std::vector<rank_t> next = next_hops(staying, stage.dimension);
    std::vector<std::size_t> member_of(n, npos);
    std::size_t groups = 0;
    for (rank_t v = 0; v < n; ++v) {
      if (!leaving[v] || member_of[v] != npos) continue;
      // A sub-network: the forwarding nodes v reaches over usable links (or v alone).
      std::vector<rank_t> members{v};
      member_of[v] = groups;
      for (std::size_t i = 0; i < members.size() && options_.mode == forwarding::sub_networks; ++i)
        g_.for_each_usable_neighbour(members[i], [&](rank_t w) {
          if (leaving[w] && member_of[w] == npos) member_of[w] = groups, members.push_back(w);
        });
      std::sort(members.begin(), members.end());
      sub_network s;
      s.members = members;
      std::size_t nearest = npos;
      for (rank_t m : members)
        if (next[m] != npos) nearest = std::min(nearest, path_to_target(m, next).size());
      if (nearest != npos)
        for (rank_t m : members)
          if (next[m] != npos && path_to_target(m, next).size() == nearest) {
            forwarding_exit e;
            e.exit = m;
            e.path = path_to_target(m, next);
            e.receiver = e.path.back();
            s.exits.push_back(std::move(e));
          }
      stage.sub_networks.push_back(std::move(s));
      ++groups;
    }
  }

  reduction_plan plan_in(const std::vector<std::size_t>& order) {
    const bool host = options_.host_degraded == hosting::always ||
                      (options_.host_degraded == hosting::automatic && !contiguous_);
    return plan_in(order, host);
  }

  /// After the first stage: every fully degraded node left in the product is played
  /// by the alive node before it on its first-dimension line (the first alive one
  /// when none is before it), so the places a node plays are one contiguous run.
  void assign_hosts() {
    const std::size_t d = first_dimension_;
    for (rank_t v = 0; v < shape_.size(); ++v) {
      if (shape_.coordinate(v, d) != 0 || !in_product(v)) continue;
      rank_t host = npos;
      for (std::size_t c = 0; c < shape_.extent(d); ++c) {
        if (!keep_[d][c]) continue;
        const rank_t node = shape_.with_coordinate(v, d, c);
        if (alive(node)) {
          if (host == npos)  // the holes before the first alive member are its
            for (std::size_t b = 0; b < c; ++b)
              if (keep_[d][b]) host_[shape_.with_coordinate(v, d, b)] = node;
          host = node;
        } else if (host != npos) {
          host_[node] = host;
        }
      }
    }
  }

  /// A node that takes part. With hosting, only the largest set of alive nodes joined
  /// by usable links does (rings there may take any path): the others are cut off.
  bool alive(rank_t v) const { return hosting_ ? joined_[v] : g_.alive(v); }

  reduction_plan plan_in(const std::vector<std::size_t>& order, bool hosting) {
    const std::size_t n = shape_.size();
    hosting_ = hosting;
    if (hosting_ && joined_.empty()) joined_ = g_.largest_joined_part();
    first_dimension_ = order.front();
    host_.assign(n, npos);
    reduction_plan p;
    p.shape_ = shape_;
    p.links_ = g_;
    p.mode_ = options_.mode;
    p.order_ = order;
    keep_.assign(shape_.dimensions(), {});
    for (std::size_t d = 0; d < shape_.dimensions(); ++d) keep_[d].assign(shape_.extent(d), true);

    std::vector<bool> before(n), after(n);
    for (rank_t v = 0; v < n; ++v) before[v] = true;
    for (std::size_t d : order) {
      plan_stage stage;
      stage.dimension = d;
      classify(d, stage);
      if (hosting_ && d == first_dimension_) assign_hosts();
      std::vector<bool> leaving(n, false);
      bool any = false;
      for (rank_t v = 0; v < n; ++v) {
        after[v] = in_product(v);
        leaving[v] = before[v] && !after[v] && alive(v);
        any = any || leaving[v];
      }
      if (any) forward(stage, leaving, after);
      p.stages_.push_back(std::move(stage));
      before = after;
    }

    // The core and its leaves (first dimension of the order most significant).
    p.core_indices_.assign(shape_.dimensions(), {});
    for (std::size_t d = 0; d < shape_.dimensions(); ++d)
      for (std::size_t c = 0; c < shape_.extent(d); ++c)
        if (keep_[d][c]) p.core_indices_[d].push_back(c);
    p.core_position_.assign(n, reduction_plan::npos);
    p.host_.assign(n, reduction_plan::npos);
    for (rank_t v = 0; v < n; ++v)
      if (after[v] && (alive(v) || host_[v] != npos)) {
        p.core_.push_back(v);
        p.host_[v] = alive(v) ? v : host_[v];
      }
    p.leaf_node_.assign(p.core_.size(), 0);
    for (rank_t v : p.core_) {
      std::size_t leaf = 0;
      for (std::size_t d : order) leaf = leaf * p.core_indices_[d].size() + p.index_along(v, d);
      p.core_position_[v] = leaf;
      p.leaf_node_[leaf] = v;
    }

    // Which forwarded data reaches the core, from the last stage back: an exit whose
    // receiver is cut off later is dropped, and a sub-network left without exits is
    // excluded with everything it carries.
    std::vector<bool> reaches(n, false);
    std::vector<std::string> reason(n);
    for (rank_t v : p.core_) reaches[v] = alive(v);
    for (std::size_t k = p.stages_.size(); k-- > 0;) {
      for (sub_network& s : p.stages_[k].sub_networks) {
        std::erase_if(s.exits, [&](const forwarding_exit& e) { return !reaches[e.receiver]; });
        for (rank_t m : s.members) {
          reaches[m] = !s.exits.empty();
          if (!reaches[m])
            reason[m] = fmt::format("no route from it{} to the core at the stage of dimension {}",
                                    s.members.size() > 1 ? " or its sub-network" : "", p.stages_[k].dimension);
        }
        build_forest(s);
      }
    }
    // A node that forwarded to a receiver that was later cut off lost its
    // contribution with it: follow each contribution to where it ends.
    p.included_flag_.assign(n, false);
    for (rank_t v = 0; v < n; ++v) {
      if (!g_.alive(v)) {
        p.excluded_.push_back({v, "fully degraded"});
        continue;
      }
      if (!alive(v)) {
        p.excluded_.push_back({v, "cut off: no usable links join it to the largest part of the grid"});
        continue;
      }
      if (reaches[v]) {
        p.included_flag_[v] = true;
        p.included_.push_back(v);
      } else {
        p.excluded_.push_back({v, reason[v].empty() ? std::string("cut off from the core") : reason[v]});
      }
    }
    return p;
  }

  /// Every member joins its nearest exit: a breadth-first search from all exits at
  /// once over the sub-network's usable links.
  void build_forest(sub_network& s) {
    s.parent.assign(s.members.size(), npos);
    s.depth.assign(s.members.size(), 0);
    auto index = [&](rank_t v) {
      const auto it = std::lower_bound(s.members.begin(), s.members.end(), v);
      return it != s.members.end() && *it == v ? static_cast<std::size_t>(it - s.members.begin()) : npos;
    };
    std::deque<std::size_t> queue;
    for (const forwarding_exit& e : s.exits) {
      const std::size_t i = index(e.exit);
      s.parent[i] = e.exit;
      queue.push_back(i);
    }
    while (!queue.empty()) {
      const std::size_t i = queue.front();
      queue.pop_front();
      g_.for_each_usable_neighbour(s.members[i], [&](rank_t w) {
        const std::size_t j = index(w);
        if (j == npos || s.parent[j] != npos) return;
        s.parent[j] = s.members[i];
        s.depth[j] = s.depth[i] + 1;
        queue.push_back(j);
      });
    }
    for (std::size_t i = 0; i < s.members.size(); ++i)
      if (s.parent[i] == npos) s.parent[i] = s.members[i];  // no exit: the whole sub-network is excluded
  }

  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  const grid& g_;
  grid_shape shape_;
  planner_options options_;
  std::vector<std::vector<bool>> keep_;
  bool contiguous_;  // the degraded set's shape decides the order's first dimension and the hosting
  bool hosting_ = false;
  std::size_t first_dimension_ = 0;
  std::vector<rank_t> host_;  // during planning: the host of each hosted place
  std::vector<bool> joined_;  // the largest part of the grid joined by usable links
};

/// Plans the reduction of every alive node's vector on `g` (see the file comment).
/// Planning a 32×32×16 torus with 1 % of its nodes degraded takes well under a
/// second (benchmarks/grid_plan_bench).
/// @par Dimension order
/// Unless options.dimension_order gives it: when the degraded set is not contiguous,
/// a dimension with at least one clean group comes first; then the dimension with
/// the fewest nodes degraded along it (so partially degraded nodes' broken links are
/// avoided); ties, and the remaining dimensions, go to the order that keeps the
/// largest core, then includes the most nodes, then forwards over the fewest hops
/// (every order is tried up to 5 dimensions).
/// @par Errors
/// qcoll::error (invalid_argument) for a dimension_order that is not a permutation.
inline reduction_plan plan_reduction(const grid& g, planner_options options = {}) {
  return planner(g, std::move(options)).run();
}

}  // namespace qcoll::topologies
