// Reproducible sums (reproducible.hpp), ranks as threads over the in-process transport:
// the same bits for every algorithm, ring order and world size 1–16 as one rank summing
// every addend itself, by either path (one allreduce of the integers, or reduce-scatter
// and gather), and each rank's block of them from reduce_scatter; 64 addends spread over
// 1–16 ranks in any way give the same bits (allreduce and reduce_scatter);
// NaN, ±Inf, signed zeros, denormals and values from 2^-120 to 2^120; the error against
// an exact sum within the documented bound; mismatches are errors on every rank; started
// calls give the blocking bits; over random meshes and tori with random faults
// (reproducible_grid.hpp) the bits of the included ranks' addends.

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>
#include <qcoll/reproducible.hpp>
#include <qcoll/reproducible_grid.hpp>
#include <qcoll/topologies/fully_connected.hpp>
#include <qcoll/topologies/router.hpp>

#include "support/ranks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace qcoll;

namespace reproducible_test {

__extension__ typedef __int128 exact_integer;  // the exact reference's fixed point (a GNU extension)

/// `addends` vectors of `count` values of T: signs and exponents spread over ±2^spread
/// (within T's range), some exact zeros.
template <class T>
std::vector<std::vector<T>> addends_of(std::size_t addends, std::size_t count, int spread, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> mantissa(0.5, 1.0);
  std::uniform_int_distribution<int> exponent(-spread, spread), coin(0, 1), rare(0, 99);
  std::vector<std::vector<T>> all(addends, std::vector<T>(count));
  for (auto& v : all)
    for (T& x : v) {
      const double value = rare(gen) == 0 ? 0.0 : (coin(gen) ? 1 : -1) * std::ldexp(mantissa(gen), exponent(gen));
      x = static_cast<T>(static_cast<float>(value));
      if constexpr (std::same_as<T, double>) x = value;
    }
  return all;
}

template <class T>
std::vector<std::uint8_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// The sum one rank makes of every addend: what every world must give.
template <class T>
std::vector<T> local_sum(const std::vector<std::vector<T>>& addends, std::size_t count, reduce_op op) {
  reproducible_accumulator<T> all(count);
  for (const auto& a : addends) all.add(a);
  std::vector<T> out(count);
  all.sum(std::span(out), op);
  return out;
}

/// Each rank r of `n` adds the addends owner(k) == r, then all reduce (or, `scatter`,
/// reduce-scatter); every rank's bits (its block's).
template <class T, class Owner>
std::vector<std::vector<T>> spread_sum(const std::vector<std::vector<T>>& addends, std::size_t count, rank_t n,
                                       Owner owner, reduce_op op, algorithm way = algorithm::unspecified,
                                       std::vector<rank_t> order = {}, bool scatter = false) {
  std::vector<std::vector<T>> out(n);
  const auto outcome = test::run_ranks<topologies::ring>(
      n,
      [&](test::inproc_communicator& comm) {
        if (way != algorithm::unspecified) comm.set_tuning(test::forcing(way));
        reproducible_accumulator<T> mine(count);
        for (std::size_t k = 0; k < addends.size(); ++k)
          if (owner(k) == comm.rank()) mine.add(addends[k]);
        out[comm.rank()].resize(scatter ? block_of(count, n, comm.rank()).size : count);
        if (scatter) mine.reduce_scatter(comm, std::span(out[comm.rank()]), op);
        else mine.allreduce(comm, std::span(out[comm.rank()]), op);
      },
      {}, [&](std::size_t size) { return order.empty() ? topologies::ring(size) : topologies::ring(order); });
  for (std::size_t r = 0; r < n; ++r) BOOST_TEST_REQUIRE(!outcome.errors[r], "rank " << r << ": " << outcome.failure(r).second);
  return out;
}

template <class T>
void check_every_world(std::size_t count, int spread) {
  for (const rank_t n : {rank_t{1}, rank_t{2}, rank_t{3}, rank_t{4}, rank_t{5}, rank_t{8}, rank_t{13}, rank_t{16}}) {
    const auto addends = addends_of<T>(n, count, spread, 100 + n);
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg}) {
      const auto expected = bits_of(local_sum(addends, count, op));
      std::vector<rank_t> reversed(n);
      std::iota(reversed.rbegin(), reversed.rend(), rank_t{0});
      for (const algorithm way : {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling})
        for (const bool permuted : {false, true})
          BOOST_TEST_CONTEXT(n << " ranks, " << to_string(op) << ", algorithm " << static_cast<int>(way)
                                << (permuted ? ", ring reversed" : "")) {
            const auto out = spread_sum(addends, count, n, [](std::size_t k) { return k; }, op, way,
                                        permuted ? reversed : std::vector<rank_t>{});
            for (rank_t r = 0; r < n; ++r) BOOST_TEST((bits_of(out[r]) == expected), "rank " << r);
          }
    }
  }
}


