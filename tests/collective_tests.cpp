// Exact collectives over the in-process transport: results equal the sequential
// reference bit for bit, for world sizes 1–8, counts not divisible by the world
// size, every reduce op, every element type and several topologies.

#define BOOST_TEST_MODULE qcoll collectives
#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>

#include "support/ranks.hpp"
#include "support/reference.hpp"
#include "support/sanitizers.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <chrono>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <unistd.h>

using namespace qcoll;
using test::all_ops;
using test::natural_order;
using test::run_ranks;

namespace {

constexpr std::size_t small_counts[] = {0, 1, 2, 3, 5, 7, 8, 9, 13, 64, 100, 1000, 4097};

/// A ring whose order is not 0, 1, …: ranks in a fixed shuffled order.
topologies::ring shuffled_ring(std::size_t n) {
  std::vector<rank_t> order(n);
  std::iota(order.begin(), order.end(), rank_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(n) * 7919u));
  return topologies::ring(std::move(order));
}

std::vector<rank_t> ring_order_of(const topologies::ring& t) { return {t.ring_order().begin(), t.ring_order().end()}; }

template <class T>
std::vector<std::vector<T>> inputs_for(std::size_t n, std::size_t count, std::uint64_t seed) {
  std::vector<std::vector<T>> inputs;
  for (std::size_t r = 0; r < n; ++r) inputs.push_back(test::random_values<T>(count, seed * 1000 + r));
  return inputs;
}

/// The ring with every step read from the peer's memory (the in-process transport
/// reads by memcpy), reductions in bounce slices of `slice_bytes`.
tuning single_copy_everywhere(std::size_t slice_bytes = 64) {
  tuning tuned = test::forcing();
  tuned.single_copy_bytes = 0;
  tuned.ring_slice_bytes = slice_bytes;
  return tuned;
}

/// The ring through the pipes, every step in slices of 8 bytes (more slices than are
/// in flight, uneven last slices, and slices flowing across steps).
tuning pipelined_everywhere() {
  tuning tuned = test::forcing();
  tuned.ring_slice_bytes = 8;
  tuned.single_copy_bytes = tuning::never;
  return tuned;
}

/// Runs allreduce on n ranks with `tuning` and checks every rank's result against the
/// reference of the algorithm it forces (the ring's over `ring`, or recursive doubling's).
template <class T, class Topology>
void check_allreduce(std::size_t n, std::size_t count, reduce_op op, bool in_place,
                     std::function<Topology(std::size_t)> make_topology, const std::vector<rank_t>& ring,
                     const tuning& tuned = test::forcing()) {
  BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " op=" << to_string(op) << " type="
                          << to_string(dtype_of<T>::value) << " in_place=" << in_place << " algorithm="
                          << to_string(tuned.allreduce) << " slice=" << tuned.ring_slice_bytes) {
    const auto inputs = inputs_for<T>(n, count, n * 131 + count);
    // Halving-doubling sums every element in recursive doubling's order.
    const auto expected = tuned.allreduce == algorithm::recursive_doubling ||
                                  tuned.allreduce == algorithm::halving_doubling
                              ? test::reference_recursive_doubling(inputs, op)
                              : test::reference_reduce(inputs, std::span<const rank_t>(ring), op);
    std::vector<std::vector<T>> results(n);
    const auto outcome = run_ranks<Topology>(
        n,
        [&](auto& comm) {
          comm.set_tuning(tuned);
          const rank_t r = comm.rank();
          if (in_place) {
            results[r] = inputs[r];
            comm.allreduce(std::span<T>(results[r]), op);
          } else {
            results[r].assign(count, T(-7));
            comm.allreduce(std::span<const T>(inputs[r]), std::span<T>(results[r]), op);
          }
        },
        {}, make_topology);
    BOOST_TEST_REQUIRE(outcome.all_succeeded());
    for (std::size_t r = 0; r < n; ++r)
      BOOST_TEST(test::bitwise_equal<T>(results[r], expected), "rank " << r << " differs from the reference");
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(allreduce)

BOOST_AUTO_TEST_CASE(matches_reference_bitwise_on_a_ring) {
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops) {
        check_allreduce<float, topologies::ring>(n, count, op, count % 2 == 0,
                                                 [](std::size_t s) { return topologies::ring(s); }, natural_order(n));
        check_allreduce<double, topologies::ring>(n, count, op, count % 2 == 1,
                                                  [](std::size_t s) { return topologies::ring(s); }, natural_order(n));
      }
}

BOOST_AUTO_TEST_CASE(follows_a_shuffled_ring_order) {
  for (std::size_t n = 2; n <= 8; ++n)
    for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{17}, std::size_t{1000}})
      for (reduce_op op : all_ops)
        check_allreduce<float, topologies::ring>(n, count, op, true, shuffled_ring, ring_order_of(shuffled_ring(n)));
}

BOOST_AUTO_TEST_CASE(runs_on_a_fully_connected_topology) {
  for (std::size_t n = 1; n <= 8; n += 3)
    for (reduce_op op : all_ops)
      check_allreduce<double, topologies::fully_connected>(
          n, 999, op, false, [](std::size_t s) { return topologies::fully_connected(s); }, natural_order(n));
}

/// Every world size 1–8, count and op, float and double, on a fully connected
/// topology, with `way` forced; also 1001 floats, which 8 ranks split unevenly at every
/// halving.
static void check_exchange_algorithm(algorithm way) {
  const tuning tuned = test::forcing(way);
  const auto fully_connected = [](std::size_t s) { return topologies::fully_connected(s); };
  for (std::size_t n = 1; n <= 8; ++n) {
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops) {
        check_allreduce<float, topologies::fully_connected>(n, count, op, count % 2 == 0, fully_connected,
                                                            natural_order(n), tuned);
        check_allreduce<double, topologies::fully_connected>(n, count, op, count % 2 == 1, fully_connected,
                                                             natural_order(n), tuned);
      }
    check_allreduce<float, topologies::fully_connected>(n, 1001, reduce_op::sum, false, fully_connected,
                                                        natural_order(n), tuned);
  }
}

