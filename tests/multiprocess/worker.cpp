// One rank of a multi-process test job, started by qcoll-run (or mpirun). The job's
// transport comes from the environment; the scenario from argv[1]. Every rank checks
// its own results and prints one verdict line; ctest checks the lines and the exit code
// (tests/multiprocess/check_job.cmake).

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/device/emulated/runtime.hpp>  // QCOLL_DEVICE=emulated: the device scenarios in CI
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/grid_allreduce.hpp>
#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/launch/join_nodes.hpp>
#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/router.hpp>
#include <qcoll/topologies/ring.hpp>
#include <qcoll/transports/cuda_peer.hpp>
#include <qcoll/transports/reference.hpp>
#include <qcoll/transports/stream/engine.hpp>
#include <qcoll/two_level_allreduce.hpp>

#include "../support/sanitizers.hpp"
#ifdef QCOLL_TEST_MPI
#include <qcoll/transports/mpi.hpp>
#endif

#include <malloc.h>
#include <unistd.h>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef QCOLL_TEST_MPI
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

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

/// Fills `values` with rank r's contribution.
template <class Floats>
Floats& filled(Floats&& values, rank_t r) {
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = value_of(r, i);
  return values;
}

/// Ordinary memory for checked_collectives.
struct vectors {
  std::vector<float> operator()(std::size_t count, float value = 0.0f) const { return std::vector<float>(count, value); }
};

/// The communicator's own memory (communicator::allocate: shared buffers over shm).
template <class Comm>
struct allocated_by {
  Comm& comm;
  buffer<float> operator()(std::size_t count, float value = 0.0f) const {
    buffer<float> b = comm.template allocate<float>(count);
    std::fill(b.begin(), b.end(), value);
    return b;
  }
};

/// Runs and checks every exact collective at sizes up to max_bytes, on buffers from
/// `fresh(count, value)`; returns the checks made.
template <class Comm, class Fresh = vectors>
std::size_t checked_collectives(Comm& comm, std::size_t max_bytes, Fresh fresh = {}) {
  const rank_t n = comm.size(), me = comm.rank();
  std::size_t checks = 0;
  // 0, 4, 64, … bytes (×16), and max_bytes itself.
  for (std::size_t bytes = 0; bytes <= max_bytes;
       bytes = bytes == max_bytes ? max_bytes + 1 : std::min(max_bytes, bytes == 0 ? 4 : bytes * 16)) {
    const std::size_t count = bytes / sizeof(float);
    auto data = fresh(count);
    filled(data, me);
    comm.allreduce(std::span<float>(data), reduce_op::sum);
    for (std::size_t i = 0; i < count; ++i)
      if (data[i] != sum_of(n, i)) fail(fmt::format("allreduce of {} bytes: element {} is {}", bytes, i, data[i]));
    ++checks;
    if (bytes > (16u << 20)) continue;  // the others stop at 16 MiB to keep the test short

    auto in = fresh(count);
    filled(in, me);
    const block_range mine = block_of(count, n, me);
    auto block = fresh(mine.size);
    comm.reduce_scatter(std::span<const float>(in), std::span<float>(block), reduce_op::sum);
    for (std::size_t i = 0; i < mine.size; ++i)
      if (block[i] != sum_of(n, mine.offset + i)) fail(fmt::format("reduce_scatter of {} bytes: wrong at {}", bytes, i));

    // Out of place: avg (divided between the phases; exact here, (n + 1)/2 · k) and
    // bfloat16 (added in float, rounded once; the float sums of these integers are exact).
    auto averaged = fresh(count, -1.0f);
    comm.allreduce(std::span<const float>(in), std::span<float>(averaged), reduce_op::avg);
    for (std::size_t i = 0; i < count; ++i)
      if (averaged[i] != sum_of(n, i) / static_cast<float>(n))
        fail(fmt::format("allreduce avg of {} bytes: element {} is {}", bytes, i, averaged[i]));
    std::vector<bfloat16> narrow_in(count), narrow_out(count);
    for (std::size_t i = 0; i < count; ++i) narrow_in[i] = bfloat16(value_of(me, i));
    comm.allreduce(std::span<const bfloat16>(narrow_in), std::span<bfloat16>(narrow_out), reduce_op::sum);
    for (std::size_t i = 0; i < count; ++i) {
      float exact = 0;
      for (rank_t r = 0; r < n; ++r) exact += static_cast<float>(bfloat16(value_of(r, i)));
      if (narrow_out[i].bits != bfloat16(exact).bits)
        fail(fmt::format("allreduce of {} bfloat16 values: element {} is {}", count, i, static_cast<float>(narrow_out[i])));
    }

    auto gathered = fresh(count, -1.0f);
    auto own = fresh(mine.size);
    for (std::size_t i = 0; i < mine.size; ++i) own[i] = static_cast<float>(mine.offset + i);
    comm.all_gather(std::span<const float>(own), std::span<float>(gathered));
    for (std::size_t i = 0; i < count; ++i)
      if (gathered[i] != static_cast<float>(i)) fail(fmt::format("all_gather of {} bytes: wrong at {}", bytes, i));

    const rank_t root = n - 1;
    auto broadcast = fresh(count);
    if (me == root) filled(broadcast, 7);
    comm.broadcast(std::span<float>(broadcast), root);
    for (std::size_t i = 0; i < count; ++i)
      if (broadcast[i] != value_of(7, i)) fail(fmt::format("broadcast of {} bytes: wrong at {}", bytes, i));
    comm.barrier();
    checks += 6;
  }
  return checks;
}

/// On ordinary memory. Over shm, single-copy steps stage their blocks in the
/// communicator's staging buffer, which the peer a ring step reads from maps: the line
/// ends with how many peer regions this rank maps (the test says how many it expects).
template <class Comm>
void check_all_collectives(Comm& comm, std::size_t max_bytes) {
  const std::size_t checks = checked_collectives(comm, max_bytes);
  std::string mapped;
  if constexpr (requires { comm.transport().mapped_peer_regions(); })
    mapped = fmt::format(", peer regions mapped: {}", comm.transport().mapped_peer_regions());
  fmt::print("rank {}: all collectives correct ({} checks, up to {} bytes{})\n", comm.rank(), checks, max_bytes,
             mapped);
}

/// The same on the communicator's own memory, with each buffer used in turn by the
/// world and by a sub-communicator (halves by parity) — shared buffers over shm, mapped
/// by the peers. Then every rank says how many peer regions it maps: buffers freed
/// since must have been let go (at most the live ones stay mapped).
template <class Comm>
void check_collectives_on_allocated_memory(Comm& comm, std::size_t max_bytes) {
  std::size_t checks = checked_collectives(comm, max_bytes, allocated_by<Comm>{comm});
  {
    auto half = comm.split(static_cast<std::int64_t>(comm.rank() % 2), 0);
    if (!half) fail("split gave no communicator");
    checks += checked_collectives(*half, max_bytes, allocated_by<Comm>{*half});
  }  // the half's staging buffer (its reduce_scatter partials are ordinary memory) is freed here
  std::string mapped = "ordinary memory";
  if constexpr (requires { comm.transport().mapped_peer_regions(); }) {
    // Two live regions per peer at most, the last buffer and the world's staging buffer:
    // every earlier buffer was freed, so the next step with each peer drops its mapping.
    buffer<float> last = comm.template allocate<float>(std::size_t{1} << 20);
    filled(last, comm.rank());
    comm.allreduce(std::span<float>(last), reduce_op::sum);
    for (std::size_t i = 0; i < last.size(); ++i)
      if (last[i] != sum_of(comm.size(), i)) fail(fmt::format("the last allreduce: wrong at {}", i));
    const std::size_t regions = comm.transport().mapped_peer_regions();
    const bool single_copy = comm.transport().single_copy();
    if (single_copy && (regions == 0 || regions > 2 * (comm.size() - 1)))
      fail(fmt::format("{} peer regions mapped after the last allreduce (expected 1 to {})", regions,
                       2 * (comm.size() - 1)));
    if (!single_copy && regions != 0) fail(fmt::format("{} peer regions mapped without single copy", regions));
    mapped = fmt::format("{} peer regions mapped", regions);
  }
  fmt::print("rank {}: all collectives correct on allocated memory ({} checks, up to {} bytes, {})\n", comm.rank(),
             checks, max_bytes, mapped);
}

/// Sub-communicators between processes: halves by parity, ranked in reverse; every
/// collective on a half interleaved with the world's; exact allreduces started without
/// waiting on both levels at once; a compressed allreduce (identity: exact sums) on a
/// half. Every check is against values only the right members could have produced.
template <class Comm>
void split_collectives(Comm& comm, std::size_t max_bytes) {
  const rank_t n = comm.size(), me = comm.rank();
  auto half = comm.split(static_cast<std::int64_t>(me % 2), -static_cast<std::int64_t>(me));
  if (!half) fail("split gave no communicator");
  std::vector<rank_t> members;  // parent ranks, in the half's rank order
  for (rank_t r = n; r-- > 0;)
    if (r % 2 == me % 2) members.push_back(r);
  if (half->size() != members.size() || members[half->rank()] != me)
    fail(fmt::format("rank {} became rank {} of {}", me, half->rank(), half->size()));
  // The half's rank h contributes as parent rank members[h] would: sums then differ per half.
  auto half_sum = [&](std::size_t i) {
    float sum = 0;
    for (rank_t m : members) sum += value_of(m, i);
    return sum;
  };
  std::size_t checks = 0;
  for (std::size_t bytes = 4; bytes <= max_bytes; bytes *= 64) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> in_half = contribution(me, count);
    half->allreduce(std::span<float>(in_half), reduce_op::sum);
    std::vector<float> in_world = contribution(me, count);
    comm.allreduce(std::span<float>(in_world), reduce_op::sum);
    for (std::size_t i = 0; i < count; ++i) {
      if (in_half[i] != half_sum(i)) fail(fmt::format("half allreduce of {} bytes: element {} is {}", bytes, i, in_half[i]));
      if (in_world[i] != sum_of(n, i)) fail(fmt::format("world allreduce of {} bytes: element {}", bytes, i));
    }
    checks += 2;
  }
  checks += checked_collectives(*half, max_bytes);

  const std::size_t count = max_bytes / sizeof(float);
  std::vector<float> started_world = contribution(me, count), started_half = contribution(me, count);
  collective_handle world_call, half_call;
  comm.start_allreduce(std::span<float>(started_world), reduce_op::sum, world_call);
  half->start_allreduce(std::span<float>(started_half), reduce_op::sum, half_call);
  half_call.wait();
  world_call.wait();
  for (std::size_t i = 0; i < count; ++i)
    if (started_world[i] != sum_of(n, i) || started_half[i] != half_sum(i))
      fail(fmt::format("started allreduces: element {} is {} and {}", i, started_world[i], started_half[i]));

  // Point to point around the half's ring and the world's, a few rounds each.
  for (Comm* c : {&*half, &comm}) {
    const rank_t size = c->size(), at = c->rank();
    if (size < 2) continue;
    const std::vector<float> mine = contribution(at, 4099);
    std::vector<float> got(4099);
    for (int round = 0; round < 3; ++round) {
      c->send_recv(std::span<const float>(mine), (at + 1) % size, std::span<float>(got), (at + size - 1) % size);
      if (got != contribution((at + size - 1) % size, 4099)) fail(fmt::format("send_recv round {} on a size-{} ring", round, size));
    }
    ++checks;
  }

  compressed_allreduce_plan<quantizers::identity<float>> plan(*half, 100003);
  std::vector<float> compressed_in = contribution(me, 100003), compressed_out(100003);
  half->allreduce(plan, std::span<const float>(compressed_in), std::span<float>(compressed_out), reduce_op::sum);
  for (std::size_t i = 0; i < compressed_out.size(); ++i)
    if (compressed_out[i] != half_sum(i)) fail(fmt::format("compressed allreduce on the half: element {}", i));
  checks += 3;
  fmt::print("rank {}: split collectives correct as rank {} of {} ({} checks, up to {} bytes)\n", me, half->rank(),
             half->size(), checks, max_bytes);
}