namespace topo = qcoll::topologies;

/// Every node's rank runs reproducible_grid_allreduce over `routing`, node v adding the
/// addends owner(k) == v (an accumulator); returns each rank's output and error.
template <class T, class Owner>
std::pair<std::vector<std::vector<T>>, test::rank_outcomes> grid_sum(const topo::grid_routing& routing,
                                                                     const std::vector<std::vector<T>>& addends,
                                                                     std::size_t count, Owner owner, reduce_op op) {
  const std::size_t n = routing.shape().size();
  std::vector<std::vector<T>> out(n, std::vector<T>(count));
  auto outcome = test::run_ranks<topo::fully_connected>(n, [&](test::inproc_communicator& comm) {
    reproducible_grid_allreduce<T> sum(comm, routing, count);
    reproducible_accumulator<T> mine(count);
    for (std::size_t k = 0; k < addends.size(); ++k)
      if (owner(k) == comm.rank()) mine.add(addends[k]);
    if (mine.addends() == 1) sum.allreduce(comm, std::span<const T>(addends[comm.rank()]), std::span(out[comm.rank()]), op);
    else sum.allreduce(comm, mine, std::span(out[comm.rank()]), op);
  });
  return {std::move(out), std::move(outcome)};
}

/// Included ranks hold `expected`; excluded ones were told why.
template <class T>
void check_grid_outcome(const topo::grid_routing& routing, const std::vector<std::vector<T>>& out,
                        const test::rank_outcomes& outcome, const std::vector<T>& expected) {
  for (rank_t v = 0; v < routing.shape().size(); ++v) {
    if (!routing.is_included(v)) {
      BOOST_TEST(outcome.failure(v).first == errc::invalid_argument, "node " << v << ": " << outcome.failure(v).second);
      BOOST_TEST(outcome.failure(v).second.find("excludes") != std::string::npos, outcome.failure(v).second);
      continue;
    }
    BOOST_TEST_REQUIRE(!outcome.errors[v], "node " << v << ": " << outcome.failure(v).second);
    BOOST_TEST((bits_of(out[v]) == bits_of(expected)), "node " << v);
  }
}

}  // namespace reproducible_test

using namespace reproducible_test;

BOOST_AUTO_TEST_SUITE(reproducible)

// Every algorithm the tuning can force, the ring in two orders, 1–16 ranks: every rank
// holds the bits one rank gets summing every addend itself. Sizes around the blocks.
BOOST_AUTO_TEST_CASE(the_bits_do_not_depend_on_the_algorithm_the_order_or_the_world) {
  for (const std::size_t count : {std::size_t{1}, std::size_t{255}, std::size_t{4097}}) {
    BOOST_TEST_CONTEXT(count << " values") {
      check_every_world<float>(count, 30);
      check_every_world<double>(count, 300);
      check_every_world<bfloat16>(count, 30);
      check_every_world<float16>(count, 6);
    }
  }
}