BOOST_AUTO_TEST_CASE(recursive_doubling_matches_its_reference_bitwise) {
  check_exchange_algorithm(algorithm::recursive_doubling);
}

BOOST_AUTO_TEST_CASE(halving_doubling_matches_recursive_doublings_reference_bitwise) {
  // small_counts include counts below, at and just above the world size, so some
  // halvings give one partner nothing.
  check_exchange_algorithm(algorithm::halving_doubling);
}

BOOST_AUTO_TEST_CASE(pipelined_ring_matches_the_reference_bitwise) {
  // Slices of 8 bytes (two floats, one double): every step of these counts is sliced,
  // with more slices than are in flight at once, and uneven last slices.
  tuning tuned = test::forcing();
  tuned.ring_slice_bytes = 8;
  tuned.single_copy_bytes = tuning::never;
  // Under ThreadSanitizer, whose cost is per message, the counts stop at 1000 (hundreds
  // of slices a step already) and the large buffer is a tenth: 41 s of the tsan preset
  // otherwise, for the same interleavings.
  std::vector<std::size_t> counts{9, 13, 64, 1000, 4097};
  if (test::thread_sanitized) counts.pop_back();
  for (std::size_t n = 2; n <= 8; ++n)
    // 13 on 4 ranks: blocks of 4 and 3 floats, cut into 2 slices and 1 (under two slices
    // a step goes whole), so neighbouring steps are cut differently.
    for (std::size_t count : counts)
      for (reduce_op op : all_ops) {
        check_allreduce<float, topologies::ring>(n, count, op, count % 2 == 0,
                                                 [](std::size_t s) { return topologies::ring(s); }, natural_order(n),
                                                 tuned);
        check_allreduce<double, topologies::ring>(n, count, op, count % 2 == 1,
                                                  [](std::size_t s) { return topologies::ring(s); },
                                                  natural_order(n), tuned);
      }
  tuned.ring_slice_bytes = 4096;  // whole-size slices of a large buffer
  check_allreduce<float, topologies::ring>(5, test::thread_sanitized ? 100'003 : 1'000'003, reduce_op::sum, true,
                                           [](std::size_t s) { return topologies::ring(s); }, natural_order(5), tuned);
}

BOOST_AUTO_TEST_CASE(single_copy_ring_matches_the_reference_bitwise) {
  // Bounce slices of 64 bytes: many per step, the last one short.
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops) {
        check_allreduce<float, topologies::ring>(n, count, op, count % 2 == 0,
                                                 [](std::size_t s) { return topologies::ring(s); }, natural_order(n),
                                                 single_copy_everywhere());
        check_allreduce<double, topologies::ring>(n, count, op, count % 2 == 1,
                                                  [](std::size_t s) { return topologies::ring(s); },
                                                  natural_order(n), single_copy_everywhere());
      }
  check_allreduce<double, topologies::ring>(3, 1'000'003, reduce_op::avg, false,
                                            [](std::size_t s) { return topologies::ring(s); }, natural_order(3),
                                            single_copy_everywhere(256 << 10));
}

BOOST_AUTO_TEST_CASE(the_size_chooses_the_algorithm) {
  // Without forcing: small buffers by recursive doubling where every pair is linked,
  // the ring above the threshold and on a ring of 5 (not every pair linked). Each
  // result carries its algorithm's summation order, so the bits tell which ran.
  tuning tuned;
  tuned.allreduce_small_bytes = 4000;
  const auto run = [&](std::size_t n, std::size_t count, bool fully_connected) {
    const auto inputs = inputs_for<float>(n, count, 4242 + count);
    std::vector<std::vector<float>> results(inputs);
    const auto body = [&](auto& comm) {
      comm.set_tuning(tuned);
      comm.allreduce(std::span<float>(results[comm.rank()]), reduce_op::sum);
    };
    const auto outcome = fully_connected ? run_ranks<topologies::fully_connected>(n, body)
                                         : run_ranks<topologies::ring>(n, body);
    BOOST_TEST_REQUIRE(outcome.all_succeeded());
    for (const auto& result : results) BOOST_TEST(test::bitwise_equal<float>(result, results[0]));
    return std::pair{inputs, results[0]};
  };
  const auto ring_result = [](const auto& inputs) {
    return test::reference_reduce(inputs, std::span<const rank_t>(natural_order(inputs.size())), reduce_op::sum);
  };
  {
    const auto [inputs, got] = run(4, 1000, true);  // 4000 bytes: at the threshold
    BOOST_TEST(test::bitwise_equal<float>(got, test::reference_recursive_doubling(inputs, reduce_op::sum)));
    BOOST_TEST(!test::bitwise_equal<float>(got, ring_result(inputs)), "the orders must differ for this to tell");
  }
  {
    // Above it, on 4 ranks, by halving-doubling: recursive doubling's order (which of the
    // two ran, the QCOLL_DEBUG=INFO test below tells).
    const auto [inputs, got] = run(4, 1001, true);
    BOOST_TEST(test::bitwise_equal<float>(got, test::reference_recursive_doubling(inputs, reduce_op::sum)));
  }
  {
    const auto [inputs, got] = run(3, 1001, true);  // not a power of two: the ring
    BOOST_TEST(test::bitwise_equal<float>(got, ring_result(inputs)));
    BOOST_TEST(!test::bitwise_equal<float>(got, test::reference_recursive_doubling(inputs, reduce_op::sum)));
  }
  tuned.allreduce_halving_bytes = 8000;
  {
    const auto [inputs, got] = run(4, 2001, true);  // above allreduce_halving_bytes: the ring
    BOOST_TEST(test::bitwise_equal<float>(got, ring_result(inputs)));
  }
  {
    const auto [inputs, got] = run(5, 100, false);
    BOOST_TEST(test::bitwise_equal<float>(got, ring_result(inputs)));
  }
}