#ifdef QCOLL_TEST_MPI
// MPI's profiling interface: every datatype this process commits is counted.
std::atomic<long> datatypes_committed{0};
}  // namespace
extern "C" int MPI_Type_commit(MPI_Datatype* type) {
  ++datatypes_committed;
  return PMPI_Type_commit(type);
}
namespace {
#endif

template <class Comm>
void many_small(Comm& comm) {
  const rank_t n = comm.size();
  for (std::size_t call = 0; call < 1000; ++call) {
    std::vector<float> data = contribution(comm.rank(), 1 + call % 16);
    comm.allreduce(std::span<float>(data), reduce_op::sum);
    for (std::size_t i = 0; i < data.size(); ++i)
      if (data[i] != sum_of(n, i)) fail(fmt::format("small allreduce #{}: wrong", call));
  }
#ifdef QCOLL_TEST_MPI
  // Small messages travel as plain bytes: a datatype made and freed per message grows
  // MPICH 4.0's memory for good (its UCX device leaks some: pmodels/mpich#7966).
  if (const long committed = datatypes_committed.load(); committed != 0)
    fail(fmt::format("rank {}: 1000 small allreduces committed {} MPI datatypes", comm.rank(), committed));
#endif
  fmt::print("rank {}: 1000 small allreduces correct\n", comm.rank());
}

/// 24 allreduces of `bytes` on ordinary memory, every third a started call, each
/// checked: over shm their single-copy steps' path may be chosen by measurement
/// (tuning/copy_path.hpp), which QCOLL_DEBUG=INFO's lines show (checked by ctest). With
/// `mixed`, 6 more with the paths forced apart: odd ranks leave their blocks for the
/// kernel's copy, even ranks stage them (a rank's choice is its own).
template <class Comm>
void repeated_allreduce(Comm& comm, std::size_t bytes, bool mixed) {
  const rank_t n = comm.size();
  const std::size_t count = bytes / sizeof(float);
  const std::size_t calls = mixed ? 30 : 24;
  for (std::size_t call = 0; call < calls; ++call) {
    if (call == 24) {
      qcoll::tuning forced = comm.tuning();
      forced.measure_copy_path = false;
      forced.single_copy_kernel_bytes = comm.rank() % 2 == 1 ? 0 : qcoll::tuning::never;
      comm.set_tuning(forced);
    }
    std::vector<float> data = contribution(comm.rank(), count);
    if (call % 3 == 2) {
      collective_handle started;
      comm.start_allreduce(std::span<float>(data), reduce_op::sum, started);
      started.wait();
    } else {
      comm.allreduce(std::span<float>(data), reduce_op::sum);
    }
    for (std::size_t i = 0; i < count; ++i)
      if (data[i] != sum_of(n, i)) fail(fmt::format("allreduce #{} of {} bytes: element {} is {}", call, bytes, i, data[i]));
  }
  fmt::print("rank {}: {} allreduces of {} bytes correct\n", comm.rank(), calls, bytes);
}

/// The last rank passes one element more (mismatch), or `last_bytes` bytes
/// (mismatch_algorithms: a count another algorithm handles, so the ranks' messages
/// carry different tags and some arrive unmatched): every rank must fail with
/// count_mismatch.
template <class Comm>
void mismatched_sizes(Comm& comm, std::size_t last_bytes) {
  const bool last = comm.rank() == comm.size() - 1;
  const std::size_t count = !last ? 100000 : last_bytes != 0 ? last_bytes / sizeof(float) : 100001;
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
void kill_a_rank(Comm& comm, bool allocated, std::size_t count, bool on_device = false) {
  const rank_t victim = comm.size() - 1;
  std::atomic<bool> inside{false};
  std::optional<std::jthread> killer;  // (emplaced: g++-12 -O2 warns of a moved-from temporary's stop_token)
  if (comm.rank() == victim)
    killer.emplace([&] {
      while (!inside) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(30ms);
      std::raise(SIGKILL);
    });
  // allocated: the communicator's memory, which over shm the survivors read in place.
  auto data = allocated ? allocated_by<Comm>{comm}(count) : buffer<float>::on_heap(count);
  // Enough calls to outlast the victim's 30 ms at any size (64 MiB: 50).
  const int rounds = static_cast<int>(std::max<std::size_t>(50, (std::size_t{4} << 30) / (count * sizeof(float) + 1)));
  filled(data, comm.rank());
  // on_device: the call on device memory (QCOLL_DEVICE's runtime), staged through the host.
  execution::device_memory<float> on_gpu(on_device ? count : 0);
  if (on_device) on_gpu.upload(std::span<const float>(data));
  const auto started = std::chrono::steady_clock::now();
  try {
    for (int round = 0; round < rounds; ++round) {
      if (round == 1) inside = true;  // stays set: short calls end before the killer looks
      if (on_device) comm.allreduce(execution::device_stream{}, on_gpu.span(), reduce_op::sum);
      else comm.allreduce(std::span<float>(data), reduce_op::sum);
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
  fail(fmt::format("{} allreduces completed although a rank was killed", rounds));
}

/// Status of a survivor that gives up after losing a peer, as a training script would.
constexpr int survivor_gave_up = 4;

/// Small and fast, for trials of the launcher's exit status: the last rank kills itself
/// (SIGKILL) after a few small allreduces; the others, waiting for it in the next one, fail
/// with the loss of that peer and exit with survivor_gave_up right away. The job's status
/// must be the killed rank's (137), however close together the ranks end.
template <class Comm>
void kill_a_rank_survivors_give_up(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  std::vector<float> data = contribution(comm.rank(), 1024);
  try {
    for (int round = 0; round < 1000; ++round) {
      if (comm.rank() == victim && round == 3) std::raise(SIGKILL);
      comm.allreduce(std::span<float>(data), reduce_op::sum);
    }
  } catch (const qcoll::error& e) {
    fmt::print(stderr, "rank {}: giving up: {}\n", comm.rank(), e.what());
    std::fflush(stderr);
    std::_Exit(survivor_gave_up);
  }
  fail("1000 allreduces completed although a rank was killed");
}

/// The last rank stops (SIGSTOP) between two calls, while the others are in an allreduce:
/// every one of them must fail within about one step timeout, none may hang.
/// Rank 0 joins half a deadline after the other live ranks: they wait on it (alive,
/// waiting itself) longer than it waits on the silent rank, so were deadlines counted
/// from the start of a wait rather than from the peer's last sign of life, theirs would
/// pass first and name rank 0. Returns when this rank started.
template <class Comm>
std::chrono::steady_clock::time_point start_after_the_others(Comm& comm) {
  const auto started = std::chrono::steady_clock::now();
  if (comm.rank() == 0) std::this_thread::sleep_for(comm.options().timeout / 2);
  return started;
}

/// Every live rank's error is a timeout within twice the deadline that names the
/// silent rank as the one that made no progress (directly, or in the abort it adopted).
template <class Comm>
std::chrono::milliseconds expect_the_silent_rank_named(Comm& comm, rank_t victim,
                                                       std::chrono::steady_clock::time_point started,
                                                       const qcoll::error& e) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  if (e.code() != errc::timeout) fail(fmt::format("expected a timeout, got: {}", e.what()));
  if (ms > 2 * comm.options().timeout) fail(fmt::format("the timeout was reported only after {}", ms));
  if (std::string_view(e.what()).find(fmt::format("no progress from peer {} ", victim)) == std::string_view::npos)
    fail(fmt::format("the error does not name rank {} as the silent one: {}", victim, e.what()));
  return ms;
}

template <class Comm>
void freeze_a_rank(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  std::vector<float> data = contribution(comm.rank(), std::size_t{4} << 20);
  // Every rank, the victim included, completes one call before the clock starts: the
  // deadline is about silence, and how long a 16 MiB allreduce takes (seconds under
  // ThreadSanitizer on a busy machine) must not count against it.
  comm.allreduce(std::span<float>(data), reduce_op::sum);
  if (comm.rank() == victim) std::raise(SIGSTOP);
  const auto started = start_after_the_others(comm);
  try {
    for (int round = 0; round < 100; ++round) comm.allreduce(std::span<float>(data), reduce_op::sum);
  } catch (const qcoll::error& e) {
    const auto ms = expect_the_silent_rank_named(comm, victim, started, e);
    fmt::print("rank {}: gave up on the frozen rank after {} ms: {}\n", comm.rank(), ms.count(), e.what());
    return;
  }
  fail("100 allreduces completed although a rank was frozen");
}

// ---- compressed allreduce ----

#ifdef QCOLL_TEST_MPI
using job_transport = transports::mpi::transport;  // this build runs under mpirun
#else
using job_transport = transports::stream::endpoint;  // shm and tcp are both stream endpoints
#endif

/// The job's transport by reference, as one type (transports/reference.hpp). The
/// compressed scenarios run their communicators over it, so that the algorithms are
/// compiled once per quantizer for both transports and both routes (the compile time of
/// this file matters under sanitizers); the cuda_peer scenarios use it as their control.
using endpoint_ref = transports::reference<job_transport>;
static_assert(transport<endpoint_ref>);

/// A topologies::ring in rank order (or reversed), or (one_way) only its links from
/// each rank to the next. A three-rank topologies::ring links every pair, so its plans
/// go direct; the one-way ring makes the forwarded route run with three ranks too. One
/// type for all: every topology type instantiates the algorithms again (compile time).
class test_ring {
 public:
  static constexpr std::size_t max_fan_out = topologies::ring::max_fan_out;
  test_ring(rank_t size, bool one_way, bool reversed = false)
      : ring_(order(size, reversed)), one_way_(one_way), reversed_(reversed) {}
  rank_t size() const noexcept { return ring_.size(); }
  bool linked(rank_t a, rank_t b) const {
    const rank_t next = reversed_ ? (a + size() - 1) % size() : (a + 1) % size();
    return one_way_ ? a != b && a < size() && b == next : ring_.linked(a, b);
  }
  std::span<const rank_t> ring_order() const noexcept { return ring_.ring_order(); }

 private:
  static std::vector<rank_t> order(rank_t size, bool reversed) {
    std::vector<rank_t> ranks(size);
    for (rank_t k = 0; k < size; ++k) ranks[k] = reversed ? (size - k) % size : k;
    return ranks;
  }

  topologies::ring ring_;
  bool one_way_;
  bool reversed_;
};
static_assert(ring_topology<test_ring>);

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15u;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
  return x ^ (x >> 31);
}

/// Identity's inputs: (r + 1)·b with b an integer in [−510, 510], so every sum and
/// average of them is exact, whatever the order.
float integer_input(rank_t r, unsigned call, std::size_t i) {
  return static_cast<float>(static_cast<long>(r + 1) * (static_cast<long>((i * 37 + call * 11) % 1021) - 510));
}
/// The lossy quantizers' inputs: gradient-like noise, different on every rank and call.
float noise_input(rank_t r, unsigned call, std::size_t i) {
  const std::uint64_t bits = mix((std::uint64_t{r} << 56) ^ (std::uint64_t{call} << 48) ^ i);
  const float unit = static_cast<float>(bits >> 40) / static_cast<float>(1u << 23) - 1.0f;  // [−1, 1)
  return unit * static_cast<float>(1 + i % 5);
}

std::uint64_t fnv1a(std::span<const float> values) {
  std::uint64_t hash = 0xcbf29ce484222325u;
  for (const std::byte b : std::as_bytes(values)) hash = (hash ^ std::to_integer<std::uint64_t>(b)) * 0x100000001b3u;
  return hash;
}

/// The first index where two ranges differ bitwise; a.size() when they do not.
std::size_t first_difference(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return i;
  return a.size();
}
bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && first_difference(a, b) == a.size();
}

/// How closely a lossy result must point the way of the exact one (cosine similarity).
/// Error feedback carries each call's error into the next, so one result may be far
/// off. The inputs are fixed, and the least cosines these quantizers reach on them
/// (2–4 ranks; QCOLL_TEST_SHOW_COSINES=1 prints them) are 0.9998, 0.92 and 0.44: the
/// bounds catch a result that agrees on every rank and route but is wrong (zero, say,
/// or misplaced), not a loss of precision.
template <class Q>
constexpr double least_cosine() {
  if constexpr (std::is_same_v<Q, quantizers::bfp>) return 0.99;
  else if constexpr (std::is_same_v<Q, quantizers::k_level>) return 0.75;
  else return 0.2;  // one_bit
}

/// The same calls through the direct route (comm, fully connected) and the forwarded
/// one (ring_comm) with the same inputs and chunking: their results and residuals
/// must be bitwise identical, since the frames and the order of the sums are — or, with
/// plans summing on the grid (`on_grid`), since the order of the sums does not matter
/// (ring_comm's ring then runs the other way).
template <class Comm, class RingComm>
class compressed_checks {
 public:
  compressed_checks(Comm& comm, RingComm& ring_comm, bool on_grid = false)
      : comm_(comm), ring_comm_(ring_comm), on_grid_(on_grid) {}