/// Block r of `all`, for rank r of n.
template <class T>
std::vector<T> block_for(const std::vector<T>& all, rank_t n, rank_t r) {
  const block_range mine = block_of(all.size(), n, r);
  return std::vector<T>(all.begin() + mine.offset, all.begin() + mine.offset + mine.size);
}

// From 256 KiB of carriers (32 Ki floats, 16 Ki doubles) the ranks reduce-scatter the
// integers and gather the rounded values: the same bits as one rank summing everything,
// for every type, world, order and forced algorithm.
BOOST_AUTO_TEST_CASE(large_sums_take_the_gathering_path_with_the_same_bits) {
  namespace r = detail::reproducible;
  BOOST_TEST_REQUIRE((r::gathers<float>(32768, 2) && !r::gathers<float>(32767, 2) && r::gathers<double>(16384, 2) &&
                      !r::gathers<float>(1 << 20, 1) && !r::gathers<float>(4097, 16)));
  for (const rank_t n : {rank_t{2}, rank_t{3}, rank_t{5}, rank_t{8}}) {
    const std::size_t count = 40000 + n;  // blocks of ranks and of grids that do not line up
    std::vector<rank_t> reversed(n);
    std::iota(reversed.rbegin(), reversed.rend(), rank_t{0});
    const reduce_op op = n % 2 ? reduce_op::avg : reduce_op::sum;
    const auto check = [&](auto tag, int spread, algorithm way) {
      using T = decltype(tag);
      const auto addends = addends_of<T>(n, count, spread, 900 + n);
      const auto expected = bits_of(local_sum(addends, count, op));
      const auto out = spread_sum(addends, count, n, [](std::size_t k) { return k; }, op, way,
                                  n % 2 ? reversed : std::vector<rank_t>{});
      for (rank_t r = 0; r < n; ++r) BOOST_TEST((bits_of(out[r]) == expected), "rank " << r);
    };
    BOOST_TEST_CONTEXT(n << " ranks, " << count << " values, " << to_string(op)) {
      check(float{}, 30, algorithm::ring);
      check(float{}, 30, algorithm::recursive_doubling);
      check(double{}, 300, algorithm::halving_doubling);
      check(bfloat16{}, 30, algorithm::ring);
      check(float16{}, 6, algorithm::unspecified);
    }
  }
}

// 64 addends over 1, 2, 4, 8 and 16 ranks — in blocks, round robin, all on one rank, at
// random — always the same bits; reduce_scatter gives each rank its block of them.
BOOST_AUTO_TEST_CASE(the_number_of_ranks_does_not_matter) {
  constexpr std::size_t count = 3001, addends = 64;
  const auto floats = addends_of<float>(addends, count, 40, 7);
  const auto doubles = addends_of<double>(addends, count, 400, 8);
  const auto sum_f = local_sum(floats, count, reduce_op::avg);
  const auto sum_d = local_sum(doubles, count, reduce_op::sum);
  const auto expected_f = bits_of(sum_f), expected_d = bits_of(sum_d);
  std::mt19937 gen(3);
  for (const rank_t n : {rank_t{1}, rank_t{2}, rank_t{4}, rank_t{8}, rank_t{16}}) {
    std::vector<rank_t> random_owner(addends);
    for (auto& o : random_owner) o = std::uniform_int_distribution<rank_t>(0, n - 1)(gen);
    const std::vector<std::pair<const char*, std::function<rank_t(std::size_t)>>> spreads = {
        {"blocks", [&](std::size_t k) { return static_cast<rank_t>(k * n / addends); }},
        {"round robin", [&](std::size_t k) { return static_cast<rank_t>(k % n); }},
        {"all on the last rank", [&](std::size_t) { return n - 1; }},
        {"at random", [&](std::size_t k) { return random_owner[k]; }}};
    for (const auto& [how, owner] : spreads)
      BOOST_TEST_CONTEXT(n << " ranks, " << how) {
        const auto out_f = spread_sum(floats, count, n, owner, reduce_op::avg);
        const auto out_d = spread_sum(doubles, count, n, owner, reduce_op::sum);
        const auto scattered_f = spread_sum(floats, count, n, owner, reduce_op::avg, algorithm::unspecified, {}, true);
        const auto scattered_d = spread_sum(doubles, count, n, owner, reduce_op::sum, algorithm::unspecified, {}, true);
        for (rank_t r = 0; r < n; ++r) {
          BOOST_TEST((bits_of(out_f[r]) == expected_f), "float, rank " << r);
          BOOST_TEST((bits_of(out_d[r]) == expected_d), "double, rank " << r);
          BOOST_TEST((bits_of(scattered_f[r]) == bits_of(block_for(sum_f, n, r))),
                     "float, reduce_scatter, rank " << r);
          BOOST_TEST((bits_of(scattered_d[r]) == bits_of(block_for(sum_d, n, r))),
                     "double, reduce_scatter, rank " << r);
        }
      }
  }
}