BOOST_AUTO_TEST_CASE(large_counts) {
  for (std::size_t n : {1, 2, 3, 5, 8}) {
    check_allreduce<float, topologies::ring>(n, 1'000'000, reduce_op::sum, true,
                                             [](std::size_t s) { return topologies::ring(s); }, natural_order(n));
    check_allreduce<double, topologies::ring>(n, 1'000'003, reduce_op::avg, false,
                                              [](std::size_t s) { return topologies::ring(s); }, natural_order(n));
  }
}

BOOST_AUTO_TEST_CASE(same_bits_on_every_run) {
  // The summation order is fixed: ten runs give ten identical results.
  const std::size_t n = 6, count = 12345;
  const auto inputs = inputs_for<float>(n, count, 99);
  std::vector<float> first;
  for (int run = 0; run < 10; ++run) {
    std::vector<std::vector<float>> results(n);
    const auto outcome = run_ranks(n, [&](auto& comm) {
      results[comm.rank()] = inputs[comm.rank()];
      comm.allreduce(std::span<float>(results[comm.rank()]), reduce_op::sum);
    });
    BOOST_TEST_REQUIRE(outcome.all_succeeded());
    if (run == 0) first = results[0];
    for (const auto& result : results) BOOST_TEST(test::bitwise_equal<float>(result, first));
  }
}

BOOST_AUTO_TEST_CASE(non_finite_values_propagate) {
  const std::size_t n = 3, count = 6;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (reduce_op op : all_ops) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count, 1.0f));
    data[1][0] = nan;
    data[2][5] = inf;
    const auto outcome = run_ranks(n, [&](auto& comm) { comm.allreduce(std::span<float>(data[comm.rank()]), op); });
    BOOST_TEST_REQUIRE(outcome.all_succeeded());
    for (const auto& d : data) {
      BOOST_TEST(std::isnan(d[0]), to_string(op) << ": NaN must survive the reduction");
      if (op != reduce_op::min) BOOST_TEST(std::isinf(d[5]));
    }
  }
}

BOOST_AUTO_TEST_CASE(back_to_back_calls_reuse_one_communicator) {
  // Rank threads only record; Boost.Test's assertions are not thread-safe.
  std::vector<std::size_t> wrong(4);
  const auto outcome = run_ranks(4, [&](auto& comm) {
    for (std::size_t i = 0; i < 300; ++i) {
      std::vector<double> v(i % 17, double(comm.rank() + i));
      comm.allreduce(std::span<double>(v), reduce_op::sum);
      for (double x : v) wrong[comm.rank()] += x != 4.0 * double(i) + 6.0;
    }
  });
  BOOST_TEST(outcome.all_succeeded());
  BOOST_TEST(wrong == std::vector<std::size_t>(4, 0));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reduce_scatter)

BOOST_AUTO_TEST_CASE(matches_reference_blocks) {
  for (const tuning& tuned : {test::forcing(), single_copy_everywhere(), pipelined_everywhere()})
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops)
        for (bool aliased : {false, true}) {
          BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " op=" << to_string(op) << " aliased=" << aliased
                                  << " single_copy_bytes=" << tuned.single_copy_bytes
                                  << " slice=" << tuned.ring_slice_bytes) {
            const auto inputs = inputs_for<double>(n, count, count + n);
            const auto expected = test::reference_reduce(inputs, std::span<const rank_t>(natural_order(n)), op);
            std::vector<std::vector<double>> buffers = inputs, results(n);
            const auto outcome = run_ranks(n, [&](auto& comm) {
              comm.set_tuning(tuned);
              const rank_t r = comm.rank();
              const block_range mine = block_of(count, n, r);
              if (aliased) {
                // The output is this rank's block of the input itself.
                std::span<double> whole(buffers[r]);
                comm.reduce_scatter(std::span<const double>(whole), mine.of(whole), op);
                results[r].assign(mine.of(whole).begin(), mine.of(whole).end());
              } else {
                results[r].assign(mine.size, -1.0);
                comm.reduce_scatter(std::span<const double>(inputs[r]), std::span<double>(results[r]), op);
              }
            });
            BOOST_TEST_REQUIRE(outcome.all_succeeded());
            for (std::size_t r = 0; r < n; ++r) {
              const auto want = block_of(count, n, r).of(std::span<const double>(expected));
              BOOST_TEST(test::bitwise_equal<double>(results[r], want), "rank " << r);
            }
            if (!aliased) BOOST_TEST(buffers == inputs, "the input must not be modified");
          }
        }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(all_gather)

BOOST_AUTO_TEST_CASE(every_rank_gets_every_block) {
  for (const tuning& tuned : {test::forcing(), single_copy_everywhere(), pipelined_everywhere()})
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (bool in_place : {false, true}) {
        BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " in_place=" << in_place
                                << " single_copy_bytes=" << tuned.single_copy_bytes
                                << " slice=" << tuned.ring_slice_bytes) {
          const auto whole = test::random_values<float>(count, count * 3 + n);
          std::vector<std::vector<float>> results(n);
          const auto outcome = run_ranks(n, [&](auto& comm) {
            comm.set_tuning(tuned);
            const rank_t r = comm.rank();
            const block_range mine = block_of(count, n, r);
            const auto my_block = mine.of(std::span<const float>(whole));
            results[r].assign(count, -1.0f);
            if (in_place) {
              std::copy(my_block.begin(), my_block.end(), mine.of(std::span<float>(results[r])).begin());
              comm.all_gather(std::span<const float>(mine.of(std::span<float>(results[r]))), std::span<float>(results[r]));
            } else {
              comm.all_gather(my_block, std::span<float>(results[r]));
            }
          });
          BOOST_TEST_REQUIRE(outcome.all_succeeded());
          for (std::size_t r = 0; r < n; ++r) BOOST_TEST(test::bitwise_equal<float>(results[r], whole), "rank " << r);
        }
      }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(broadcast)

