// Bad input gives a clear error on every rank — never a hang, a crash or a wrong
// result reported as success.

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>

#include "support/expect_failure.hpp"
#include "support/ranks.hpp"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace qcoll;
using test::expect_every_rank_fails;
using test::quick;
using test::rank_outcomes;
using test::run_ranks;

BOOST_AUTO_TEST_SUITE(bad_input)

BOOST_AUTO_TEST_CASE(element_counts_that_differ_across_ranks) {
  for (std::size_t n : {2, 3, 4, 8})
    for (rank_t odd : {rank_t{0}, rank_t(n / 2), rank_t(n - 1)}) {
      BOOST_TEST_CONTEXT("n=" << n << " odd rank=" << odd) {
        const auto outcome = run_ranks(
            n,
            [&](auto& comm) {
              std::vector<float> v(comm.rank() == odd ? 101 : 100, 1.0f);
              comm.allreduce(std::span<float>(v), reduce_op::sum);
            },
            quick);
        expect_every_rank_fails(outcome, errc::count_mismatch, {"allreduce(count=101, f32, sum)", "allreduce(count=100, f32, sum)", "of " + std::to_string(n)});
      }
    }
}

BOOST_AUTO_TEST_CASE(counts_differ_in_every_collective) {
  const std::size_t n = 4;
  const auto outcome_rs = run_ranks(n, [&](auto& comm) {
    std::vector<double> in(comm.rank() == 3 ? 41 : 40, 1.0);
    std::vector<double> out(block_of(in.size(), n, comm.rank()).size);
    comm.reduce_scatter(std::span<const double>(in), std::span<double>(out), reduce_op::sum);
  }, quick);
  expect_every_rank_fails(outcome_rs, errc::count_mismatch);

  const auto outcome_ag = run_ranks(n, [&](auto& comm) {
    std::vector<double> out(comm.rank() == 0 ? 44 : 40);
    std::vector<double> in(block_of(out.size(), n, comm.rank()).size, 1.0);
    comm.all_gather(std::span<const double>(in), std::span<double>(out));
  }, quick);
  expect_every_rank_fails(outcome_ag, errc::count_mismatch);

  const auto outcome_bc = run_ranks(n, [&](auto& comm) {
    comm.set_tuning(test::forcing());  // a tree's leaves hear from their parent only (see below)
    std::vector<double> data(comm.rank() == 2 ? 9 : 10, 1.0);
    comm.broadcast(std::span<double>(data), 1);
  }, quick);
  expect_every_rank_fails(outcome_bc, errc::count_mismatch);
}

BOOST_AUTO_TEST_CASE(element_types_that_differ_across_ranks) {
  const auto outcome = run_ranks(3, [](auto& comm) {
    if (comm.rank() == 1) {
      std::vector<double> v(64, 1.0);
      comm.allreduce(std::span<double>(v), reduce_op::sum);
    } else {
      std::vector<float> v(64, 1.0f);
      comm.allreduce(std::span<float>(v), reduce_op::sum);
    }
  }, quick);
  expect_every_rank_fails(outcome, errc::type_mismatch, {"f64", "f32"});

  // 16-bit elements send float partials first: the header, not the byte count, tells.
  const auto half_and_float = run_ranks(2, [](auto& comm) {
    if (comm.rank() == 0) {
      std::vector<bfloat16> v(64, bfloat16(1.0f));
      comm.allreduce(std::span<bfloat16>(v), reduce_op::sum);
    } else {
      std::vector<float> v(64, 1.0f);
      comm.allreduce(std::span<float>(v), reduce_op::sum);
    }
  }, quick);
  expect_every_rank_fails(half_and_float, errc::type_mismatch, {"bf16", "f32"});
  const auto bf16_and_f16 = run_ranks(3, [](auto& comm) {
    if (comm.rank() == 2) {
      std::vector<float16> v(64, float16(1.0f));
      comm.allreduce(std::span<float16>(v), reduce_op::sum);
    } else {
      std::vector<bfloat16> v(64, bfloat16(1.0f));
      comm.allreduce(std::span<bfloat16>(v), reduce_op::sum);
    }
  }, quick);
  expect_every_rank_fails(bf16_and_f16, errc::type_mismatch, {"bf16", "f16"});
}

