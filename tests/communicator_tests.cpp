// Sub-communicators (communicator::split), exact collectives started without waiting,
// and point-to-point messages, over the in-process transport, through the public API.
// The shm and TCP jobs run the same calls between processes
// (tests/multiprocess/worker.cpp, "split").

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>

#include "support/expect_failure.hpp"
#include "support/ranks.hpp"
#include "support/reference.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace qcoll;
using test::all_ops;
using test::expect_every_rank_fails;
using test::natural_order;
using test::quick;
using test::run_ranks;

namespace {


/// Rank r's input of a call numbered `call`, in a job of any size.
template <class T>
std::vector<T> input_of(rank_t r, std::size_t count, std::uint64_t call) {
  return test::random_values<T>(count, call * 1000 + r);
}

/// What an allreduce over `members` (parent ranks, in sub-communicator rank order) gives:
/// the reference over their inputs, in the sub-communicator's ring (rank) order.
template <class T>
std::vector<T> expected_allreduce(const std::vector<rank_t>& members, std::size_t count, std::uint64_t call,
                                  reduce_op op) {
  std::vector<std::vector<T>> inputs;
  for (rank_t m : members) inputs.push_back(input_of<T>(m, count, call));
  return test::reference_reduce(inputs, std::span<const rank_t>(natural_order(members.size())), op);
}

/// Whether `comm` (over `members`) reduces rank inputs of call `call` as the reference does.
template <class Comm>
bool allreduce_matches(Comm& comm, const std::vector<rank_t>& members, std::size_t count, std::uint64_t call,
                       reduce_op op) {
  std::vector<double> data = input_of<double>(members[comm.rank()], count, call);
  comm.set_tuning(test::forcing());  // the reference folds in ring order
  comm.allreduce(std::span<double>(data), op);
  return test::bitwise_equal<double>(data, expected_allreduce<double>(members, count, call, op));
}

/// The parent ranks of color c when rank r has color r % colors, ranked by key −r.
std::vector<rank_t> members_by_descending_rank(std::size_t n, std::size_t colors, std::size_t c) {
  std::vector<rank_t> members;
  for (rank_t r = n; r-- > 0;)
    if (r % colors == c) members.push_back(r);
  return members;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(split)

BOOST_AUTO_TEST_CASE(ranks_follow_the_key_then_the_parent_rank) {
  // Color 0: keys 10 − r (descending ranks); color 1: all keys 0 (ties keep parent order).
  const std::size_t n = 7;
  std::vector<rank_t> sub_rank(n), sub_size(n), base_of_zero(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    const rank_t r = comm.rank();
    const bool even = r % 2 == 0;
    auto sub = comm.split(even ? 0 : 1, even ? 10 - static_cast<std::int64_t>(r) : 0);
    sub_rank[r] = sub->rank();
    sub_size[r] = sub->size();
    base_of_zero[r] = sub->channel().base_rank(0);
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      if (r % 2 == 0) {
        BOOST_TEST(sub_size[r] == 4u);
        BOOST_TEST(sub_rank[r] == (6 - r) / 2);
        BOOST_TEST(base_of_zero[r] == 6u);
      } else {
        BOOST_TEST(sub_size[r] == 3u);
        BOOST_TEST(sub_rank[r] == r / 2);
        BOOST_TEST(base_of_zero[r] == 1u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(every_collective_on_sub_communicators_interleaved_with_the_parent) {
  for (std::size_t n : {2, 3, 5, 8})
    for (std::size_t colors : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
      if (colors > n) continue;
      BOOST_TEST_CONTEXT("n=" << n << " colors=" << colors) {
        const std::size_t count = 1000 + n;  // not a multiple of any sub-communicator's size
        std::vector<std::string> wrong(n);
        const auto outcome = run_ranks(n, [&](auto& comm) {
          const rank_t r = comm.rank();
          const std::size_t color = r % colors;
          auto sub = comm.split(static_cast<std::int64_t>(color), -static_cast<std::int64_t>(r));
          const std::vector<rank_t> members = members_by_descending_rank(n, colors, color);
          const std::vector<rank_t> everyone = natural_order(n);
          const std::size_t k = members.size();
          std::uint64_t call = 0;
          for (reduce_op op : all_ops) {
            if (!allreduce_matches(*sub, members, count, ++call, op)) wrong[r] += " sub allreduce";
            // The parent's ring is topologies::ring(n), in rank order.
            if (!allreduce_matches(comm, everyone, count, ++call, op)) wrong[r] += " parent allreduce";

            const std::vector<double> in = input_of<double>(r, count, ++call);
            const block_range mine = block_of(count, k, sub->rank());
            std::vector<double> block(mine.size);
            sub->reduce_scatter(std::span<const double>(in), std::span<double>(block), op);
            const auto full = expected_allreduce<double>(members, count, call, op);
            if (!test::bitwise_equal<double>(block, mine.of(std::span<const double>(full)))) wrong[r] += " reduce_scatter";
          }
          std::vector<double> gathered(count, -1.0);
          const block_range mine = block_of(count, k, sub->rank());
          std::vector<double> own(mine.size);
          for (std::size_t i = 0; i < mine.size; ++i) own[i] = static_cast<double>(mine.offset + i);
          sub->all_gather(std::span<const double>(own), std::span<double>(gathered));
          for (std::size_t i = 0; i < count; ++i)
            if (gathered[i] != static_cast<double>(i)) wrong[r] += " all_gather";

          const rank_t root = k - 1;  // sub rank; its parent rank is members[root]
          std::vector<double> data = sub->rank() == root ? input_of<double>(members[root], count, 99)
                                                         : std::vector<double>(count, 0.0);
          sub->broadcast(std::span<double>(data), root);
          if (data != input_of<double>(members[root], count, 99)) wrong[r] += " broadcast";
          sub->barrier();
          comm.barrier();
        });
        BOOST_TEST_REQUIRE(outcome.all_succeeded());
        for (rank_t r = 0; r < n; ++r) BOOST_TEST(wrong[r].empty(), "rank " << r << ":" << wrong[r]);
      }
    }
}

BOOST_AUTO_TEST_CASE(a_rank_with_no_color_takes_no_part) {
  const std::size_t n = 5;
  const rank_t outsider = 2;
  std::vector<char> got_one(n), correct(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    const rank_t r = comm.rank();
    auto sub = comm.split(r == outsider ? no_color : 7, 0);
    got_one[r] = sub.has_value();
    bool ok = true;
    if (sub) ok = sub->size() == n - 1 && allreduce_matches(*sub, {0, 1, 3, 4}, 333, 1, reduce_op::sum);
    correct[r] = ok && allreduce_matches(comm, natural_order(n), 333, 2, reduce_op::sum);
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(static_cast<bool>(got_one[r]) == (r != outsider), "rank " << r);
    BOOST_TEST(static_cast<bool>(correct[r]), "rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(an_invalid_color_is_reported_on_every_rank_and_the_parent_goes_on) {
  const std::size_t n = 4;
  std::vector<std::string> message(n);
  std::vector<char> parent_works(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    const rank_t r = comm.rank();
    try {
      comm.split(r == 1 ? -5 : 0, 0);
    } catch (const error& e) {
      if (e.code() == errc::invalid_argument) message[r] = e.what();
    }
    parent_works[r] = allreduce_matches(comm, natural_order(n), 100, 3, reduce_op::max);
  }, quick);
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(message[r].find("rank 1 passed color -5") != std::string::npos, "rank " << r << ": " << message[r]);
    BOOST_TEST(static_cast<bool>(parent_works[r]), "rank " << r);
  }
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_about_the_call_fail_together) {
  const auto outcome = run_ranks(3, [](auto& comm) {
    if (comm.rank() == 2) {
      std::vector<double> v(3, 1.0);
      comm.allreduce(std::span<double>(v), reduce_op::sum);
    } else {
      comm.split(0, 0);
    }
  }, quick);
  expect_every_rank_fails(outcome, errc::operation_mismatch, {"split #0", "allreduce(count=3, f64, sum) #0"});
}

BOOST_AUTO_TEST_CASE(nested_splits_get_contexts_of_their_own) {
  // 8 ranks → halves by parity → quarters; collectives on all three levels interleave.
  const std::size_t n = 8;
  std::vector<std::string> wrong(n);
  std::vector<std::uint32_t> half_context(n), quarter_context(n), later_context(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    const rank_t r = comm.rank();
    auto half = comm.split(static_cast<std::int64_t>(r % 2), static_cast<std::int64_t>(r));
    auto quarter = half->split(static_cast<std::int64_t>(half->rank() / 2), 0);
    const std::vector<rank_t> half_members = r % 2 == 0 ? std::vector<rank_t>{0, 2, 4, 6} : std::vector<rank_t>{1, 3, 5, 7};
    const std::size_t q = half->rank() / 2;
    const std::vector<rank_t> quarter_members{half_members[2 * q], half_members[2 * q + 1]};
    for (std::uint64_t call = 1; call <= 3; ++call) {
      if (!allreduce_matches(*quarter, quarter_members, 77, call * 10 + 1, reduce_op::sum)) wrong[r] += " quarter";
      if (!allreduce_matches(comm, natural_order(n), 77, call * 10 + 2, reduce_op::sum)) wrong[r] += " world";
      if (!allreduce_matches(*half, half_members, 77, call * 10 + 3, reduce_op::sum)) wrong[r] += " half";
    }
    half_context[r] = half->channel().context();
    quarter_context[r] = quarter->channel().context();
    later_context[r] = comm.split(0, 0)->channel().context();
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(wrong[r].empty(), "rank " << r << ":" << wrong[r]);
    BOOST_TEST(half_context[r] >= 1u);
    BOOST_TEST(quarter_context[r] > half_context[r]);
    BOOST_TEST(later_context[r] > quarter_context[r]);  // no rank of the world may still use it
  }
}

BOOST_AUTO_TEST_CASE(started_calls_on_parent_and_sub_communicators_run_in_start_order) {
  const std::size_t n = 4;
  std::vector<std::string> wrong(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    const rank_t r = comm.rank();
    auto sub = comm.split(static_cast<std::int64_t>(r / 2), 0);
    const std::vector<rank_t> members = r < 2 ? std::vector<rank_t>{0, 1} : std::vector<rank_t>{2, 3};
    std::vector<double> world_data = input_of<double>(r, 5000, 1);
    std::vector<double> sub_data = input_of<double>(r, 5000, 2);
    collective_handle world_call, sub_call;
    comm.start_allreduce(std::span<double>(world_data), reduce_op::sum, world_call);
    sub->start_allreduce(std::span<double>(sub_data), reduce_op::sum, sub_call);
    sub_call.wait();
    world_call.wait();
    if (world_data != expected_allreduce<double>(natural_order(n), 5000, 1, reduce_op::sum)) wrong[r] += " world";
    if (sub_data != expected_allreduce<double>(members, 5000, 2, reduce_op::sum)) wrong[r] += " sub";
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) BOOST_TEST(wrong[r].empty(), "rank " << r << ":" << wrong[r]);
}

BOOST_AUTO_TEST_CASE(an_abort_reaches_every_communicator_of_the_transport) {
  const std::size_t n = 4;
  const auto outcome = run_ranks(n, [&](auto& comm) {
    auto sub = comm.split(static_cast<std::int64_t>(comm.rank() % 2), 0);
    if (comm.rank() == 0) sub->abort("the test gives up");
    comm.barrier();  // ranks 1 and 3 never shared a sub-communicator with rank 0
  }, quick);
  expect_every_rank_fails(outcome, errc::aborted, {"rank 0 aborted the communicator: the test gives up"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(non_blocking)

BOOST_AUTO_TEST_CASE(a_started_call_returns_before_the_data_moves) {
  // Rank 1 joins only after rank 0's start returned and rank 0 saw its call still in
  // flight: the start cannot have waited for the exchange, which needs rank 1. (`out`
  // is not read before wait(): the call may be writing it.)
  std::atomic<bool> rank_0_looked{false};
  std::vector<char> in_flight_at_start(2), correct(2);
  const auto outcome = run_ranks(2, [&](auto& comm) {
    const rank_t r = comm.rank();
    const std::vector<float> in(4096, static_cast<float>(r + 1));
    std::vector<float> out(4096, -1.0f);
    collective_handle call;
    if (r == 1) {
      while (!rank_0_looked.load()) std::this_thread::yield();
      comm.start_allreduce(std::span<const float>(in), std::span<float>(out), reduce_op::sum, call);
    } else {
      comm.start_allreduce(std::span<const float>(in), std::span<float>(out), reduce_op::sum, call);
      in_flight_at_start[r] = call.in_flight() && !call.test();
      rank_0_looked.store(true);
    }
    call.wait();
    correct[r] = std::all_of(out.begin(), out.end(), [](float x) { return x == 3.0f; }) && call.test();
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  BOOST_TEST(static_cast<bool>(in_flight_at_start[0]));
  BOOST_TEST(static_cast<bool>(correct[0]));
  BOOST_TEST(static_cast<bool>(correct[1]));
}

template <class T>
void check_started_equals_blocking(std::size_t n, std::size_t count) {
  BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " type=" << to_string(dtype_of<T>::value)) {
    std::vector<std::string> wrong(n);
    const auto outcome = run_ranks(n, [&](auto& comm) {
      const rank_t r = comm.rank();
      auto values = [&](std::uint64_t call) {
        const std::vector<float> v = input_of<float>(r, count, call);
        return std::vector<T>(v.begin(), v.end());
      };
      const block_range mine = block_of(count, n, r);
      // Started: every kind at once, each with its own handle, waited for in reverse.
      std::vector<T> reduced = values(1), scattered(mine.size), gathered(count), broadcast = values(3);
      const std::vector<T> scatter_in = values(2), own = values(4);
      const std::span<const T> own_block = mine.of(std::span<const T>(own));
      std::vector<collective_handle> calls(4);
      comm.start_allreduce(std::span<T>(reduced), reduce_op::avg, calls[0]);
      comm.start_reduce_scatter(std::span<const T>(scatter_in), std::span<T>(scattered), reduce_op::max, calls[1]);
      comm.start_all_gather(own_block, std::span<T>(gathered), calls[2]);
      comm.start_broadcast(std::span<T>(broadcast), n / 2, calls[3]);
      for (std::size_t c = calls.size(); c-- > 0;) calls[c].wait();
      // Blocking, the same calls.
      std::vector<T> reduced_b = values(1), scattered_b(mine.size), gathered_b(count), broadcast_b = values(3);
      comm.allreduce(std::span<T>(reduced_b), reduce_op::avg);
      comm.reduce_scatter(std::span<const T>(scatter_in), std::span<T>(scattered_b), reduce_op::max);
      comm.all_gather(own_block, std::span<T>(gathered_b));
      comm.broadcast(std::span<T>(broadcast_b), n / 2);
      if (!test::bitwise_equal<T>(reduced, reduced_b)) wrong[r] += " allreduce";
      if (!test::bitwise_equal<T>(scattered, scattered_b)) wrong[r] += " reduce_scatter";
      if (!test::bitwise_equal<T>(gathered, gathered_b)) wrong[r] += " all_gather";
      if (!test::bitwise_equal<T>(broadcast, broadcast_b)) wrong[r] += " broadcast";
    });
    BOOST_TEST_REQUIRE(outcome.all_succeeded());
    for (rank_t r = 0; r < n; ++r) BOOST_TEST(wrong[r].empty(), "rank " << r << ":" << wrong[r]);
  }
}

BOOST_AUTO_TEST_CASE(every_started_collective_equals_the_blocking_one) {
  for (std::size_t n : {1, 2, 3, 5})
    for (std::size_t count : {0, 1, 7, 1000, 65537}) {
      check_started_equals_blocking<float>(n, count);
      check_started_equals_blocking<double>(n, count);
      check_started_equals_blocking<bfloat16>(n, count);
    }
}

BOOST_AUTO_TEST_CASE(buffers_and_handles_are_the_callers_again_after_wait) {
  // One buffer and one handle, reused: each round rewrites the buffer right after wait().
  const std::size_t n = 3;
  std::vector<int> wrong_rounds(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    std::vector<double> data(2048);
    collective_handle call;
    for (int round = 0; round < 50; ++round) {
      std::fill(data.begin(), data.end(), static_cast<double>(round * 10 + comm.rank()));
      comm.start_allreduce(std::span<double>(data), reduce_op::sum, call);
      call.wait();
      const double expected = 3.0 * round * 10 + 3.0;
      if (!std::all_of(data.begin(), data.end(), [&](double x) { return x == expected; })) ++wrong_rounds[comm.rank()];
    }
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) BOOST_TEST(wrong_rounds[r] == 0, "rank " << r);
}

BOOST_AUTO_TEST_CASE(a_blocking_call_after_a_start_keeps_program_order) {
  const std::size_t n = 4;
  std::vector<char> correct(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    std::vector<double> started = input_of<double>(comm.rank(), 3000, 1);
    std::vector<double> blocking = input_of<double>(comm.rank(), 3000, 2);
    collective_handle call;
    comm.start_allreduce(std::span<double>(started), reduce_op::sum, call);
    comm.allreduce(std::span<double>(blocking), reduce_op::sum);  // waits for the started call first
    correct[comm.rank()] = call.test() && started == expected_allreduce<double>(natural_order(n), 3000, 1, reduce_op::sum) &&
                           blocking == expected_allreduce<double>(natural_order(n), 3000, 2, reduce_op::sum);
    call.wait();
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) BOOST_TEST(static_cast<bool>(correct[r]), "rank " << r);
}

BOOST_AUTO_TEST_CASE(errors_of_a_started_call_come_from_wait_on_every_rank) {
  const auto outcome = run_ranks(3, [](auto& comm) {
    std::vector<float> data(comm.rank() == 1 ? 11 : 10, 1.0f);
    collective_handle call;
    comm.start_allreduce(std::span<float>(data), reduce_op::sum, call);
    call.wait();
  }, quick);
  expect_every_rank_fails(outcome, errc::count_mismatch, {"allreduce(count=11, f32, sum)"});

  const auto reported = run_ranks(2, [](auto& comm) {
    std::vector<float> data(10, 1.0f);
    collective_handle call;
    std::error_code ec;
    comm.start_broadcast(std::span<float>(data), 5, call, ec);  // the start itself succeeds
    if (ec) throw error(ec, "start");
    call.wait(ec);
    if (ec) call.wait();  // the same outcome again, thrown with its message
  }, quick);
  expect_every_rank_fails(reported, errc::invalid_argument, {"root 5 is out of range"});
}

BOOST_AUTO_TEST_CASE(a_handle_in_flight_is_refused_without_aborting) {
  // Rank 1 starts only after rank 0 tried to reuse its handle: rank 0's call is
  // certainly still in flight then.
  std::atomic<bool> rank_0_tried{false};
  std::string refusal;
  std::vector<char> correct(2);
  const auto outcome = run_ranks(2, [&](auto& comm) {
    std::vector<float> a(100, 1.0f), b(100, 2.0f);
    collective_handle call;
    if (comm.rank() == 1)
      while (!rank_0_tried.load()) std::this_thread::yield();
    comm.start_allreduce(std::span<float>(a), reduce_op::sum, call);
    if (comm.rank() == 0) {
      try {
        comm.start_allreduce(std::span<float>(b), reduce_op::sum, call);
      } catch (const error& e) {
        if (e.code() == errc::invalid_argument) refusal = e.what();
      }
      rank_0_tried.store(true);
    }
    call.wait();
    correct[comm.rank()] = std::all_of(a.begin(), a.end(), [](float x) { return x == 2.0f; }) &&
                           std::all_of(b.begin(), b.end(), [](float x) { return x == 2.0f; });
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  BOOST_TEST(refusal.find("collective_handle::start: a call is in flight") != std::string::npos, refusal);
  for (rank_t r = 0; r < 2; ++r) BOOST_TEST(static_cast<bool>(correct[r]));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(allocate)

BOOST_AUTO_TEST_CASE(ordinary_memory_where_the_transport_shares_none) {
  // The in-process transport maps no peer memory: allocate gives zero-filled, aligned
  // ordinary memory that collectives take like any span.
  std::vector<std::string> seen(3);
  const auto outcome = run_ranks(3, [&](auto& comm) {
    buffer<double> empty = comm.template allocate<double>(0);
    buffer<double> data = comm.template allocate<double>(1001);
    std::string& verdict = seen[comm.rank()];
    if (!empty.empty() || data.size() != 1001 || reinterpret_cast<std::uintptr_t>(data.data()) % 64 != 0 ||
        !std::all_of(data.begin(), data.end(), [](double x) { return x == 0.0; }))
      verdict = "misshapen";
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = double(comm.rank() + i);
    buffer<double> moved = std::move(data);
    comm.allreduce(std::span<double>(moved), reduce_op::sum);
    for (std::size_t i = 0; i < moved.size(); ++i)
      if (moved[i] != double(3 + 3 * i)) verdict = "wrong at " + std::to_string(i);
    if (verdict.empty()) verdict = data.empty() ? "ok" : "the moved-from buffer kept its elements";
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < 3; ++r) BOOST_TEST(seen[r] == "ok", "rank " << r);
}

BOOST_AUTO_TEST_CASE(a_size_that_overflows_is_refused) {
  const auto outcome = run_ranks(1, [](auto& comm) { (void)comm.template allocate<double>(SIZE_MAX / 4); });
  const auto [code, message] = outcome.failure(0);
  BOOST_TEST((code == errc::invalid_argument), message);
  BOOST_TEST(message.find("overflows") != std::string::npos, message);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(point_to_point)

BOOST_AUTO_TEST_CASE(send_recv_around_a_ring_delivers_each_neighbours_data) {
  for (std::size_t n : {2, 3, 5})
    for (std::size_t count : {0, 1, 1000, 100003}) {
      BOOST_TEST_CONTEXT("n=" << n << " count=" << count) {
        std::vector<char> correct(n);
        const auto outcome = run_ranks(n, [&](auto& comm) {
          const rank_t r = comm.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
          const std::vector<double> mine = input_of<double>(r, count, 1);
          std::vector<double> got(count, -1.0);
          bool ok = true;
          for (int round = 0; round < 3; ++round) {  // the pair's messages are numbered
            comm.send_recv(std::span<const double>(mine), next, std::span<double>(got), prev);
            ok = ok && got == input_of<double>(prev, count, 1);
          }
          correct[r] = ok;
        });
        BOOST_TEST_REQUIRE(outcome.all_succeeded());
        for (rank_t r = 0; r < n; ++r) BOOST_TEST(static_cast<bool>(correct[r]), "rank " << r);
      }
    }
}

BOOST_AUTO_TEST_CASE(messages_between_a_pair_arrive_in_send_order_between_collectives) {
  // Rank 0 sends 50 messages of growing size to rank 2, with collectives in between
  // on every rank; rank 1 only takes part in the collectives.
  const std::size_t n = 3;
  std::vector<int> wrong(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    for (std::size_t m = 0; m < 50; ++m) {
      std::vector<float> message(m, static_cast<float>(m));
      if (comm.rank() == 0) comm.send(std::span<const float>(message), 2);
      if (comm.rank() == 2) {
        std::fill(message.begin(), message.end(), -1.0f);
        comm.recv(std::span<float>(message), 0);
        if (!std::all_of(message.begin(), message.end(), [&](float x) { return x == static_cast<float>(m); }))
          ++wrong[2];
      }
      if (m % 10 == 0) {
        std::vector<double> one(1, 1.0);
        comm.allreduce(std::span<double>(one), reduce_op::sum);
        if (one[0] != 3.0) ++wrong[comm.rank()];
      }
    }
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) BOOST_TEST(wrong[r] == 0, "rank " << r);
}

BOOST_AUTO_TEST_CASE(neighbours_on_a_sub_communicator_exchange_both_ways) {
  // A pipeline's two passes on the odd ranks of 6: activations forward, gradients back.
  const std::size_t n = 6;
  std::vector<char> correct(n);
  const auto outcome = run_ranks(n, [&](auto& comm) {
    const rank_t r = comm.rank();
    auto line = comm.split(static_cast<std::int64_t>(r % 2), 0);
    const rank_t s = line->rank(), k = line->size();
    std::vector<float> forward(64, static_cast<float>(10 * r)), backward(64, -10.0f * static_cast<float>(r));
    std::vector<float> from_prev(64, 0.0f), from_next(64, 0.0f);
    if (s + 1 < k && s > 0) {
      line->send_recv(std::span<const float>(forward), s + 1, std::span<float>(from_prev), s - 1);
      line->send_recv(std::span<const float>(backward), s - 1, std::span<float>(from_next), s + 1);
    } else if (s == 0) {
      line->send(std::span<const float>(forward), 1);
      line->recv(std::span<float>(from_next), 1);
    } else {
      line->recv(std::span<float>(from_prev), s - 1);
      line->send(std::span<const float>(backward), s - 1);
    }
    const float prev_rank = s > 0 ? static_cast<float>(r - 2) : 0.0f, next_rank = s + 1 < k ? static_cast<float>(r + 2) : 0.0f;
    correct[r] = (s == 0 || from_prev[0] == 10 * prev_rank) && (s + 1 == k || from_next[63] == -10 * next_rank);
    comm.barrier();
  });
  BOOST_TEST_REQUIRE(outcome.all_succeeded());
  for (rank_t r = 0; r < n; ++r) BOOST_TEST(static_cast<bool>(correct[r]), "rank " << r);
}

BOOST_AUTO_TEST_CASE(a_receive_of_another_size_fails_on_both_ranks) {
  const auto outcome = run_ranks(2, [](auto& comm) {
    std::vector<float> v(comm.rank() == 0 ? 10 : 11, 1.0f);
    if (comm.rank() == 0) comm.send(std::span<const float>(v), 1);
    else comm.recv(std::span<float>(v), 0);
    comm.barrier();  // the sender learns of it here at the latest
  }, quick);
  expect_every_rank_fails(outcome, errc::count_mismatch, {"point_to_point(count=10, f32) message #0 of the pair"});
}

BOOST_AUTO_TEST_CASE(a_receive_that_meets_a_collective_fails_instead_of_taking_its_bytes) {
  const auto outcome = run_ranks(2, [](auto& comm) {
    std::vector<float> v(8, 1.0f);
    if (comm.rank() == 0) comm.allreduce(std::span<float>(v), reduce_op::sum);
    else comm.recv(std::span<float>(v), 0);
  }, quick);
  for (rank_t r = 0; r < 2; ++r) {
    const auto [code, what] = outcome.failure(r);
    BOOST_TEST(code == make_error_code(errc::operation_mismatch), "rank " << r << ": " << what);
  }
}

BOOST_AUTO_TEST_CASE(a_bad_peer_is_refused_on_every_rank) {
  const auto outcome = run_ranks(2, [](auto& comm) {
    std::vector<float> v(4, 1.0f);
    if (comm.rank() == 0) comm.send(std::span<const float>(v), 0);
    comm.barrier();
  }, quick);
  expect_every_rank_fails(outcome, errc::invalid_argument, {"a rank does not send to or receive from itself"});
  const auto far = run_ranks(2, [](auto& comm) {
    std::vector<float> v(4, 1.0f);
    std::error_code ec;
    comm.recv(std::span<float>(v), 9, ec);
    if (ec) throw error(ec, "recv");
    comm.barrier();
  }, quick);
  expect_every_rank_fails(far, errc::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