BOOST_AUTO_TEST_CASE(every_root_reaches_every_rank) {
  for (const algorithm way : {algorithm::ring, algorithm::binomial_tree})
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (rank_t root = 0; root < n; ++root) {
        BOOST_TEST_CONTEXT(to_string(way) << " n=" << n << " count=" << count << " root=" << root) {
          const auto source = test::random_values<double>(count, root + 17 * count);
          std::vector<std::vector<double>> data(n, std::vector<double>(count, -3.0));
          data[root] = source;
          const auto outcome = run_ranks<topologies::ring>(
              n,
              [&](auto& comm) {
                comm.set_tuning(test::forcing(algorithm::ring, way));
                comm.broadcast(std::span<double>(data[comm.rank()]), root);
              },
              {}, shuffled_ring);
          BOOST_TEST_REQUIRE(outcome.all_succeeded());
          for (std::size_t r = 0; r < n; ++r) BOOST_TEST(test::bitwise_equal<double>(data[r], source), "rank " << r);
        }
      }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(barrier)

BOOST_AUTO_TEST_CASE(nobody_leaves_before_everybody_arrived) {
  for (const algorithm way : {algorithm::ring, algorithm::dissemination})
  for (std::size_t n = 1; n <= 8; ++n) {
    std::atomic<std::size_t> arrived{0};
    std::atomic<bool> left_early{false};
    const auto outcome = run_ranks(n, [&](auto& comm) {
      comm.set_tuning(test::forcing(algorithm::ring, algorithm::ring, way));
      for (int round = 1; round <= 20; ++round) {
        // Stagger arrivals so a barrier that does not wait would be caught.
        std::this_thread::sleep_for(std::chrono::microseconds(50 * ((comm.rank() * 7 + round) % 5)));
        arrived.fetch_add(1);
        comm.barrier();
        if (arrived.load() < round * n) left_early = true;
        comm.barrier();  // nobody starts the next round before all have checked
      }
    });
    BOOST_TEST(outcome.all_succeeded());
    BOOST_TEST(!left_early.load(), to_string(way) << " n=" << n);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// bfloat16 and float16 reduce in float and round once: the result is the float
// reduction of the widened inputs, in the documented order, rounded to 16 bits.
BOOST_AUTO_TEST_SUITE(half_elements)

namespace {

template <class Half>
std::vector<std::vector<Half>> half_inputs(std::size_t n, std::size_t count, std::uint64_t seed) {
  std::vector<std::vector<Half>> inputs(n);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-12, 12);  // sums of 8 stay below float16's 65504
  for (auto& values : inputs)
    for (std::size_t i = 0; i < count; ++i) values.push_back(Half(std::ldexp(mantissa(gen), exponent(gen))));
  return inputs;
}

template <class Half>
std::vector<float> widened(const std::vector<Half>& values) {
  std::vector<float> wide;
  for (Half v : values) wide.push_back(float(v));
  return wide;
}

template <class Half>
std::vector<std::uint16_t> bits(std::span<const Half> values) {
  std::vector<std::uint16_t> out;
  for (Half v : values) out.push_back(v.bits);
  return out;
}

/// The expected result: the float reference over the widened inputs, rounded once.
template <class Half>
std::vector<std::uint16_t> rounded_once(const std::vector<std::vector<Half>>& inputs, reduce_op op, algorithm way) {
  std::vector<std::vector<float>> wide;
  for (const auto& values : inputs) wide.push_back(widened(values));
  const std::vector<rank_t> ring = natural_order(inputs.size());
  std::vector<std::uint16_t> out;
  const std::vector<float> reduced = way == algorithm::recursive_doubling || way == algorithm::halving_doubling
                                         ? test::reference_recursive_doubling(wide, op)
                                         : test::reference_reduce(wide, std::span<const rank_t>(ring), op);
  for (float v : reduced) out.push_back(Half(v).bits);
  return out;
}

/// allreduce (by `way`) and reduce_scatter (by the ring) against the float reference.
template <class Half>
void check_allreduce_and_reduce_scatter(algorithm way, std::optional<tuning> tuned = std::nullopt) {
  for (std::size_t n = 1; n <= 5; ++n)
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops)
        BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " op=" << to_string(op) << " type="
                                << to_string(dtype_of<Half>::value) << " algorithm=" << to_string(way)
                                << " slice=" << (tuned ? tuned->ring_slice_bytes : 0)) {
          const auto inputs = half_inputs<Half>(n, count, n * 7 + count);
          const auto expected = rounded_once(inputs, op, way);
          const auto expected_blocks = rounded_once(inputs, op, algorithm::ring);
          const bool in_place = (count + n) % 2 == 0;
          std::vector<std::vector<Half>> results(n), blocks(n), buffers = inputs;
          const auto outcome = run_ranks(n, [&](auto& comm) {
            comm.set_tuning(tuned               ? *tuned
                            : way == algorithm::ring_single_copy ? single_copy_everywhere()
                                                                 : test::forcing(way));
            const rank_t r = comm.rank();
            if (in_place) {
              comm.allreduce(std::span<Half>(buffers[r]), op);
              results[r] = buffers[r];
            } else {
              results[r].assign(count, Half(-7.0f));
              comm.allreduce(std::span<const Half>(inputs[r]), std::span<Half>(results[r]), op);
            }
            const block_range mine = block_of(count, n, r);
            if (in_place) {  // the output is this rank's block of the input itself
              std::vector<Half> whole = inputs[r];
              comm.reduce_scatter(std::span<const Half>(whole), mine.of(std::span<Half>(whole)), op);
              blocks[r].assign(whole.begin() + static_cast<std::ptrdiff_t>(mine.offset),
                               whole.begin() + static_cast<std::ptrdiff_t>(mine.offset + mine.size));
            } else {
              blocks[r].assign(mine.size, Half(-7.0f));
              comm.reduce_scatter(std::span<const Half>(inputs[r]), std::span<Half>(blocks[r]), op);
            }
          });
          BOOST_TEST_REQUIRE(outcome.all_succeeded());
          for (std::size_t r = 0; r < n; ++r) {
            BOOST_TEST(bits<Half>(results[r]) == expected, "allreduce on rank " << r);
            const auto want = block_of(count, n, r).of(std::span<const std::uint16_t>(expected_blocks));
            BOOST_TEST(bits<Half>(blocks[r]) == std::vector<std::uint16_t>(want.begin(), want.end()),
                       "reduce_scatter on rank " << r);
          }
        }
}

}  // namespace