BOOST_AUTO_TEST_CASE(ranks_that_call_different_operations) {
  // Under the ring, whose every step hears from a neighbour, every rank learns of the
  // mismatch; the small-message algorithms are tested below.
  const auto different_op = run_ranks(4, [](auto& comm) {
    comm.set_tuning(test::forcing());
    std::vector<float> v(16, 1.0f);
    comm.allreduce(std::span<float>(v), comm.rank() == 2 ? reduce_op::max : reduce_op::sum);
  }, quick);
  expect_every_rank_fails(different_op, errc::operation_mismatch, {"max", "sum"});

  const auto different_collective = run_ranks(3, [](auto& comm) {
    comm.set_tuning(test::forcing());
    std::vector<float> v(16, 1.0f);
    if (comm.rank() == 0)
      comm.broadcast(std::span<float>(v), 0);
    else
      comm.allreduce(std::span<float>(v), reduce_op::sum);
  }, quick);
  expect_every_rank_fails(different_collective, errc::operation_mismatch, {"broadcast", "allreduce"});

  const auto different_root = run_ranks(3, [](auto& comm) {
    comm.set_tuning(test::forcing());
    std::vector<float> v(16, 1.0f);
    comm.broadcast(std::span<float>(v), comm.rank() == 1 ? 2 : 0);
  }, quick);
  expect_every_rank_fails(different_root, errc::operation_mismatch, {"root=2", "root=0"});

  // A rank that skipped a collective is one sequence number behind.
  const auto skipped = run_ranks(3, [](auto& comm) {
    comm.set_tuning(test::forcing());
    std::vector<float> v(16, 1.0f);
    if (comm.rank() != 2) comm.barrier();
    comm.allreduce(std::span<float>(v), reduce_op::sum);
  }, quick);
  expect_every_rank_fails(skipped, errc::operation_mismatch, {"barrier #0", "allreduce(count=16, f32, sum) #0"});
}

BOOST_AUTO_TEST_CASE(a_different_root_in_a_tree_broadcast_fails_within_the_deadline) {
  // A tree rank hears from its parent only: with root 0 for ranks 0 and 2 and root 2 for
  // rank 1, rank 2 is a leaf under 0 and gets root 0's data; ranks 0 and 1 wait for
  // messages that never come (or learn that rank 2 left: here its thread ends). Documented:
  // no hang, an error within the deadline where the call cannot finish, root 0's bits
  // where it can.
  const auto started = clock::now();
  std::vector<std::vector<float>> data(3, std::vector<float>(16, -1.0f));
  data[0].assign(16, 5.0f);
  const auto outcome = run_ranks(3, [&](auto& comm) {
    comm.set_tuning(test::forcing(algorithm::ring, algorithm::binomial_tree));
    comm.broadcast(std::span<float>(data[comm.rank()]), comm.rank() == 1 ? 2 : 0);
  }, quick);
  BOOST_TEST((clock::now() - started < quick.timeout + std::chrono::seconds(2)));
  for (rank_t r = 0; r < 3; ++r) {
    const auto [code, message] = outcome.failure(r);
    BOOST_TEST_CONTEXT("rank " << r << ": " << message) {
      if (code) BOOST_TEST((code == errc::timeout || code == errc::peer_lost));
      else BOOST_TEST(data[r] == std::vector<float>(16, 5.0f));
    }
  }
  BOOST_TEST(static_cast<bool>(outcome.failure(1).first), "rank 1 cannot finish");
}

BOOST_AUTO_TEST_CASE(mismatched_calls_under_the_small_message_algorithms) {
  // Under recursive (and halving-) doubling and the dissemination barrier, a mismatch is seen in the
  // first exchange, and every rank fails with it. A tree broadcast's root only sends:
  // it may return before the mismatch is found (its next call then fails).
  for (std::size_t n : {2, 3, 4, 6}) {
    BOOST_TEST_CONTEXT("n=" << n) {
      const tuning small = test::forcing(algorithm::recursive_doubling, algorithm::binomial_tree, algorithm::dissemination);
      for (const algorithm way : {algorithm::recursive_doubling, algorithm::halving_doubling}) {
        const auto counts = run_ranks(n, [&](auto& comm) {
          comm.set_tuning(test::forcing(way));
          std::vector<float> v(comm.rank() == n - 1 ? 17 : 16, 1.0f);
          comm.allreduce(std::span<float>(v), reduce_op::sum);
        }, quick);
        expect_every_rank_fails(counts, errc::count_mismatch,
                                {"count=17", "count=16", std::string("via ") + to_string(way)});
      }
      const auto ops = run_ranks(n, [&](auto& comm) {
        comm.set_tuning(small);
        std::vector<float> v(16, 1.0f);
        comm.allreduce(std::span<float>(v), comm.rank() == 0 ? reduce_op::max : reduce_op::sum);
      }, quick);
      expect_every_rank_fails(ops, errc::operation_mismatch, {"max", "sum"});
      const auto collectives = run_ranks(n, [&](auto& comm) {
        comm.set_tuning(small);
        std::vector<float> v(16, 1.0f);
        if (comm.rank() == 0) comm.broadcast(std::span<float>(v), 0);
        else comm.allreduce(std::span<float>(v), reduce_op::sum);
      }, quick);
      for (rank_t r = 0; r < n; ++r)
        BOOST_TEST((r == 0 || collectives.failure(r).first == errc::operation_mismatch), "rank " << r);
      BOOST_TEST(collectives.failure(n - 1).second.find("broadcast") != std::string::npos);
      const auto skipped = run_ranks(n, [&](auto& comm) {
        comm.set_tuning(small);
        std::vector<float> v(16, 1.0f);
        if (comm.rank() != n - 1) comm.barrier();
        comm.allreduce(std::span<float>(v), reduce_op::sum);
      }, quick);
      expect_every_rank_fails(skipped, errc::operation_mismatch, {"barrier #0 via dissemination"});
    }
  }
}

