// The grid router on large degraded tori: how long planning takes, and what the
// planned allreduce costs on the grid next to the healthy torus and the naive
// rerouting baseline (algorithms/grid_cost.hpp), without running anything.
//
//   grid_routing_bench [-b BYTES] [--bits 32|1] [--seeds N]
//
// (a) route_grid on a 32×32×16 torus with 1 % of its nodes (164) fully degraded
//     at random, seeds 1..N (default 5): min/median/max milliseconds, core, included.
// (b) one row per (scenario, algorithm):
//       healthy    the same shape with no faults (the rows' reference)
//       qcoll      route_grid's default: hosting when the faults are scattered,
//                  forwarding by sub-network (spec process 900) when contiguous
//       forward    hosting::never: the spec's process, by sub-network (process 900)
//       per-node   hosting::never, forwarding::per_node: every node sends its own
//                  vector (process 800)
//       host       hosting::always: degraded nodes' places played by their hosts
//       flat-ring  one ring over the alive nodes in snake order, rerouted around the
//                  dead ones (flat_ring_cost): what a library does without a router
//     Columns: incl (contributions in the result), core (the plan's core places),
//     steps, messages, maxlink(B) (the most bytes on one directed link), maxnode(B)
//     (the most in + out through one node, relaying included), total(B) (bytes × hops
//     over all links), link×/node× (maxlink, maxnode over the healthy torus's), the
//     hottest link and node, and ms (planning, scheduling and costing that row).
// The buffer is -b bytes of float32 (default 256M: 64 Mi values); --bits 32 charges
// 4 bytes per value, --bits 1 one_bit-like frames of values/8 + 24 bytes.

#include "bench_args.hpp"

#include <qcoll/algorithms/grid_cost.hpp>
#include <qcoll/algorithms/grid_schedule.hpp>
#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/router.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using namespace qcoll;
namespace topo = qcoll::topologies;
using algorithms::grid_cost;
using algorithms::grid_schedule;

struct options {
  std::size_t bytes = std::size_t{256} << 20;
  unsigned bits = 32;
  int seeds = 5;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("option {} needs a value", flag));
    const std::string value = argv[i + 1];
    if (flag == "-b") o.bytes = bench::parse_bytes(value);
    else if (flag == "--bits") o.bits = static_cast<unsigned>(std::stoul(value));
    else if (flag == "--seeds") o.seeds = std::stoi(value);
    else throw std::invalid_argument(fmt::format("unknown option {} (-b BYTES, --bits 32|1, --seeds N)", flag));
  }
  if (o.bits != 32 && o.bits != 1) throw std::invalid_argument("--bits is 32 or 1");
  if (o.bytes < 4 || o.seeds < 1) throw std::invalid_argument("need -b >= 4 and --seeds >= 1");
  return o;
}

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

/// `how_many` distinct nodes of `n`, fully degraded. A partial Fisher–Yates shuffle on
/// mt19937_64's raw output, so every standard library picks the same nodes.
topo::grid_faults scattered(std::size_t n, std::size_t how_many, std::uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<rank_t> nodes(n);
  for (rank_t v = 0; v < n; ++v) nodes[v] = v;
  topo::grid_faults faults;
  for (std::size_t i = 0; i < how_many; ++i) {
    std::swap(nodes[i], nodes[i + random() % (n - i)]);
    faults.nodes.push_back(topo::degraded_node::fully(nodes[i]));
  }
  return faults;
}

/// Every node whose coordinates all lie in [first, first + side) — a block.
topo::grid_faults block(const topo::grid_shape& shape, std::size_t first, std::size_t side) {
  topo::grid_faults faults;
  for (rank_t v = 0; v < shape.size(); ++v) {
    bool inside = true;
    for (std::size_t d = 0; d < shape.dimensions(); ++d)
      inside = inside && shape.coordinate(v, d) >= first && shape.coordinate(v, d) < first + side;
    if (inside) faults.nodes.push_back(topo::degraded_node::fully(v));
  }
  return faults;
}

std::size_t one_percent(std::size_t n) { return (n + 50) / 100; }

void planning_times(const options& o) {
  const std::vector<std::size_t> extents{32, 32, 16};
  const topo::grid_shape shape(extents, true);
  const std::size_t down = one_percent(shape.size());
  fmt::print("# (a) route_grid: 32×32×16 torus, {} of {} nodes fully degraded at random (seeds 1..{})\n", down,
             shape.size(), o.seeds);
  fmt::print("# {:>5} {:>10} {:>8} {:>9} {:>7} {:>9}\n", "seed", "plan(ms)", "core", "included", "order", "fwd.hops");
  std::vector<double> times;
  for (int seed = 1; seed <= o.seeds; ++seed) {
    const topo::torus g(extents, scattered(shape.size(), down, static_cast<std::uint64_t>(seed)));
    const auto start = clock_type::now();
    const topo::grid_routing plan = topo::route_grid(g);
    times.push_back(ms_since(start));
    std::string order;
    for (std::size_t d : plan.dimension_order()) order += std::to_string(d);
    fmt::print("  {:>5} {:>10.1f} {:>8} {:>9} {:>7} {:>9}\n", seed, times.back(), plan.core().size(),
               plan.included().size(), order, plan.forwarding_hops());
  }
  std::sort(times.begin(), times.end());
  fmt::print("# plan(ms) min {:.1f}, median {:.1f}, max {:.1f}\n#\n", times.front(), times[times.size() / 2],
             times.back());
}