BOOST_AUTO_TEST_CASE(bfloat16_equals_the_float_reduction_rounded_once) {
  check_allreduce_and_reduce_scatter<bfloat16>(algorithm::ring);
  check_allreduce_and_reduce_scatter<bfloat16>(algorithm::ring_single_copy);
  check_allreduce_and_reduce_scatter<bfloat16>(algorithm::ring, pipelined_everywhere());
  check_allreduce_and_reduce_scatter<bfloat16>(algorithm::recursive_doubling);
  check_allreduce_and_reduce_scatter<bfloat16>(algorithm::halving_doubling);
}

BOOST_AUTO_TEST_CASE(float16_equals_the_float_reduction_rounded_once) {
  check_allreduce_and_reduce_scatter<float16>(algorithm::ring);
  check_allreduce_and_reduce_scatter<float16>(algorithm::ring_single_copy);
  check_allreduce_and_reduce_scatter<float16>(algorithm::ring, pipelined_everywhere());
  check_allreduce_and_reduce_scatter<float16>(algorithm::recursive_doubling);
  check_allreduce_and_reduce_scatter<float16>(algorithm::halving_doubling);
}

// 1 + 2^-8 + 2^-8 is 1 + 2^-7 in float and in bfloat16. Rounding after each hop
// would lose both halves wherever the fold starts with 1 + 2^-8 (a tie, to even: 1).
BOOST_AUTO_TEST_CASE(partial_sums_are_not_rounded_on_the_way) {
  const auto outcome = run_ranks(3, [](auto& comm) {
    std::vector<bfloat16> v(30, bfloat16(comm.rank() == 0 ? 1.0f : 0x1p-8f));
    comm.allreduce(std::span<bfloat16>(v), reduce_op::sum);
    for (bfloat16 x : v)
      if (x.bits != bfloat16(1.0f + 0x1p-7f).bits)
        throw std::runtime_error("a partial sum was rounded to bfloat16 on the way");
  });
  BOOST_TEST(outcome.all_succeeded());
}