// NaN wins, +Inf and −Inf make NaN, one infinity makes it, −0 only from −0s, denormals
// summed exactly, a value far below its block's largest rounded away (2^-120 beside
// 2^120) — each element in a block of its own; on every world, the local sum's bits.
BOOST_AUTO_TEST_CASE(special_values) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float denormal = std::numeric_limits<float>::denorm_min();
  // Element: 0 NaN, 1 +Inf, 2 +Inf and −Inf, 3 −0 only, 4 −0 and +0, 5 denormals, 6 huge and tiny, 7 plain.
  const std::vector<std::vector<float>> columns = {
      {nan, inf, inf, -0.0f, -0.0f, denormal, std::ldexp(1.0f, 120), 1.0f},
      {1.0f, 2.0f, -inf, -0.0f, 0.0f, 3 * denormal, std::ldexp(1.0f, -120), 2.0f},
      {2.0f, -5.0f, 1.0f, -0.0f, -0.0f, denormal, -std::ldexp(1.0f, 120), 0.5f}};
  constexpr std::size_t count = 8 * reproducible_block;
  std::vector<std::vector<float>> addends(columns.size(), std::vector<float>(count, 0.0f));
  for (std::size_t a = 0; a < columns.size(); ++a)
    for (std::size_t k = 0; k < 8; ++k) addends[a][k * reproducible_block] = columns[a][k];
  const std::vector<float> sum = local_sum(addends, count, reduce_op::sum);
  const auto at = [&](std::size_t k) { return sum[k * reproducible_block]; };
  BOOST_TEST(std::isnan(at(0)));
  BOOST_TEST(at(1) == inf);
  BOOST_TEST(std::isnan(at(2)));
  BOOST_TEST((at(3) == 0 && std::signbit(at(3))));
  BOOST_TEST((at(4) == 0 && !std::signbit(at(4))));
  BOOST_TEST(at(5) == 5 * denormal);
  BOOST_TEST(at(6) == 0.0f);  // 2^-120 lies far below the block's grid, 2^(121 − 30)
  BOOST_TEST(at(7) == 3.5f);
  for (const rank_t n : {rank_t{1}, rank_t{2}, rank_t{3}}) {
    const auto out = spread_sum(addends, count, n, [n](std::size_t k) { return static_cast<rank_t>(k % n); },
                                reduce_op::sum);
    for (rank_t r = 0; r < n; ++r) BOOST_TEST((bits_of(out[r]) == bits_of(sum)), n << " ranks, rank " << r);
  }
}

