// One rank of a multi-process test job, started by qcoll-run (or mpirun). The job's
// transport comes from the environment; the scenario from argv[1]. Every rank checks
// its own results and prints one verdict line; ctest checks the lines and the exit code
// (tests/multiprocess/check_job.cmake).

#include <qcoll/communicator.hpp>
#include <qcoll/rendezvous/join.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace qcoll;
using namespace std::chrono_literals;

[[noreturn]] void fail(const std::string& why) {
  fmt::print(stderr, "FAILED: {}\n", why);
  std::exit(1);
}

/// Rank r holds (r + 1)·((i mod 1021) + 1): every partial sum is a small exact integer.
float value_of(rank_t r, std::size_t i) { return static_cast<float>((r + 1) * ((i % 1021) + 1)); }
float sum_of(rank_t n, std::size_t i) { return static_cast<float>(n * (n + 1) / 2 * ((i % 1021) + 1)); }

std::vector<float> contribution(rank_t r, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value_of(r, i);
  return v;
}

template <class Comm>
void check_all_collectives(Comm& comm, std::size_t max_bytes) {
  const rank_t n = comm.size(), me = comm.rank();
  std::size_t checks = 0;
  // 0, 4, 64, … bytes (×16), and max_bytes itself.
  for (std::size_t bytes = 0; bytes <= max_bytes;
       bytes = bytes == max_bytes ? max_bytes + 1 : std::min(max_bytes, bytes == 0 ? 4 : bytes * 16)) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> data = contribution(me, count);
    comm.allreduce(std::span<float>(data), reduce_op::sum);
    for (std::size_t i = 0; i < count; ++i)
      if (data[i] != sum_of(n, i)) fail(fmt::format("allreduce of {} bytes: element {} is {}", bytes, i, data[i]));
    ++checks;
    if (bytes > (16u << 20)) continue;  // the others stop at 16 MiB to keep the test short

    const std::vector<float> in = contribution(me, count);
    const block_range mine = block_of(count, n, me);
    std::vector<float> block(mine.size);
    comm.reduce_scatter(std::span<const float>(in), std::span<float>(block), reduce_op::sum);
    for (std::size_t i = 0; i < mine.size; ++i)
      if (block[i] != sum_of(n, mine.offset + i)) fail(fmt::format("reduce_scatter of {} bytes: wrong at {}", bytes, i));

    std::vector<float> gathered(count, -1.0f);
    std::vector<float> own(mine.size);
    for (std::size_t i = 0; i < mine.size; ++i) own[i] = static_cast<float>(mine.offset + i);
    comm.all_gather(std::span<const float>(own), std::span<float>(gathered));
    for (std::size_t i = 0; i < count; ++i)
      if (gathered[i] != static_cast<float>(i)) fail(fmt::format("all_gather of {} bytes: wrong at {}", bytes, i));

    const rank_t root = n - 1;
    std::vector<float> broadcast = me == root ? contribution(7, count) : std::vector<float>(count, 0.0f);
    comm.broadcast(std::span<float>(broadcast), root);
    for (std::size_t i = 0; i < count; ++i)
      if (broadcast[i] != value_of(7, i)) fail(fmt::format("broadcast of {} bytes: wrong at {}", bytes, i));
    comm.barrier();
    checks += 4;
  }
  fmt::print("rank {}: all collectives correct ({} checks, up to {} bytes)\n", me, checks, max_bytes);
}

template <class Comm>
void many_small(Comm& comm) {
  const rank_t n = comm.size();
  for (std::size_t call = 0; call < 1000; ++call) {
    std::vector<float> data = contribution(comm.rank(), 1 + call % 16);
    comm.allreduce(std::span<float>(data), reduce_op::sum);
    for (std::size_t i = 0; i < data.size(); ++i)
      if (data[i] != sum_of(n, i)) fail(fmt::format("small allreduce #{}: wrong", call));
  }
  fmt::print("rank {}: 1000 small allreduces correct\n", comm.rank());
}

/// The last rank passes one element more: every rank must fail with count_mismatch.
template <class Comm>
void mismatched_sizes(Comm& comm) {
  const std::size_t count = 100000 + (comm.rank() == comm.size() - 1 ? 1 : 0);
  std::vector<float> data = contribution(comm.rank(), count);
  try {
    comm.allreduce(std::span<float>(data), reduce_op::sum);
  } catch (const qcoll::error& e) {
    if (e.code() != errc::count_mismatch) fail(fmt::format("expected count_mismatch, got: {}", e.what()));
    fmt::print("rank {}: count mismatch reported: {}\n", comm.rank(), e.what());
    return;
  }
  fail("an allreduce of mismatched sizes succeeded");
}