BOOST_AUTO_TEST_CASE(ranks_that_chose_different_algorithms) {
  // A tuning variable set on some ranks only: the headers name both algorithms.
  const auto outcome = run_ranks(2, [](auto& comm) {
    comm.set_tuning(test::forcing(comm.rank() == 0 ? algorithm::ring : algorithm::recursive_doubling));
    std::vector<float> v(16, 1.0f);
    comm.allreduce(std::span<float>(v), reduce_op::sum);
  }, quick);
  expect_every_rank_fails(outcome, errc::operation_mismatch);
  // Whichever rank reads the other's header first says so from its side, and the other
  // rank passes that reason on: either way every message names both algorithms.
  const std::string seen_by_rank_0 =
      "peer 1 called allreduce(count=16, f32, sum) #0 via recursive_doubling but this rank called "
      "allreduce(count=16, f32, sum) #0 via ring";
  const std::string seen_by_rank_1 =
      "peer 0 called allreduce(count=16, f32, sum) #0 via ring but this rank called "
      "allreduce(count=16, f32, sum) #0 via recursive_doubling";
  for (std::size_t r = 0; r < outcome.errors.size(); ++r) {
    const std::string what = outcome.failure(r).second;
    BOOST_TEST((what.find(seen_by_rank_0) != std::string::npos || what.find(seen_by_rank_1) != std::string::npos),
               "rank " << r << ": " << what);
  }
}

BOOST_AUTO_TEST_CASE(rank_out_of_range) {
  transports::inproc::world world(2);
  BOOST_CHECK_THROW(world.endpoint(2), error);
  auto taken = world.endpoint(0);
  BOOST_CHECK_THROW(world.endpoint(0), error);  // each endpoint once

  const auto bad_root_everywhere = run_ranks(3, [](auto& comm) {
    std::vector<float> v(8);
    comm.broadcast(std::span<float>(v), 3);
  }, quick);
  expect_every_rank_fails(bad_root_everywhere, errc::invalid_argument, {"root 3 is out of range"});

  const auto bad_root_on_one_rank = run_ranks(3, [](auto& comm) {
    std::vector<float> v(8);
    comm.broadcast(std::span<float>(v), comm.rank() == 0 ? 7 : 0);
  }, quick);
  expect_every_rank_fails(bad_root_on_one_rank, errc::invalid_argument, {"root 7 is out of range"});
}

BOOST_AUTO_TEST_CASE(empty_or_inconsistent_communicator) {
  BOOST_CHECK_THROW(transports::inproc::world(0), error);
  BOOST_CHECK_THROW(topologies::ring(0), error);
  BOOST_CHECK_THROW(topologies::ring(std::vector<rank_t>{}), error);
  BOOST_CHECK_THROW(topologies::ring(std::vector<rank_t>{0, 2}), error);  // not a permutation
  BOOST_CHECK_THROW(topologies::ring(std::vector<rank_t>{1, 1}), error);
  BOOST_CHECK_THROW(topologies::fully_connected(0), error);

  transports::inproc::world world(3);
  try {
    communicator comm(world.endpoint(0), topologies::ring(4));
    BOOST_FAIL("a topology of another size must be refused");
  } catch (const error& e) {
    BOOST_TEST(e.code() == make_error_code(errc::invalid_argument));
    BOOST_TEST(std::string(e.what()).find("topology has 4 ranks but the transport has 3") != std::string::npos);
  }
  BOOST_CHECK_THROW(communicator(world.endpoint(1), communicator_options{std::chrono::milliseconds(0)}), error);
}