// Against the exact sum (every value a multiple of 2^-33 below 2^8, so 48 of them sum
// exactly in a 128-bit fixed point, and that sum converts exactly to a long double), the
// error is at most half a grid step of the block per addend plus half an ulp of the
// result: |out − exact| ≤ A · 2^(e − P − 1) + ulp(out)/2. Values span 17 binades, so the
// grid (2^(e − 30)) rounds the smallest.
BOOST_AUTO_TEST_CASE(the_error_stays_within_the_bound) {
  constexpr std::size_t count = 2048, addends = 48;
  const auto values = addends_of<float>(addends, count, 8, 11);
  const std::vector<float> out = local_sum(values, count, reduce_op::sum);
  double worst_ratio = 0;
  for (std::size_t b = 0; b < count / reproducible_block; ++b) {
    int e = -1000;
    for (const auto& v : values)
      for (std::size_t i = b * reproducible_block; i < (b + 1) * reproducible_block; ++i)
        if (v[i] != 0) e = std::max(e, std::ilogb(v[i]) + 1);
    for (std::size_t i = b * reproducible_block; i < (b + 1) * reproducible_block; ++i) {
      exact_integer exact = 0;
      for (const auto& v : values) exact += static_cast<exact_integer>(std::ldexp(static_cast<double>(v[i]), 33));
      const long double exact_value = std::ldexp(static_cast<long double>(exact), -33);
      const long double error = std::fabs(static_cast<long double>(out[i]) - exact_value);
      const long double bound = addends * std::ldexp(1.0L, e - 30 - 1) +
                                0.5L * (std::nextafter(std::fabs(out[i]), std::numeric_limits<float>::infinity()) -
                                        std::fabs(out[i]));
      BOOST_TEST(error <= bound, "value " << i << ": error " << static_cast<double>(error) << " over the bound "
                                         << static_cast<double>(bound));
      worst_ratio = std::max(worst_ratio, static_cast<double>(error / bound));
    }
  }
  BOOST_TEST_MESSAGE("worst error / bound: " << worst_ratio);
}

// Ranks that pass different ops, call an ordinary allreduce or pass another size: an
// error on every rank, none waiting for its timeout.
BOOST_AUTO_TEST_CASE(mismatches_fail_every_rank) {
  const auto ops = test::run_ranks(3, [](test::inproc_communicator& comm) {
    std::vector<float> data(100, 1.0f);
    reproducible_allreduce(comm, std::span(data), comm.rank() == 1 ? reduce_op::avg : reduce_op::sum);
  });
  for (rank_t r = 0; r < 3; ++r) {
    BOOST_TEST(ops.failure(r).first == errc::invalid_argument, "rank " << r << ": " << ops.failure(r).second);
    BOOST_TEST(ops.failure(r).second.find("different ops") != std::string::npos, ops.failure(r).second);
  }
  const auto ordinary = test::run_ranks(3, [](test::inproc_communicator& comm) {
    std::vector<float> data(100, 1.0f);
    if (comm.rank() == 2) comm.allreduce(std::span(data), reduce_op::sum);
    else reproducible_allreduce(comm, std::span(data), reduce_op::sum);
  }, {.timeout = std::chrono::seconds(20)});
  const auto sizes = test::run_ranks(3, [](test::inproc_communicator& comm) {
    std::vector<float> data(comm.rank() == 0 ? 1000 : 1001, 1.0f);
    reproducible_allreduce(comm, std::span(data), reduce_op::sum);
  }, {.timeout = std::chrono::seconds(20)});
  for (rank_t r = 0; r < 3; ++r) {
    BOOST_TEST(static_cast<bool>(ordinary.failure(r).first), "rank " << r << " did not fail");
    BOOST_TEST(static_cast<bool>(sizes.failure(r).first), "rank " << r << " did not fail");
  }
  const auto bad_op = test::run_ranks(2, [](test::inproc_communicator& comm) {
    std::vector<float> data(10, 1.0f);
    reproducible_allreduce(comm, std::span(data), reduce_op::max);
  });
  for (rank_t r = 0; r < 2; ++r) BOOST_TEST(bad_op.failure(r).first == errc::invalid_argument);
}