  /// Three calls of `op` on one pair of plans: in place (blocking), started and
  /// waited for (out of place), then blocking out of place; residuals persist.
  template <class Q>
  void run(const Q& quantizer, std::size_t count, std::size_t chunk_values, reduce_op op) {
    constexpr bool exact = std::is_same_v<Q, quantizers::identity<float>>;
    const rank_t n = comm_.size(), me = comm_.rank();
    const compressed_allreduce_options options{.chunk_values = chunk_values, .reproducible = on_grid_};
    compressed_allreduce_plan direct(comm_, count, quantizer, options);
    compressed_allreduce_plan ring(ring_comm_, count, quantizer, options);
    const auto name = [&](unsigned call) {
      return fmt::format("{} {} of {} values (chunks of {}){}, call {}", Q::name, to_string(op), count,
                         chunk_values == compressed_allreduce_options::automatic ? "automatic" : std::to_string(chunk_values),
                         on_grid_ ? " on the grid" : "", call);
    };
    if (direct.route() != stripe_route::direct) fail(fmt::format("{}: the plan is not direct", name(0)));
    if ((ring.route() == stripe_route::ring) != (n > 2))
      fail(fmt::format("{}: the ring communicator's plan does not take the ring route", name(0)));
    ring_route_seen_ = ring_route_seen_ || ring.route() == stripe_route::ring;

    std::vector<float> in(count), direct_out(count), ring_out(count);
    std::vector<double> expected(count);
    for (unsigned call = 0; call < 3; ++call) {
      for (std::size_t i = 0; i < count; ++i) in[i] = exact ? integer_input(me, call, i) : noise_input(me, call, i);
      const auto exchange = [&](auto& communicator, auto& plan, std::vector<float>& out) {
        if (call == 0) {
          out = in;
          communicator.allreduce(plan, std::span<float>(out), op);
        } else if (call == 1) {
          communicator.start_allreduce(plan, std::span<const float>(in), std::span<float>(out), op);
          if (plan.route() == stripe_route::direct) compute_expected(exact, call, op, expected);  // meanwhile
          plan.wait();
        } else {
          communicator.allreduce(plan, std::span<const float>(in), std::span<float>(out), op);
        }
        if (plan.last_call().bytes_sent != plan.bytes_sent_per_call())
          fail(fmt::format("{}, {} route: sent {} bytes, but bytes_sent_per_call() is {}", name(call),
                           plan.route() == stripe_route::direct ? "direct" : "ring", plan.last_call().bytes_sent,
                           plan.bytes_sent_per_call()));
      };
      exchange(comm_, direct, direct_out);
      exchange(ring_comm_, ring, ring_out);
      if (call != 1) compute_expected(exact, call, op, expected);

      if (const std::size_t at = first_difference(direct_out, ring_out); at != count)
        fail(fmt::format("{}: the routes differ at element {}: direct {}, ring {}", name(call), at, direct_out[at],
                         ring_out[at]));
      if (!bitwise_equal(direct.worker_residual(), ring.worker_residual()) ||
          !bitwise_equal(direct.server_residual(), ring.server_residual()))
        fail(fmt::format("{}: the routes left different residuals", name(call)));
      check_against_exact<Q>(name(call), direct_out, expected);
      const std::uint64_t hash = fnv1a(direct_out);
      hashes_.push_back(static_cast<double>(hash >> 32));  // exact in a double
      hashes_.push_back(static_cast<double>(hash & 0xffffffffu));
      names_.push_back(name(call));
    }
    ++cases_;
  }

  /// Every rank got bitwise the same results: the least and greatest of each hash
  /// over the ranks are this rank's own (exact allreduces over the direct communicator).
  void check_identical_on_all_ranks() {
    std::vector<double> least = hashes_, greatest = hashes_;
    comm_.allreduce(std::span<double>(least), reduce_op::min);
    comm_.allreduce(std::span<double>(greatest), reduce_op::max);
    for (std::size_t k = 0; k < hashes_.size(); ++k)
      if (least[k] != hashes_[k] || greatest[k] != hashes_[k])
        fail(fmt::format("{}: the ranks' results differ", names_[k / 2]));
  }

  std::size_t cases() const noexcept { return cases_; }
  std::size_t calls() const noexcept { return names_.size(); }
  bool ring_route_seen() const noexcept { return ring_route_seen_; }

 private:
  void compute_expected(bool integers, unsigned call, reduce_op op, std::vector<double>& expected) const {
    const rank_t n = comm_.size();
    for (std::size_t i = 0; i < expected.size(); ++i) {
      double sum = 0;
      for (rank_t r = 0; r < n; ++r) sum += integers ? integer_input(r, call, i) : noise_input(r, call, i);
      expected[i] = op == reduce_op::avg ? sum / n : sum;
    }
  }

  template <class Q>
  static void check_against_exact(const std::string& name, std::span<const float> out,
                                  std::span<const double> expected) {
    if constexpr (std::is_same_v<Q, quantizers::identity<float>>) {
      for (std::size_t i = 0; i < out.size(); ++i)
        if (static_cast<double>(out[i]) != expected[i])
          fail(fmt::format("{}: element {} is {}, not {}", name, i, out[i], expected[i]));
    } else {
      double dot = 0, out_norm = 0, exact_norm = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (!std::isfinite(out[i])) fail(fmt::format("{}: element {} is {}", name, i, out[i]));
        dot += out[i] * expected[i];
        out_norm += static_cast<double>(out[i]) * out[i];
        exact_norm += expected[i] * expected[i];
      }
      if (out.size() < 2) return;  // one value: its direction says nothing
      const double cosine = dot / std::sqrt(out_norm * exact_norm);
      if (std::getenv("QCOLL_TEST_SHOW_COSINES")) fmt::print(stderr, "{}: cosine {:.4f}\n", name, cosine);
      if (!(cosine >= least_cosine<Q>()))
        fail(fmt::format("{}: the result's cosine similarity to the exact one is {:.3f}, less than {}", name, cosine,
                         least_cosine<Q>()));
    }
  }

  Comm& comm_;
  RingComm& ring_comm_;
  bool on_grid_;
  std::vector<double> hashes_;      // each call's result hash, as two 32-bit halves
  std::vector<std::string> names_;  // each call's description
  std::size_t cases_ = 0;
  bool ring_route_seen_ = false;
};

