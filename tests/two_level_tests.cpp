// The two-level allreduce (two_level_allreduce.hpp) on host buffers, ranks as threads
// over the in-process transport, nodes of L ranks split from the world (or joined as
// worlds of their own): exact with identity; with one_bit, bit for bit the compressed
// plans between the nodes run on the nodes' exact sums, for both exchanges; error
// feedback keeps the mass; a failed call at any send leaves every residual as it was;
// bad layouts and bad calls fail every rank. On device buffers and the CUDA peer
// transport: tests/cuda_peer_tests.cpp; processes: tests/multiprocess/worker.cpp.

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>
#include <qcoll/two_level_allreduce.hpp>

#include "support/counting_transport.hpp"
#include "support/expect_failure.hpp"
#include "support/ranks.hpp"

#include <cmath>
#include <cstdint>
#include <latch>
#include <random>
#include <string>
#include <system_error>
#include <vector>

using namespace qcoll;

namespace two_level_test {

using world_comm = communicator<transports::inproc::transport>;
using counted_comm = communicator<test::counting_transport>;
using values = std::vector<float>;

constexpr two_level_exchange exchanges[] = {two_level_exchange::shards, two_level_exchange::leaders};

struct shape {
  std::size_t nodes, per_node;
  std::size_t world() const { return nodes * per_node; }
};
std::ostream& operator<<(std::ostream& os, shape s) { return os << s.nodes << " nodes x " << s.per_node; }
const char* name(two_level_exchange e) { return e == two_level_exchange::shards ? "shards" : "leaders"; }

/// calls × ranks × count values: small integers (so every sum is exact in any order),
/// or gaussians.
std::vector<std::vector<values>> inputs_of(std::size_t calls, std::size_t n, std::size_t count, std::uint64_t seed,
                                           bool integers) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<std::vector<values>> inputs(calls, std::vector<values>(n, values(count)));
  for (auto& call : inputs)
    for (auto& rank : call)
      for (float& x : rank) x = integers ? static_cast<float>(small(gen)) : normal(gen) * 0.01f;
  return inputs;
}

/// Runs fn(node, world, rank) on every rank of a world of `s`, nodes split from it.
template <class Fn>
test::rank_outcomes run_nodes(shape s, Fn fn) {
  return test::run_ranks(
      s.world(),
      [&](world_comm& world) {
        const rank_t r = world.rank();
        auto node = world.split(static_cast<std::int64_t>(r / s.per_node), static_cast<std::int64_t>(r));
        fn(*node, world, r);
      },
      {.timeout = std::chrono::seconds(20)});
}

void expect_all_succeeded(const test::rank_outcomes& outcome) {
  for (std::size_t r = 0; r < outcome.errors.size(); ++r)
    BOOST_TEST(!outcome.errors[r], "rank " << r << ": " << outcome.failure(r).second);
}

/// Each node's exact sum of one call's inputs (world rank r on node r / per_node).
std::vector<values> node_sums(const std::vector<values>& call, shape s) {
  std::vector<values> sums(s.nodes, values(call[0].size(), 0.0f));
  for (std::size_t r = 0; r < call.size(); ++r)
    for (std::size_t i = 0; i < call[r].size(); ++i) sums[r / s.per_node][i] += call[r][i];
  return sums;
}

}  // namespace two_level_test

using namespace two_level_test;

BOOST_AUTO_TEST_SUITE(two_level)