struct scenario {
  std::string name;
  std::vector<std::size_t> extents;
  std::function<topo::grid_faults(const topo::grid_shape&)> faults;
};

void cost_table(const options& o) {
  const std::size_t count = o.bytes / 4;
  const grid_schedule::encoded_size_function encoded_size =
      o.bits == 32 ? grid_schedule::encoded_size_function([](std::size_t v) { return 4 * v; })
                   : grid_schedule::encoded_size_function([](std::size_t v) { return (v + 7) / 8 + 24; });
  const std::vector<scenario> scenarios{
      {"4x4 Fig.7",
       {4, 4},
       [](const topo::grid_shape&) {
         topo::grid_faults f;
         for (rank_t v : {0u, 1u, 4u, 5u}) f.nodes.push_back(topo::degraded_node::fully(v));
         return f;
       }},
      {"16x16 3x3 block", {16, 16}, [](const topo::grid_shape& s) { return block(s, 6, 3); }},
      {"32x32 1% scattered",
       {32, 32},
       [](const topo::grid_shape& s) { return scattered(s.size(), one_percent(s.size()), 1); }},
      {"8x8x8 2x2x2 block", {8, 8, 8}, [](const topo::grid_shape& s) { return block(s, 3, 2); }},
      {"32x32x16 1% scattered",
       {32, 32, 16},
       [](const topo::grid_shape& s) { return scattered(s.size(), one_percent(s.size()), 1); }},
  };
  fmt::print("# (b) one allreduce of {} float32 values ({} B) on each torus; on the wire: {}\n", count, count * 4,
             o.bits == 32 ? "4 B per value" : "one_bit-like frames of values/8 + 24 B");
  fmt::print("# {:<22} {:>9} {:>6} {:>6} {:>6} {:>9} {:>14} {:>14} {:>16} {:>6} {:>6} {:>27} {:>12} {:>6}\n",
             "scenario", "algorithm", "incl", "core", "steps", "messages", "maxlink(B)", "maxnode(B)", "total(B)",
             "link×", "node×", "hottest link", "hottest node", "ms");
  for (const scenario& s : scenarios) {
    const topo::grid_shape shape(s.extents, true);
    const topo::torus healthy(s.extents);
    const topo::torus degraded(s.extents, s.faults(shape));
    grid_cost reference;
    // A measurement returns the cost and the plan's core size (0: no core, the flat ring).
    auto row = [&](const char* algorithm, const std::function<std::pair<grid_cost, std::size_t>()>& measure) {
      const auto start = clock_type::now();
      const auto [c, core] = measure();
      const double ms = ms_since(start);
      if (std::string_view(algorithm) == "healthy") reference = c;
      const auto ratio = [](std::size_t a, std::size_t b) {
        return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
      };
      fmt::print(
          "  {:<22} {:>9} {:>6} {:>6} {:>6} {:>9} {:>14} {:>14} {:>16} {:>6.2f} {:>6.2f} {:>27} {:>12} {:>6.0f}\n",
          s.name, algorithm, c.contributions, core ? std::to_string(core) : "-", c.steps, c.messages, c.max_link_bytes,
          c.max_node_bytes, c.total_link_bytes, ratio(c.max_link_bytes, reference.max_link_bytes),
          ratio(c.max_node_bytes, reference.max_node_bytes),
          shape.name(c.hottest_link_from) + "→" + shape.name(c.hottest_link_to), shape.name(c.hottest_node), ms);
      std::fflush(stdout);
    };
    auto planned = [&](const topo::grid& g, topo::forwarding mode, topo::hosting host) {
      return [&g, mode, host, count, &encoded_size] {
        topo::routing_options po;
        po.mode = mode;
        po.host_degraded = host;
        const topo::grid_routing plan = topo::route_grid(g, po);
        return std::pair(algorithms::cost_of(grid_schedule(plan, count, 1, encoded_size)), plan.core().size());
      };
    };
    row("healthy", planned(healthy, topo::forwarding::sub_networks, topo::hosting::automatic));
    row("qcoll", planned(degraded, topo::forwarding::sub_networks, topo::hosting::automatic));
    row("forward", planned(degraded, topo::forwarding::sub_networks, topo::hosting::never));
    row("per-node", planned(degraded, topo::forwarding::per_node, topo::hosting::never));
    row("host", planned(degraded, topo::forwarding::sub_networks, topo::hosting::always));
    row("flat-ring",
        [&] { return std::pair(algorithms::flat_ring_cost(degraded, count, encoded_size), std::size_t{0}); });
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const options o = parse(argc, argv);
  const auto start = clock_type::now();
  planning_times(o);
  cost_table(o);
  fmt::print("# total {:.1f} s\n", ms_since(start) / 1000);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "grid_routing_bench: {}\n", e.what());
  return 2;
}