BOOST_AUTO_TEST_CASE(buffers_that_overlap_where_they_must_not) {
  const auto allreduce_overlap = run_ranks(3, [](auto& comm) {
    std::vector<float> storage(101, 1.0f);
    std::span<float> whole(storage);
    if (comm.rank() == 1)
      comm.allreduce(std::span<const float>(whole.first(100)), whole.last(100), reduce_op::sum);
    else
      comm.allreduce(whole.first(100), reduce_op::sum);
  }, quick);
  expect_every_rank_fails(allreduce_overlap, errc::invalid_argument, {"overlap", "rank 1 of 3"});

  const auto reduce_scatter_overlap = run_ranks(2, [](auto& comm) {
    std::vector<double> in(10, 1.0);
    std::span<double> whole(in);
    // Block 0 is [0, 5): passing [1, 6) as rank 0's output overlaps the input wrongly.
    auto out = comm.rank() == 0 ? whole.subspan(1, 5) : whole.subspan(5, 5);
    comm.reduce_scatter(std::span<const double>(whole), out, reduce_op::sum);
  }, quick);
  expect_every_rank_fails(reduce_scatter_overlap, errc::invalid_argument, {"overlaps the input"});

  const auto all_gather_overlap = run_ranks(2, [](auto& comm) {
    std::vector<double> out(10, 1.0);
    std::span<double> whole(out);
    auto in = comm.rank() == 1 ? whole.subspan(0, 5) : whole.subspan(0, 5);  // rank 1's block is [5, 10)
    comm.all_gather(std::span<const double>(in), whole);
  }, quick);
  expect_every_rank_fails(all_gather_overlap, errc::invalid_argument, {"overlaps the output"});
}

BOOST_AUTO_TEST_CASE(wrong_block_size) {
  const auto outcome = run_ranks(4, [](auto& comm) {
    std::vector<float> in(10, 1.0f);
    std::vector<float> out(block_of(10, 4, comm.rank()).size + (comm.rank() == 3 ? 1 : 0));
    comm.reduce_scatter(std::span<const float>(in), std::span<float>(out), reduce_op::sum);
  }, quick);
  expect_every_rank_fails(outcome, errc::invalid_argument, {"output has 3 elements but block 3 of 10 has 2"});
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_arrives_times_out_everywhere) {
  const communicator_options short_deadline{std::chrono::milliseconds(200)};
  const auto started = clock::now();
  const auto outcome = run_ranks(3, [](auto& comm) {
    comm.set_tuning(test::forcing());  // each rank waits on its ring neighbour: rank 0 on 2
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // alive, but silent
      std::vector<float> v(4096);
      comm.allreduce(std::span<float>(v), reduce_op::sum);  // by now the others have given up
      return;
    }
    std::vector<float> v(4096);
    comm.allreduce(std::span<float>(v), reduce_op::sum);
  }, short_deadline);
  expect_every_rank_fails(outcome, errc::timeout, {"no progress from peer 2 within 200ms"});
  BOOST_TEST((clock::now() - started < std::chrono::milliseconds(1500 + 1000)));
  // The silent rank learns it too: the communicator was aborted while it slept.
  BOOST_TEST(std::get<1>(outcome.failure(2)).find("the communicator was aborted") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_rank_that_leaves_is_reported_lost) {
  for (std::size_t n : {2, 3, 5}) {
    const auto outcome = run_ranks(n, [n](auto& comm) {
      if (comm.rank() == n - 1) return;  // its endpoint goes away without a word
      std::vector<double> v(1 << 16, 1.0);
      comm.allreduce(std::span<double>(v), reduce_op::sum);
    }, quick);
    for (std::size_t r = 0; r + 1 < n; ++r)
      BOOST_TEST(outcome.failure(r).first == make_error_code(errc::peer_lost), "n=" << n << " rank " << r);
    BOOST_TEST(!outcome.errors[n - 1]);
  }
}

BOOST_AUTO_TEST_CASE(abort_fails_everyone_now_and_later) {
  bool aborted_seen = false;
  const auto outcome = run_ranks(4, [&](auto& comm) {
    std::vector<float> v(1000, 1.0f);
    if (comm.rank() == 0) {
      comm.abort("the loss went NaN");
      aborted_seen = comm.aborted();  // only rank 0 writes it
    }
    comm.allreduce(std::span<float>(v), reduce_op::sum);
  }, quick);
  BOOST_TEST(aborted_seen);
  expect_every_rank_fails(outcome, errc::aborted, {"rank 0 aborted the communicator: the loss went NaN"});
}

BOOST_AUTO_TEST_CASE(error_code_forms_report_instead_of_throwing) {
  std::vector<std::error_code> codes(3), later_codes(3);
  const auto outcome = run_ranks(3, [&](auto& comm) {
    std::vector<float> v(comm.rank() == 0 ? 10 : 11);
    comm.allreduce(std::span<float>(v), reduce_op::sum, codes[comm.rank()]);
    // The communicator is aborted: the cause is reported again, still no throw.
    comm.barrier(later_codes[comm.rank()]);
  }, quick);
  BOOST_TEST(outcome.all_succeeded());
  for (const auto& ec : codes) BOOST_TEST(ec == make_error_code(errc::count_mismatch));
  for (const auto& ec : later_codes) BOOST_TEST(ec == make_error_code(errc::count_mismatch));
}

BOOST_AUTO_TEST_SUITE_END()