/// Every quantizer over both routes, for counts that no world or group size divides,
/// up to `largest` values: identity sums exactly; the lossy ones agree bitwise on
/// every rank and on both routes; every call sends what bytes_sent_per_call() says.
void compressed(endpoint_ref transport, communicator_options options, std::size_t largest) {
  communicator comm(transport, options);
  communicator ring_comm(transport, test_ring(comm.size(), comm.size() == 3), options);
  compressed_checks checks(comm, ring_comm);
  // Small chunks for the middle counts: many frames per stripe, pipelined.
  const struct {
    std::size_t count, chunk_values;
    reduce_op op;
  } sizes[] = {{0, 1024, reduce_op::sum},
               {1, 1024, reduce_op::avg},
               {2049, 1024, reduce_op::avg},
               {100003, 8192, reduce_op::sum},
               {largest, compressed_allreduce_options{}.chunk_values, reduce_op::avg}};
  auto k_level = quantizers::k_level_options::with_bits(4);
  k_level.rounding = quantizers::rounding::stochastic;
  k_level.seed = 1 + comm.rank();
  for (const auto& [count, chunk_values, op] : sizes) {
    checks.run(quantizers::identity<float>{}, count, chunk_values, op);
    checks.run(quantizers::one_bit{}, count, chunk_values, op);
    checks.run(quantizers::k_level(k_level), count, chunk_values, op);
    checks.run(quantizers::bfp{}, count, chunk_values, op);  // 8-bit mantissas
  }
  checks.check_identical_on_all_ranks();
  // Owners summing on the grid: the direct route and a ring the other way round agree.
  communicator reversed_comm(transport, test_ring(comm.size(), comm.size() == 3, true), options);
  compressed_checks on_grid(comm, reversed_comm, true);
  on_grid.run(quantizers::one_bit{}, largest, compressed_allreduce_options{}.chunk_values, reduce_op::avg);
  on_grid.run(quantizers::k_level(k_level), 100003, 8192, reduce_op::sum);
  on_grid.check_identical_on_all_ranks();
  fmt::print("rank {}: compressed ok ({} cases, {} calls, routes direct and {}, up to {} values)\n", comm.rank(),
             checks.cases() + on_grid.cases(), checks.calls() + on_grid.calls(),
             checks.ring_route_seen() ? "ring" : "direct (two ranks)", largest);
}

/// The grid allreduce on a 2×4 torus of the job's 8 ranks with node 6 fully degraded,
/// both forwarding modes, every quantizer, counts up to `largest`: rank 6 is refused
/// at once, saying why; identity sums the other 7 exactly; the lossy quantizers agree
/// bitwise on every included rank; every call sends what bytes_sent_per_call() says.
void grid(endpoint_ref transport, communicator_options options, std::size_t largest) {
  communicator comm(transport, options);
  if (comm.size() != 8) fail("the grid scenario needs 8 ranks");
  const rank_t me = comm.rank(), degraded = 6;
  const topologies::torus torus({2, 4}, {.nodes = {topologies::degraded_node::fully(degraded)}});
  std::vector<double> hashes;
  std::size_t calls = 0;
  for (const auto mode : {topologies::forwarding::sub_networks, topologies::forwarding::per_node}) {
    topologies::routing_options options;
    options.mode = mode;
    const topologies::grid_routing routing = topologies::route_grid(torus, options);
    auto run = [&](const auto& quantizer, std::size_t count) {
      using Q = std::decay_t<decltype(quantizer)>;
      constexpr bool exact = std::is_same_v<Q, quantizers::identity<float>>;
      grid_allreduce_plan plan(comm, routing, count, quantizer);
      std::vector<float> in(count), out(count);
      for (unsigned call = 0; call < 2; ++call) {
        for (std::size_t i = 0; i < count; ++i) in[i] = exact ? integer_input(me, call, i) : noise_input(me, call, i);
        const auto name = fmt::format("grid {} {} count {} call {}", Q::name,
                                      mode == topologies::forwarding::per_node ? "per node" : "by sub-network", count,
                                      call);
        try {
          if (call == 0) {
            comm.allreduce(plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
          } else {
            comm.start_allreduce(plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
            plan.wait();
          }
          if (me == degraded) fail(fmt::format("{}: the degraded node's rank took part", name));
        } catch (const qcoll::error& e) {
          if (me != degraded || e.code() != errc::invalid_argument ||
              std::string_view(e.what()).find("excludes") == std::string_view::npos)
            throw;
          hashes.push_back(std::numeric_limits<double>::quiet_NaN());  // replaced below: takes no part in the check
          hashes.push_back(std::numeric_limits<double>::quiet_NaN());
          continue;
        }
        if (plan.last_call().bytes_sent != plan.bytes_sent_per_call())
          fail(fmt::format("{}: sent {} bytes, but bytes_sent_per_call() is {}", name, plan.last_call().bytes_sent,
                           plan.bytes_sent_per_call()));
        if constexpr (exact) {
          for (std::size_t i = 0; i < count; ++i) {
            double sum = 0;
            for (rank_t r = 0; r < comm.size(); ++r)
              if (r != degraded) sum += integer_input(r, call, i);
            if (static_cast<double>(out[i]) != sum) fail(fmt::format("{}: element {} is {}, not {}", name, i, out[i], sum));
          }
        }
        const std::uint64_t hash = fnv1a(out);
        hashes.push_back(static_cast<double>(hash >> 32));
        hashes.push_back(static_cast<double>(hash & 0xffffffffu));
        ++calls;
      }
    };
    auto k_level = quantizers::k_level_options::with_bits(4);
    k_level.rounding = quantizers::rounding::stochastic;
    k_level.seed = 1 + me;
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2049}, largest}) {
      run(quantizers::identity<float>{}, count);
      run(quantizers::one_bit{}, count);
      run(quantizers::k_level(k_level), count);
      run(quantizers::bfp{}, count);
    }
  }
  // Every included rank got bitwise the same results: the least and greatest hash of
  // each call over them are this rank's own (the degraded rank offers neutral values).
  std::vector<double> least = hashes, greatest = hashes;
  for (double& h : least) h = std::isnan(h) ? std::numeric_limits<double>::infinity() : h;
  for (double& h : greatest) h = std::isnan(h) ? -std::numeric_limits<double>::infinity() : h;
  comm.allreduce(std::span<double>(least), reduce_op::min);
  comm.allreduce(std::span<double>(greatest), reduce_op::max);
  if (me == degraded) {
    fmt::print("rank {}: grid excluded as expected\n", me);
    return;
  }
  for (std::size_t k = 0; k < hashes.size(); ++k)
    if (least[k] != hashes[k] || greatest[k] != hashes[k]) fail(fmt::format("grid call {}: the ranks' results differ", k / 2));
  fmt::print("rank {}: grid ok ({} calls, up to {} values)\n", me, calls, largest);
}

/// The last rank kills itself in the middle of a large one_bit compressed allreduce,
/// as in kill_a_rank: in its third call, half as long into it as its second one took
/// (a fixed delay may miss the call; the first call, which touches every page of the
/// plan, is slower). Every survivor's call
/// fails naming it, well before the timeout, and leaves the plan's residuals bitwise
/// as they were before the call. Every call blocks, or (`started_calls`) is started
/// and waited for.
void kill_during_compressed(endpoint_ref transport, communicator_options options, std::size_t count,
                            bool started_calls) {
  communicator comm(transport, options);
  const rank_t victim = comm.size() - 1;
  compressed_allreduce_plan plan(comm, count, quantizers::one_bit{});
  std::vector<float> in(count), out(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = noise_input(comm.rank(), 0, i);
  std::vector<float> worker_before, server_before;
  auto call_began = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration second_call{};
  int round = 0;
  try {
    for (; round < 50; ++round) {
      worker_before.assign(plan.worker_residual().begin(), plan.worker_residual().end());
      server_before.assign(plan.server_residual().begin(), plan.server_residual().end());
      // Detached: a std::jthread here draws a false -Wmaybe-uninitialized from GCC 12
      // under ASan (in std::stop_source).
      if (round == 2 && comm.rank() == victim) {
        std::thread([delay = std::max<std::chrono::steady_clock::duration>(second_call / 2, 1ms)] {
          std::this_thread::sleep_for(delay);
          std::raise(SIGKILL);
        }).detach();
      }
      call_began = std::chrono::steady_clock::now();
      if (started_calls) {
        comm.start_allreduce(plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
        plan.wait();
      } else {
        comm.allreduce(plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
      }
      if (round == 1) second_call = std::chrono::steady_clock::now() - call_began;
      // Else the comparison after the failure would prove nothing.
      if (bitwise_equal(plan.worker_residual(), worker_before)) fail("a call left the worker residual as it was");
    }
  } catch (const qcoll::error& e) {
    using std::chrono::milliseconds;
    const auto ms = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - call_began);
    const std::string what = e.what();
    if (e.code() != condition::transport_failure) fail(fmt::format("expected a transport failure, got: {}", what));
    if (what.find(fmt::format("peer {}", victim)) == std::string::npos)
      fail(fmt::format("the error does not name peer {}: {}", victim, what));
    if (ms >= comm.options().timeout) fail(fmt::format("the loss was reported only after {}", ms));
    if (round == 0) fail(fmt::format("the first call failed, before any residual was kept: {}", what));
    if (std::all_of(worker_before.begin(), worker_before.end(), [](float v) { return v == 0; }))
      fail("the worker residual was zero before the failed call");
    if (!bitwise_equal(plan.worker_residual(), worker_before) || !bitwise_equal(plan.server_residual(), server_before))
      fail(fmt::format("the failed call {} changed the plan's residuals", round));
    fmt::print("rank {}: residuals unchanged after the loss of peer {} ({}) in {} call {}, {} ms into it: {}\n",
               comm.rank(), victim, e.code().message(), started_calls ? "started" : "blocking", round, ms.count(),
               what);
    return;
  }
  fail("50 compressed allreduces completed although a rank was killed");
}

// ---- The soak: collectives of every kind back to back, resources watched ----

/// What this process holds: resident memory, open descriptors, threads, and mappings
/// of shared memory (named segments and memfd regions); and, reported but not checked,
/// the bytes malloc has handed out and not had back: when resident memory grows with
/// this flat, the growth is not in allocations anyone holds (allocator retention, or
/// memory a library maps itself).
struct held_resources {
  long rss_kib = 0, descriptors = 0, threads = 0, shared_mappings = 0, heap_in_use_kib = 0;
};

held_resources resources_held() {
  held_resources held;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("VmRSS:")) held.rss_kib = std::stol(line.substr(6));
    if (line.starts_with("Threads:")) held.threads = std::stol(line.substr(8));
  }
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++held.descriptors;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("/dev/shm/") != std::string::npos || line.find("/memfd:") != std::string::npos) ++held.shared_mappings;
  const struct mallinfo2 heap = ::mallinfo2();  // in use: arena chunks plus mmap'd blocks
  held.heap_in_use_kib = static_cast<long>((heap.uordblks + heap.hblkhd) / 1024);
  return held;
}

std::string describe(const held_resources& held) {
  return fmt::format("rss {} KiB (heap in use {} KiB), {} descriptors, {} threads, {} shared mappings", held.rss_kib,
                     held.heap_in_use_kib, held.descriptors, held.threads, held.shared_mappings);
}

