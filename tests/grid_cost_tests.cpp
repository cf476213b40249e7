// The grid cost model: hand-computed link and node totals of small schedules (a
// ring, a 2×2 mesh, the spec's Fig. 5b forwarding per node and by sub-network) and of
// the flat-ring baseline, which must equal the schedule's own ring where both are one
// ring. Part of the grid_tests executable (which defines the module).

#include <boost/test/unit_test.hpp>

#include <qcoll/algorithms/grid_cost.hpp>
#include <qcoll/core/error.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

using namespace qcoll;
using algorithms::grid_schedule;
namespace topo = qcoll::topologies;

namespace {

/// float32 as it is: the costs below are whole numbers of values.
std::size_t four_bytes_each(std::size_t values) { return 4 * values; }

/// The spec's names on a 4×4 grid: at("b3") is row b, column 3.
rank_t at(const char* name) { return static_cast<rank_t>((name[0] - 'a') * 4 + (name[1] - '1')); }

topo::grid_faults fully(std::initializer_list<rank_t> nodes) {
  topo::grid_faults faults;
  for (rank_t v : nodes) faults.nodes.push_back(topo::degraded_node::fully(v));
  return faults;
}

/// The spec's process: degraded nodes are not hosted, their groups forward.
topo::routing_options spec_options(std::vector<std::size_t> order, topo::forwarding mode) {
  topo::routing_options o;
  o.dimension_order = std::move(order);
  o.mode = mode;
  o.host_degraded = topo::hosting::never;
  return o;
}

/// Fig. 5b: a1, a2, b1, b2 down, reduced along rows (dimension 1) first, so a3 and
/// b3 forward to c3 (a3 through b3) and a4, b4 to c4. 12 values of 4 bytes: a
/// forwarded vector is 48 bytes.
struct fig_5b {
  topo::mesh grid{{4, 4}, fully({at("a1"), at("a2"), at("b1"), at("b2")})};
  topo::grid_routing plan;
  grid_schedule schedule;

