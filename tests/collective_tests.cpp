// Exact collectives over the in-process transport: results equal the sequential
// reference bit for bit, for world sizes 1–8, counts not divisible by the world
// size, every reduce op, every element type and several topologies.

#define BOOST_TEST_MODULE qcoll collectives
#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>

#include "support/ranks.hpp"
#include "support/reference.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

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

/// Runs allreduce on n ranks and checks every rank's result against the reference.
template <class T, class Topology>
void check_allreduce(std::size_t n, std::size_t count, reduce_op op, bool in_place,
                     std::function<Topology(std::size_t)> make_topology, const std::vector<rank_t>& ring) {
  BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " op=" << to_string(op) << " type="
                          << to_string(dtype_of<T>::value) << " in_place=" << in_place) {
    const auto inputs = inputs_for<T>(n, count, n * 131 + count);
    const auto expected = test::reference_reduce(inputs, std::span<const rank_t>(ring), op);
    std::vector<std::vector<T>> results(n);
    const auto outcome = run_ranks<Topology>(
        n,
        [&](auto& comm) {
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
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops)
        for (bool aliased : {false, true}) {
          BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " op=" << to_string(op) << " aliased=" << aliased) {
            const auto inputs = inputs_for<double>(n, count, count + n);
            const auto expected = test::reference_reduce(inputs, std::span<const rank_t>(natural_order(n)), op);
            std::vector<std::vector<double>> buffers = inputs, results(n);
            const auto outcome = run_ranks(n, [&](auto& comm) {
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
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (bool in_place : {false, true}) {
        BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " in_place=" << in_place) {
          const auto whole = test::random_values<float>(count, count * 3 + n);
          std::vector<std::vector<float>> results(n);
          const auto outcome = run_ranks(n, [&](auto& comm) {
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
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : small_counts)
      for (rank_t root = 0; root < n; ++root) {
        BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " root=" << root) {
          const auto source = test::random_values<double>(count, root + 17 * count);
          std::vector<std::vector<double>> data(n, std::vector<double>(count, -3.0));
          data[root] = source;
          const auto outcome = run_ranks<topologies::ring>(
              n, [&](auto& comm) { comm.broadcast(std::span<double>(data[comm.rank()]), root); }, {},
              shuffled_ring);
          BOOST_TEST_REQUIRE(outcome.all_succeeded());
          for (std::size_t r = 0; r < n; ++r) BOOST_TEST(test::bitwise_equal<double>(data[r], source), "rank " << r);
        }
      }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(barrier)

BOOST_AUTO_TEST_CASE(nobody_leaves_before_everybody_arrived) {
  for (std::size_t n = 1; n <= 8; ++n) {
    std::atomic<std::size_t> arrived{0};
    std::atomic<bool> left_early{false};
    const auto outcome = run_ranks(n, [&](auto& comm) {
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
    BOOST_TEST(!left_early.load(), "n=" << n);
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
std::vector<std::uint16_t> rounded_once(const std::vector<std::vector<Half>>& inputs, reduce_op op) {
  std::vector<std::vector<float>> wide;
  for (const auto& values : inputs) wide.push_back(widened(values));
  const std::vector<rank_t> ring = natural_order(inputs.size());
  std::vector<std::uint16_t> out;
  for (float v : test::reference_reduce(wide, std::span<const rank_t>(ring), op)) out.push_back(Half(v).bits);
  return out;
}

template <class Half>
void check_allreduce_and_reduce_scatter() {
  for (std::size_t n = 1; n <= 5; ++n)
    for (std::size_t count : small_counts)
      for (reduce_op op : all_ops)
        BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " op=" << to_string(op) << " type="
                                << to_string(dtype_of<Half>::value)) {
          const auto inputs = half_inputs<Half>(n, count, n * 7 + count);
          const auto expected = rounded_once(inputs, op);
          const bool in_place = (count + n) % 2 == 0;
          std::vector<std::vector<Half>> results(n), blocks(n), buffers = inputs;
          const auto outcome = run_ranks(n, [&](auto& comm) {
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
            const auto want = block_of(count, n, r).of(std::span<const std::uint16_t>(expected));
            BOOST_TEST(bits<Half>(blocks[r]) == std::vector<std::uint16_t>(want.begin(), want.end()),
                       "reduce_scatter on rank " << r);
          }
        }
}

}  // namespace

BOOST_AUTO_TEST_CASE(bfloat16_equals_the_float_reduction_rounded_once) {
  check_allreduce_and_reduce_scatter<bfloat16>();
}

BOOST_AUTO_TEST_CASE(float16_equals_the_float_reduction_rounded_once) {
  check_allreduce_and_reduce_scatter<float16>();
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