// identity between the nodes: the exact sum (and, with powers of two, the exact
// average) on every rank, for every shape, both exchanges, buffers smaller than a node.
BOOST_AUTO_TEST_CASE(identity_gives_the_exact_sum) {
  for (const shape s : {shape{2, 2}, shape{3, 2}, shape{2, 3}, shape{1, 4}, shape{4, 1}})
    for (const two_level_exchange exchange : exchanges)
      for (const std::size_t count : {std::size_t{1}, std::size_t{1001}})
        for (const reduce_op op : {reduce_op::sum, reduce_op::avg}) {
          const bool exact_average = (s.nodes & (s.nodes - 1)) == 0 && (s.per_node & (s.per_node - 1)) == 0;
          if (op == reduce_op::avg && !exact_average) continue;
          BOOST_TEST_CONTEXT(s << ", " << name(exchange) << ", " << count << " values, " << to_string(op)) {
            const auto inputs = inputs_of(1, s.world(), count, 11 + count, true)[0];
            values expected(count, 0.0f);
            for (const auto& in : inputs)
              for (std::size_t i = 0; i < count; ++i) expected[i] += in[i];
            if (op == reduce_op::avg)
              for (float& x : expected) x /= static_cast<float>(s.world());
            std::vector<values> outputs(s.world(), values(count));
            expect_all_succeeded(run_nodes(s, [&](world_comm& node, world_comm& world, rank_t r) {
              two_level_allreduce bucket(node, world, count, quantizers::identity<float>{}, {.exchange = exchange});
              bucket.allreduce(std::span<const float>(inputs[r]), std::span(outputs[r]), op);
            }));
            for (std::size_t r = 0; r < s.world(); ++r) BOOST_TEST(outputs[r] == expected, "rank " << r);
          }
        }
}

// one_bit between the nodes: every rank gets the bits of compressed_allreduce_plans run
// by themselves between N ranks on the nodes' exact sums (on each shard, or on the whole
// buffer by the leaders), call after call, so the residuals carry over as they should.
BOOST_AUTO_TEST_CASE(one_bit_is_the_plan_between_the_nodes_on_their_sums) {
  const std::size_t count = 5003, calls = 3;
  const compressed_allreduce_options chunks{.chunk_values = 1024};
  for (const shape s : {shape{2, 2}, shape{3, 2}})
    for (const two_level_exchange exchange : exchanges)
      BOOST_TEST_CONTEXT(s << ", " << name(exchange)) {
        const auto inputs = inputs_of(calls, s.world(), count, 5, true);
        const std::size_t parts = exchange == two_level_exchange::shards ? s.per_node : 1;

        // The reference: per part, N ranks run the plan on their node's sums.
        std::vector<values> expected(calls, values(count));
        for (std::size_t part = 0; part < parts; ++part) {
          const block_range piece = block_of(count, parts, part);
          expect_all_succeeded(test::run_ranks<topologies::fully_connected>(s.nodes, [&](world_comm& comm) {
            compressed_allreduce_plan plan(comm, piece.size, quantizers::one_bit{}, chunks);
            for (std::size_t c = 0; c < calls; ++c) {
              const values sum = node_sums(inputs[c], s)[comm.rank()];
              values out(piece.size);
              comm.allreduce(plan, std::span<const float>(sum).subspan(piece.offset, piece.size), std::span(out),
                             reduce_op::sum);
              if (comm.rank() == 0) std::copy(out.begin(), out.end(), expected[c].begin() + piece.offset);
            }
          }));
        }

        std::vector<std::vector<values>> outputs(calls, std::vector<values>(s.world(), values(count)));
        std::vector<std::size_t> sent(s.world());
        expect_all_succeeded(run_nodes(s, [&](world_comm& node, world_comm& world, rank_t r) {
          two_level_allreduce bucket(node, world, count, quantizers::one_bit{},
                                     {.exchange = exchange, .compressed = chunks});
          for (std::size_t c = 0; c < calls; ++c)
            bucket.allreduce(std::span<const float>(inputs[c][r]), std::span(outputs[c][r]), reduce_op::sum);
          sent[r] = bucket.last_call().bytes_sent;
          if (sent[r] != bucket.bytes_between_nodes_per_call()) throw std::runtime_error("bytes differ from the formula");
        }));
        for (std::size_t c = 0; c < calls; ++c)
          for (std::size_t r = 0; r < s.world(); ++r) BOOST_TEST(outputs[c][r] == expected[c], "call " << c << ", rank " << r);
        // Across the slow link, the exchanges move the same bytes per node, up to frame headers.
        std::size_t per_node = 0;
        for (std::size_t r = 0; r < s.per_node; ++r) per_node += sent[r];
        BOOST_TEST(per_node > 0u);
        if (exchange == two_level_exchange::leaders)
          for (std::size_t r = 1; r < s.per_node; ++r) BOOST_TEST(sent[r] == 0u);
      }
}

