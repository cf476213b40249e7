// Reproducible sums on device buffers (reproducible.hpp's device_stream forms), on the
// emulated device in CI and on a GPU through tools/gpu-check: ranks as threads over the
// in-process transport (the rounds staged through pinned memory) and over cuda_peer
// (GPU to GPU); 1–4 ranks, float, double, bfloat16 and float16, sizes on both paths (one
// allreduce of the integers, or reduce-scatter and gather), sum and avg, in place and
// not, reduce_scatter: every rank holds the bits one rank gets summing every rank's
// values on the host. A host buffer given to the device call, or a device buffer to the
// host call, fails every rank.

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/reproducible.hpp>
#include <qcoll/topologies/fully_connected.hpp>
#include <qcoll/transports/cuda_peer.hpp>
#include <qcoll/transports/inproc.hpp>

#include "support/device_values.hpp"
#include "support/per_rank.hpp"
#include "support/ranks.hpp"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace qcoll;
using execution::device_memory;
using execution::device_stream;

namespace {

template <class T>
std::vector<T> values_of(std::size_t n, rank_t rank) {
  std::mt19937_64 gen(n * 977 + rank);
  std::uniform_real_distribution<double> mantissa(0.5, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20), coin(0, 1);
  std::vector<T> v(n);
  for (T& x : v) {
    const double value = (coin(gen) ? 1 : -1) * std::ldexp(mantissa(gen), exponent(gen));
    if constexpr (std::same_as<T, double>) x = value;
    else x = static_cast<T>(static_cast<float>(value));
  }
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// What every rank must hold: one rank summing every rank's values on the host.
template <class T>
std::vector<T> host_sum(std::size_t count, rank_t n, reduce_op op) {
  reproducible_accumulator<T> all(count);
  for (rank_t r = 0; r < n; ++r) all.add(values_of<T>(count, r));
  std::vector<T> out(count);
  all.sum(std::span(out), op);
  return out;
}

using test::per_rank;

/// On one rank of `comm`: allreduce (out of place and in place) and reduce_scatter of
/// `count` values on device buffers, against the host sum's bits.
template <class T, class Communicator>
void device_calls_give_the_host_bits(Communicator& comm, std::size_t count, reduce_op op, per_rank& wrong) {
  const rank_t n = comm.size(), r = comm.rank();
  const std::vector<T> expected = host_sum<T>(count, n, op);
  const std::string what = std::to_string(n) + " ranks, " + std::to_string(count) + " " +
                           to_string(dtype_of<T>::value) + ", " + to_string(op) + ", rank " + std::to_string(r);
  const device_memory<T> in = test::on_device(values_of<T>(count, r));
  device_memory<T> out(count);
  reproducible_allreduce(comm, device_stream{}, std::span<const T>(in.span()), out.span(), op);
  if (!same_bits(test::to_host(out), expected)) wrong.differ(what + ": allreduce");
  device_memory<T> data = test::on_device(values_of<T>(count, r));
  reproducible_allreduce(comm, device_stream{}, data.span(), op);
  if (!same_bits(test::to_host(data), expected)) wrong.differ(what + ": allreduce in place");
  const block_range mine = block_of(count, n, r);
  device_memory<T> block(mine.size);
  reproducible_reduce_scatter(comm, device_stream{}, std::span<const T>(in.span()), block.span(), op);
  if (!same_bits(test::to_host(block),
                 std::vector<T>(expected.begin() + mine.offset, expected.begin() + mine.offset + mine.size)))
    wrong.differ(what + ": reduce_scatter");
}

template <class Communicator>
void every_case(Communicator& comm, per_rank& wrong) {
  for (const std::size_t count : {std::size_t{1}, std::size_t{4097}, std::size_t{40001}})
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg}) {
      device_calls_give_the_host_bits<float>(comm, count, op, wrong);
      device_calls_give_the_host_bits<bfloat16>(comm, count, op, wrong);
      device_calls_give_the_host_bits<double>(comm, count, op, wrong);
    }
  device_calls_give_the_host_bits<float16>(comm, 40001, reduce_op::avg, wrong);
}

using peer_transport = transports::cuda_peer::transport<transports::inproc::transport>;

}  // namespace

BOOST_AUTO_TEST_SUITE(reproducible_on_device)

BOOST_AUTO_TEST_CASE(device_sums_have_the_host_bits) {
  for (const rank_t n : {rank_t{1}, rank_t{2}, rank_t{3}, rank_t{4}}) {
    per_rank wrong;
    const auto outcome = test::run_ranks(n, [&](test::inproc_communicator& comm) { every_case(comm, wrong); });
    for (rank_t r = 0; r < n; ++r) BOOST_TEST(!outcome.errors[r], "rank " << r << ": " << outcome.failure(r).second);
    wrong.check();
  }
}

BOOST_AUTO_TEST_CASE(over_cuda_peer_too) {
  const transports::cuda_peer::options settings{.slot_bytes = 16384, .slots = 3};
  for (const rank_t n : {rank_t{2}, rank_t{3}}) {
    per_rank wrong;
    const auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport control) {
      communicator<peer_transport> comm(peer_transport(std::move(control), settings), topologies::fully_connected(n),
                                        {.timeout = std::chrono::seconds(30)});
      every_case(comm, wrong);
    });
    for (rank_t r = 0; r < n; ++r)
      if (errors[r]) {
        try {
          std::rethrow_exception(errors[r]);
        } catch (const std::exception& e) {
          BOOST_ERROR("rank " << r << ": " << e.what());
        }
      }
    wrong.check();
  }
}

BOOST_AUTO_TEST_CASE(buffers_in_the_wrong_memory_fail_every_rank) {
  constexpr std::size_t count = 1000;
  const auto host_on_one = test::run_ranks(3, [](test::inproc_communicator& comm) {
    std::vector<float> host(count, 1.0f);
    device_memory<float> d(count);
    reproducible_allreduce(comm, device_stream{}, comm.rank() == 1 ? std::span<float>(host) : d.span(), reduce_op::sum);
  });
  for (rank_t r = 0; r < 3; ++r) BOOST_TEST(static_cast<bool>(host_on_one.failure(r).first), "rank " << r);
  BOOST_TEST(host_on_one.failure(1).first == errc::invalid_argument);
  BOOST_TEST(host_on_one.failure(1).second.find("host memory") != std::string::npos, host_on_one.failure(1).second);
  const auto device_to_host_call = test::run_ranks(2, [](test::inproc_communicator& comm) {
    std::vector<float> host(count, 1.0f);
    device_memory<float> d(count);
    reproducible_allreduce(comm, comm.rank() == 0 ? d.span() : std::span<float>(host), reduce_op::sum);
  });
  for (rank_t r = 0; r < 2; ++r) BOOST_TEST(static_cast<bool>(device_to_host_call.failure(r).first), "rank " << r);
  // The accumulator keeps host copies: device memory is refused when added.
  reproducible_accumulator<float> acc(count);
  device_memory<float> d(count);
  BOOST_CHECK_EXCEPTION(acc.add(std::span<const float>(d.span())), qcoll::error,
                        [](const qcoll::error& e) { return e.code() == errc::invalid_argument; });
  BOOST_TEST(device_to_host_call.failure(0).first == errc::invalid_argument);
  BOOST_TEST(device_to_host_call.failure(0).second.find("device memory") != std::string::npos,
             device_to_host_call.failure(0).second);
}

BOOST_AUTO_TEST_SUITE_END()