/// `calls` collectives chosen by one random sequence that every rank draws alike:
/// allreduce (sum, avg, min, max; float, double, bfloat16, float16; in place and out),
/// reduce_scatter, all_gather, broadcast, barrier, started calls, calls on a
/// sub-communicator, and compressed allreduces with every quantizer (blocking and
/// started), of 0 B to 16 MiB; now and then a compressed plan made and dropped. Every
/// result is checked (exact ones element by element; lossy ones against the exact sum
/// and, every 1,000 calls, bitwise across the ranks). Descriptors, threads and shared
/// mappings must be the same at the end as after the first 1,000 calls (or half the
/// calls, in a short soak), and resident memory may not grow by more than 2 MiB (the first calls take every kind
/// to the largest size, so that the high-water marks are reached before the first look).
void soak(endpoint_ref transport, communicator_options options, std::size_t calls) {
  // glibc raises its mmap threshold to the largest block freed, after which big buffers
  // stay in the heap when freed: resident memory would then track the largest size seen
  // so far, not what is live. A fixed threshold makes it measure what is held.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  communicator comm(transport, options);
  const rank_t n = comm.size(), me = comm.rank();
  auto half = comm.split(static_cast<std::int64_t>(me % 2), static_cast<std::int64_t>(me));
  if (!half) fail("split gave no communicator");
  const auto half_sum = [&](std::size_t i) {
    float sum = 0;
    for (rank_t r = me % 2; r < n; r += 2) sum += value_of(r, i);
    return sum;
  };
  std::mt19937_64 choose(20261128);  // the same sequence on every rank
  const auto pick_count = [&]() -> std::size_t {
    if (choose() % 50 == 0) return 0;
    const unsigned log2 = static_cast<unsigned>(choose() % 10 == 0 ? choose() % 23 : choose() % 13);
    return std::min<std::size_t>((std::size_t{1} << log2) + choose() % 7, std::size_t{1} << 22);  // ≤ 16 MiB of floats
  };
  const auto check = [&](bool ok, std::size_t call, std::string_view what, std::size_t count) {
    if (!ok) fail(fmt::format("soak call {}: {} of {} values is wrong", call, what, count));
  };

  // The compressed plans, made once (a few made and dropped along the way as well).
  auto k_level = quantizers::k_level_options::with_bits(4);
  std::tuple<quantizers::identity<float>, quantizers::one_bit, quantizers::k_level, quantizers::bfp> quantizer_set{
      quantizers::identity<float>{}, quantizers::one_bit{}, quantizers::k_level(k_level), quantizers::bfp{}};
  const std::size_t plan_counts[] = {0, 1, 2049, 65537, 1048579};
  auto plans = std::apply([&](const auto&... q) {
    return std::make_tuple([&] {
      std::vector<compressed_allreduce_plan<std::decay_t<decltype(q)>>> list;
      for (std::size_t count : plan_counts) list.emplace_back(comm, count, q);
      return list;
    }()...);
  }, quantizer_set);
  std::uint64_t lossy_hash = 0;
  const auto check_identical = [&](std::size_t call) {
    std::vector<double> halves{static_cast<double>(lossy_hash >> 32), static_cast<double>(lossy_hash & 0xffffffffu)};
    std::vector<double> least = halves, greatest = halves;
    comm.allreduce(std::span<double>(least), reduce_op::min);
    comm.allreduce(std::span<double>(greatest), reduce_op::max);
    if (least != halves || greatest != halves) fail(fmt::format("soak: lossy results differ between ranks by call {}", call));
  };
  const auto compressed_call = [&](auto& plan, std::size_t call, bool started) {
    using Q = typename std::decay_t<decltype(plan)>::quantizer_type;
    constexpr bool exact = std::is_same_v<Q, quantizers::identity<float>>;
    const std::size_t count = plan.count();
    const auto seed = static_cast<unsigned>(call);
    std::vector<float> in(count), out(count);
    for (std::size_t i = 0; i < count; ++i) in[i] = exact ? integer_input(me, seed, i) : noise_input(me, seed, i);
    if (started) {
      comm.start_allreduce(plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
      plan.wait();
    } else {
      comm.allreduce(plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
    }
    double dot = 0, out_norm = 0, exact_norm = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (rank_t r = 0; r < n; ++r) sum += exact ? integer_input(r, seed, i) : noise_input(r, seed, i);
      if (exact) check(static_cast<double>(out[i]) == sum, call, "an identity compressed allreduce", count);
      check(std::isfinite(out[i]), call, "a compressed allreduce", count);
      dot += out[i] * sum;
      out_norm += static_cast<double>(out[i]) * out[i];
      exact_norm += sum * sum;
    }
    // Error feedback may leave one call far off (least_cosine); a right result is not opposite.
    if (!exact && count > 1 && !(dot / std::sqrt(out_norm * exact_norm) > 0.0))
      fail(fmt::format("soak call {}: a {} compressed allreduce of {} values points away from the exact sum", call,
                       Q::name, count));
    lossy_hash = mix(lossy_hash ^ fnv1a(out));
  };

  const std::size_t checkpoint = std::min<std::size_t>(1000, calls / 2);
  held_resources at_checkpoint;
  std::size_t compressed_calls = 0, sub_calls = 0, started_calls = 0;
  for (std::size_t call = 0; call < calls; ++call) {
    if (call == checkpoint) {
      check_identical(call);
      at_checkpoint = resources_held();
    }
    if (call % 1000 == 999) check_identical(call);
    if (me == 0 && call > checkpoint && call % std::max<std::size_t>(1000, calls / 10) == 0)
      fmt::print("rank 0: soak call {}: {}\n", call, describe(resources_held()));
    // The first 20 calls are each kind at the largest size, twice: resident memory then
    // holds every buffer's high-water mark before the first measurement.
    const std::size_t count = call < 20 ? std::size_t{1} << 22 : pick_count();
    switch (call < 20 ? call % 10 : choose() % 10) {
      case 0: {
        const reduce_op op = std::array{reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max}[choose() % 4];
        std::vector<float> data = contribution(me, count);
        comm.allreduce(std::span<float>(data), op);
        bool right = true;
        for (std::size_t i = 0; i < count; ++i) {
          const float expected = op == reduce_op::sum   ? sum_of(n, i)
                                 : op == reduce_op::avg ? sum_of(n, i) / static_cast<float>(n)
                                 : op == reduce_op::min ? value_of(0, i)
                                                        : value_of(n - 1, i);
          right = right && data[i] == expected;
        }
        check(right, call, fmt::format("an allreduce {}", to_string(op)), count);
        break;
      }
      case 1: {
        std::vector<double> in(count), out(count, -1.0);
        for (std::size_t i = 0; i < count; ++i) in[i] = value_of(me, i);
        comm.allreduce(std::span<const double>(in), std::span<double>(out), reduce_op::sum);
        for (std::size_t i = 0; i < count; ++i) check(out[i] == sum_of(n, i), call, "a double allreduce", count);
        break;
      }
      case 2: {
        const auto narrow = [&](auto zero) {
          using T = decltype(zero);
          std::vector<T> in(count), out(count);
          for (std::size_t i = 0; i < count; ++i) in[i] = T(value_of(me, i));
          comm.allreduce(std::span<const T>(in), std::span<T>(out), reduce_op::sum);
          for (std::size_t i = 0; i < count; ++i) {
            float exact = 0;
            for (rank_t r = 0; r < n; ++r) exact += static_cast<float>(T(value_of(r, i)));
            check(out[i].bits == T(exact).bits, call, "a 16-bit allreduce", count);
          }
        };
        if (choose() % 2) narrow(bfloat16{});
        else narrow(float16{});
        break;
      }
      case 3: {
        const std::vector<float> in = contribution(me, count);
        const block_range mine = block_of(count, n, me);
        std::vector<float> block(mine.size);
        comm.reduce_scatter(std::span<const float>(in), std::span<float>(block), reduce_op::sum);
        for (std::size_t i = 0; i < mine.size; ++i)
          check(block[i] == sum_of(n, mine.offset + i), call, "a reduce_scatter", count);
        break;
      }
      case 4: {
        const block_range mine = block_of(count, n, me);
        std::vector<float> own(mine.size), gathered(count, -1.0f);
        for (std::size_t i = 0; i < mine.size; ++i) own[i] = static_cast<float>(mine.offset + i);
        comm.all_gather(std::span<const float>(own), std::span<float>(gathered));
        for (std::size_t i = 0; i < count; ++i) check(gathered[i] == static_cast<float>(i), call, "an all_gather", count);
        break;
      }
      case 5: {
        const rank_t root = static_cast<rank_t>(choose() % n);
        std::vector<float> data = me == root ? contribution(root, count) : std::vector<float>(count);
        comm.broadcast(std::span<float>(data), root);
        for (std::size_t i = 0; i < count; ++i) check(data[i] == value_of(root, i), call, "a broadcast", count);
        break;
      }
      case 6: comm.barrier(); break;
      case 7: {
        std::vector<float> data = contribution(me, count);
        collective_handle handle;
        comm.start_allreduce(std::span<float>(data), reduce_op::sum, handle);
        handle.wait();
        for (std::size_t i = 0; i < count; ++i) check(data[i] == sum_of(n, i), call, "a started allreduce", count);
        ++started_calls;
        break;
      }
      case 8: {
        std::vector<float> data = contribution(me, count);
        half->allreduce(std::span<float>(data), reduce_op::sum);
        for (std::size_t i = 0; i < count; ++i) check(data[i] == half_sum(i), call, "a sub-communicator allreduce", count);
        ++sub_calls;
        break;
      }
      default: {
        const std::size_t which = choose() % std::size(plan_counts);
        const bool started = choose() % 2 == 0;
        switch (choose() % 4) {
          case 0: compressed_call(std::get<0>(plans)[which], call, started); break;
          case 1: compressed_call(std::get<1>(plans)[which], call, started); break;
          case 2: compressed_call(std::get<2>(plans)[which], call, started); break;
          default: compressed_call(std::get<3>(plans)[which], call, started); break;
        }
        ++compressed_calls;
        break;
      }
    }
    if (call % 500 == 250) {  // a plan made, used once and dropped
      compressed_allreduce_plan<quantizers::one_bit> passing(comm, 100 + call % 1000);
      compressed_call(passing, call, false);
    }
  }
  check_identical(calls);
  const held_resources at_end = resources_held();
  fmt::print("rank {}: soak of {} collectives correct ({} compressed, {} started, {} on a sub-communicator); "
             "after {} calls: {}; at the end: {}\n",
             me, calls, compressed_calls, started_calls, sub_calls, checkpoint, describe(at_checkpoint),
             describe(at_end));
  // Under a sanitizer resident memory measures its quarantine and shadow, not qcoll's:
  // there LeakSanitizer (asan) checks memory, and the rest is checked here.
  constexpr bool check_rss = !test::sanitized;
  if (at_end.descriptors != at_checkpoint.descriptors || at_end.threads != at_checkpoint.threads ||
      at_end.shared_mappings != at_checkpoint.shared_mappings ||
      (check_rss && at_end.rss_kib > at_checkpoint.rss_kib + 2 * 1024))
    fail(fmt::format("rank {}: resources grew during the soak: {} after {} calls, {} at the end", me,
                     describe(at_checkpoint), checkpoint, describe(at_end)));
}

// ---- One trial of the fault campaign (tests/faults/campaign.py) ----

std::int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// `calls` collectives of random kinds and sizes (a sequence every rank draws alike from
/// QCOLL_CAMPAIGN_SEED), each checked, while tests/faults/campaign.py kills or stops a rank at a
/// random moment. Each rank prints its pid first, then either "campaign done" or, for
/// the error it got, "campaign error at <ms since the epoch>: <code>: <message>" and
/// exits 3. The driver judges the lines.
void campaign(endpoint_ref transport, communicator_options options, std::size_t calls) {
  const char* seed = std::getenv("QCOLL_CAMPAIGN_SEED");
  communicator comm(transport, options);
  const rank_t n = comm.size(), me = comm.rank();
  fmt::print("rank {}: campaign pid {}\n", me, ::getpid());
  std::fflush(stdout);
  std::mt19937_64 choose(seed ? std::strtoull(seed, nullptr, 10) : 1);
  compressed_allreduce_plan<quantizers::one_bit> one_bit_plan(comm, 65537);
  compressed_allreduce_plan<quantizers::identity<float>> identity_plan(comm, 65537);
  std::size_t call = 0;
  try {
    for (; call < calls; ++call) {
      const std::size_t count = choose() % 4 == 0 ? choose() % (1u << 20) : choose() % 4096;
      switch (choose() % 5) {
        case 0:
        case 1: {
          std::vector<float> data = contribution(me, count);
          comm.allreduce(std::span<float>(data), reduce_op::sum);
          for (std::size_t i = 0; i < count; ++i)
            if (data[i] != sum_of(n, i)) fail(fmt::format("campaign call {}: allreduce wrong at {}", call, i));
          break;
        }
        case 2: {
          const rank_t root = static_cast<rank_t>(choose() % n);
          std::vector<float> data = me == root ? contribution(root, count) : std::vector<float>(count);
          comm.broadcast(std::span<float>(data), root);
          for (std::size_t i = 0; i < count; ++i)
            if (data[i] != value_of(root, i)) fail(fmt::format("campaign call {}: broadcast wrong at {}", call, i));
          break;
        }
        case 3: {
          std::vector<float> in(65537), out(65537);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = integer_input(me, static_cast<unsigned>(call), i);
          comm.allreduce(identity_plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
          for (std::size_t i = 0; i < in.size(); ++i) {
            double sum = 0;
            for (rank_t r = 0; r < n; ++r) sum += integer_input(r, static_cast<unsigned>(call), i);
            if (static_cast<double>(out[i]) != sum) fail(fmt::format("campaign call {}: compressed wrong at {}", call, i));
          }
          break;
        }
        default: {
          std::vector<float> in(65537), out(65537);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = noise_input(me, static_cast<unsigned>(call), i);
          comm.start_allreduce(one_bit_plan, std::span<const float>(in), std::span<float>(out), reduce_op::sum);
          one_bit_plan.wait();
          for (float v : out)
            if (!std::isfinite(v)) fail(fmt::format("campaign call {}: one_bit result not finite", call));
        }
      }
    }
  } catch (const qcoll::error& e) {
    fmt::print("rank {}: campaign error at {}: {}: {}\n", me, wall_clock_ms(), e.code().message(), e.what());
    std::fflush(stdout);
    std::exit(3);
  }
  fmt::print("rank {}: campaign done: {} calls correct\n", me, calls);
}

/// The last rank starts sending garbage after a first allreduce (tests/faults/garble.cpp,
/// preloaded: SIGUSR1 turns it on; TCP only). Every other rank fails with a protocol
/// error that names it as the sender of something that is not a qcoll message, directly
/// or in the abort it adopted, never as a rank that "called" some other collective.
template <class Comm>
void garble_a_rank(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  std::vector<float> data = contribution(comm.rank(), std::size_t{1} << 18);
  if (comm.rank() == victim) {
    comm.allreduce(std::span<float>(data), reduce_op::sum);
    std::raise(SIGUSR1);
  }
  try {
    // The others may still be in the first call when the garbage reaches one of them.
    for (int round = 0; round < 100; ++round) comm.allreduce(std::span<float>(data), reduce_op::sum);
  } catch (const qcoll::error& e) {
    if (comm.rank() == victim) {
      fmt::print("rank {}: its peers refused its garbage: {}\n", comm.rank(), e.what());
      return;
    }
    if (e.code() != errc::protocol_error) fail(fmt::format("expected a protocol error, got: {}", e.what()));
    const std::string names = fmt::format("peer {} sent something that is not a qcoll message", victim);
    if (std::string_view(e.what()).find(names) == std::string_view::npos)
      fail(fmt::format("the error does not say that rank {} sent garbage: {}", victim, e.what()));
    fmt::print("rank {}: refused the garbage of rank {}\n", comm.rank(), victim);
    return;
  }
  fail("100 allreduces completed although a rank sent garbage");
}

/// Over TLS (QCOLL_TLS=1), one bit of the last rank's next large write flipped in
/// transit (faults/garble.cpp, QCOLL_GARBLE=payload; the ciphertext, as a man in the
/// middle would): the record fails its authentication, so the rank that reads it names
/// the victim and every rank fails; no call completes with the altered bytes.
template <class Comm>
void alter_a_tls_record(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  const std::size_t count = std::size_t{1} << 18;
  std::vector<float> data = contribution(comm.rank(), count);
  const auto expect_the_sum = [&](int round) {
    for (std::size_t i = 0; i < count; ++i)
      if (data[i] != sum_of(comm.size(), i))
        fail(fmt::format("round {}: element {} is {}, expected {}: altered bytes were used", round, i, data[i],
                         sum_of(comm.size(), i)));
  };
  comm.allreduce(std::span<float>(data), reduce_op::sum);
  expect_the_sum(0);
  if (comm.rank() == victim) std::raise(SIGUSR1);
  try {
    for (int round = 1; round <= 100; ++round) {
      data = contribution(comm.rank(), count);
      comm.allreduce(std::span<float>(data), reduce_op::sum);
      expect_the_sum(round);
    }
  } catch (const qcoll::error& e) {
    const std::string said = e.what();
    if (said.find("failed to decrypt or authenticate") == std::string::npos ||
        said.find(fmt::format("rank {}", victim)) == std::string::npos)
      fail(fmt::format("the error does not say that rank {}'s TLS record failed: {}", victim, said));
    fmt::print("rank {}: refused the altered TLS record of rank {}: {}\n", comm.rank(), victim, said);
    return;
  }
  fail("100 allreduces completed although a TLS record was altered");
}

#ifdef QCOLL_TEST_MPI
// ---- MPI only: failures an MPI launcher lets the ranks see ----

/// The last rank stops answering for three timeouts (asleep, not killed: an MPI
/// launcher ends the whole job when a rank dies). The others time out within their
/// deadline and abort; the sleeper's next call then fails with their words.
template <class Comm>
void stall_a_rank(Comm& comm) {
  const rank_t victim = comm.size() - 1;
  std::vector<float> data = contribution(comm.rank(), std::size_t{1} << 20);
  comm.allreduce(std::span<float>(data), reduce_op::sum);
  if (comm.rank() == victim) {
    std::this_thread::sleep_for(3 * comm.options().timeout);
    try {
      comm.allreduce(std::span<float>(data), reduce_op::sum);
    } catch (const qcoll::error& e) {
      if (e.code() != errc::timeout) fail(fmt::format("expected a timeout, got: {}", e.what()));
      fmt::print("rank {}: woke up to the others' abort: {}\n", comm.rank(), e.what());
      return;
    }
    fail("the allreduce completed although the others had given up");
  }
  const auto started = start_after_the_others(comm);
  try {
    for (int round = 0; round < 100; ++round) comm.allreduce(std::span<float>(data), reduce_op::sum);
  } catch (const qcoll::error& e) {
    const auto ms = expect_the_silent_rank_named(comm, victim, started, e);
    fmt::print("rank {}: gave up on the stalled rank after {} ms: {}\n", comm.rank(), ms.count(), e.what());
    return;
  }
  fail("100 allreduces completed although a rank stalled");
}

/// Rank 0 aborts the communicator with its own words in the middle of the others'
/// allreduce: every rank fails with errc::aborted and those words.
template <class Comm>
void abort_with_reason(Comm& comm) {
  std::vector<float> data = contribution(comm.rank(), std::size_t{1} << 18);
  comm.allreduce(std::span<float>(data), reduce_op::sum);
  const std::string words = "rank 0 gives up: the learning rate diverged";
  try {
    if (comm.rank() == 0) {
      std::this_thread::sleep_for(100ms);  // the others are inside their allreduce by now
      comm.abort(words);
      comm.allreduce(std::span<float>(data), reduce_op::sum);
    } else {
      for (int round = 0; round < 100; ++round) comm.allreduce(std::span<float>(data), reduce_op::sum);
    }
  } catch (const qcoll::error& e) {
    if (e.code() != errc::aborted) fail(fmt::format("expected aborted, got: {}", e.what()));
    if (std::string_view(e.what()).find(words) == std::string_view::npos)
      fail(fmt::format("the error does not carry rank 0's words: {}", e.what()));
    fmt::print("rank {}: aborted with rank 0's words: {}\n", comm.rank(), e.what());
    return;
  }
  fail("allreduces went on after rank 0 aborted");
}

/// Rank 0 sends rank 1 one message of more than 2 GiB (MPI counts are int: the
/// transport describes it in 1 GiB units), each way; both check every 4 KiB page.
template <class Comm>
void over_two_gibibytes(Comm& comm) {
  const std::size_t count = (std::size_t{1} << 29) + 1027;  // floats: 2 GiB + 4108 bytes
  if (comm.size() != 2) fail("the scenario needs 2 ranks");
  const auto value = [](std::size_t i, rank_t from) { return float((i * 7 + from) % 65521); };
  std::vector<float> data(count);
  const rank_t peer = 1 - comm.rank();
  for (std::size_t i = 0; i < count; ++i) data[i] = value(i, comm.rank());
  std::vector<float> got(count, -1.0f);
  comm.send_recv(std::span<const float>(data), peer, std::span<float>(got), peer);
  for (std::size_t i = 0; i < count; i += 1021)
    if (got[i] != value(i, peer)) fail(fmt::format("element {} is {}, expected {}", i, got[i], value(i, peer)));
  if (got.back() != value(count - 1, peer)) fail("the last element is wrong");
  fmt::print("rank {}: {} bytes each way correct\n", comm.rank(), count * sizeof(float));
}
#endif

/// Bit for bit: the device call's result (downloaded) against the host call's.
template <class T>
void expect_same(const execution::device_memory<T>& device_result, const std::vector<T>& host_result,
                 const std::string& what) {
  std::vector<T> got(device_result.size());
  device_result.download(got);
  if (got.size() != host_result.size() ||
      (!got.empty() && std::memcmp(got.data(), host_result.data(), got.size() * sizeof(T)) != 0))
    fail(fmt::format("{}: the device result differs from the host's", what));
}

/// Every exact collective, blocking and started, and a compressed plan on device
/// buffers (QCOLL_DEVICE's runtime: the emulated device in CI), each against the host
/// call on the same inputs, bit for bit.
template <class T, class Comm, class DeviceComm>
std::size_t device_collectives_of(Comm& comm, DeviceComm& device_comm, std::size_t count) {
  const rank_t rank = comm.rank(), n = comm.size();
  const std::string type = to_string(dtype_of<T>::value);
  std::vector<T> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<T>(std::sin(0.37f * static_cast<float>(i + 1) * (rank + 1)));
  execution::device_memory<T> d_in(count), d_out(count);
  d_in.upload(in);
  std::size_t checks = 0;
  for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
    std::vector<T> out(count);
    comm.allreduce(std::span<const T>(in), std::span<T>(out), op);
    device_comm.allreduce(execution::device_stream{}, std::span<const T>(d_in.span()), d_out.span(), op);
    expect_same(d_out, out, fmt::format("allreduce {} of {} {}", to_string(op), count, type));
    ++checks;
  }
  const block_range mine = block_of(count, n, rank);
  std::vector<T> scattered(mine.size);
  comm.reduce_scatter(std::span<const T>(in), std::span<T>(scattered), reduce_op::sum);
  execution::device_memory<T> d_scattered(mine.size);
  device_comm.reduce_scatter(execution::device_stream{}, std::span<const T>(d_in.span()), d_scattered.span(), reduce_op::sum);
  expect_same(d_scattered, scattered, fmt::format("reduce_scatter of {} {}", count, type));
  std::vector<T> gathered(count);
  comm.all_gather(mine.of(std::span<const T>(in)), std::span<T>(gathered));
  collective_handle handle;
  device_comm.start_all_gather(execution::device_stream{}, mine.of(std::span<const T>(d_in.span())), d_out.span(), handle);
  handle.wait();
  expect_same(d_out, gathered, fmt::format("started all_gather of {} {}", count, type));
  std::vector<T> broadcast = in;
  comm.broadcast(std::span<T>(broadcast), n - 1);
  d_out.upload(in);
  device_comm.broadcast(execution::device_stream{}, d_out.span(), n - 1);
  expect_same(d_out, broadcast, fmt::format("broadcast of {} {}", count, type));
  return checks + 3;
}

/// `device_comm`: where the device calls go (the same communicator, staged through the
/// host; or one over cuda_peer, moving device memory itself).
template <class Comm, class DeviceComm>
void check_device_collectives(Comm& comm, DeviceComm& device_comm, std::size_t max_bytes,
                              std::string_view over = "the job's transport") {
  std::size_t checks = 0;
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{262147}, max_bytes / 4}) {
    checks += device_collectives_of<float>(comm, device_comm, count);
    if (count <= 262147) checks += device_collectives_of<bfloat16>(comm, device_comm, count);
  }
  // A compressed plan on device memory against the host plan, over three calls.
  const std::size_t values = max_bytes / 4 + 3;
  compressed_allreduce_plan host_plan(comm, values, quantizers::one_bit{});
  compressed_allreduce_plan device_plan(execution::device_stream{}, device_comm, values, quantizers::one_bit{});
  execution::device_memory<float> d(values);
  for (unsigned call = 0; call < 3; ++call) {
    std::vector<float> g(values);
    for (std::size_t i = 0; i < values; ++i) g[i] = std::cos(0.11f * static_cast<float>(i) + float(call + comm.rank()));
    d.upload(g);
    comm.allreduce(host_plan, std::span<float>(g), reduce_op::avg);
    device_comm.allreduce(execution::device_stream{}, device_plan, d.span(), reduce_op::avg);
    expect_same(d, g, fmt::format("one_bit plan of {} values, call {}", values, call));
    ++checks;
  }
  fmt::print("rank {}: device collectives equal the host's ({} checks, up to {} bytes, on the {} device, over {})\n",
             comm.rank(), checks, max_bytes, execution::device_runtime("worker").name, over);
}