/// The last rank kills itself in the middle of a 64 MiB allreduce.
template <class Comm>
void kill_a_rank(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  std::atomic<bool> inside{false};
  std::jthread killer;
  if (comm.rank() == victim)
    killer = std::jthread([&] {
      while (!inside) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(30ms);
      std::raise(SIGKILL);
    });
  std::vector<float> data = contribution(comm.rank(), std::size_t{16} << 20);
  const auto started = std::chrono::steady_clock::now();
  try {
    for (int round = 0; round < 50; ++round) {
      inside = round == 1;
      comm.allreduce(std::span<float>(data), reduce_op::sum);
    }
  } catch (const qcoll::error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    const std::string what = e.what();
    if (e.code() != condition::transport_failure) fail(fmt::format("expected a transport failure, got: {}", what));
    if (what.find(fmt::format("peer {}", victim)) == std::string::npos)
      fail(fmt::format("the error does not name peer {}: {}", victim, what));
    if (ms >= comm.options().timeout) fail(fmt::format("the loss was reported only after {}", ms));
    fmt::print("rank {}: survivor saw the loss of peer {} ({}) {} ms into the call: {}\n", comm.rank(), victim,
               e.code().message(), ms.count(), what);
    return;
  }
  fail("50 allreduces completed although a rank was killed");
}

/// The last rank stops (SIGSTOP) in the middle of an allreduce without closing anything:
/// every other rank must fail within about one step timeout, none may hang.
template <class Comm>
void freeze_a_rank(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  std::vector<float> data = contribution(comm.rank(), std::size_t{4} << 20);
  if (comm.rank() == victim) {
    comm.allreduce(std::span<float>(data), reduce_op::sum);
    std::raise(SIGSTOP);
  }
  const auto started = std::chrono::steady_clock::now();
  try {
    for (int round = 0; round < 100; ++round) comm.allreduce(std::span<float>(data), reduce_op::sum);
  } catch (const qcoll::error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    if (e.code() != errc::timeout) fail(fmt::format("expected a timeout, got: {}", e.what()));
    if (ms > 2 * comm.options().timeout) fail(fmt::format("the timeout was reported only after {}", ms));
    fmt::print("rank {}: gave up on the frozen rank after {} ms: {}\n", comm.rank(), ms.count(), e.what());
    return;
  }
  fail("100 allreduces completed although a rank was frozen");
}

template <class Transport>
int run(std::string_view scenario, Transport transport, std::chrono::milliseconds timeout, std::size_t max_bytes) {
  communicator comm(std::move(transport), communicator_options{timeout});
  if (scenario == "collectives") check_all_collectives(comm, max_bytes);
  else if (scenario == "many_small") many_small(comm);
  else if (scenario == "mismatch") mismatched_sizes(comm);
  else if (scenario == "kill") kill_a_rank(comm);
  else if (scenario == "freeze") freeze_a_rank(comm);
  else fail(fmt::format("unknown scenario '{}'", scenario));
  return 0;
}

/// Before joining, the last rank knocks on rank 0's store and data port with garbage and
/// a wrong secret; both must be refused while the job carries on.
void knock_with_bad_credentials(const rendezvous::job& job) {
  namespace asio = boost::asio;
  asio::io_context io;
  const deadline until = clock::now() + job.timeout;
  rendezvous::store_client store(job, until);
  const std::string address = store.get("qcoll/tcp/address/0", until);
  const auto colon = address.rfind(':');
  const asio::ip::tcp::endpoint data_port(asio::ip::make_address(address.substr(0, colon)),
                                          static_cast<unsigned short>(std::stoul(address.substr(colon + 1))));
  {
    asio::ip::tcp::socket garbage(io);
    garbage.connect(data_port);
    asio::write(garbage, asio::buffer(std::string("GET / HTTP/1.1\r\nHost: qcoll\r\n\r\n")));
  }
  rendezvous::job impostor = job;
  impostor.secret = "not the job's secret";
  asio::ip::tcp::socket wrong_secret(io);
  wrong_secret.connect(data_port);
  try {
    rendezvous::introduce(wrong_secret, impostor, rendezvous::channel::data, until);
    fail("a connection with a wrong secret was admitted");
  } catch (const qcoll::error& e) {
    fmt::print("rank {}: impostor refused as expected: {}\n", job.rank, e.what());
  }
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) fail("usage: worker collectives|many_small|mismatch|kill|freeze|intruders|wrong_secret [max bytes]");
  const std::string_view scenario = argv[1];
  const std::size_t max_bytes = argc > 2 ? std::stoull(argv[2]) : std::size_t{1} << 20;
  rendezvous::job job = rendezvous::job_from_environment();

  if (scenario == "wrong_secret") {
    // The last rank has the wrong secret: it is refused, the others time out naming it.
    if (job.rank == job.size - 1) job.secret = "wrong";
    try {
      rendezvous::join(job, [](auto) { return 0; });
    } catch (const qcoll::error& e) {
      fmt::print("rank {}: join failed as expected ({}): {}\n", job.rank, e.code().message(), e.what());
      return 0;
    }
    fail("a job with a wrong secret on one rank formed");
  }
  if (scenario == "intruders") {
    if (job.rank == job.size - 1 && job.size > 1) knock_with_bad_credentials(job);
    return rendezvous::join(job, [&](auto transport) {
      return run("collectives", std::move(transport), job.timeout, 1 << 16);
    });
  }
  return rendezvous::join(job, [&](auto transport) { return run(scenario, std::move(transport), job.timeout, max_bytes); });
} catch (const std::exception& e) {
  fail(e.what());
}