  explicit fig_5b(topo::forwarding mode)
      : plan(topo::route_grid(grid, spec_options({1, 0}, mode))), schedule(plan, 12, 1, four_bytes_each) {}
};

/// Rows c and d run the 4-member ring (mesh: the closing hop goes back along the
/// row): over 3 reduce and 3 gather steps every directed row link carries 6 blocks of
/// 3 values = 72 bytes. Columns c–d then exchange 2 + 1 values each way = 12 bytes.
void check_core_of_fig_5b(const algorithms::grid_traffic& traffic) {
  for (const char* row : {"c", "d"})
    for (int column = 1; column < 4; ++column) {
      const std::string left = fmt::format("{}{}", row, column), right = fmt::format("{}{}", row, column + 1);
      BOOST_TEST(traffic.link_bytes(at(left.c_str()), at(right.c_str())) == 72u);
      BOOST_TEST(traffic.link_bytes(at(right.c_str()), at(left.c_str())) == 72u);
    }
  for (const char* column : {"1", "2", "3", "4"}) {
    const std::string c = fmt::format("c{}", column), d = fmt::format("d{}", column);
    BOOST_TEST(traffic.link_bytes(at(c.c_str()), at(d.c_str())) == 12u);
    BOOST_TEST(traffic.link_bytes(at(d.c_str()), at(c.c_str())) == 12u);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(grid_cost)

BOOST_AUTO_TEST_CASE(healthy_ring_charges_each_forward_link_six_blocks) {
  // 1×4 torus, 8 values: blocks of 2 values (8 bytes), 3 reduce + 3 gather steps, all
  // in the +1 direction.
  const topo::torus ring({1, 4});
  const topo::grid_routing plan = topo::route_grid(ring);
  const grid_schedule schedule(plan, 8, 1, four_bytes_each);
  const algorithms::grid_traffic traffic = algorithms::traffic_of(schedule);
  for (rank_t v = 0; v < 4; ++v) {
    BOOST_TEST(traffic.link_bytes(v, (v + 1) % 4) == 48u);
    BOOST_TEST(traffic.link_bytes((v + 1) % 4, v) == 0u);
    BOOST_TEST(traffic.node_bytes(v) == 96u);
  }
  const algorithms::grid_cost cost = algorithms::cost_of(schedule);
  BOOST_TEST(cost.steps == 6u);
  BOOST_TEST(cost.messages == 24u);
  BOOST_TEST(cost.max_link_bytes == 48u);
  BOOST_TEST(cost.max_node_bytes == 96u);
  BOOST_TEST(cost.total_link_bytes == 192u);
  BOOST_TEST(cost.contributions == 4u);
  BOOST_TEST(cost.hottest_link_from == 0u);
  BOOST_TEST(cost.hottest_link_to == 1u);
}

BOOST_AUTO_TEST_CASE(healthy_2x2_mesh_reduces_columns_then_rows) {
  // 8 values: along columns every node sends half (16 bytes) each way, reduce and
  // gather; along rows a quarter (8 bytes).
  const topo::mesh square({2, 2});
  const topo::grid_routing plan = topo::route_grid(square);
  const grid_schedule schedule(plan, 8, 1, four_bytes_each);
  const algorithms::grid_traffic traffic = algorithms::traffic_of(schedule);
  BOOST_TEST(traffic.link_bytes(0, 2) == 32u);
  BOOST_TEST(traffic.link_bytes(2, 0) == 32u);
  BOOST_TEST(traffic.link_bytes(0, 1) == 16u);
  BOOST_TEST(traffic.link_bytes(1, 0) == 16u);
  const algorithms::grid_cost cost = algorithms::cost_of(schedule);
  BOOST_TEST(cost.steps == 4u);
  BOOST_TEST(cost.messages == 16u);
  BOOST_TEST(cost.max_link_bytes == 32u);
  BOOST_TEST(cost.max_node_bytes == 96u);
  BOOST_TEST(cost.total_link_bytes == 192u);
}

BOOST_AUTO_TEST_CASE(fig_5b_per_node_stacks_two_vectors_on_b3_c3) {
  const fig_5b f(topo::forwarding::per_node);
  const algorithms::grid_traffic traffic = algorithms::traffic_of(f.schedule);
  // b3 → c3 carries a3's vector (relayed) and b3's own; the results come back the same way.
  BOOST_TEST(traffic.link_bytes(at("a3"), at("b3")) == 48u);
  BOOST_TEST(traffic.link_bytes(at("b3"), at("c3")) == 96u);
  BOOST_TEST(traffic.link_bytes(at("c3"), at("b3")) == 96u);
  BOOST_TEST(traffic.link_bytes(at("b4"), at("c4")) == 96u);
  BOOST_TEST(traffic.node_bytes(at("b3")) == 2 * 48u + 2 * 96u);  // relays a3's both ways
  check_core_of_fig_5b(traffic);
  const algorithms::grid_cost cost = algorithms::cost_of(f.schedule);
  BOOST_TEST(cost.steps == 10u);
  BOOST_TEST(cost.messages == 72u);
  BOOST_TEST(cost.max_link_bytes == 96u);
  BOOST_TEST(f.plan.shape().name(cost.hottest_link_from) == "b3");
  BOOST_TEST(f.plan.shape().name(cost.hottest_link_to) == "c3");
  // c3: 4 row links × 72, c3↔d3 2 × 12, b3↔c3 2 × 96.
  BOOST_TEST(cost.max_node_bytes == 504u);
  BOOST_TEST(f.plan.shape().name(cost.hottest_node) == "c3");
  BOOST_TEST(cost.total_link_bytes == 2 * 6 * 72u + 4 * 2 * 12u + 2 * 2 * (48u + 96u));
  BOOST_TEST(cost.contributions == 12u);
}

BOOST_AUTO_TEST_CASE(fig_5b_sub_networks_send_one_vector_per_link) {
  const fig_5b f(topo::forwarding::sub_networks);
  const algorithms::grid_traffic traffic = algorithms::traffic_of(f.schedule);
  // a3 adds into b3 first; b3 → c3 carries one sum.
  for (const char* column : {"3", "4"}) {
    const std::string a = fmt::format("a{}", column), b = fmt::format("b{}", column), c = fmt::format("c{}", column);
    BOOST_TEST(traffic.link_bytes(at(a.c_str()), at(b.c_str())) == 48u);
    BOOST_TEST(traffic.link_bytes(at(b.c_str()), at(c.c_str())) == 48u);
    BOOST_TEST(traffic.link_bytes(at(c.c_str()), at(b.c_str())) == 48u);
    BOOST_TEST(traffic.link_bytes(at(b.c_str()), at(a.c_str())) == 48u);
  }
  check_core_of_fig_5b(traffic);
  const algorithms::grid_cost cost = algorithms::cost_of(f.schedule);
  BOOST_TEST(cost.steps == 12u);  // the tree's extra level
  BOOST_TEST(cost.messages == 72u);
  BOOST_TEST(cost.max_link_bytes == 72u);  // the core's rows now
  BOOST_TEST(f.plan.shape().name(cost.hottest_link_from) == "c1");
  BOOST_TEST(f.plan.shape().name(cost.hottest_link_to) == "c2");
  BOOST_TEST(cost.max_node_bytes == 4 * 72u + 2 * 12u + 2 * 48u);
  BOOST_TEST(f.plan.shape().name(cost.hottest_node) == "c3");
  BOOST_TEST(cost.total_link_bytes == 2 * 6 * 72u + 4 * 2 * 12u + 2 * 2 * (48u + 48u));
}

BOOST_AUTO_TEST_CASE(flat_ring_routes_around_a_dead_node) {
  // 1×5 torus without node 2: the ring 0 1 3 4; 1 → 3 goes the other way round,
  // 1 0 4 3. 8 values over 4 members: blocks of 8 bytes, 6 per ring edge.
  const topo::torus line({1, 5}, fully({2}));
  BOOST_TEST(algorithms::flat_ring_order(line) == std::vector<rank_t>({0, 1, 3, 4}), boost::test_tools::per_element());
  const algorithms::grid_traffic traffic = algorithms::flat_ring_traffic(line, 8, four_bytes_each);
  for (auto [from, to] : {std::pair<rank_t, rank_t>{0, 1}, {1, 0}, {0, 4}, {4, 3}, {3, 4}, {4, 0}})
    BOOST_TEST(traffic.link_bytes(from, to) == 48u);
  BOOST_TEST(traffic.link_bytes(1, 2) == 0u);
  BOOST_TEST(traffic.link_bytes(3, 2) == 0u);
  const algorithms::grid_cost cost = algorithms::flat_ring_cost(line, 8, four_bytes_each);
  BOOST_TEST(cost.steps == 6u);
  BOOST_TEST(cost.messages == 24u);
  BOOST_TEST(cost.max_link_bytes == 48u);
  BOOST_TEST(cost.max_node_bytes == 4 * 48u);  // node 0 sends, receives and relays both ways
  BOOST_TEST(cost.hottest_node == 0u);
  BOOST_TEST(cost.total_link_bytes == 6 * 48u);
  BOOST_TEST(cost.contributions == 4u);
}

BOOST_AUTO_TEST_CASE(flat_ring_equals_the_schedule_on_a_healthy_ring) {
  // 13 values over 5: blocks of 3, 3, 3, 2, 2 values, so every edge differs.
  const topo::torus line({1, 5});
  const topo::grid_routing plan = topo::route_grid(line);
  const grid_schedule schedule(plan, 13, 1, four_bytes_each);
  const algorithms::grid_traffic planned = algorithms::traffic_of(schedule);
  const algorithms::grid_traffic flat = algorithms::flat_ring_traffic(line, 13, four_bytes_each);
  for (rank_t v = 0; v < 5; ++v) {
    BOOST_TEST(flat.link_bytes(v, (v + 1) % 5) == planned.link_bytes(v, (v + 1) % 5));
    BOOST_TEST(flat.node_bytes(v) == planned.node_bytes(v));
  }
  BOOST_TEST(flat.link_bytes(0, 1) == 4 * (2 * 13u - 3 - 3));
  BOOST_TEST(flat.link_bytes(4, 0) == 4 * (2 * 13u - 2 - 3));
  const algorithms::grid_cost a = algorithms::cost_of(schedule);
  const algorithms::grid_cost b = algorithms::flat_ring_cost(line, 13, four_bytes_each);
  BOOST_TEST(a.steps == b.steps);
  BOOST_TEST(a.messages == b.messages);
  BOOST_TEST(a.max_link_bytes == b.max_link_bytes);
  BOOST_TEST(a.max_node_bytes == b.max_node_bytes);
  BOOST_TEST(a.total_link_bytes == b.total_link_bytes);
}

BOOST_AUTO_TEST_CASE(flat_ring_order_snakes_through_neighbours) {
  BOOST_TEST(
      algorithms::flat_ring_order(topo::mesh({3, 4})) == std::vector<rank_t>({0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11}),
      boost::test_tools::per_element());
  // In 3-D too every member is linked to the next; a torus with even extents also
  // closes the ring over one link.
  const topo::torus cube({4, 3, 2});
  const std::vector<rank_t> order = algorithms::flat_ring_order(cube);
  BOOST_TEST(order.size() == 24u);
  for (std::size_t i = 0; i + 1 < order.size(); ++i) BOOST_TEST(cube.linked(order[i], order[i + 1]));
  BOOST_TEST(cube.linked(order.back(), order.front()));
}

BOOST_AUTO_TEST_CASE(flat_ring_leaves_out_nodes_cut_off) {
  // 3×3 mesh without b1 and a2: a1 has no usable link left.
  const topo::mesh square({3, 3}, fully({1, 3}));
  const std::vector<rank_t> order = algorithms::flat_ring_order(square);
  BOOST_TEST(order == std::vector<rank_t>({2, 5, 4, 6, 7, 8}), boost::test_tools::per_element());
  const algorithms::grid_cost cost = algorithms::flat_ring_cost(square, 12, four_bytes_each);
  BOOST_TEST(cost.contributions == 6u);
  BOOST_TEST(cost.steps == 10u);
}

BOOST_AUTO_TEST_CASE(charging_a_link_that_carries_nothing_is_refused) {
  topo::grid_faults faults;
  faults.broken_links = {{0, 1}};
  const topo::torus line({1, 4}, faults);
  algorithms::grid_traffic traffic(line);
  const rank_t broken[] = {0, 1}, not_neighbours[] = {0, 2}, alone[] = {3};
  BOOST_CHECK_THROW(traffic.charge(broken, 1), qcoll::error);
  BOOST_CHECK_THROW(traffic.charge(not_neighbours, 1), qcoll::error);
  BOOST_CHECK_THROW(traffic.charge(alone, 1), qcoll::error);
  const rank_t fine[] = {1, 2, 3};
  traffic.charge(fine, 5);
  BOOST_TEST(traffic.link_bytes(1, 2) == 5u);
  BOOST_TEST(traffic.node_bytes(2) == 10u);
  BOOST_TEST(traffic.node_bytes(0) == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