#ifndef QCOLL_TEST_MPI
/// The CUDA peer transport between this job's processes, the job's transport its
/// control channel: every exact collective and a compressed plan against the host calls
/// (kill: the last rank killed in the middle of an allreduce, which every survivor names).
/// Each rank on device local rank % the devices (several ranks per device).
/// The CUDA peer transport's settings for the rank `index` of its node: on device index %
/// the devices, made current.
transports::cuda_peer::options peer_settings(rank_t index, int& devices) {
  const device::runtime& runtime = execution::device_runtime("worker");
  execution::check_device(runtime, runtime.device_count(&devices), "counting devices");
  transports::cuda_peer::options settings{.slot_bytes = 256 << 10, .slots = 4};
  settings.device = static_cast<int>(index % static_cast<rank_t>(devices));
  execution::check_device(runtime, runtime.set_device(settings.device), "choosing a device");
  return settings;
}

template <class Comm>
void over_cuda_peer(Comm& comm, std::size_t amount, bool kill) {
  int devices = 0;
  const transports::cuda_peer::options settings = peer_settings(comm.rank(), devices);
  communicator peers(transports::cuda_peer::transport<endpoint_ref>(endpoint_ref(comm.transport()), settings),
                     comm.options());
  if (kill) return kill_a_rank(peers, false, amount / sizeof(float), true);
  // The host calls are the reference. cuda_peer does not read peers' memory, so the host
  // communicator must not either: with single-copy steps it would choose another
  // algorithm (ring_single_copy where cuda_peer takes halving_doubling, 4 ranks, 1 MiB),
  // adding in another order — other bits, rightly. Same algorithm, same bits.
  qcoll::tuning without_single_copy = comm.tuning();
  without_single_copy.single_copy_bytes = qcoll::tuning::never;
  comm.set_tuning(without_single_copy);
  check_device_collectives(comm, peers, amount, fmt::format("cuda_peer on device {} of {}", settings.device, devices));
}
#endif