// Σ_t out_t = Σ_t Σ_ranks in_t − Σ_ranks mass (avg: divided by the ranks), with the
// residuals of every shard; every rank holds the same bits.
BOOST_AUTO_TEST_CASE(error_feedback_keeps_the_mass) {
  const std::size_t count = 3000, calls = 6;
  const shape s{2, 2};
  for (const two_level_exchange exchange : exchanges)
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg})
      BOOST_TEST_CONTEXT(name(exchange) << ", " << to_string(op)) {
        const auto inputs = inputs_of(calls, s.world(), count, 23, false);
        std::vector<values> totals(s.world(), values(count, 0.0f)), mass(s.world(), values(count, 0.0f));
        expect_all_succeeded(run_nodes(s, [&](world_comm& node, world_comm& world, rank_t r) {
          two_level_allreduce bucket(node, world, count, quantizers::one_bit{}, {.exchange = exchange});
          values out(count);
          for (std::size_t c = 0; c < calls; ++c) {
            bucket.allreduce(std::span<const float>(inputs[c][r]), std::span(out), op);
            for (std::size_t i = 0; i < count; ++i) totals[r][i] += out[i];
          }
          bucket.add_residual_mass(std::span(mass[r]), op);
        }));
        const float divide = op == reduce_op::avg ? static_cast<float>(s.world()) : 1.0f;
        double worst = 0, largest = 0;
        for (std::size_t i = 0; i < count; ++i) {
          double in = 0, held = 0;
          for (std::size_t c = 0; c < calls; ++c)
            for (std::size_t r = 0; r < s.world(); ++r) in += inputs[c][r][i];
          for (std::size_t r = 0; r < s.world(); ++r) held += mass[r][i];
          worst = std::max(worst, std::abs(totals[0][i] - (in - held) / divide));
          largest = std::max(largest, std::abs(in / divide));
        }
        BOOST_TEST(worst < 1e-4 * std::max(largest, 1.0), "worst " << worst << " of " << largest);
        for (std::size_t r = 1; r < s.world(); ++r) BOOST_TEST(totals[r] == totals[0], "rank " << r);
      }
}

// A link fails at the first, a middle or the last send of the second call, on a node's
// first or last rank: the victim and its node fail, and every plan's residuals are as
// after the first call — on the ranks that failed (the last sends are the node's
// all_gather, after the plans committed, so there the plan rolls back by itself), and
// after roll_back_last_call() on those that had everything before the failure.
BOOST_AUTO_TEST_CASE(a_failed_call_leaves_every_residual) {
  const std::size_t count = 4000;
  const shape s{2, 2};
  const auto inputs = inputs_of(2, s.world(), count, 31, false);
  struct residuals {
    values worker, server;
    bool operator==(const residuals&) const = default;
  };
  struct world_state {
    std::vector<residuals> before, after;  // after the first call; after the second
    std::vector<std::size_t> sends;        // of the second call
    std::vector<std::error_code> codes;    // of the second call
  };
  auto run = [&](two_level_exchange exchange, rank_t victim, std::size_t fail_at) {
    world_state state{std::vector<residuals>(s.world()), std::vector<residuals>(s.world()),
                      std::vector<std::size_t>(s.world()), std::vector<std::error_code>(s.world())};
    std::latch first_call_done(static_cast<std::ptrdiff_t>(s.world()));
    auto errors = transports::inproc::run_ranks(s.world(), [&](transports::inproc::transport endpoint) {
      const rank_t r = endpoint.rank();
      counted_comm world(test::counting_transport(std::move(endpoint)), topologies::fully_connected(s.world()),
                         {.timeout = std::chrono::seconds(20)});
      auto node = world.split(static_cast<std::int64_t>(r / s.per_node), static_cast<std::int64_t>(r));
      two_level_allreduce bucket(*node, world, count, quantizers::one_bit{}, {.exchange = exchange});
      auto residuals_now = [&] {
        residuals now;
        if (const auto* plan = bucket.between_nodes_plan()) {
          now.worker.assign(plan->worker_residual().begin(), plan->worker_residual().end());
          now.server.assign(plan->server_residual().begin(), plan->server_residual().end());
        }
        return now;
      };
      values out(count);
      bucket.allreduce(std::span<const float>(inputs[0][r]), std::span(out), reduce_op::sum);
      state.before[r] = residuals_now();
      first_call_done.arrive_and_wait();  // the failure must not reach a rank still in the first call
      const std::size_t sends_before = world.transport().sends();
      if (r == victim) world.transport().fail_after_sends(fail_at);
      try {
        bucket.allreduce(std::span<const float>(inputs[1][r]), std::span(out), reduce_op::sum);
        state.sends[r] = world.transport().sends() - sends_before;
        // A rank that had all it needed before the failure completes (as with the plans);
        // to repeat the step everywhere it rolls back.
        if (victim < s.world()) bucket.roll_back_last_call();
      } catch (const std::system_error& e) {
        state.codes[r] = e.code();
      }
      state.after[r] = residuals_now();
    });
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return state;
  };
  for (const two_level_exchange exchange : exchanges) {
    const world_state clean = run(exchange, ~rank_t{0}, 0);
    for (rank_t r = 0; r < s.world(); ++r) {
      BOOST_TEST(!clean.codes[r]);
      BOOST_TEST((clean.after[r] == clean.before[r]) == clean.before[r].worker.empty(), "rank " << r);
    }
    for (const rank_t victim : {rank_t{0}, rank_t{3}}) {
      const std::size_t sends = clean.sends[victim];
      for (const std::size_t fail_at : {std::size_t{0}, sends / 2, sends - 1})
        BOOST_TEST_CONTEXT(name(exchange) << ", rank " << victim << " fails send " << fail_at << " of " << sends) {
          const world_state failed = run(exchange, victim, fail_at);
          for (rank_t r = 0; r < s.world(); ++r) {
            if (r / s.per_node == victim / s.per_node)
              BOOST_TEST(static_cast<bool>(failed.codes[r]), "rank " << r << " did not fail");
            BOOST_TEST((failed.after[r] == failed.before[r]), "rank " << r << "'s residuals changed");
          }
        }
    }
  }
}