// reduce_scatter: rank r gets block r of the bits one rank sums; in place too; the
// ring's order does not matter; an output of another size fails every rank.
template <class T>
void check_reduce_scatter(rank_t n, std::size_t count, reduce_op op, bool reversed, bool in_place) {
  const auto addends = addends_of<T>(n, count, std::same_as<T, double> ? 300 : 20, 40 + n + count);
  const std::vector<T> expected = local_sum(addends, count, op);
  std::vector<std::vector<T>> out(n);
  std::vector<rank_t> order(n);
  std::iota(order.begin(), order.end(), rank_t{0});
  if (reversed) std::reverse(order.begin(), order.end());
  const auto outcome = test::run_ranks<topologies::ring>(
      n,
      [&](test::inproc_communicator& comm) {
        const block_range mine = block_of(count, n, comm.rank());
        std::vector<T> in = addends[comm.rank()];
        if (in_place) {
          reproducible_reduce_scatter(comm, std::span<const T>(in), mine.of(std::span<T>(in)), op);
          out[comm.rank()].assign(in.begin() + mine.offset, in.begin() + mine.offset + mine.size);
        } else {
          out[comm.rank()].resize(mine.size);
          reproducible_reduce_scatter(comm, std::span<const T>(in), std::span<T>(out[comm.rank()]), op);
        }
      },
      {}, [&](std::size_t) { return topologies::ring(order); });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) {
    const block_range mine = block_of(count, n, r);
    const std::vector<T> block(expected.begin() + mine.offset, expected.begin() + mine.offset + mine.size);
    BOOST_TEST((bits_of(out[r]) == bits_of(block)), "rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(reduce_scatter_gives_each_rank_its_block_of_the_same_bits) {
  for (const rank_t n : {rank_t{1}, rank_t{2}, rank_t{3}, rank_t{5}, rank_t{8}})
    for (const std::size_t count : {std::size_t{1}, std::size_t{255}, std::size_t{4097}})
      for (const reduce_op op : {reduce_op::sum, reduce_op::avg})
        BOOST_TEST_CONTEXT(n << " ranks, " << count << " values, " << to_string(op)) {
          check_reduce_scatter<float>(n, count, op, false, false);
          check_reduce_scatter<double>(n, count, op, true, false);
          check_reduce_scatter<bfloat16>(n, count, op, false, true);
          check_reduce_scatter<double>(n, count, op, false, true);
        }
  const auto wrong = test::run_ranks(3, [](test::inproc_communicator& comm) {
    std::vector<float> in(100, 1.0f), out(comm.rank() == 1 ? 40 : block_of(100, 3, comm.rank()).size);
    reproducible_reduce_scatter(comm, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
  }, {.timeout = std::chrono::seconds(20)});
  for (rank_t r = 0; r < 3; ++r) BOOST_TEST(static_cast<bool>(wrong.failure(r).first), "rank " << r << " did not fail");
}

// Started calls: three reproducible sums in flight with an ordinary started allreduce
// between them, then a reproducible reduce_scatter: each the bits of its blocking form;
// ranks that pass different ops learn it from wait(), every one of them.
BOOST_AUTO_TEST_CASE(started_calls_give_the_blocking_bits) {
  constexpr rank_t n = 3;
  constexpr std::size_t count = 40000;  // the gathering path
  const auto addends = addends_of<float>(n, count, 30, 21);
  const auto small = addends_of<double>(n, 300, 300, 22);
  const auto expected = bits_of(local_sum(addends, count, reduce_op::avg));
  const auto expected_small = bits_of(local_sum(small, 300, reduce_op::sum));
  std::vector<std::vector<std::vector<std::uint8_t>>> got(n);
  const auto outcome = test::run_ranks(n, [&](test::inproc_communicator& comm) {
    const rank_t r = comm.rank();
    std::vector<float> a = addends[r], b(count), ordinary(1000, 1.0f);
    std::vector<double> c = small[r];
    std::vector<float> block(block_of(count, n, r).size);
    collective_handle first, second, plain, third, scatter;
    start_reproducible_allreduce(comm, std::span(a), reduce_op::avg, first);
    start_reproducible_allreduce(comm, std::span<const float>(addends[r]), std::span(b), reduce_op::avg, second);
    comm.start_allreduce(std::span(ordinary), reduce_op::sum, plain);
    start_reproducible_allreduce(comm, std::span(c), reduce_op::sum, third);
    start_reproducible_reduce_scatter(comm, std::span<const float>(addends[r]), std::span(block), reduce_op::avg,
                                      scatter);
    for (collective_handle* h : {&first, &second, &plain, &third, &scatter}) h->wait();
    got[r] = {bits_of(a), bits_of(b), bits_of(c), bits_of(block), bits_of(ordinary)};
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  const auto sum = local_sum(addends, count, reduce_op::avg);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST((got[r][0] == expected && got[r][1] == expected), "rank " << r);
    BOOST_TEST((got[r][2] == expected_small), "rank " << r);
    BOOST_TEST((got[r][3] == bits_of(block_for(sum, n, r))), "rank " << r);
    BOOST_TEST((got[r][4] == bits_of(std::vector<float>(1000, 3.0f))), "rank " << r);
  }
  const auto mismatch = test::run_ranks(n, [](test::inproc_communicator& comm) {
    std::vector<float> data(100, 1.0f);
    collective_handle h;
    start_reproducible_allreduce(comm, std::span(data), comm.rank() == 1 ? reduce_op::avg : reduce_op::sum, h);
    h.wait();
  });
  for (rank_t r = 0; r < n; ++r)
    BOOST_TEST(mismatch.failure(r).second.find("different ops") != std::string::npos, mismatch.failure(r).second);
}

// A sub-communicator sums its members' addends: the bits of its members' local sum.
BOOST_AUTO_TEST_CASE(sub_communicators) {
  constexpr std::size_t count = 777;
  const auto addends = addends_of<float>(6, count, 25, 5);
  const auto evens = bits_of(local_sum(std::vector<std::vector<float>>{addends[0], addends[2], addends[4]}, count,
                                       reduce_op::sum));
  std::vector<std::vector<float>> out(6, std::vector<float>(count));
  const auto outcome = test::run_ranks(6, [&](test::inproc_communicator& comm) {
    auto half = comm.split(comm.rank() % 2, -static_cast<std::int64_t>(comm.rank()));  // reversed order too
    reproducible_allreduce(*half, std::span<const float>(addends[comm.rank()]), std::span(out[comm.rank()]),
                           reduce_op::sum);
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < 6; r += 2) BOOST_TEST((bits_of(out[r]) == evens), "rank " << r);
}


// Random meshes and tori of 2 and 3 dimensions with random degraded nodes (fully and
// along dimensions) and broken links, routed either way: every included rank holds the
// bits of one rank summing the included ranks' addends — whatever the shape, faults or
// route — and excluded ranks are told why at once.
BOOST_AUTO_TEST_CASE(grid_allreduce_on_random_degraded_grids_gives_the_bits_of_the_included_addends) {
  std::mt19937_64 gen(55);
  std::uniform_real_distribution<double> uniform(0, 1);
  int degraded_runs = 0;
  for (int trial = 0; trial < 14; ++trial) {
    std::vector<std::size_t> extents(std::uniform_int_distribution<std::size_t>(2, 3)(gen));
    do {
      for (auto& e : extents) e = std::uniform_int_distribution<std::size_t>(1, 4)(gen);
    } while (std::accumulate(extents.begin(), extents.end(), std::size_t{1}, std::multiplies<>()) > 16);
    const topo::grid_shape shape(extents, uniform(gen) < 0.5);
    topo::grid_faults faults;
    for (rank_t v = 0; v < shape.size(); ++v) {
      if (uniform(gen) < 0.2) faults.nodes.push_back(topo::degraded_node::fully(v));
      else if (uniform(gen) < 0.1)
        faults.nodes.push_back({v, std::uniform_int_distribution<std::uint64_t>(1, (1u << extents.size()) - 1)(gen)});
      for (std::size_t d = 0; d < extents.size(); ++d)
        if (auto w = shape.neighbour(v, d, +1); w && *w != v && uniform(gen) < 0.1) faults.broken_links.push_back({v, *w});
    }
    topo::routing_options options;
    options.mode = uniform(gen) < 0.5 ? topo::forwarding::sub_networks : topo::forwarding::per_node;
    const topo::grid_routing routing = topo::route_grid(topo::grid(shape, faults), options);
    if (routing.included().empty()) continue;
    degraded_runs += routing.included().size() < shape.size();
    const std::size_t count = std::array{std::size_t{1}, std::size_t{300}, std::size_t{5000}}[trial % 3];
    const reduce_op op = trial % 2 ? reduce_op::avg : reduce_op::sum;
    BOOST_TEST_CONTEXT("trial " << trial << ", " << count << " values, " << to_string(op) << "\n" << routing.describe()) {
      const auto check = [&](auto tag, int spread) {
        using T = decltype(tag);
        const auto addends = addends_of<T>(shape.size(), count, spread, 300 + trial);
        std::vector<std::vector<T>> included;
        for (rank_t v : routing.included()) included.push_back(addends[v]);
        const auto [out, outcome] = grid_sum(routing, addends, count, [](std::size_t k) { return k; }, op);
        check_grid_outcome(routing, out, outcome, local_sum(included, count, op));
      };
      check(float{}, 30);
      if (trial % 4 == 0) check(double{}, 300);
      if (trial % 4 == 1) check(bfloat16{}, 30);
    }
  }
  BOOST_TEST(degraded_runs >= 5);
}

// The same 64 addends summed on a healthy 4×4 torus (16 ranks), on the same torus with
// two nodes degraded (14 ranks hold them), and by one rank alone: identical bits.
BOOST_AUTO_TEST_CASE(a_healthy_and_a_degraded_torus_give_identical_sums) {
  constexpr std::size_t count = 1000, addends = 64;
  const auto values = addends_of<float>(addends, count, 30, 17);
  const auto expected = local_sum(values, count, reduce_op::avg);
  for (const bool degraded : {false, true}) {
    topo::grid_faults faults;
    if (degraded) faults.nodes = {topo::degraded_node::fully(5), topo::degraded_node::fully(10)};
    const topo::grid_routing routing = topo::route_grid(topo::torus({4, 4}, faults));
    const std::vector<rank_t> nodes(routing.included().begin(), routing.included().end());
    BOOST_TEST_REQUIRE(nodes.size() == (degraded ? 14u : 16u));
    BOOST_TEST_CONTEXT((degraded ? "degraded" : "healthy")) {
      const auto [out, outcome] =
          grid_sum(routing, values, count, [&](std::size_t k) { return nodes[k % nodes.size()]; }, reduce_op::avg);
      check_grid_outcome(routing, out, outcome, expected);
    }
  }
  // A rank passing another size fails every rank, none waiting for its deadline.
  const topo::grid_routing square = topo::route_grid(topo::torus({2, 2}));
  const auto wrong = test::run_ranks<topo::fully_connected>(4, [&](test::inproc_communicator& comm) {
    reproducible_grid_allreduce<float> sum(comm, square, 100);
    std::vector<float> data(comm.rank() == 1 ? 99 : 100, 1.0f);
    sum.allreduce(comm, std::span(data), reduce_op::sum);
  }, {.timeout = std::chrono::seconds(20)});
  for (rank_t r = 0; r < 4; ++r) BOOST_TEST(static_cast<bool>(wrong.failure(r).first), "rank " << r << " did not fail");
  BOOST_TEST(wrong.failure(1).second.find("99 values in") != std::string::npos, wrong.failure(1).second);
}

BOOST_AUTO_TEST_SUITE_END()
