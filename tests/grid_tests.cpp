// N-D meshes and tori with degraded nodes: the topology, the router (the spec's
// worked examples, and properties of random plans on 2-D to 4-D shapes), and the
// grid allreduce over the in-process transport with every quantizer.
#define BOOST_TEST_MODULE grid
#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>

#include "support/counting_transport.hpp"
#include "support/reference.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace qcoll;
namespace topo = qcoll::topologies;

namespace {

/// The spec's names on a 4×4 grid: node("b3") is row b, column 3.
rank_t node(const char* name) { return static_cast<rank_t>((name[0] - 'a') * 4 + (name[1] - '1')); }

topo::grid_faults fully(std::initializer_list<const char*> names) {
  topo::grid_faults faults;
  for (const char* n : names) faults.nodes.push_back(topo::degraded_node::fully(node(n)));
  return faults;
}

/// The spec's process (no hosting) unless `hosting`.
topo::routing_options options(std::vector<std::size_t> order, topo::forwarding mode, bool hosting = false) {
  topo::routing_options o;
  o.dimension_order = std::move(order);
  o.mode = mode;
  o.host_degraded = hosting ? topo::hosting::always : topo::hosting::never;
  return o;
}

/// The node that plays a schedule's end: the host of a core place.
rank_t player(const topo::grid_routing& plan, rank_t v) { return plan.in_core(v) ? plan.host_of(v) : v; }

/// Every route of a stage as "exit→receiver via n1 n2 …", and every tree edge as "m→parent".
std::set<std::string> routes_of(const topo::grid_routing& plan, std::size_t stage) {
  std::set<std::string> routes;
  const auto& shape = plan.shape();
  for (const topo::sub_network& s : plan.stages()[stage].sub_networks) {
    for (const topo::forwarding_exit& e : s.exits) {
      std::string text = fmt::format("{}→{} via", shape.name(e.exit), shape.name(e.receiver));
      for (rank_t v : e.path) text += fmt::format(" {}", shape.name(v));
      routes.insert(text);
    }
    for (std::size_t i = 0; i < s.members.size(); ++i)
      if (s.parent[i] != s.members[i]) routes.insert(fmt::format("{}→{}", shape.name(s.members[i]), shape.name(s.parent[i])));
  }
  return routes;
}

std::set<std::string> names(const topo::grid_routing& plan, std::span<const rank_t> nodes) {
  std::set<std::string> result;
  for (rank_t v : nodes) result.insert(plan.shape().name(v));
  return result;
}

std::set<std::string> excluded_names(const topo::grid_routing& plan) {
  std::set<std::string> result;
  for (const topo::excluded_node& e : plan.excluded()) result.insert(plan.shape().name(e.node));
  return result;
}

// ---- running a plan ----

template <class Q>
using grid_plan = grid_allreduce_plan<Q>;

/// What one world did: per rank, its outputs of each call and its error.
struct grid_outcome {
  std::vector<std::vector<std::vector<float>>> outputs;  // [rank][call]
  std::vector<std::error_code> codes;
  std::vector<std::string> messages;
};

/// Rank r runs `calls` calls of plans[r] with inputs[call][r]; `victim`'s transport
/// fails at its `fail_at`-th send. Plans live on the main thread so their residuals
/// can be inspected afterwards.
template <class Q>
grid_outcome run_plans(std::vector<std::unique_ptr<grid_plan<Q>>>& plans,
                       const std::vector<std::vector<std::vector<float>>>& inputs, reduce_op op,
                       rank_t victim = ~rank_t{0}, std::size_t fail_at = 0, bool started = false,
                       std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const std::size_t n = plans.size();
  grid_outcome outcome{std::vector<std::vector<std::vector<float>>>(n), std::vector<std::error_code>(n),
                       std::vector<std::string>(n)};
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    const rank_t r = endpoint.rank();
    communicator<test::counting_transport> comm(test::counting_transport(std::move(endpoint)),
                                                topologies::fully_connected(n), {.timeout = timeout});
    if (r == victim) comm.transport().fail_after_sends(fail_at);
    try {
      for (const auto& call : inputs) {
        std::vector<float> out(call[r].size());
        if (started) {
          comm.start_allreduce(*plans[r], std::span(call[r]), std::span(out), op);
          plans[r]->wait();
        } else {
          comm.allreduce(*plans[r], std::span(call[r]), std::span(out), op);
        }
        outcome.outputs[r].push_back(std::move(out));
      }
    } catch (const std::system_error& e) {
      outcome.codes[r] = e.code();
      outcome.messages[r] = e.what();
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return outcome;
}

template <class Q>
std::vector<std::unique_ptr<grid_plan<Q>>> make_plans(const topo::grid_routing& plan, std::size_t ranks,
                                                      std::size_t count, const Q& quantizer) {
  std::vector<std::unique_ptr<grid_plan<Q>>> plans;
  for (rank_t r = 0; r < ranks; ++r) plans.push_back(std::make_unique<grid_plan<Q>>(r, ranks, plan, count, quantizer));
  return plans;
}

/// Inputs whose sums are exact in float in any order: small integers.
std::vector<std::vector<std::vector<float>>> integer_inputs(std::size_t calls, std::size_t ranks, std::size_t count,
                                                            std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> value(-1000, 1000);
  std::vector<std::vector<std::vector<float>>> inputs(calls, std::vector<std::vector<float>>(ranks));
  for (auto& call : inputs)
    for (auto& rank : call) {
      rank.resize(count);
      for (float& x : rank) x = static_cast<float>(value(gen));
    }
  return inputs;
}

/// With identity every included rank gets exactly the sum (or average) of the
/// included ranks' inputs; excluded ranks are told why and take no part.
void check_exact_sums(const topo::grid_routing& plan, std::size_t count = 517, reduce_op op = reduce_op::sum) {
  const std::size_t n = plan.shape().size();
  auto plans = make_plans(plan, n, count, quantizers::identity<float>{});
  const auto inputs = integer_inputs(2, n, count, 11);
  const grid_outcome outcome = run_plans(plans, inputs, op);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST_INFO("node " << plan.shape().name(r) << ": " << outcome.messages[r]);
    if (!plan.is_included(r)) {
      BOOST_TEST(outcome.codes[r] == errc::invalid_argument);
      BOOST_TEST(outcome.messages[r].find("excludes") != std::string::npos);
      continue;
    }
    BOOST_TEST_REQUIRE(!outcome.codes[r]);
    for (std::size_t call = 0; call < inputs.size(); ++call) {
      std::vector<float> expected(count, 0.0f);
      for (rank_t v : plan.included())
        for (std::size_t i = 0; i < count; ++i) expected[i] += inputs[call][v][i];
      if (op == reduce_op::avg)
        for (float& x : expected) x /= static_cast<float>(plan.divisor());
      BOOST_TEST(outcome.outputs[r][call] == expected, boost::test_tools::per_element());
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grid_topology)

BOOST_AUTO_TEST_CASE(coordinates_neighbours_and_names) {
  const topo::grid_shape shape({3, 4, 2}, true);
  BOOST_TEST(shape.size() == 24u);
  const rank_t v = 1 * 8 + 2 * 2 + 1;  // (1, 2, 1): last dimension fastest
  BOOST_TEST(shape.coordinate(v, 0) == 1u);
  BOOST_TEST(shape.coordinate(v, 1) == 2u);
  BOOST_TEST(shape.coordinate(v, 2) == 1u);
  BOOST_TEST(shape.name(v) == "(1,2,1)");
  BOOST_TEST(*shape.neighbour(v, 1, +1) == v + 2);
  BOOST_TEST(*shape.neighbour(shape.with_coordinate(v, 1, 3), 1, +1) == shape.with_coordinate(v, 1, 0));  // wraps
  // Extent 2 on a torus: both directions reach the one neighbour over one link.
  BOOST_TEST(*shape.neighbour(v, 2, +1) == *shape.neighbour(v, 2, -1));
  const topo::grid_shape mesh({4, 1}, false);
  BOOST_TEST(!mesh.neighbour(0, 0, -1));                    // the edge of a mesh
  BOOST_TEST(!mesh.neighbour(0, 1, +1));                    // extent 1: no link
  BOOST_TEST(topo::grid_shape({4, 4}, false).name(node("b3")) == "b3");
  BOOST_TEST(*topo::grid_shape({4, 4}, false).link_dimension(node("b3"), node("c3")) == 0u);
  BOOST_TEST(!topo::grid_shape({4, 4}, false).link_dimension(node("a1"), node("a4")));
  BOOST_TEST(*topo::grid_shape({4, 4}, true).link_dimension(node("a1"), node("a4")) == 1u);
}

BOOST_AUTO_TEST_CASE(faults_resolve_into_usable_links) {
  topo::grid_faults faults;
  faults.nodes = {topo::degraded_node::fully(node("a1")), topo::degraded_node::along_dimensions(node("c3"), {1})};
  faults.broken_links = {{node("b2"), node("b3")}};
  const topo::mesh grid({4, 4}, faults);
  BOOST_TEST(!grid.alive(node("a1")));
  BOOST_TEST(grid.alive(node("c3")));  // partially degraded nodes still contribute
  BOOST_TEST(!grid.linked(node("a1"), node("a2")));
  BOOST_TEST(!grid.linked(node("c3"), node("c4")));  // along rows
  BOOST_TEST(grid.linked(node("c3"), node("d3")));   // along columns
  BOOST_TEST(!grid.linked(node("b2"), node("b3")));
  BOOST_TEST(grid.linked(node("b3"), node("b4")));
  BOOST_TEST(!grid.linked(node("a2"), node("a4")));  // not neighbours
  // The neighbour rule: c4's only neighbour along rows (c3) is degraded along rows.
  BOOST_TEST(grid.degraded_along(node("c4"), 1));
  BOOST_TEST(!grid.degraded_along(node("c4"), 0));
  BOOST_TEST(grid.marked_by_neighbour_rule().size() == 1u);

  topo::grid_faults all_partial = faults;
  all_partial.partial_as_full = true;
  BOOST_TEST(!topo::mesh({4, 4}, all_partial).alive(node("c3")));
}

BOOST_AUTO_TEST_CASE(bad_shapes_and_faults_are_refused) {
  auto refused = [](auto make) {
    try {
      make();
    } catch (const qcoll::error& e) {
      return e.code() == errc::invalid_argument;
    }
    return false;
  };
  BOOST_TEST(refused([] { topo::mesh({4, 0}); }));
  BOOST_TEST(refused([] { topo::mesh(std::vector<std::size_t>{}); }));
  BOOST_TEST(refused([] { topo::mesh({2, 2}, {.nodes = {topo::degraded_node::fully(4)}}); }));
  BOOST_TEST(refused([] { topo::mesh({2, 2}, {.nodes = {topo::degraded_node::along_dimensions(0, {2})}}); }));
  BOOST_TEST(refused([] { topo::mesh({4, 4}, {.nodes = {}, .broken_links = {{node("a1"), node("b2")}}}); }));
  BOOST_TEST(refused([] { topo::route_grid(topo::mesh({4, 4}), options({0, 0}, topo::forwarding::per_node)); }));
  BOOST_TEST(refused([] { topo::route_grid(topo::mesh({4, 4}), options({1}, topo::forwarding::per_node)); }));
}

BOOST_AUTO_TEST_SUITE_END()

// The spec's worked examples (degraded-torus.md §6), on 4×4 grids: the routes of the
// figures, and exact sums through the executor with the identity quantizer.
BOOST_AUTO_TEST_SUITE(grid_routing_figures)

BOOST_AUTO_TEST_CASE(healthy_torus_is_all_core_with_no_forwarding) {
  const auto plan = topo::route_grid(topo::torus({4, 4}));
  BOOST_TEST(plan.core().size() == 16u);
  BOOST_TEST(plan.divisor() == 16u);
  BOOST_TEST(plan.excluded().empty());
  for (const auto& stage : plan.stages()) BOOST_TEST(stage.sub_networks.empty());
  // Per-dimension rings use the wraparound: a1's row ring closes a4 → a1 in one hop.
  const std::vector<rank_t> row = plan.core_line(node("a1"), 1);
  BOOST_TEST(plan.core_path(row.back(), row.front(), 1).size() == 2u);
  check_exact_sums(plan);
  check_exact_sums(plan, 517, reduce_op::avg);
}

// Fig. 5a: b2, b3, c2, c3 degraded along rows only. Reducing along columns first (the
// heuristic: no node is degraded along them) avoids the broken row links; rows b
// and c then forward down their columns: c1→d1, b1→a1, b4→a4, c4→d4, as in the
// figure — and b2, b3, c2, c3 too, since their column links work.
BOOST_AUTO_TEST_CASE(figure_5a_partial_degradation_along_rows) {
  topo::grid_faults faults;
  for (const char* n : {"b2", "b3", "c2", "c3"})
    faults.nodes.push_back(topo::degraded_node::along_dimensions(node(n), {1}));
  const topo::mesh grid({4, 4}, faults);
  const auto plan = topo::route_grid(grid, options({}, topo::forwarding::per_node));
  BOOST_TEST(plan.dimension_order()[0] == 0u);
  BOOST_TEST(plan.stages()[1].forwarding_groups == 2u);  // rows b and c
  const auto routes = routes_of(plan, 1);
  for (const char* r : {"c1→d1 via c1 d1", "b1→a1 via b1 a1", "b4→a4 via b4 a4", "c4→d4 via c4 d4",
                        "b2→a2 via b2 a2", "c3→d3 via c3 d3"})
    BOOST_TEST(routes.count(r) == 1u, r);
  BOOST_TEST(names(plan, plan.core()) == (std::set<std::string>{"a1", "a2", "a3", "a4", "d1", "d2", "d3", "d4"}));
  BOOST_TEST(plan.divisor() == 16u);
  check_exact_sums(plan);
}

// Fig. 5b: a1, a2, b1, b2 degraded; reduce along rows. a3, b3 → c3 (a3 via b3);
// a4, b4 → c4; rows c and d reduce.
BOOST_AUTO_TEST_CASE(figure_5b_forwarding_around_a_block) {
  const topo::mesh grid({4, 4}, fully({"a1", "a2", "b1", "b2"}));
  const auto plan = topo::route_grid(grid, options({1, 0}, topo::forwarding::per_node));
  BOOST_TEST(routes_of(plan, 0) == (std::set<std::string>{"a3→c3 via a3 b3 c3", "b3→c3 via b3 c3",
                                                          "a4→c4 via a4 b4 c4", "b4→c4 via b4 c4"}));
  BOOST_TEST(plan.stages()[0].critical_groups == 2u);
  BOOST_TEST(names(plan, plan.core()) == (std::set<std::string>{"c1", "c2", "c3", "c4", "d1", "d2", "d3", "d4"}));
  BOOST_TEST(excluded_names(plan) == (std::set<std::string>{"a1", "a2", "b1", "b2"}));
  BOOST_TEST(plan.divisor() == 12u);
  // The picture: # core, letters forwarding nodes, X degraded, arrows the routes.
  BOOST_TEST(plan.draw() ==
             "    1   2   3   4\n"
             "a   X   X   A - B\n"
             "            v   v\n"
             "b   X   X   C - D\n"
             "            v   v\n"
             "c   # - # - # - #\n"
             "    |   |   |   |\n"
             "d   # - # - # - #\n");
  check_exact_sums(plan);
  check_exact_sums(plan, 517, reduce_op::avg);
}

// Fig. 5c: a1, b2, d4 degraded (not contiguous); row c is the only clean row.
// b1, d1 → c1; a3, b3, d3 → c3; a4, b4 → c4; d2 → c2 by the general rule. The text
// leaves a2 out (b2 blocks its column); the router routes it along its row and
// down column 3 instead, so it is included.
BOOST_AUTO_TEST_CASE(figure_5c_non_contiguous_faults) {
  const topo::mesh grid({4, 4}, fully({"a1", "b2", "d4"}));
  const auto plan = topo::route_grid(grid, options({1, 0}, topo::forwarding::per_node));
  BOOST_TEST(routes_of(plan, 0) ==
             (std::set<std::string>{"b1→c1 via b1 c1", "d1→c1 via d1 c1", "a3→c3 via a3 b3 c3", "b3→c3 via b3 c3",
                                    "d3→c3 via d3 c3", "a4→c4 via a4 b4 c4", "b4→c4 via b4 c4", "d2→c2 via d2 c2",
                                    "a2→c3 via a2 a3 b3 c3"}));
  BOOST_TEST(names(plan, plan.core()) == (std::set<std::string>{"c1", "c2", "c3", "c4"}));
  BOOST_TEST(plan.divisor() == 13u);
  // The heuristic: the degraded set is not contiguous, so the first dimension must
  // have a clean group (both do here: row c, column 3).
  const auto heuristic = topo::route_grid(grid, options({}, topo::forwarding::sub_networks));
  BOOST_TEST(heuristic.stages()[0].critical_groups >= 1u);
  check_exact_sums(plan);
  check_exact_sums(heuristic);
}

// Fig. 6: b2, a3, b3 degraded; reduce along columns: columns 2 and 3 forward, 1 and 4
// are critical. Sub-networks {a2} → a1 and {c2, c3, d2, d3} → c1, d1, c4, d4: the
// figure sends one internal vector to four receivers; here each of the four is an
// exit carrying only its own tree (itself), so nothing is counted twice.
BOOST_AUTO_TEST_CASE(figure_6_sub_networks_with_several_receivers) {
  const topo::mesh grid({4, 4}, fully({"b2", "a3", "b3"}));
  const auto plan = topo::route_grid(grid, options({}, topo::forwarding::sub_networks));
  BOOST_TEST(plan.dimension_order()[0] == 0u);  // the heuristic picks columns, as the figure
  const auto& stage = plan.stages()[0];
  BOOST_TEST(stage.critical_groups == 2u);
  BOOST_TEST(stage.forwarding_groups == 2u);
  BOOST_TEST(stage.sub_networks.size() == 2u);
  BOOST_TEST(names(plan, stage.sub_networks[0].members) == (std::set<std::string>{"a2"}));
  BOOST_TEST(names(plan, stage.sub_networks[1].members) == (std::set<std::string>{"c2", "c3", "d2", "d3"}));
  BOOST_TEST(routes_of(plan, 0) == (std::set<std::string>{"a2→a1 via a2 a1", "c2→c1 via c2 c1", "c3→c4 via c3 c4",
                                                          "d2→d1 via d2 d1", "d3→d4 via d3 d4"}));
  BOOST_TEST(plan.divisor() == 13u);
  check_exact_sums(plan);
}

// Fig. 7: a1, a2, b1, b2 degraded on a torus; reduce along columns. {c1, c2, d1, d2}
// is one sub-network (the wraparound counts for contiguity). On a mesh its exits
// are c2 → c3 and d2 → d3, as in the figure, with c1 and d1 summing into them; on
// the torus c1 and d1 also reach column 4 over the wraparound, so four exits share
// the forwarding.
BOOST_AUTO_TEST_CASE(figure_7_torus_sub_network) {
  const auto faults = fully({"a1", "a2", "b1", "b2"});
  const auto on_mesh = topo::route_grid(topo::mesh({4, 4}, faults), options({0, 1}, topo::forwarding::sub_networks));
  BOOST_TEST(routes_of(on_mesh, 0) ==
             (std::set<std::string>{"c2→c3 via c2 c3", "d2→d3 via d2 d3", "c1→c2", "d1→d2"}));
  const auto on_torus =
      topo::route_grid(topo::torus({4, 4}, faults), options({0, 1}, topo::forwarding::sub_networks));
  BOOST_TEST(on_torus.stages()[0].sub_networks.size() == 1u);
  BOOST_TEST(routes_of(on_torus, 0) ==
             (std::set<std::string>{"c2→c3 via c2 c3", "d2→d3 via d2 d3", "c1→c4 via c1 c4", "d1→d4 via d1 d4"}));
  BOOST_TEST(names(on_torus, on_torus.core()) ==
             (std::set<std::string>{"a3", "a4", "b3", "b4", "c3", "c4", "d3", "d4"}));
  check_exact_sums(on_mesh);
  check_exact_sums(on_torus);
}

BOOST_AUTO_TEST_CASE(unreachable_nodes_are_excluded_with_the_reason) {
  // d1 is walled in by c1 and d2 on a mesh: alive but cut off.
  const topo::mesh grid({4, 4}, fully({"c1", "d2"}));
  auto reason_of_d1 = [](const topo::grid_routing& plan) {
    for (const auto& e : plan.excluded())
      if (e.node == node("d1")) return e.reason;
    return std::string("(included)");
  };
  const auto spec = topo::route_grid(grid, options({}, topo::forwarding::sub_networks));
  BOOST_TEST(reason_of_d1(spec) == "no route from it to the core at the stage of dimension 0");
  BOOST_TEST(spec.describe().find("excluded d1: no route") != std::string::npos);
  // The neighbour rule marks d1 degraded too, so the degraded set {c1, d1, d2} is
  // contiguous and the default forwards; hosting must be asked for.
  const auto hosted = topo::route_grid(grid, options({}, topo::forwarding::sub_networks, true));
  BOOST_TEST(reason_of_d1(hosted) == "cut off: no usable links join it to the largest part of the grid");
  BOOST_TEST(hosted.hosted() == 3u);  // c1, d2 and the cut-off d1 keep their places
  for (const auto* plan : {&spec, &hosted}) {
    BOOST_TEST(plan->divisor() == 13u);
    check_exact_sums(*plan);
  }
}

// Hosting (the default): a fully degraded node keeps its place in the core, played
// by the alive node before it along the first dimension, so scattered faults cost a
// few hosts some extra work instead of whole groups forwarding.
BOOST_AUTO_TEST_CASE(degraded_nodes_are_hosted_by_default) {
  const auto plan = topo::route_grid(topo::torus({4, 4}, fully({"b2", "d3"})));
  const std::size_t first = plan.dimension_order()[0];
  BOOST_TEST(plan.core().size() == 16u);
  BOOST_TEST(plan.hosted() == 2u);
  for (const auto& stage : plan.stages()) BOOST_TEST(stage.sub_networks.empty());
  // The host is the alive node before it along the first dimension.
  const rank_t b2 = node("b2");
  const rank_t expected_host = plan.shape().with_coordinate(b2, first, plan.shape().coordinate(b2, first) - 1);
  BOOST_TEST(plan.host_of(b2) == expected_host);
  BOOST_TEST(plan.host_of(node("a1")) == node("a1"));
  BOOST_TEST(plan.describe().find("2 hosted: b2 by") != std::string::npos);
  BOOST_TEST(plan.divisor() == 14u);
  check_exact_sums(plan);
  // A 3-D torus with scattered faults keeps every place.
  topo::grid_faults faults;
  for (rank_t v : {5u, 22u, 40u}) faults.nodes.push_back(topo::degraded_node::fully(v));
  const auto cube = topo::route_grid(topo::torus({4, 4, 3}, faults));
  BOOST_TEST(cube.core().size() == 48u);
  BOOST_TEST(cube.hosted() == 3u);
  check_exact_sums(cube);
}

BOOST_AUTO_TEST_SUITE_END()

// Random shapes of 2 to 4 dimensions (extents 1 to 5, mesh or torus) with random
// fully and partially degraded nodes and broken links: every plan is checked
// through its schedule, symbolically.
BOOST_AUTO_TEST_SUITE(grid_routing_properties)

namespace {

struct random_case {
  topo::grid grid;
  topo::routing_options options;
};

random_case make_random_case(std::mt19937_64& gen, std::size_t max_nodes) {
  std::uniform_int_distribution<std::size_t> dims(2, 4), extent(1, 5);
  std::uniform_real_distribution<double> uniform(0, 1);
  std::vector<std::size_t> extents;
  do {
    extents.assign(dims(gen), 0);
    for (auto& e : extents) e = extent(gen);
  } while (std::accumulate(extents.begin(), extents.end(), std::size_t{1}, std::multiplies<>()) > max_nodes);
  const topo::grid_shape shape(extents, uniform(gen) < 0.5);
  const double p_full = uniform(gen) * 0.2, p_partial = uniform(gen) * 0.1, p_link = uniform(gen) * 0.1;
  topo::grid_faults faults;
  for (rank_t v = 0; v < shape.size(); ++v) {
    if (uniform(gen) < p_full) faults.nodes.push_back(topo::degraded_node::fully(v));
    else if (uniform(gen) < p_partial)
      faults.nodes.push_back({v, std::uniform_int_distribution<std::uint64_t>(1, (1u << extents.size()) - 1)(gen)});
    for (std::size_t d = 0; d < extents.size(); ++d)
      if (auto w = shape.neighbour(v, d, +1); w && *w != v && uniform(gen) < p_link) faults.broken_links.push_back({v, *w});
  }
  topo::routing_options o;
  o.mode = uniform(gen) < 0.5 ? topo::forwarding::sub_networks : topo::forwarding::per_node;
  o.host_degraded = std::array{topo::hosting::automatic, topo::hosting::always,
                                topo::hosting::never}[std::uniform_int_distribution<int>(0, 2)(gen)];
  if (uniform(gen) < 0.3) {
    o.dimension_order.resize(extents.size());
    std::iota(o.dimension_order.begin(), o.dimension_order.end(), std::size_t{0});
    std::shuffle(o.dimension_order.begin(), o.dimension_order.end(), gen);
  }
  return {topo::grid(shape, faults), o};
}

/// Alive nodes connected to the core over usable links.
std::vector<bool> connected_to_core(const topo::grid& g, const topo::grid_routing& plan) {
  std::vector<bool> seen(g.size(), false);
  std::vector<rank_t> queue;
  for (rank_t v : plan.core())
    if (!seen[plan.host_of(v)]) queue.push_back(plan.host_of(v)), seen[plan.host_of(v)] = true;
  for (std::size_t i = 0; i < queue.size(); ++i)
    for (std::size_t d = 0; d < g.shape().dimensions(); ++d)
      for (int direction : {+1, -1})
        if (auto w = g.usable_neighbour(queue[i], d, direction); w && !seen[*w]) {
          seen[*w] = true;
          queue.push_back(*w);
        }
  return seen;
}

/// Runs the schedule on symbols: each node holds, per leaf, how many times each
/// node's contribution is in its partial sum, and which leaf frames it has. A step's
/// transfers all read the state from before the step.
void check_schedule(const topo::grid& g, const topo::grid_routing& plan) {
  const std::size_t n = g.size(), leaves = plan.leaves();
  const std::size_t count = 3 * std::max<std::size_t>(leaves, 1);
  const algorithms::grid_schedule schedule(plan, count, 1, [](std::size_t v) { return 4 * v + 8; });
  auto leaves_of = [&](block_range values) {
    std::pair<std::size_t, std::size_t> result{leaves, 0};
    for (std::size_t l = 0; l < leaves; ++l) {
      const block_range lv = schedule.leaf_values(l);
      if (lv.offset >= values.offset && lv.offset + lv.size <= values.offset + values.size)
        result = {std::min(result.first, l), std::max(result.second, l + 1)};
    }
    return result;
  };
  // counts[node][leaf][contributor]
  std::vector<std::vector<std::vector<int>>> counts(n, std::vector<std::vector<int>>(leaves, std::vector<int>(n, 0)));
  std::vector<std::vector<bool>> has_frame(n, std::vector<bool>(leaves, false));
  for (rank_t v = 0; v < n; ++v)
    if (g.alive(v))
      for (std::size_t l = 0; l < leaves; ++l) counts[v][l][v] = 1;
  const auto transfers = schedule.transfers();
  for (std::size_t begin = 0; begin < transfers.size();) {
    std::size_t end = begin;
    while (end < transfers.size() && transfers[end].step == transfers[begin].step) ++end;
    const auto before = counts;
    auto frames_before = has_frame;
    for (std::size_t i = begin; i < end; ++i) {
      const algorithms::grid_transfer& t = transfers[i];
      // Every route crosses usable links only, so never a degraded node.
      const rank_t from = player(plan, t.from), to = player(plan, t.to);
      const std::vector<rank_t> hops = schedule.hops(t);
      BOOST_TEST_REQUIRE(hops.size() >= 2u);
      BOOST_TEST(hops.front() == from);
      BOOST_TEST(hops.back() == to);
      for (std::size_t h = 0; h + 1 < hops.size(); ++h) BOOST_TEST(g.linked(hops[h], hops[h + 1]));
      BOOST_TEST(plan.is_included(from));
      BOOST_TEST(plan.is_included(to));
      BOOST_TEST(from != to);
      if (t.phase == algorithms::grid_phase::forward || t.phase == algorithms::grid_phase::reduce) {
        const auto [first, last] = leaves_of(t.values);
        BOOST_TEST(first < last);
        for (std::size_t l = first; l < last; ++l)
          for (rank_t c = 0; c < n; ++c) counts[to][l][c] += before[from][l][c];
      } else {
        for (std::size_t l = t.first_leaf; l < t.last_leaf; ++l) {
          const bool own_leaf = plan.host_of(plan.core_of_leaf(l)) == from;  // it finished that leaf itself
          BOOST_TEST((frames_before[from][l] || own_leaf));  // it has what it sends
          BOOST_TEST(!has_frame[to][l]);                     // and nobody gets a frame twice
          BOOST_TEST(plan.host_of(plan.core_of_leaf(l)) != to);
          has_frame[to][l] = true;
        }
      }
    }
    begin = end;
  }
  // Exactly once: each leaf's owner holds every included contribution once, nothing else.
  for (std::size_t l = 0; l < leaves; ++l) {
    const rank_t owner = plan.host_of(plan.core_of_leaf(l));
    for (rank_t c = 0; c < n; ++c) {
      BOOST_TEST_INFO("leaf " << l << " contribution of " << g.shape().name(c));
      BOOST_TEST(counts[owner][l][c] == (plan.is_included(c) ? 1 : 0));
    }
    has_frame[owner][l] = true;
  }
  // Every included node ends with every leaf's frame, the excluded with none.
  for (rank_t v = 0; v < n; ++v)
    for (std::size_t l = 0; l < leaves; ++l) BOOST_TEST(has_frame[v][l] == plan.is_included(v));
}

}  // namespace

BOOST_AUTO_TEST_CASE(random_plans_count_every_contribution_once_over_usable_links) {
  std::mt19937_64 gen(2026);
  std::size_t planned = 0, with_forwarding = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const random_case c = make_random_case(gen, 150);
    const auto plan = topo::route_grid(c.grid, c.options);
    BOOST_TEST_CONTEXT("trial " << trial << "\n" << plan.describe()) {
      // Who is in: exactly the alive nodes joined to the core over usable links.
      const std::vector<bool> reachable = connected_to_core(c.grid, plan);
      std::size_t included = 0;
      for (rank_t v = 0; v < c.grid.size(); ++v) {
        BOOST_TEST(plan.is_included(v) == (c.grid.alive(v) && reachable[v]));
        included += plan.is_included(v) ? 1 : 0;
      }
      BOOST_TEST(plan.divisor() == included);
      BOOST_TEST(plan.included().size() + plan.excluded().size() == c.grid.size());
      for (const auto& e : plan.excluded()) BOOST_TEST(!e.reason.empty());
      for (rank_t v : plan.core()) BOOST_TEST(c.grid.alive(plan.host_of(v)));
      check_schedule(c.grid, plan);
      ++planned;
      for (const auto& stage : plan.stages()) with_forwarding += stage.sub_networks.empty() ? 0 : 1;
    }
  }
  BOOST_TEST(planned == 300u);
  BOOST_TEST(with_forwarding > 100u);  // the cases exercise forwarding, not only healthy grids
}

BOOST_AUTO_TEST_CASE(random_plans_give_exact_sums) {
  std::mt19937_64 gen(77);
  for (int trial = 0; trial < 24; ++trial) {
    const random_case c = make_random_case(gen, 24);
    const auto plan = topo::route_grid(c.grid, c.options);
    BOOST_TEST_CONTEXT("trial " << trial << "\n" << plan.describe()) {
      if (plan.included().empty()) continue;
      check_exact_sums(plan, 100 + 37 * static_cast<std::size_t>(trial), trial % 2 ? reduce_op::avg : reduce_op::sum);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_large_torus_plans_quickly) {
  // 32×32×16 with 1 % of the nodes degraded: the bound is one second; the
  // test only checks the plan is sound (timings live in benchmarks/grid_routing_bench).
  std::mt19937_64 gen(5);
  topo::grid_faults faults;
  std::set<rank_t> chosen;
  while (chosen.size() < 164) chosen.insert(std::uniform_int_distribution<rank_t>(0, 32 * 32 * 16 - 1)(gen));
  for (rank_t v : chosen) faults.nodes.push_back(topo::degraded_node::fully(v));
  const topo::torus grid({32, 32, 16}, faults);
  const auto plan = topo::route_grid(grid);
  BOOST_TEST(plan.divisor() == 32u * 32u * 16u - 164u);  // a torus this size leaves nobody cut off
  BOOST_TEST(plan.core().size() > 32u * 32u * 16u * 9 / 10);  // hosting keeps the core (without: ~10 %)
  for (rank_t v : plan.core()) BOOST_TEST_REQUIRE(grid.alive(plan.host_of(v)));
}

BOOST_AUTO_TEST_SUITE_END()

// The executor with lossy quantizers: the same guarantees as the compressed allreduce.
BOOST_AUTO_TEST_SUITE(grid_allreduce_quantized)

namespace {

const topo::grid_routing& figure_7_plan() {
  // The spec's process: c1, c2, d1, d2 forward as a sub-network.
  static const auto plan = topo::route_grid(topo::torus({4, 4}, fully({"a1", "a2", "b1", "b2"})),
                                                options({}, topo::forwarding::sub_networks));
  return plan;
}

std::vector<std::vector<std::vector<float>>> random_inputs(std::size_t calls, std::size_t ranks, std::size_t count,
                                                           std::uint64_t seed) {
  std::vector<std::vector<std::vector<float>>> inputs(calls, std::vector<std::vector<float>>(ranks));
  for (std::size_t c = 0; c < calls; ++c)
    for (std::size_t r = 0; r < ranks; ++r) inputs[c][r] = test::random_values<float>(count, seed + 100 * c + r);
  return inputs;
}

/// Every included rank's outputs are bitwise identical, and close to the exact sums.
template <class Q>
void check_identical_and_close(const topo::grid_routing& plan, const Q& quantizer, double tolerance,
                               bool started = false) {
  const std::size_t n = plan.shape().size(), count = 3000;
  auto plans = make_plans(plan, n, count, quantizer);
  std::vector<std::vector<std::vector<float>>> inputs(3, std::vector<std::vector<float>>(n));
  std::mt19937_64 gen(3);
  std::normal_distribution<float> normal(0, 1);
  for (auto& call : inputs)
    for (auto& rank : call) {
      rank.resize(count);
      for (float& x : rank) x = normal(gen);
    }
  const grid_outcome outcome = run_plans(plans, inputs, reduce_op::avg, ~rank_t{0}, 0, started);
  const rank_t first = plan.included()[0];
  for (rank_t r : plan.included()) {
    BOOST_TEST_INFO("rank " << r << ": " << outcome.messages[r]);
    BOOST_TEST_REQUIRE(!outcome.codes[r]);
    for (std::size_t call = 0; call < inputs.size(); ++call)
      BOOST_TEST(test::bitwise_equal<float>(outcome.outputs[r][call], outcome.outputs[first][call]));
  }
  double worst = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (rank_t v : plan.included()) exact += inputs[2][v][i];
    exact /= static_cast<double>(plan.divisor());
    worst = std::max(worst, std::abs(outcome.outputs[first][2][i] - exact));
  }
  BOOST_TEST(worst < tolerance);
}

}  // namespace

BOOST_AUTO_TEST_CASE(lossy_results_are_bitwise_identical_on_every_rank) {
  const auto& plan = figure_7_plan();
  check_identical_and_close(plan, quantizers::one_bit({.group_size = 128}), 2.0);
  check_identical_and_close(plan, quantizers::k_level(quantizers::k_level_options::with_bits(4)), 0.5);
  check_identical_and_close(plan, quantizers::bfp({.mantissa_bits = 8, .block_size = 32}), 0.05);
  check_identical_and_close(plan, quantizers::one_bit({.group_size = 128}), 2.0, /*started=*/true);
  // Per-node forwarding and a 3-D shape.
  check_identical_and_close(topo::route_grid(topo::mesh({4, 4}, fully({"b2", "a3", "b3"})),
                                                 options({}, topo::forwarding::per_node)),
                            quantizers::k_level(quantizers::k_level_options::with_bits(8)), 0.05);
  check_identical_and_close(topo::route_grid(topo::torus({2, 3, 3}, {.nodes = {topo::degraded_node::fully(4)}})),
                            quantizers::bfp({.mantissa_bits = 8, .block_size = 32}), 0.05);
  // Hosted places: b2 and c3 played by their hosts.
  check_identical_and_close(topo::route_grid(topo::torus({4, 4}, fully({"b2", "c3"}))),
                            quantizers::one_bit({.group_size = 128}), 2.0);
}

// With error feedback the running sum telescopes: Σ_t out_t = Σ_t exact_t − Σ_ranks
// (residual mass). Checked exactly (to float rounding), and the running error stays
// bounded over many steps of gradients with a persistent direction.
BOOST_AUTO_TEST_CASE(a_plan_runs_on_a_sub_communicator_as_on_a_world_of_its_size) {
  // 8 ranks split into two halves (parent ranks 0–3 and 4–7); each half runs the
  // 2×2-torus plan with one_bit. Each half's outputs are bitwise those of a 4-rank
  // world with the same inputs, while the parent's allreduce between the calls sums all 8.
  const auto routing = topo::route_grid(topo::torus({2, 2}, {}));
  const std::size_t count = 777;
  const auto inputs = random_inputs(2, 8, count, 5);  // [call][parent rank]
  const quantizers::one_bit quantizer({.group_size = 64});
  std::vector<std::vector<std::vector<float>>> sub_outputs(8);  // [parent rank][call]
  std::vector<char> parent_correct(8);
  auto errors = transports::inproc::run_ranks(8, [&](transports::inproc::transport endpoint) {
    communicator<transports::inproc::transport> comm(std::move(endpoint));
    const rank_t r = comm.rank();
    auto half = comm.split(static_cast<std::int64_t>(r / 4), 0);
    grid_plan<quantizers::one_bit> plan(*half, routing, count, quantizer);
    bool correct = true;
    for (const auto& call : inputs) {
      std::vector<float> out(count);
      half->allreduce(plan, std::span(call[r]), std::span(out), reduce_op::avg);
      sub_outputs[r].push_back(std::move(out));
      std::vector<double> ones(10, 1.0);
      comm.allreduce(std::span<double>(ones), reduce_op::sum);
      correct = correct && std::all_of(ones.begin(), ones.end(), [](double x) { return x == 8.0; });
    }
    parent_correct[r] = correct;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t first : {rank_t{0}, rank_t{4}}) {
    std::vector<std::vector<std::vector<float>>> half_inputs(2);
    for (std::size_t call = 0; call < 2; ++call)
      half_inputs[call].assign(inputs[call].begin() + first, inputs[call].begin() + first + 4);
    auto plans = make_plans(routing, 4, count, quantizer);
    const grid_outcome world = run_plans(plans, half_inputs, reduce_op::avg);
    for (rank_t h = 0; h < 4; ++h) {
      BOOST_TEST_REQUIRE(!world.codes[h], world.messages[h]);
      BOOST_TEST_REQUIRE(parent_correct[first + h]);
      for (std::size_t call = 0; call < 2; ++call)
        BOOST_TEST(test::bitwise_equal<float>(sub_outputs[first + h][call], world.outputs[h][call]),
                   "parent rank " << first + h << ", call " << call);
    }
  }
}

BOOST_AUTO_TEST_CASE(error_feedback_telescopes_and_stays_bounded) {
  const auto& plan = figure_7_plan();
  const std::size_t n = 16, count = 1024, steps = 200;
  auto plans = make_plans(plan, n, count, quantizers::one_bit({.group_size = 64}));
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> mean(count);
  for (float& m : mean) m = normal(gen) * 0.01f;
  std::vector<std::vector<std::vector<float>>> inputs(steps, std::vector<std::vector<float>>(n));
  for (auto& call : inputs)
    for (auto& rank : call) {
      rank.resize(count);
      for (std::size_t i = 0; i < count; ++i) rank[i] = mean[i] + normal(gen) * 0.01f;
    }
  const grid_outcome outcome = run_plans(plans, inputs, reduce_op::sum);
  const rank_t first = plan.included()[0];
  BOOST_TEST_REQUIRE(!outcome.codes[first]);
  std::vector<double> exact_sum(count, 0), out_sum(count, 0);
  std::vector<double> error_at(steps);
  double largest = 0;
  for (std::size_t t = 0; t < steps; ++t) {
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) {
      for (rank_t v : plan.included()) exact_sum[i] += inputs[t][v][i];
      out_sum[i] += outcome.outputs[first][t][i];
      worst = std::max(worst, std::abs(out_sum[i] - exact_sum[i]));
      largest = std::max(largest, std::abs(exact_sum[i]));
    }
    error_at[t] = worst;
  }
  std::vector<float> mass(count, 0.0f);
  for (rank_t r : plan.included()) plans[r]->add_residual_mass(mass);
  double gap = 0;
  for (std::size_t i = 0; i < count; ++i) gap = std::max(gap, std::abs(out_sum[i] + mass[i] - exact_sum[i]));
  BOOST_TEST(gap < 1e-4 * largest);
  const double late = *std::max_element(error_at.begin() + steps / 2, error_at.end());
  const double early = *std::max_element(error_at.begin(), error_at.begin() + steps / 2);
  BOOST_TEST(late < 1.5 * early + 1e-3);  // bounded, not growing with the steps
}

// A link fails at a chosen send: failed ranks keep their residuals, ranks that
// completed roll back, and the retry gives the bits of a run that never failed.
BOOST_AUTO_TEST_CASE(a_failed_call_leaves_the_residuals_as_they_were) {
  const auto& plan = figure_7_plan();
  const std::size_t n = 16, count = 700;
  const auto q = quantizers::one_bit({.group_size = 64});
  const auto inputs = random_inputs(2, n, count, 5);
  auto clean = make_plans(plan, n, count, q);
  const grid_outcome reference = run_plans(clean, inputs, reduce_op::sum);
  auto mass = [&](const grid_plan<quantizers::one_bit>& p) {
    std::vector<float> m(count, 0.0f);
    p.add_residual_mass(m);
    return m;
  };
  // A forwarding node and a core node, failing at their first, middle and last send.
  for (rank_t victim : {node("c1"), node("d4")}) {
    const std::size_t sends = clean[victim]->last_call().messages_sent;
    BOOST_TEST_REQUIRE(sends >= 1u);
    for (std::size_t fail_at : {std::size_t{0}, sends / 2, sends - 1}) {
      BOOST_TEST_CONTEXT("victim " << victim << " fails its send " << fail_at << " of the second call") {
        auto plans = make_plans(plan, n, count, q);
        const std::vector<std::vector<std::vector<float>>> first_call{inputs[0]}, second_call{inputs[1]};
        run_plans(plans, first_call, reduce_op::sum);
        std::vector<std::vector<float>> before;
        for (auto& p : plans) before.push_back(mass(*p));
        const grid_outcome failed = run_plans(plans, second_call, reduce_op::sum, victim, fail_at);
        BOOST_TEST(failed.codes[victim] == errc::peer_lost);
        for (rank_t r : plan.included()) {
          BOOST_TEST_INFO("rank " << r << ": " << failed.messages[r]);
          if (!failed.codes[r]) {
            BOOST_TEST(test::bitwise_equal<float>(failed.outputs[r][0], reference.outputs[r][1]));
            plans[r]->roll_back_last_call();
          } else {
            BOOST_TEST(failed.codes[r] == errc::peer_lost);
          }
          BOOST_TEST(test::bitwise_equal<float>(mass(*plans[r]), before[r]));
        }
        const grid_outcome retried = run_plans(plans, second_call, reduce_op::sum);
        for (rank_t r : plan.included()) {
          BOOST_TEST_REQUIRE(!retried.codes[r]);
          BOOST_TEST(test::bitwise_equal<float>(retried.outputs[r][0], reference.outputs[r][1]));
          BOOST_TEST(test::bitwise_equal<float>(mass(*plans[r]), mass(*clean[r])));
        }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(grid_allreduce_bad_input)

BOOST_AUTO_TEST_CASE(ranks_map_onto_nodes) {
  const auto plan = topo::route_grid(topo::torus({4, 4}, fully({"b2", "c3"})));
  // 14 ranks for the 14 nodes that are not fully degraded: rank r plays the r-th.
  const grid_plan<quantizers::identity<float>> survivors(5, 14, plan, 10);
  BOOST_TEST(survivors.node() == node("b3"));
  BOOST_TEST(survivors.included());
  // An explicit map, and maps that cannot work.
  std::vector<rank_t> reversed(16);
  std::iota(reversed.rbegin(), reversed.rend(), rank_t{0});
  BOOST_TEST(grid_plan<quantizers::identity<float>>(0, 16, plan, 10, {}, {reversed}).node() == 15u);
  auto refused = [&](rank_t size, std::vector<rank_t> map) {
    try {
      grid_plan<quantizers::identity<float>>(0, size, plan, 10, {}, {std::move(map)});
    } catch (const qcoll::error& e) {
      return e.code() == errc::invalid_argument;
    }
    return false;
  };
  BOOST_TEST(refused(13, {}));                    // neither every node nor the alive ones
  BOOST_TEST(refused(2, {0, 0}));                 // a node twice
  BOOST_TEST(refused(2, {0, 16}));                // outside the grid
  BOOST_TEST(refused(2, {0, 1}));                 // included nodes without a rank
  BOOST_TEST(refused(3, {0, 1}));                 // the wrong length
}

BOOST_AUTO_TEST_CASE(an_excluded_rank_is_told_why_and_nobody_waits_for_it) {
  // The same 16 ranks, 14 alive: the two degraded nodes' ranks are refused at once.
  const auto plan = topo::route_grid(topo::torus({4, 4}, fully({"b2", "c3"})));
  auto plans = make_plans(plan, 16, 50, quantizers::identity<float>{});
  const grid_outcome outcome = run_plans(plans, integer_inputs(1, 16, 50, 1), reduce_op::sum);
  BOOST_TEST(outcome.codes[node("b2")] == errc::invalid_argument);
  BOOST_TEST(outcome.messages[node("b2")].find("node b2, which the routing excludes: fully degraded") != std::string::npos);
  BOOST_TEST(!outcome.codes[node("a1")]);
}

BOOST_AUTO_TEST_CASE(ranks_with_different_plans_or_sizes_are_told_so) {
  // Half the ranks planned with b2 degraded, half without: the first message says so.
  const auto healthy = topo::route_grid(topo::torus({4, 4}));
  const auto degraded = topo::route_grid(topo::torus({4, 4}, fully({"b2"})));
  std::vector<std::unique_ptr<grid_plan<quantizers::identity<float>>>> plans;
  for (rank_t r = 0; r < 16; ++r)
    plans.push_back(std::make_unique<grid_plan<quantizers::identity<float>>>(r, 16, r < 8 ? healthy : degraded, 64));
  const grid_outcome mixed =
      run_plans(plans, integer_inputs(1, 16, 64, 2), reduce_op::sum, ~rank_t{0}, 0, false, std::chrono::seconds(5));
  std::size_t told = 0;
  for (rank_t r = 0; r < 16; ++r) {
    if (r == node("b2") && mixed.codes[r] == errc::invalid_argument) continue;  // excluded by its own plan
    BOOST_TEST_INFO("rank " << r << ": " << mixed.messages[r]);
    BOOST_TEST(mixed.codes[r] != std::error_code());
    BOOST_TEST(mixed.codes[r] != errc::timeout);
    told += mixed.codes[r] == errc::operation_mismatch ? 1 : 0;
  }
  BOOST_TEST(told >= 1u);

  // A wrong count and an unsupported op fail on every rank.
  auto good = make_plans(healthy, 16, 64, quantizers::identity<float>{});
  const grid_outcome wrong_count = run_plans(good, integer_inputs(1, 16, 63, 3), reduce_op::sum);
  for (rank_t r = 0; r < 16; ++r) BOOST_TEST(wrong_count.codes[r] != std::error_code());
  const grid_outcome max_op = run_plans(good, integer_inputs(1, 16, 64, 3), reduce_op::max);
  for (rank_t r = 0; r < 16; ++r) BOOST_TEST(max_op.codes[r] != std::error_code());
  BOOST_TEST(max_op.messages[0].find("max is not supported") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