/// The two-level allreduce between processes: `node` over shm among this host's ranks
/// (qcoll-run --ranks-per-node), `world` over tcp. Identity gives the exact sums; one_bit
/// the same bits on every rank, call after call, with its mass kept; both exchanges.
/// cuda_peer: also the same calls on device memory with the node over the CUDA peer
/// transport (the node's shm its control), bit for bit the host's.
template <class Comm>
void two_level(Comm& node, Comm& world, std::size_t count, bool cuda_peer) {
  const std::size_t n = world.size();
  auto input = [&](rank_t r, unsigned call) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>(static_cast<int>((i * 7 + r * 13 + call) % 17) - 8);
    return v;
  };
  std::optional<communicator<transports::cuda_peer::transport<endpoint_ref>>> peers;
  if (cuda_peer) {
    int devices = 0;
    const transports::cuda_peer::options settings = peer_settings(node.rank(), devices);
    peers.emplace(transports::cuda_peer::transport<endpoint_ref>(endpoint_ref(node.transport()), settings),
                  node.options());
  }
  std::size_t checks = 0;
  for (const two_level_exchange exchange : {two_level_exchange::shards, two_level_exchange::leaders}) {
    const two_level_options options{.exchange = exchange, .compressed = {.chunk_values = 65536}};
    two_level_allreduce exact(node, world, count, quantizers::identity<float>{}, options);
    std::vector<float> expected(count, 0.0f), out(count);
    for (rank_t r = 0; r < n; ++r) {
      const std::vector<float> in = input(r, 0);
      for (std::size_t i = 0; i < count; ++i) expected[i] += in[i];
    }
    exact.allreduce(std::span<const float>(input(world.rank(), 0)), std::span(out), reduce_op::sum);
    if (out != expected) fail("the exact two-level allreduce is not the exact sum");
    ++checks;

    two_level_allreduce lossy(node, world, count, quantizers::one_bit{}, options);
    using device_bucket = two_level_allreduce<communicator<transports::cuda_peer::transport<endpoint_ref>>, Comm,
                                              quantizers::one_bit, float, execution::device_space>;
    std::optional<device_bucket> on_device;
    if (peers) on_device.emplace(execution::device_stream{}, *peers, world, count, quantizers::one_bit{}, options);
    std::vector<double> total(count, 0.0), given(count, 0.0);
    for (unsigned call = 0; call < 3; ++call) {
      for (rank_t r = 0; r < n; ++r) {
        const std::vector<float> in = input(r, call);
        for (std::size_t i = 0; i < count; ++i) given[i] += in[i];
      }
      const std::vector<float> in = input(world.rank(), call);
      lossy.allreduce(std::span<const float>(in), std::span(out), reduce_op::sum);
      for (std::size_t i = 0; i < count; ++i) total[i] += out[i];
      // The same bits everywhere: the largest and the smallest of every value agree.
      std::vector<float> high = out, low = out;
      world.allreduce(std::span(high), reduce_op::max);
      world.allreduce(std::span(low), reduce_op::min);
      if (high != out || low != out) fail(fmt::format("call {}: the ranks' one_bit results differ", call));
      ++checks;
      if (on_device) {
        const execution::device_memory<float> d_in = [&] {
          execution::device_memory<float> d(count);
          d.upload(in);
          return d;
        }();
        execution::device_memory<float> d_out(count);
        on_device->allreduce(execution::device_stream{}, std::span<const float>(d_in.span()), d_out.span(),
                             reduce_op::sum);
        expect_same(d_out, out, fmt::format("the two-level allreduce over cuda_peer, call {}", call));
        ++checks;
      }
    }
    // Σ outputs + the mass every rank's residuals hold = Σ inputs.
    std::vector<float> mass(count, 0.0f);
    lossy.add_residual_mass(std::span(mass), reduce_op::sum);
    world.allreduce(std::span(mass), reduce_op::sum);
    for (std::size_t i = 0; i < count; ++i)
      if (std::abs(total[i] + mass[i] - given[i]) > 1e-3 * (1 + std::abs(given[i])))
        fail(fmt::format("value {}: outputs {} + mass {} for inputs {}", i, total[i], mass[i], given[i]));
    ++checks;
  }
  fmt::print("rank {}: two-level allreduce ({} nodes of {}, {} values) right ({} checks{})\n", world.rank(),
             n / node.size(), node.size(), count, checks, cuda_peer ? ", over cuda_peer on device too" : "");
}

