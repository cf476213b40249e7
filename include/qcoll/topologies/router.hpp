#pragma once
/// @file
/// The router for reductions on meshes and tori with degraded nodes (spec
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
///  - Hosting (qcoll's addition, routing_options::host_degraded): a fully degraded
///    node may keep its place in the core, played by a neighbour, instead of making
///    its groups forward; by default when the faults are scattered.
///
/// Over 500 lines: one algorithm (the spec's §3–7) in one class whose stages share the
/// grid, the faults and the routes found so far; 105 of its lines are the rules above and
/// the comments on them. What is not the router already lives beside it (below).
///
/// This header holds the router: routing_options, route_grid. It includes what
/// that needs and gives: routing.hpp (the grid_routing it returns, describe() and
/// draw()), grid_paths.hpp (the path queries and breadth-first walks it routes with)
/// and grid_drawing.hpp (the 2-D ASCII layout draw() uses).

#include <qcoll/core/partition.hpp>
#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/grid_paths.hpp>
#include <qcoll/topologies/routing.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace qcoll::topologies {

/// What becomes of a fully degraded node's place in the core.
enum class hosting : std::uint8_t {
  /// hosted when the degraded set is not contiguous (scattered faults), forwarded
  /// when it is (a failed region): measured, each is the better one there
  /// (docs/grid-allreduce.md, benchmarks/grid_routing_bench)
  automatic,
  always,  ///< played by the alive node before it along the first dimension (its host)
  never,   ///< its groups forward, as in the spec's process (its figures)
};

struct routing_options {
  /// The dimensions in the order they are reduced; empty: the spec's heuristics (see
  /// route_grid).
  std::vector<std::size_t> dimension_order = {};
  forwarding mode = forwarding::sub_networks;
  /// Keep a fully degraded node's place in the core, played by the alive node before
  /// it along the first dimension (its *host*), instead of making its whole group
  /// forward. Scattered faults then cost a few hosts some extra work instead of a
  /// smaller core; a failed region is cheaper forwarded. `never` gives the spec's
  /// process exactly (its figures).
  hosting host_degraded = hosting::automatic;
};

/// Builds plans; route_grid() is the entry point.
class router {
 public:
  router(const grid& g, routing_options options)
      : g_(g), shape_(g.shape()), options_(std::move(options)), contiguous_(degraded_set_contiguous()) {}