// Node communicators that are not nodes of one size fail every rank at construction;
// a bad call on one rank fails every rank at once, also when the nodes are worlds of
// their own (another transport than the world's: the abort crosses over).
BOOST_AUTO_TEST_CASE(bad_layouts_and_calls_fail_every_rank) {
  std::vector<std::string> failures(4);
  auto unequal = test::run_ranks(4, [&](world_comm& world) {
    auto node = world.split(world.rank() < 3 ? 0 : 1, world.rank());
    two_level_allreduce bucket(*node, world, 100, quantizers::one_bit{});
  });
  for (rank_t r = 0; r < 4; ++r) {
    BOOST_TEST(unequal.failure(r).first == errc::invalid_argument, "rank " << r);
    BOOST_TEST(unequal.failure(r).second.find("nodes of different sizes") != std::string::npos,
               unequal.failure(r).second);
  }

  for (const reduce_op bad_op : {reduce_op::sum, reduce_op::max})
    BOOST_TEST_CONTEXT("rank 3 calls with " << (bad_op == reduce_op::sum ? "a wrong size" : "op max")) {
      transports::inproc::world first(2), second(2);
      std::vector<std::error_code> codes(4);
      const auto started = std::chrono::steady_clock::now();
      auto errors = transports::inproc::run_ranks(4, [&](transports::inproc::transport endpoint) {
        const rank_t r = endpoint.rank();
        world_comm world(std::move(endpoint), topologies::fully_connected(4), {.timeout = std::chrono::seconds(30)});
        world_comm node((r < 2 ? first : second).endpoint(r % 2), topologies::fully_connected(2),
                        {.timeout = std::chrono::seconds(30)});
        values data(r == 3 && bad_op == reduce_op::sum ? 999 : 1000, 1.0f);
        try {  // rank 3 may fail the others while they still make theirs
          two_level_allreduce bucket(node, world, 1000, quantizers::one_bit{});
          bucket.allreduce(std::span(data), r == 3 ? bad_op : reduce_op::sum);
        } catch (const std::system_error& e) {
          codes[r] = e.code();
        }
      });
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      test::expect_culprit_fails_everyone(codes, 3, errc::invalid_argument, started);
    }
}

BOOST_AUTO_TEST_SUITE_END()