BOOST_AUTO_TEST_CASE(all_gather_and_broadcast_copy_the_bits) {
  for (std::size_t n : {1u, 2u, 4u})
    BOOST_TEST_CONTEXT("n=" << n) {
      const std::size_t count = 1001;
      std::vector<float16> source(count);
      for (std::size_t i = 0; i < count; ++i) source[i] = float16::from_bits(static_cast<std::uint16_t>(i * 65));
      std::vector<std::vector<float16>> gathered(n), broadcast(n);
      const auto outcome = run_ranks(n, [&](auto& comm) {
        const rank_t r = comm.rank();
        const block_range mine = block_of(count, n, r);
        gathered[r].assign(count, float16::from_bits(0));
        comm.all_gather(mine.of(std::span<const float16>(source)), std::span<float16>(gathered[r]));
        broadcast[r] = r == n - 1 ? source : std::vector<float16>(count, float16::from_bits(0));
        comm.broadcast(std::span<float16>(broadcast[r]), n - 1);
      });
      BOOST_TEST_REQUIRE(outcome.all_succeeded());
      for (std::size_t r = 0; r < n; ++r) {
        BOOST_TEST(bits<float16>(gathered[r]) == bits<float16>(source));  // NaN payloads included
        BOOST_TEST(bits<float16>(broadcast[r]) == bits<float16>(source));
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(choosing_an_algorithm)

BOOST_AUTO_TEST_CASE(the_environment_overrides_the_table) {
  ::setenv("QCOLL_ALLREDUCE_ALGO", "recursive_doubling", 1);
  ::setenv("QCOLL_BARRIER_ALGO", "auto", 1);
  ::setenv("QCOLL_RING_SLICE_BYTES", "64K", 1);
  ::setenv("QCOLL_SINGLE_COPY_BYTES", "off", 1);
  ::setenv("QCOLL_BROADCAST_SMALL_BYTES", "1000", 1);
  ::setenv("QCOLL_ALLREDUCE_HALVING_BYTES", "2M", 1);
  ::setenv("QCOLL_SINGLE_COPY_KERNEL_BYTES", "4M", 1);
  const tuning t = tuning::from_environment();
  BOOST_TEST((t.allreduce == algorithm::recursive_doubling));
  BOOST_TEST((t.barrier == algorithm::unspecified));
  BOOST_TEST(t.ring_slice_bytes == 65536u);
  BOOST_TEST(t.single_copy_bytes == tuning::never);
  BOOST_TEST(t.broadcast_small_bytes == 1000u);
  BOOST_TEST(t.allreduce_halving_bytes == std::size_t{2} << 20);
  BOOST_TEST(t.allreduce_small_bytes == tuning_table::allreduce_small_bytes);
  BOOST_TEST(t.single_copy_kernel_bytes == std::size_t{4} << 20);
  BOOST_TEST(!t.measure_copy_path);  // a size replaces the measurement
  ::setenv("QCOLL_SINGLE_COPY_KERNEL_BYTES", "auto", 1);
  BOOST_TEST(tuning::from_environment().measure_copy_path);
  ::unsetenv("QCOLL_SINGLE_COPY_KERNEL_BYTES");
  // Unset: measured where the ranks that read each other's memory fit the host's cores.
  BOOST_TEST(!tuning::from_environment().measure_copy_path);  // none do: nothing is staged
  BOOST_TEST(tuning::from_environment(1).measure_copy_path);
  const auto cores = static_cast<rank_t>(std::thread::hardware_concurrency());
  BOOST_TEST(tuning::from_environment(cores).measure_copy_path == (cores > 0));
  BOOST_TEST(!tuning::from_environment(cores + 1).measure_copy_path);  // oversubscribed: every step staged
  ::setenv("QCOLL_SINGLE_COPY_KERNEL_BYTES", "off", 1);
  BOOST_TEST(!tuning::from_environment(1).measure_copy_path);
  BOOST_TEST(tuning::from_environment(1).single_copy_kernel_bytes == tuning::never);
  ::setenv("QCOLL_SINGLE_COPY_KERNEL_BYTES", "auto", 1);
  BOOST_TEST(tuning::from_environment(cores + 1).measure_copy_path);  // asked for
  ::setenv("QCOLL_SINGLE_COPY_KERNEL_BYTES", "4M", 1);
  // A communicator reads them when it is made.
  const auto outcome = test::run_ranks(2, [](auto& comm) {
    if (comm.tuning().allreduce != algorithm::recursive_doubling) throw std::runtime_error("not read");
  });
  BOOST_TEST(outcome.all_succeeded());

  const auto refused = [](const char* name, const char* value, const char* mention) {
    ::setenv(name, value, 1);
    try {
      (void)tuning::from_environment();
      BOOST_ERROR(name << "=" << value << " was accepted");
    } catch (const error& e) {
      BOOST_TEST((e.code() == errc::invalid_argument));
      BOOST_TEST(std::string(e.what()).find(mention) != std::string::npos, e.what());
    }
    ::unsetenv(name);
  };
  refused("QCOLL_ALLREDUCE_ALGO", "binomial_tree", "QCOLL_ALLREDUCE_ALGO=binomial_tree is not one of ring, recursive_doubling, halving_doubling, auto");
  refused("QCOLL_RING_SLICE_BYTES", "12Q", "QCOLL_RING_SLICE_BYTES=12Q is not a byte count");
  refused("QCOLL_ALLREDUCE_SMALL_BYTES", "-1", "QCOLL_ALLREDUCE_SMALL_BYTES=-1");
  refused("QCOLL_SINGLE_COPY_BYTES", "99999999999999999999M", "QCOLL_SINGLE_COPY_BYTES");
  refused("QCOLL_SINGLE_COPY_KERNEL_BYTES", "4G", "QCOLL_SINGLE_COPY_KERNEL_BYTES=4G is not a byte count");
  for (const char* name : {"QCOLL_ALLREDUCE_ALGO", "QCOLL_BARRIER_ALGO", "QCOLL_RING_SLICE_BYTES", "QCOLL_SINGLE_COPY_BYTES",
                           "QCOLL_BROADCAST_SMALL_BYTES", "QCOLL_ALLREDUCE_HALVING_BYTES", "QCOLL_SINGLE_COPY_KERNEL_BYTES"})
    ::unsetenv(name);
}

BOOST_AUTO_TEST_CASE(every_rule_chooses_from_plain_data) {
  // tuning/choose.hpp decides without a communicator: each rule, with the words
  // QCOLL_DEBUG=INFO prints after the call.
  const tuning table;
  const auto chose = [](choose::choice made, algorithm expected, std::string_view rule) {
    return made.algorithm == expected && std::string_view(made.rule) == rule;
  };
  const choose::world four{.size = 4, .fully_linked = true, .reads_peers_memory = true};
  const choose::world pipes{.size = 4, .fully_linked = true, .reads_peers_memory = false};
  const choose::world ring_of_five{.size = 5, .fully_linked = false};
  const std::size_t small = table.allreduce_small_bytes, medium = small + 1, large = 4 * table.single_copy_bytes,
                    huge = table.allreduce_halving_bytes + 4;
  const char* halving = "bytes <= allreduce_halving_bytes, 2^k >= 4 ranks, steps through the transport";
  const char* single_copy = "steps of >= single_copy_bytes, and the transport reads peers' memory";
  BOOST_TEST(chose(choose::allreduce(table, four, small, small / 4), algorithm::recursive_doubling,
                   "bytes <= allreduce_small_bytes"));
  BOOST_TEST(chose(choose::allreduce(table, four, medium, medium / 4), algorithm::halving_doubling, halving));
  BOOST_TEST(chose(choose::allreduce(table, four, large, large / 4), algorithm::ring_single_copy, single_copy));
  BOOST_TEST(chose(choose::allreduce(table, pipes, large, large / 4), algorithm::halving_doubling, halving));
  BOOST_TEST(chose(choose::allreduce(table, pipes, huge, huge / 4), algorithm::ring, "bytes > allreduce_halving_bytes"));
  BOOST_TEST(chose(choose::allreduce(table, {.size = 3}, medium, medium / 3), algorithm::ring,
                   "bytes > allreduce_small_bytes, and halving-doubling needs 2^k >= 4 ranks"));
  BOOST_TEST(chose(choose::allreduce(table, {.size = 1}, small, small), algorithm::ring, "the only algorithm"));
  BOOST_TEST(chose(choose::allreduce(table, ring_of_five, small, small / 5), algorithm::ring,
                   "the topology does not link every pair"));
  BOOST_TEST(chose(choose::broadcast(table, four, table.broadcast_small_bytes), algorithm::binomial_tree,
                   "bytes <= broadcast_small_bytes"));
  BOOST_TEST(chose(choose::broadcast(table, four, table.broadcast_small_bytes + 1), algorithm::ring,
                   "bytes > broadcast_small_bytes"));
  BOOST_TEST(chose(choose::broadcast(table, ring_of_five, 64), algorithm::ring, "the topology does not link every pair"));
  BOOST_TEST(chose(choose::barrier(table, four), algorithm::dissemination, "every pair linked"));
  BOOST_TEST(chose(choose::barrier(table, ring_of_five), algorithm::ring, "the topology does not link every pair"));
  // reduce_scatter and all_gather run the ring, read from the peer's memory where they can.
  BOOST_TEST(chose(choose::ring(table, table.single_copy_bytes, true), algorithm::ring_single_copy, single_copy));
  BOOST_TEST(chose(choose::ring(table, table.single_copy_bytes - 1, true), algorithm::ring, "the only algorithm"));
  BOOST_TEST(chose(choose::ring(table, table.single_copy_bytes, false), algorithm::ring, "the only algorithm"));

  tuning forced = table;
  forced.allreduce = algorithm::ring;  // still read from the peer's memory where it can
  forced.broadcast = algorithm::ring;
  forced.barrier = algorithm::ring;
  BOOST_TEST(chose(choose::allreduce(forced, four, large, large / 4), algorithm::ring_single_copy,
                   "forced (QCOLL_ALLREDUCE_ALGO or set_tuning)"));
  BOOST_TEST(chose(choose::broadcast(forced, four, 64), algorithm::ring, "forced (QCOLL_BROADCAST_ALGO or set_tuning)"));
  BOOST_TEST(chose(choose::barrier(forced, four), algorithm::ring, "forced (QCOLL_BARRIER_ALGO or set_tuning)"));
  forced.allreduce = algorithm::halving_doubling;  // on any world, where every pair is linked or not
  BOOST_TEST(chose(choose::allreduce(forced, ring_of_five, huge, huge / 5), algorithm::halving_doubling,
                   "forced (QCOLL_ALLREDUCE_ALGO or set_tuning)"));
}

/// A host for the single-copy path's chooser (tuning/copy_path.hpp): each path's time
/// per byte, by size class, as the calls find it.
struct copy_host {
  double staged = 1.0, peer_read = 1.0;  // ns per byte
};

/// `calls` calls of `bytes` on `host`; returns how many were trials.
int run_copy_calls(tuning_copy::copy_path_chooser& chooser, std::size_t bytes, copy_host host, int calls) {
  int trials = 0;
  for (int k = 0; k < calls; ++k) {
    const tuning_copy::copy_decision made = chooser.choose(bytes);
    trials += made.trial;
    const double rate = made.path == tuning_copy::copy_path::staged ? host.staged : host.peer_read;
    chooser.record(made, std::chrono::nanoseconds(static_cast<long long>(rate * static_cast<double>(bytes))));
  }
  return trials;
}

BOOST_AUTO_TEST_CASE(the_copy_path_is_the_faster_one_of_each_size_class_at_a_bounded_cost) {
  using tuning_copy::copy_path;
  const std::size_t one_mib = std::size_t{1} << 20, four_mib = std::size_t{4} << 20;
  {  // Staging is faster: it stays, and trials thin out to one round (3 calls) per 1,024.
    tuning_copy::copy_path_chooser chooser;
    BOOST_TEST(run_copy_calls(chooser, one_mib, {1.0, 2.0}, 16) == 0);  // after a benchmark's warm-up
    BOOST_TEST(run_copy_calls(chooser, one_mib, {1.0, 2.0}, 3) == 3);   // calls 16 to 18 are the first trials
    BOOST_TEST((chooser.current(one_mib) == copy_path::staged));
    const int trials = run_copy_calls(chooser, one_mib, {1.0, 2.0}, 9981);
    BOOST_TEST((chooser.current(one_mib) == copy_path::staged));
    BOOST_TEST(trials <= 3 * (6 + 10000 / 1024), trials << " trials in 10,000 calls");
    BOOST_TEST(trials >= 3 * (10000 / 1024));  // it keeps checking
  }
  {  // A trial over twice as slow thins the rounds out faster: 2 rounds in 300 calls, not 4.
    tuning_copy::copy_path_chooser near, far;
    BOOST_TEST(run_copy_calls(near, one_mib, {1.0, 2.0}, 300) == 12);
    BOOST_TEST(run_copy_calls(far, one_mib, {1.0, 4.0}, 300) == 6);
  }
  {  // The kernel's copy is faster: the first round switches, and it stays switched.
    tuning_copy::copy_path_chooser chooser;
    run_copy_calls(chooser, one_mib, {2.0, 1.0}, 19);
    BOOST_TEST((chooser.current(one_mib) == copy_path::peer_read));
    const int trials = run_copy_calls(chooser, one_mib, {2.0, 1.0}, 81);
    BOOST_TEST((chooser.current(one_mib) == copy_path::peer_read));
    BOOST_TEST(trials <= 6, trials << " trials in calls 19-99");
  }
  {  // Size classes are measured apart: staged at 1 MiB, the kernel at 4 MiB, interleaved.
    tuning_copy::copy_path_chooser chooser;
    for (int k = 0; k < 200; ++k) {
      run_copy_calls(chooser, one_mib, {1.0, 1.5}, 1);
      run_copy_calls(chooser, four_mib, {1.5, 1.0}, 1);
    }
    BOOST_TEST((chooser.current(one_mib) == copy_path::staged));
    BOOST_TEST((chooser.current(four_mib) == copy_path::peer_read));
    BOOST_TEST((chooser.current(one_mib / 2) == copy_path::staged));  // an unused class: the default
  }
  {  // Within the margin the current path stays (no flapping between equals).
    tuning_copy::copy_path_chooser chooser;
    run_copy_calls(chooser, one_mib, {1.0, 0.95}, 3000);
    BOOST_TEST((chooser.current(one_mib) == copy_path::staged));
  }
  {  // A slow window: staging turns 4x slower after 3,000 calls; the class follows within 20.
    tuning_copy::copy_path_chooser chooser;
    run_copy_calls(chooser, one_mib, {1.0, 2.0}, 3000);
    BOOST_TEST_REQUIRE((chooser.current(one_mib) == copy_path::staged));
    run_copy_calls(chooser, one_mib, {4.0, 2.0}, 20);
    BOOST_TEST((chooser.current(one_mib) == copy_path::peer_read));
    // ... and back when the window ends.
    run_copy_calls(chooser, one_mib, {1.0, 4.0}, 20);
    BOOST_TEST((chooser.current(one_mib) == copy_path::staged));
  }
  {  // Outliers: one slow call of the current path brings no round; one fast trial switches
     // nothing unless it beats the calls around it, and the first call (fresh memory) is not counted.
    tuning_copy::copy_path_chooser chooser;
    auto first = chooser.choose(one_mib);
    chooser.record(first, std::chrono::seconds(10));
    run_copy_calls(chooser, one_mib, {1.0, 2.0}, 100);
    int trials = 0;
    for (int k = 0; k < 200; ++k) {  // every 16th call of the current path takes 10x
      const tuning_copy::copy_decision made = chooser.choose(one_mib);
      trials += made.trial;
      const double rate = made.trial ? 2.0 : k % 16 == 0 ? 10.0 : 1.0;
      chooser.record(made, std::chrono::nanoseconds(static_cast<long long>(rate * one_mib)));
    }
    BOOST_TEST((chooser.current(one_mib) == copy_path::staged));
    BOOST_TEST(trials <= 6, trials << " trials");  // the scheduled rounds, no more
  }
  {  // The first call on the other path pays for the switch (measured on an Intel Xeon host:
     // a lone kernel-copy call among staged ones 1.3-1.8x a call in a run of them). The kernel's
     // copy 20 % faster in a run, its first call 60 % slower: the round still switches.
    tuning_copy::copy_path_chooser chooser;
    copy_path previous = copy_path::staged;
    for (int k = 0; k < 100; ++k) {
      const tuning_copy::copy_decision made = chooser.choose(one_mib);
      const double rate = (made.path == copy_path::staged ? 1.0 : 0.8) * (made.path != previous ? 2.0 : 1.0);
      previous = made.path;
      chooser.record(made, std::chrono::nanoseconds(static_cast<long long>(rate * one_mib)));
    }
    BOOST_TEST((chooser.current(one_mib) == copy_path::peer_read));
  }
  {  // A trial that failed (never recorded) does not end the measuring: a later round comes.
    tuning_copy::copy_path_chooser chooser;
    run_copy_calls(chooser, one_mib, {1.0, 1.0}, 18);
    const tuning_copy::copy_decision lost = chooser.choose(one_mib);  // call 18, the round's last trial: it throws
    BOOST_TEST(lost.trial);
    BOOST_TEST(lost.call == 18u);
    run_copy_calls(chooser, one_mib, {2.0, 1.0}, 200);
    BOOST_TEST((chooser.current(one_mib) == copy_path::peer_read));
  }
}

BOOST_AUTO_TEST_CASE(qcoll_debug_info_names_the_algorithm_and_copy_path_of_each_call) {
  // QCOLL_DEBUG=INFO: one line per exact collective when it ends, on stderr (captured here).
  ::setenv("QCOLL_DEBUG", "INFO", 1);
  std::FILE* captured = std::tmpfile();
  BOOST_TEST_REQUIRE(captured != nullptr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(::fileno(captured), STDERR_FILENO);
  const auto outcome = test::run_ranks<topologies::fully_connected>(4, [](auto& comm) {
    // Steps of 40 KB go through the transport, steps of 400 KB are read from the peer.
    std::vector<float> small(16, 1.0f), medium(40'000, 1.0f), large(400'000, 1.0f);
    comm.allreduce(std::span<float>(small), reduce_op::sum);
    comm.allreduce(std::span<float>(medium), reduce_op::sum);
    comm.allreduce(std::span<float>(large), reduce_op::sum);
    comm.broadcast(std::span<float>(small), 1);
    comm.barrier();
  });
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::unsetenv("QCOLL_DEBUG");
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  std::string log(1 << 16, '\0');
  std::rewind(captured);
  log.resize(std::fread(log.data(), 1, log.size(), captured));
  std::fclose(captured);
  // Each call's line: the choice, then its time and where its bytes went.
  struct expected {
    const char* choice;
    const char* paths;  // what this rank moved, and how
  };
  // Recursive doubling on 4 ranks: two exchanges of the whole 64 bytes. Halving-doubling:
  // 2(n-1)/n of 160,000 bytes sent. Ring single copy (in-process: the transport's
  // read_peer): 2(n-1)/n of 1,600,000 bytes read from the peers, and per step only the
  // 56 bytes that say where the block is. A barrier moves no bytes.
  for (const expected& call : std::initializer_list<expected>{
           {"qcoll: rank 0 of 4: allreduce(count=16, f32, sum) #0 via recursive_doubling (64 bytes): bytes <= "
            "allreduce_small_bytes; ",
            " bytes: transport 128, mapped 0, peer_read 0, staged 0\n"},
           {"qcoll: rank 1 of 4: allreduce(count=40000, f32, sum) #1 via halving_doubling (160000 bytes): bytes <= "
            "allreduce_halving_bytes, 2^k >= 4 ranks, steps through the transport; ",
            " bytes: transport 240000, mapped 0, peer_read 0, staged 0\n"},
           {"qcoll: rank 3 of 4: allreduce(count=400000, f32, sum) #2 via ring_single_copy (1600000 bytes): steps of >= "
            "single_copy_bytes, and the transport reads peers' memory; ",
            " bytes: transport 336, mapped 0, peer_read 2400000, staged 0\n"},
           {"qcoll: rank 2 of 4: broadcast(count=16, f32, root=1) #3 via binomial_tree (64 bytes): bytes <= "
            "broadcast_small_bytes; ",
            " us of it waiting; bytes: "},
           {"qcoll: rank 1 of 4: barrier #4 via dissemination (0 bytes): every pair linked; ",
            " bytes: transport 0, mapped 0, peer_read 0, staged 0\n"}}) {
    const std::size_t at = log.find(call.choice);
    BOOST_TEST_REQUIRE(at != std::string::npos, "missing: " << call.choice << "\nin:\n" << log);
    const std::string line = log.substr(at, log.find('\n', at) + 1 - at);
    BOOST_TEST(line.find(call.paths) != std::string::npos, "expected '" << call.paths << "' in: " << line);
  }
}

BOOST_AUTO_TEST_SUITE_END()