/// The last rank is killed in the middle of a two-level call: every survivor's call fails
/// within the deadline — with the loss (its errors say which world rank a node's or the
/// nodes' rank k is), or with the abort of a survivor that saw it first.
template <class Comm>
void kill_during_two_level(Comm& node, Comm& world, std::size_t count) {
  const rank_t victim = world.size() - 1;
  std::atomic<bool> inside{false};
  std::optional<std::jthread> killer;
  if (world.rank() == victim)
    killer.emplace([&] {
      while (!inside) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(30ms);
      std::raise(SIGKILL);
    });
  two_level_allreduce bucket(node, world, count, quantizers::one_bit{});
  std::vector<float> data(count, 1.0f);
  const auto started = std::chrono::steady_clock::now();
  try {
    for (int round = 0; round < 200; ++round) {
      if (round == 1) inside = true;
      bucket.allreduce(std::span(data), reduce_op::avg);
    }
  } catch (const qcoll::error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    const std::string what = e.what();
    if (ms >= world.options().timeout) fail(fmt::format("the loss was reported only after {}", ms));
    fmt::print("rank {}: survivor's two-level call failed {} ms in ({}): {}\n", world.rank(), ms.count(),
               e.code().message(), what);
    return;
  }
  fail("200 two-level allreduces completed although a rank was killed");
}

template <class Transport>
int run(std::string_view scenario, Transport transport, std::chrono::milliseconds timeout, std::size_t amount) {
  communicator comm(std::move(transport), communicator_options{timeout});
  if (scenario == "collectives") check_all_collectives(comm, amount);
  else if (scenario == "allocated") check_collectives_on_allocated_memory(comm, amount);
  else if (scenario == "collectives_and_allocated") {
    check_all_collectives(comm, amount);
    check_collectives_on_allocated_memory(comm, amount);
  }
  else if (scenario == "many_small") many_small(comm);
  else if (scenario == "repeat" || scenario == "repeat_mixed") repeated_allreduce(comm, amount, scenario == "repeat_mixed");
  else if (scenario == "split") split_collectives(comm, amount);
  else if (scenario == "mismatch") mismatched_sizes(comm, 0);
  else if (scenario == "mismatch_algorithms") mismatched_sizes(comm, amount);
  else if (scenario == "kill" || scenario == "kill_allocated") kill_a_rank(comm, scenario == "kill_allocated", amount / sizeof(float));
  else if (scenario == "kill_device") kill_a_rank(comm, false, amount / sizeof(float), true);
  else if (scenario == "device") check_device_collectives(comm, comm, amount);
#ifndef QCOLL_TEST_MPI
  else if (scenario == "cuda_peer" || scenario == "kill_cuda_peer") over_cuda_peer(comm, amount, scenario == "kill_cuda_peer");
#endif
  else if (scenario == "kill_survivors_give_up") kill_a_rank_survivors_give_up(comm);
  else if (scenario == "freeze") freeze_a_rank(comm);
  else if (scenario == "compressed") compressed(endpoint_ref(comm.transport()), comm.options(), amount);
  else if (scenario == "grid") grid(endpoint_ref(comm.transport()), comm.options(), amount);
  else if (scenario == "soak") soak(endpoint_ref(comm.transport()), comm.options(), amount);
  else if (scenario == "campaign") campaign(endpoint_ref(comm.transport()), comm.options(), amount);
  else if (scenario == "compressed_kill" || scenario == "compressed_kill_started")
    kill_during_compressed(endpoint_ref(comm.transport()), comm.options(), amount, scenario.ends_with("started"));
  else if (scenario == "garble") garble_a_rank(comm);  // TCP only: tests/faults/garble.cpp
  else if (scenario == "alter_a_tls_record") alter_a_tls_record(comm);  // TCP with QCOLL_TLS=1
#ifdef QCOLL_TEST_MPI
  else if (scenario == "stall") stall_a_rank(comm);
  else if (scenario == "abort") abort_with_reason(comm);
  else if (scenario == "over_2GiB") over_two_gibibytes(comm);
#endif
  else fail(fmt::format("unknown scenario '{}'", scenario));
  return 0;
}

#ifndef QCOLL_TEST_MPI
/// Removes CAP_SYS_PTRACE from this process (tests run as root, which may read any process).
void drop_ptrace_capability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &header, data) != 0) fail("capget failed");
  const auto bit = 1u << (CAP_SYS_PTRACE % 32);
  data[CAP_SYS_PTRACE / 32].effective &= ~bit;
  data[CAP_SYS_PTRACE / 32].permitted &= ~bit;
  data[CAP_SYS_PTRACE / 32].inheritable &= ~bit;
  if (::syscall(SYS_capset, &header, data) != 0) fail("capset failed");
}

/// Makes pidfd_getfd fail with EPERM in this process (a seccomp filter, as a container
/// runtime's may be): peers' shared regions cannot be mapped, so single-copy steps read
/// them through the kernel's copy. False where this architecture has no filter here.
bool refuse_fetching_peer_descriptors() {
#if defined(__x86_64__) && defined(SYS_pidfd_getfd)
  sock_filter program[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pidfd_getfd, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  const sock_fprog filter{static_cast<unsigned short>(std::size(program)), program};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail("prctl(PR_SET_NO_NEW_PRIVS) failed");
  if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter, 0, 0) != 0) fail("prctl(PR_SET_SECCOMP) failed");
  return true;
#else
  return false;
#endif
}

/// Before joining, the last rank knocks on rank 0's store and data port with garbage and
/// a wrong secret; both must be refused while the job carries on.
void knock_with_bad_credentials(const rendezvous::job& job) {
  namespace asio = boost::asio;
  asio::io_context io;
  const deadline until = clock::now() + job.timeout;
  rendezvous::store_client store(job, until);
  // Rank 0 opens its data port once every rank has stated its transport.
  launch::agree_on_transport(job, store, until);
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

#endif

}  // namespace

#ifdef QCOLL_TEST_MPI
// Under mpirun: the transport is MPI's, over MPI_COMM_WORLD; QCOLL_TIMEOUT_MS is the
// per-step deadline (60 s unless set).
int main(int argc, char** argv) try {
  if (argc < 2)
    fail("usage: worker_mpi collectives|many_small|split|mismatch|mismatch_algorithms|stall|abort|compressed|grid|"
         "thread_single [max bytes or values]");
  const std::string_view scenario = argv[1];
  const std::size_t max_bytes = argc > 2 ? std::stoull(argv[2]) : std::size_t{1} << 20;
  const char* timeout_text = std::getenv("QCOLL_TIMEOUT_MS");
  const std::chrono::milliseconds timeout(timeout_text ? std::stoll(timeout_text) : 60000);
  if (scenario == "thread_single") {  // qcoll's progress thread needs more: refused at once
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    try {
      transports::mpi::transport refused(MPI_COMM_WORLD);
      fail("the transport accepted MPI_THREAD_SINGLE");
    } catch (const qcoll::error& e) {
      if (e.code() != errc::invalid_argument) fail(fmt::format("expected invalid_argument, got: {}", e.what()));
      fmt::print("rank {}: refused as expected: {}\n", [] { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }(),
                 e.what());
    }
    MPI_Finalize();
    return 0;
  }
  transports::mpi::environment mpi(argc, argv);
  return run(scenario, transports::mpi::transport(MPI_COMM_WORLD), timeout, max_bytes);
} catch (const std::exception& e) {
  fail(e.what());
}
#else
int main(int argc, char** argv) try {
  if (argc < 2)
    fail("usage: worker collectives|many_small|mismatch|mismatch_algorithms|kill|kill_survivors_give_up|freeze|"
         "intruders|wrong_secret\n"
         "              [max bytes]\n"
         "       worker compressed|compressed_kill|compressed_kill_started [values]");
  const std::string_view scenario = argv[1];
  const std::size_t max_bytes = argc > 2 ? std::stoull(argv[2]) : std::size_t{1} << 20;
  rendezvous::job job = rendezvous::job_from_environment();

  if (scenario == "wrong_secret") {
    // The last rank has the wrong secret: it is refused, the others time out naming it.
    if (job.rank == job.size - 1) job.secret = "wrong";
    try {
      launch::join(job, [](auto) { return 0; });
    } catch (const qcoll::error& e) {
      fmt::print("rank {}: join failed as expected ({}): {}\n", job.rank, e.code().message(), e.what());
      return 0;
    }
    fail("a job with a wrong secret on one rank formed");
  }
  if (scenario == "two_level" || scenario == "two_level_cuda_peer" || scenario == "kill_two_level")
    // Nodes over shm (qcoll-run --ranks-per-node K), the job over its transport (tcp).
    return launch::join_nodes(job, [&](auto node_transport, auto world_transport) {
      communicator node(std::move(node_transport), communicator_options{job.timeout});
      communicator world(std::move(world_transport), communicator_options{job.timeout});
      if (scenario == "kill_two_level") kill_during_two_level(node, world, max_bytes / sizeof(float));
      else two_level(node, world, max_bytes / sizeof(float), scenario == "two_level_cuda_peer");
      return 0;
    });
  if (scenario == "refuse_single_copy") {
    // No rank may read a non-dumpable process without CAP_SYS_PTRACE: rank 1 becomes
    // one, so the probe at join fails for every rank that tries it, and all fall back.
    drop_ptrace_capability();
    if (job.rank == 1 && ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) fail("prctl(PR_SET_DUMPABLE) failed");
    return launch::join(job, [&](auto transport) {
      if constexpr (requires { transport.single_copy(); })
        fmt::print("rank {}: single copy {}\n", job.rank, transport.single_copy() ? "on" : "off");
      // Shared buffers need single copy's permission too: without it they are ordinary memory.
      return run("collectives_and_allocated", std::move(transport), job.timeout, max_bytes);
    });
  }
  if (scenario == "refuse_peer_mappings") {
    if (!refuse_fetching_peer_descriptors()) {
      fmt::print("rank {}: no seccomp filter on this architecture; skipped\n", job.rank);
      return 0;
    }
    return launch::join(job, [&](auto transport) { return run("collectives", std::move(transport), job.timeout, max_bytes); });
  }
  if (scenario == "intruders") {
    if (job.rank == job.size - 1 && job.size > 1) knock_with_bad_credentials(job);
    return launch::join(job, [&](auto transport) {
      return run("collectives", std::move(transport), job.timeout, 1 << 16);
    });
  }
  return launch::join(job, [&](auto transport) { return run(scenario, std::move(transport), job.timeout, max_bytes); });
} catch (const std::exception& e) {
  fail(e.what());
}
#endif