  grid_routing run() {
    if (!options_.dimension_order.empty()) return route_in(checked_order(options_.dimension_order));
    // The spec's heuristics decide the first dimension; the rest, and ties, go to
    // the order that keeps the largest core (then includes the most nodes, then
    // forwards over the fewest hops). Up to 5 dimensions every order is tried.
    std::vector<std::size_t> order(shape_.dimensions());
    std::iota(order.begin(), order.end(), std::size_t{0});
    const std::vector<std::size_t> keys = heuristic_keys();
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return keys[a] != keys[b] ? keys[a] < keys[b] : a > b;
    });
    if (order.size() > 5) return route_in(order);
    std::optional<grid_routing> best;
    std::vector<std::size_t> candidate = order;
    std::sort(candidate.begin(), candidate.end());
    do {
      if (keys[candidate[0]] != keys[order[0]]) continue;
      grid_routing p = route_in(candidate);
      if (!best || better(p, *best)) best = std::move(p);
    } while (std::next_permutation(candidate.begin(), candidate.end()));
    return std::move(*best);
  }

 private:
  static bool better(const grid_routing& a, const grid_routing& b) {
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
                            "route_grid: dimension_order must be a permutation of 0..{}", shape_.dimensions() - 1);
      seen[d] = true;
    }
    if (order.size() != shape_.dimensions())
      detail::throw_error(errc::invalid_argument, "route_grid: dimension_order names {} of {} dimensions",
                          order.size(), shape_.dimensions());
    return order;
  }

  /// Spec §2: every degraded node (along any dimension) reaches every other through
  /// degraded nodes only.
  bool degraded_set_contiguous() const {
    std::vector<bool> degraded(shape_.size(), false);
    for (rank_t v = 0; v < shape_.size(); ++v)
      for (std::size_t d = 0; d < shape_.dimensions(); ++d)
        if (g_.degraded_along(v, d)) degraded[v] = true;
    return joined_in_shape(shape_, degraded);
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
    const std::vector<bool> reached = reached_along_line(g_, shape_.with_coordinate(v, d, members[0]), d);
    for (std::size_t c : members)
      if (!reached[c]) return false;
    return true;
  }

  /// The stage of dimension d: drops the indices (of other dimensions) of the
  /// forwarding groups, greedily the index that removes the most of them (in 2-D
  /// exactly the forwarding groups). When no other dimension has an index to
  /// spare, the line itself shrinks to its usable part.
  void classify(std::size_t d, routing_stage& stage) {
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
          const std::vector<bool> reached = reached_along_line(g_, shape_.with_coordinate(v, d, c), d);
          for (std::size_t p = 0; p < shape_.extent(d); ++p)
            if (reached[p] && keep_[d][p] && !seen[p]) {
              seen[p] = true;
              component.push_back(p);
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

  /// The forwarding of one stage: the alive nodes in `leaving` go to the nodes of
  /// `staying` (the stage's sub-network).
  void forward(routing_stage& stage, const std::vector<bool>& leaving, const std::vector<bool>& staying) {
    const std::size_t n = shape_.size();
    // Each node's next hop towards its nearest node of the sub-network over usable
    // links, leaving the stage's line first.
    const std::vector<rank_t> next = next_hops(g_, staying, stage.dimension);
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
        if (next[m] != no_next_hop) nearest = std::min(nearest, path_to_target(m, next).size());
      if (nearest != npos)
        for (rank_t m : members)
          if (next[m] != no_next_hop && path_to_target(m, next).size() == nearest) {
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

  grid_routing route_in(const std::vector<std::size_t>& order) {
    const bool host = options_.host_degraded == hosting::always ||
                      (options_.host_degraded == hosting::automatic && !contiguous_);
    return route_in(order, host);
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

  grid_routing route_in(const std::vector<std::size_t>& order, bool hosting) {
    const std::size_t n = shape_.size();
    hosting_ = hosting;
    if (hosting_ && joined_.empty()) joined_ = g_.largest_joined_part();
    first_dimension_ = order.front();
    host_.assign(n, npos);
    grid_routing p;
    p.shape_ = shape_;
    p.links_ = g_;
    p.mode_ = options_.mode;
    p.order_ = order;
    keep_.assign(shape_.dimensions(), {});
    for (std::size_t d = 0; d < shape_.dimensions(); ++d) keep_[d].assign(shape_.extent(d), true);

    std::vector<bool> before(n), after(n);
    for (rank_t v = 0; v < n; ++v) before[v] = true;
    for (std::size_t d : order) {
      routing_stage stage;
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
    p.core_position_.assign(n, grid_routing::npos);
    p.host_.assign(n, grid_routing::npos);
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
            reason[m] = qcoll::detail::format("no route from it{} to the core at the stage of dimension {}",
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

  /// Every member joins its nearest exit (grid_paths.hpp's nearest_root_forest); a
  /// sub-network without exits is excluded, its members their own parents.
  void build_forest(sub_network& s) {
    std::vector<rank_t> exits;
    for (const forwarding_exit& e : s.exits) exits.push_back(e.exit);
    walk_forest forest = nearest_root_forest(g_, s.members, exits);
    s.parent = std::move(forest.parent);
    s.depth = std::move(forest.depth);
  }

  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  const grid& g_;
  grid_shape shape_;
  routing_options options_;
  std::vector<std::vector<bool>> keep_;
  bool contiguous_;  // the degraded set's shape decides the order's first dimension and the hosting
  bool hosting_ = false;
  std::size_t first_dimension_ = 0;
  std::vector<rank_t> host_;  // while routing: the host of each hosted place
  std::vector<bool> joined_;  // the largest part of the grid joined by usable links
};

/// Routes the reduction of every alive node's vector on `g` (see the file comment).
/// Routing a 32×32×16 torus with 1 % of its nodes degraded takes well under a
/// second (benchmarks/grid_routing_bench).
/// @par Dimension order
/// Unless options.dimension_order gives it: when the degraded set is not contiguous,
/// a dimension with at least one clean group comes first; then the dimension with
/// the fewest nodes degraded along it (so partially degraded nodes' broken links are
/// avoided); ties, and the remaining dimensions, go to the order that keeps the
/// largest core, then includes the most nodes, then forwards over the fewest hops
/// (every order is tried up to 5 dimensions).
/// @par Errors
/// qcoll::error (invalid_argument) for a dimension_order that is not a permutation.
inline grid_routing route_grid(const grid& g, routing_options options = {}) {
  return router(g, std::move(options)).run();
}

}  // namespace qcoll::topologies
