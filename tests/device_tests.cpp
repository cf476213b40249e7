// Collectives and plans on device buffers, on the emulated device (device/emulated/runtime.hpp):
// - the emulated device itself: memory known by its space, work that has not run when
//   the call that queued it returns, streams and events in order, illegal addresses,
//   injected failures, several devices, memory and events shared between processes;
// - every exact collective on device buffers (threads over the in-process transport),
//   2–4 ranks, every op and element type, sizes around the staging's chunk boundaries,
//   blocking and started, bit for bit equal to the host call with the same inputs;
//   ordering on the caller's stream; bad input and device failures on every rank;
//   nothing leaked;
// - the compressed and grid plans on device buffers, bit for bit equal to the host
//   plans (outputs and residuals), fused, 16-bit, started; a failed call leaves the
//   output and the residuals as they were; bad input on every rank.
// Processes over shm, TCP and MPI: tests/multiprocess/worker.cpp's "device" scenario.
// The same tests run with QCOLL_DEVICE=cuda on a GPU (tools/gpu-check), where the
// emulation's own checks (the first suite) are skipped.

#define BOOST_TEST_MODULE qcoll device collectives
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>
#include <qcoll/device/emulated/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>

#include "support/device_values.hpp"
#include "support/per_rank.hpp"
#include "support/ranks.hpp"
#include "support/sanitizers.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace qcoll;
using execution::device_memory;
using execution::device_stream;
using execution::pinned_memory;

namespace {

using test::sanitized;
// The tests that show a forgotten wait read memory a stream's worker writes later, which
// is the race they demonstrate: ThreadSanitizer rightly reports it, so they skip that part.
using test::thread_sanitized;

const device::runtime& runtime() { return execution::device_runtime("device_tests"); }
bool emulated() { return std::string_view(runtime().name) == "emulated"; }

/// Work queued on an emulated stream runs no sooner than this after it was queued, so a
/// missing wait shows (the emulation's default is 0).
constexpr std::chrono::microseconds test_delay(50);

struct emulated_setup {
  emulated_setup() {
    if (std::getenv("QCOLL_DEVICE") == nullptr) execution::use_device(device::emulated());
    if (emulated()) device::configure_emulated({.devices = 1, .delay = test_delay});
  }
};
BOOST_GLOBAL_FIXTURE(emulated_setup);

using test::on_device;
using test::to_host;

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

/// Values whose sums depend on the order they are added in (so a different order shows).
template <class T>
std::vector<T> inputs(std::size_t n, rank_t rank, unsigned salt = 0) {
  std::mt19937 gen(static_cast<unsigned>(n * 131 + rank * 7 + salt));
  std::uniform_real_distribution<double> value(-3.0, 3.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(static_cast<float>(value(gen) * (1.0 + rank)));
  return v;
}

using test::per_rank;

template <class Fn>
void ranks(std::size_t n, Fn&& fn, communicator_options options = {}) {
  const auto outcome = test::run_ranks(n, fn, options);
  for (std::size_t r = 0; r < n; ++r)
    if (outcome.errors[r]) BOOST_ERROR("rank " << r << " failed: " << outcome.failure(r).second);
}

std::string describe(std::size_t ranks, const char* call, dtype type, std::size_t n, const char* more = "") {
  return std::to_string(ranks) + " ranks: " + call + " of " + std::to_string(n) + " " + to_string(type) + more;
}

}  // namespace

// ---------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(emulated_device)

BOOST_AUTO_TEST_CASE(memory_is_known_by_its_space) {
  if (!emulated()) return;
  const device::emulated_census before = device::census();
  const auto& rt = runtime();
  void* d = nullptr;
  void* p = nullptr;
  BOOST_REQUIRE_EQUAL(rt.allocate(1000, &d), 0);
  BOOST_REQUIRE_EQUAL(rt.allocate_host(1000, &p), 0);
  std::vector<char> h(1000);
  device::pointer_facts facts;
  rt.locate(d, &facts);
  BOOST_TEST((facts.device && facts.ordinal == 0));
  rt.locate(static_cast<char*>(d) + 999, &facts);
  BOOST_TEST(facts.device);
  rt.locate(p, &facts);
  BOOST_TEST(!facts.device);
  rt.locate(h.data(), &facts);
  BOOST_TEST(!facts.device);
  BOOST_TEST((execution::space_of(d) == execution::memory_space::device));
  BOOST_TEST((execution::space_of(h.data()) == execution::memory_space::host));
  BOOST_TEST(device::census().allocations == before.allocations + 2);
  BOOST_TEST(rt.release(p) != 0);  // pinned memory is not device memory
  BOOST_TEST(rt.release(d) == 0);
  BOOST_TEST(rt.release(d) != 0);  // twice
  BOOST_TEST(rt.release_host(p) == 0);
  BOOST_TEST(device::census().allocations == before.allocations);
}

BOOST_AUTO_TEST_CASE(queued_work_has_not_run_when_the_call_returns) {
  if (!emulated()) return;
  device::configure_emulated({.devices = 1, .delay = std::chrono::milliseconds(20)});
  execution::device_stream_owner stream("test");  // takes the delay at creation
  device::configure_emulated({.devices = 1, .delay = test_delay});
  const auto& rt = runtime();
  device_memory<int> d(1);
  pinned_memory<int> from(1), into(1);
  from.data()[0] = 42;
  into.data()[0] = 0;
  BOOST_REQUIRE_EQUAL(rt.copy(d.data(), from.data(), sizeof(int), stream.get()), 0);
  BOOST_REQUIRE_EQUAL(rt.copy(into.data(), d.data(), sizeof(int), stream.get()), 0);
  // The worker writes `into` later: this read is the very race the test shows the
  // emulation exposes (atomic so that it is no undefined behaviour in the test itself).
  if (!thread_sanitized) BOOST_TEST(std::atomic_ref<int>(*into.data()).load() == 0);
  BOOST_REQUIRE_EQUAL(rt.synchronize(stream.get()), 0);
  BOOST_TEST(into.data()[0] == 42);
}

BOOST_AUTO_TEST_CASE(streams_run_in_order_and_events_order_streams) {
  if (!emulated()) return;
  const auto& rt = runtime();
  device::configure_emulated({.devices = 1, .delay = std::chrono::milliseconds(10)});
  execution::device_stream_owner slow("test");
  device::configure_emulated({.devices = 1, .delay = test_delay});
  execution::device_stream_owner fast("test");
  execution::device_event done("test");
  BOOST_TEST(rt.event_query(done.get()) == 0);  // never recorded: complete
  const std::vector<float> values = inputs<float>(4096, 1);
  device_memory<float> a(values.size()), b(values.size());
  pinned_memory<float> staged(values.size());
  std::copy(values.begin(), values.end(), staged.data());
  BOOST_REQUIRE_EQUAL(rt.copy(a.data(), staged.data(), a.span().size_bytes(), slow.get()), 0);
  BOOST_REQUIRE_EQUAL(rt.event_record(done.get(), slow.get()), 0);
  BOOST_TEST(rt.event_query(done.get()) == rt.not_ready);
  BOOST_REQUIRE_EQUAL(rt.stream_wait(fast.get(), done.get()), 0);
  BOOST_REQUIRE_EQUAL(rt.copy(b.data(), a.data(), a.span().size_bytes(), fast.get()), 0);
  BOOST_REQUIRE_EQUAL(rt.synchronize(fast.get()), 0);
  BOOST_TEST(rt.event_query(done.get()) == 0);
  BOOST_TEST(same_bits(to_host(b), values));
}

BOOST_AUTO_TEST_CASE(work_past_an_allocation_is_an_illegal_address) {
  if (!emulated()) return;
  const auto& rt = runtime();
  device_memory<float> d(16);
  std::vector<float> host(32, 1.0f);
  BOOST_TEST(rt.copy(d.data(), host.data(), 17 * sizeof(float), nullptr) == 700);
  BOOST_TEST(rt.reduce(reduce_op::sum, dtype::f32, host.data(), d.data(), d.data(), 16, nullptr) == 700);
  BOOST_TEST(rt.reduce(reduce_op::sum, dtype::f32, d.data(), d.data(), d.data(), 17, nullptr) == 700);
  BOOST_TEST(rt.reduce(reduce_op::sum, dtype::f32, d.data(), d.data(), d.data(), 16, nullptr) == 0);
  BOOST_TEST(rt.synchronize(nullptr) == 0);
  execution::device_stream_owner unknown_after_destroy("test");
  device::stream_handle gone = unknown_after_destroy.get();
  unknown_after_destroy = {};
  BOOST_TEST(rt.synchronize(gone) == 400);
}

BOOST_AUTO_TEST_CASE(failures_can_be_injected) {
  if (!emulated()) return;
  const auto& rt = runtime();
  device::emulated_faults::inject(device::emulated_fault::allocation);
  BOOST_CHECK_THROW(device_memory<float>(8), qcoll::error);
  device_memory<float> d(8);  // the fault fired once
  std::vector<float> host(8, 2.0f);
  device::emulated_faults::inject(device::emulated_fault::copy, 1);
  BOOST_TEST(rt.copy(d.data(), host.data(), 32, nullptr) == 0);
  BOOST_TEST(rt.copy(d.data(), host.data(), 32, nullptr) == 999);
  device::emulated_faults::inject(device::emulated_fault::kernel);
  BOOST_TEST(rt.divide(dtype::f32, d.data(), 8, 2, nullptr) == 999);
  device::emulated_faults::inject(device::emulated_fault::failed_work);
  BOOST_TEST(rt.divide(dtype::f32, d.data(), 8, 2, nullptr) == 0);  // queued; fails when it runs
  BOOST_TEST(rt.synchronize(nullptr) == 999);
  BOOST_TEST(rt.synchronize(nullptr) == 0);  // reported once
  device::ipc_handle handle;
  BOOST_REQUIRE_EQUAL(rt.export_memory(d.data(), &handle), 0);
  device::emulated_faults::inject(device::emulated_fault::lost_handle);
  void* opened = nullptr;
  BOOST_TEST(rt.open_memory(&handle, &opened) == 400);
  device::emulated_faults::clear();
}

BOOST_AUTO_TEST_CASE(memory_and_streams_belong_to_a_device) {
  if (!emulated()) return;
  const auto& rt = runtime();
  device::configure_emulated({.devices = 2, .delay = test_delay});
  BOOST_TEST(rt.set_device(2) == 101);
  BOOST_REQUIRE_EQUAL(rt.set_device(1), 0);
  device_memory<float> on_one(4);
  execution::device_stream_owner stream_one("test");
  int ordinal = -1;
  BOOST_TEST(rt.stream_device(stream_one.get(), &ordinal) == 0);
  BOOST_TEST(ordinal == 1);
  BOOST_TEST(rt.stream_device(nullptr, &ordinal) == 0);
  BOOST_TEST(ordinal == 1);  // the current device's default stream
  BOOST_REQUIRE_EQUAL(rt.set_device(0), 0);
  device::pointer_facts facts;
  rt.locate(on_one.data(), &facts);
  BOOST_TEST(facts.ordinal == 1);
  // A kernel on device 0's stream cannot reach device 1's memory.
  BOOST_TEST(rt.divide(dtype::f32, on_one.data(), 4, 2, nullptr) == 700);
  on_one = {};
  stream_one = {};
  device::configure_emulated({.devices = 1, .delay = test_delay});
}

BOOST_AUTO_TEST_CASE(handles_cross_processes_and_stale_ones_are_refused) {
  if (!emulated()) return;
  const auto& rt = runtime();
  // This process's memory and an event, recorded after a slow copy into it.
  device::configure_emulated({.devices = 1, .delay = std::chrono::milliseconds(50)});
  execution::device_stream_owner slow("test");
  device::configure_emulated({.devices = 1, .delay = test_delay});
  device_memory<std::uint32_t> mine(64);
  execution::device_event written("test", true);
  pinned_memory<std::uint32_t> pattern(64);
  for (std::uint32_t i = 0; i < 64; ++i) pattern.data()[i] = 0xC0FFEE00u + i;
  BOOST_REQUIRE_EQUAL(rt.copy(mine.data(), pattern.data(), 64 * sizeof(std::uint32_t), slow.get()), 0);
  BOOST_REQUIRE_EQUAL(rt.event_record(written.get(), slow.get()), 0);
  device::ipc_handle memory_handle, event_handle;
  BOOST_REQUIRE_EQUAL(rt.export_memory(mine.data(), &memory_handle), 0);
  BOOST_REQUIRE_EQUAL(rt.export_event(written.get(), &event_handle), 0);

  // Another process opens both, waits for the event, checks the memory, writes its
  // answer into it and exports memory of its own, then exits.
  auto hex = [](const device::ipc_handle& h) {
    std::string text;
    for (std::byte b : h.bytes) text += "0123456789abcdef"[std::to_integer<int>(b) >> 4], text += "0123456789abcdef"[std::to_integer<int>(b) & 15];
    return text;
  };
  int pipe_ends[2];
  BOOST_REQUIRE_EQUAL(::pipe(pipe_ends), 0);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string mem = hex(memory_handle), evt = hex(event_handle), out = std::to_string(pipe_ends[1]);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_ends[0]);
    ::execl(self.c_str(), self.c_str(), "--ipc-child", mem.c_str(), evt.c_str(), out.c_str(), nullptr);
    ::_exit(127);
  }
  ::close(pipe_ends[1]);
  std::string reported;
  char buffer[256];
  for (ssize_t got; (got = ::read(pipe_ends[0], buffer, sizeof buffer)) > 0;) reported.append(buffer, static_cast<std::size_t>(got));
  ::close(pipe_ends[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  // The child waited for `written` before writing; ThreadSanitizer cannot see a wait in
  // another process, so this process orders its own copy too before reading `mine`.
  BOOST_REQUIRE_EQUAL(rt.synchronize(slow.get()), 0);
  BOOST_TEST((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the child's exit status is " << status);
  BOOST_TEST(reported.substr(0, 3) == "ok ", "the child said: " << reported);
  // Its answer: every value doubled.
  const std::vector<std::uint32_t> answered = to_host(mine);
  bool doubled = true;
  for (std::uint32_t i = 0; i < 64; ++i) doubled = doubled && answered[i] == 2 * (0xC0FFEE00u + i);
  BOOST_TEST(doubled);
  // The child is gone: its handle is stale.
  device::ipc_handle childs{};
  const std::string childs_hex = reported.size() > 3 ? reported.substr(3, 128) : std::string();
  for (std::size_t i = 0; i + 1 < childs_hex.size() && i / 2 < sizeof childs.bytes; i += 2)
    childs.bytes[i / 2] = static_cast<std::byte>(std::stoi(childs_hex.substr(i, 2), nullptr, 16));
  void* opened = nullptr;
  BOOST_TEST(rt.open_memory(&childs, &opened) == 400);
  // So is this process's own once the memory is freed.
  mine = {};
  BOOST_TEST(rt.open_memory(&memory_handle, &opened) == 400);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(device_collectives)

/// The host call and the device call on the same inputs, on every rank; `call(comm,
/// where, in, out)` runs one with `where` null for the host.
template <class T, class Host, class Device>
void compare_collective(std::size_t n_ranks, std::size_t in_count, std::size_t out_count, const std::string& what,
                        Host&& host, Device&& device_call, tuning forced = {}, bool override_tuning = false) {
  per_rank results;
  ranks(n_ranks, [&](test::inproc_communicator& comm) {
    if (override_tuning) comm.set_tuning(forced);
    const std::vector<T> in = inputs<T>(in_count, comm.rank());
    std::vector<T> expected(out_count);
    host(comm, std::span<const T>(in), std::span<T>(expected));
    const device_memory<T> d_in = on_device(in);
    device_memory<T> d_out(out_count);
    device_call(comm, std::span<const T>(d_in.span()), d_out.span());
    if (!same_bits(to_host(d_out), expected)) results.differ("rank " + std::to_string(comm.rank()) + ": " + what);
  });
  results.check();
}

/// On one rank of `comm`: allreduce of `count` values of T by `op`, and (sum or avg)
/// reduce_scatter, all_gather and broadcast, each on host buffers and on device buffers
/// with the same inputs; a difference is recorded in `results`.
template <class T, class Communicator>
void every_collective(Communicator& comm, std::size_t count, reduce_op op, per_rank& results) {
  const std::size_t n = comm.size();
  const dtype type = dtype_of<T>::value;
  const std::string what = to_string(op);
  const std::vector<T> in = inputs<T>(count, comm.rank(), static_cast<unsigned>(op));
  const device_memory<T> d_in = on_device(in);
  std::vector<T> reduced(count);
  comm.allreduce(std::span<const T>(in), std::span<T>(reduced), op);
  device_memory<T> d_reduced(count);
  comm.allreduce(device_stream{}, std::span<const T>(d_in.span()), d_reduced.span(), op);
  if (!same_bits(to_host(d_reduced), reduced)) results.differ(describe(n, "allreduce", type, count, what.c_str()));
  if (op != reduce_op::sum && op != reduce_op::avg) return;
  const block_range mine = block_of(count, n, comm.rank());
  std::vector<T> scattered(mine.size);
  comm.reduce_scatter(std::span<const T>(in), std::span<T>(scattered), op);
  device_memory<T> d_scattered(mine.size);
  comm.reduce_scatter(device_stream{}, std::span<const T>(d_in.span()), d_scattered.span(), op);
  if (!same_bits(to_host(d_scattered), scattered)) results.differ(describe(n, "reduce_scatter", type, count));
  // all_gather of this rank's block
  std::vector<T> gathered(count);
  comm.all_gather(mine.of(std::span<const T>(in)), std::span<T>(gathered));
  device_memory<T> d_gathered(count);
  comm.all_gather(device_stream{}, mine.of(std::span<const T>(d_in.span())), d_gathered.span());
  if (!same_bits(to_host(d_gathered), gathered)) results.differ(describe(n, "all_gather", type, count));
  // broadcast from the last rank
  std::vector<T> data = in;
  comm.broadcast(std::span<T>(data), n - 1);
  device_memory<T> d_data = on_device(in);
  comm.broadcast(device_stream{}, d_data.span(), n - 1);
  if (!same_bits(to_host(d_data), data)) results.differ(describe(n, "broadcast", type, count));
}

constexpr reduce_op every_op[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product};

BOOST_AUTO_TEST_CASE(every_collective_equals_the_host_call) {
  // Sizes around the staging's chunk (1 MiB) and the ring's block boundaries; every op
  // where the staging's path is the same for all, two ops around the chunk boundaries.
  const std::size_t chunk = algorithms::device_staging::chunk_bytes / sizeof(float);
  per_rank results;
  for (std::size_t n : {2u, 3u, 4u}) {
    ranks(n, [&](test::inproc_communicator& comm) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4097}})
        for (reduce_op op : every_op) every_collective<float>(comm, count, op, results);
      for (std::size_t count : {chunk - 1, chunk + 1, 4 * chunk + 3}) {
        every_collective<float>(comm, count, reduce_op::sum, results);
        every_collective<float>(comm, count, reduce_op::max, results);
      }
      for (std::size_t count : {std::size_t{0}, std::size_t{1000}, std::size_t{300001}}) {
        every_collective<double>(comm, count, reduce_op::sum, results);
        every_collective<bfloat16>(comm, count, reduce_op::avg, results);
        every_collective<float16>(comm, count, reduce_op::sum, results);
      }
    });
  }
  // 64 MiB, the most chunks a call has (64), in the release builds.
  if (!sanitized)
    ranks(2, [&](test::inproc_communicator& comm) { every_collective<float>(comm, 64 * chunk + 5, reduce_op::sum, results); });
  results.check();
}

BOOST_AUTO_TEST_CASE(every_allreduce_algorithm_equals_the_host_call) {
  for (algorithm a : {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling})
    for (std::size_t n : {3u, 4u})
      for (std::size_t count : {std::size_t{5}, std::size_t{70001}, std::size_t{(1u << 19) + 3}}) {
        compare_collective<float>(
            n, count, count, describe(n, "allreduce", dtype::f32, count, to_string(a)),
            [](auto& comm, std::span<const float> in, std::span<float> out) { comm.allreduce(in, out, reduce_op::sum); },
            [](auto& comm, std::span<const float> in, std::span<float> out) {
              comm.allreduce(device_stream{}, in, out, reduce_op::sum);
            },
            test::forcing(a), true);
        compare_collective<bfloat16>(
            n, count, count, describe(n, "allreduce", dtype::bf16, count, to_string(a)),
            [](auto& comm, std::span<const bfloat16> in, std::span<bfloat16> out) { comm.allreduce(in, out, reduce_op::sum); },
            [](auto& comm, std::span<const bfloat16> in, std::span<bfloat16> out) {
              comm.allreduce(device_stream{}, in, out, reduce_op::sum);
            },
            test::forcing(a), true);
      }
}

BOOST_AUTO_TEST_CASE(in_place_started_and_point_to_point) {
  per_rank results;
  const std::size_t count = 300007;
  ranks(3, [&](test::inproc_communicator& comm) {
    const std::vector<float> in = inputs<float>(count, comm.rank());
    std::vector<float> expected = in;
    comm.allreduce(std::span<float>(expected), reduce_op::sum);
    // In place.
    device_memory<float> d = on_device(in);
    comm.allreduce(device_stream{}, d.span(), reduce_op::sum);
    if (!same_bits(to_host(d), expected)) results.differ("in-place allreduce");
    // Started, on a stream of its own, then waited for.
    execution::device_stream_owner stream("test");
    device_memory<float> started = on_device(in), started_out(count);
    collective_handle handle, second;
    comm.start_allreduce(device_stream{stream.get()}, std::span<const float>(started.span()), started_out.span(),
                         reduce_op::sum, handle);
    device_memory<float> gathered(count);
    const block_range mine = block_of(count, 3, comm.rank());
    comm.start_all_gather(device_stream{stream.get()}, mine.of(std::span<const float>(started.span())), gathered.span(), second);
    handle.wait();
    second.wait();
    if (!same_bits(to_host(started_out), expected)) results.differ("started allreduce");
    std::vector<float> host_gathered(count);
    comm.all_gather(mine.of(std::span<const float>(in)), std::span<float>(host_gathered));
    if (!same_bits(to_host(gathered), host_gathered)) results.differ("started all_gather");
    // Point to point around the ring, and a barrier.
    const rank_t next = (comm.rank() + 1) % 3, prev = (comm.rank() + 2) % 3;
    device_memory<float> received(count);
    comm.send_recv(device_stream{}, std::span<const float>(started.span()), next, received.span(), prev);
    if (!same_bits(to_host(received), inputs<float>(count, prev))) results.differ("send_recv");
    if (comm.rank() == 0) comm.send(device_stream{}, std::span<const float>(d.span()), 1);
    if (comm.rank() == 1) {
      device_memory<float> one(count);
      comm.recv(device_stream{}, one.span(), 0);
      if (!same_bits(to_host(one), expected)) results.differ("send and recv");
    }
    comm.barrier(device_stream{});
  });
  results.check();
}

BOOST_AUTO_TEST_CASE(calls_are_ordered_on_the_callers_stream) {
  if (!emulated()) return;  // the delay that makes an unordered read visible is the emulation's
  per_rank results;
  const std::size_t count = 100003;
  ranks(2, [&](test::inproc_communicator& comm) {
    // The other stream's work runs 300 ms after it is queued; the call's stream's soon.
    static std::mutex configuring;
    execution::device_stream_owner other, mine;
    {
      std::lock_guard lock(configuring);
      device::configure_emulated({.devices = 1, .delay = std::chrono::milliseconds(300)});
      other = execution::device_stream_owner("test");
      device::configure_emulated({.devices = 1, .delay = std::chrono::milliseconds(2)});
      mine = execution::device_stream_owner("test");
    }
    const auto& rt = runtime();
    const std::vector<float> old_values(count, 1.0f), new_values = inputs<float>(count, comm.rank());
    std::vector<float> expected = new_values;
    comm.allreduce(std::span<float>(expected), reduce_op::sum);
    pinned_memory<float> staged(count);
    std::copy(new_values.begin(), new_values.end(), staged.data());
    device_memory<float> d = on_device(old_values), out(count);
    // Work queued before the call, on the call's stream: the call sees it.
    rt.copy(d.data(), staged.data(), count * sizeof(float), mine.get());
    comm.allreduce(device_stream{mine.get()}, std::span<const float>(d.span()), out.span(), reduce_op::sum);
    // Work queued after it sees the result.
    pinned_memory<float> back(count);
    rt.copy(back.data(), out.data(), count * sizeof(float), mine.get());
    rt.synchronize(mine.get());
    if (!same_bits(std::span<const float>(back.data(), count), expected)) results.differ("ordered on its stream");
    // Written on another stream and not waited for: the call reads the old values — what
    // a forgotten wait does, and what this emulation shows instead of a race on a GPU
    // (and ThreadSanitizer as the race it is: skipped there).
    if (!thread_sanitized) {
      device_memory<float> stale = on_device(old_values), stale_out(count);
      rt.copy(stale.data(), staged.data(), count * sizeof(float), other.get());
      comm.allreduce(device_stream{mine.get()}, std::span<const float>(stale.span()), stale_out.span(), reduce_op::sum);
      rt.synchronize(other.get());
      const std::vector<float> twos(count, 2.0f);
      if (!same_bits(to_host(stale_out), twos)) results.differ("a forgotten wait was not visible");
    }
    // The same with the wait: the call's stream waits for the other's event.
    execution::device_event written("test");
    device_memory<float> waited = on_device(old_values), waited_out(count);
    rt.copy(waited.data(), staged.data(), count * sizeof(float), other.get());
    rt.event_record(written.get(), other.get());
    rt.stream_wait(mine.get(), written.get());
    comm.allreduce(device_stream{mine.get()}, std::span<const float>(waited.span()), waited_out.span(), reduce_op::sum);
    if (!same_bits(to_host(waited_out), expected)) results.differ("waited for the other stream");
  });
  device::configure_emulated({.devices = 1, .delay = test_delay});
  results.check();
}

BOOST_AUTO_TEST_CASE(bad_input_fails_on_every_rank) {
  const std::size_t count = 1000;
  // A host buffer on one rank.
  std::vector<std::error_code> codes(3);
  std::vector<std::string> messages(3);
  test::run_ranks(3, [&](test::inproc_communicator& comm) {
    std::vector<float> host(count, 1.0f);
    device_memory<float> d(count);
    std::error_code ec;
    try {
      comm.allreduce(device_stream{}, comm.rank() == 1 ? std::span<float>(host) : d.span(), reduce_op::sum);
    } catch (const qcoll::error& e) {
      codes[comm.rank()] = e.code();
      messages[comm.rank()] = e.what();
    }
  });
  for (std::size_t r = 0; r < 3; ++r) BOOST_TEST(codes[r] == errc::invalid_argument, "rank " << r << ": " << messages[r]);
  BOOST_TEST(messages[1].find("host memory") != std::string::npos, messages[1]);
  // A device buffer given to the host call.
  std::vector<std::error_code> host_codes(2);
  test::run_ranks(2, [&](test::inproc_communicator& comm) {
    device_memory<float> d(count);
    std::vector<float> host(count);
    comm.allreduce(comm.rank() == 0 ? d.span() : std::span<float>(host), reduce_op::sum, host_codes[comm.rank()]);
  });
  BOOST_TEST(host_codes[0] == errc::invalid_argument);
  BOOST_TEST(host_codes[1] == errc::invalid_argument);
  if (!emulated()) return;
  // A buffer on another device than the stream's.
  device::configure_emulated({.devices = 2, .delay = test_delay});
  std::vector<std::string> device_messages(2);
  std::vector<std::error_code> device_codes(2);
  test::run_ranks(2, [&](test::inproc_communicator& comm) {
    if (comm.rank() == 0) runtime().set_device(1);
    device_memory<float> d(count);
    runtime().set_device(0);
    try {
      comm.allreduce(device_stream{}, d.span(), reduce_op::sum);
    } catch (const qcoll::error& e) {
      device_codes[comm.rank()] = e.code();
      device_messages[comm.rank()] = e.what();
    }
  });
  device::configure_emulated({.devices = 1, .delay = test_delay});
  BOOST_TEST(device_codes[0] == errc::invalid_argument, device_messages[0]);
  BOOST_TEST(device_codes[1] == errc::invalid_argument, device_messages[1]);
  BOOST_TEST(device_messages[0].find("on device 1") != std::string::npos, device_messages[0]);
}

BOOST_AUTO_TEST_CASE(device_failures_fail_every_rank_and_leak_nothing) {
  if (!emulated()) return;
  const device::emulated_census before = device::census();
  for (device::emulated_fault fault : {device::emulated_fault::copy, device::emulated_fault::failed_work,
                                       device::emulated_fault::allocation}) {
    std::vector<std::string> errors(3);
    test::run_ranks(3, [&](test::inproc_communicator& comm) {
      device_memory<float> d = on_device(inputs<float>(1u << 20, comm.rank()));
      // For this thread's calls only, so no other rank's call fires it: nothing else to order.
      if (comm.rank() == 2) device::emulated_faults::inject_here(fault);
      try {
        comm.allreduce(device_stream{}, d.span(), reduce_op::sum);
      } catch (const qcoll::error& e) {
        errors[comm.rank()] = e.what();
      }
    });
    device::emulated_faults::clear();
    for (std::size_t r = 0; r < 3; ++r)
      BOOST_TEST(!errors[r].empty(), "rank " << r << " succeeded despite an injected failure of kind "
                                             << static_cast<int>(fault) << " on rank 2, whose error was: " << errors[2]);
  }
  const device::emulated_census after = device::census();
  BOOST_TEST(after.allocations == before.allocations);
  BOOST_TEST(after.streams == before.streams);
  BOOST_TEST(after.events == before.events);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(device_plans)

template <class T>
std::vector<T> residual_of(std::span<const T> device_values) {
  return to_host(device_values);
}

/// Three calls of a host plan and of the same plan on device memory, on every rank:
/// outputs and residuals bit for bit.
template <class T, class MakeHost, class MakeDevice>
void compare_plans(std::size_t n, std::size_t count, reduce_op op, bool in_place, const std::string& what,
                   MakeHost&& make_host, MakeDevice&& make_device,
                   std::function<topologies::graph(std::size_t)> topology = {}) {
  per_rank results;
  const auto body = [&](auto& comm) {
    auto host_plan = make_host(comm);
    auto device_plan = make_device(comm);
    device_memory<T> d_in(count), d_out(count);
    for (unsigned call = 0; call < 3; ++call) {
      const std::vector<T> in = inputs<T>(count, comm.rank(), call);
      std::vector<T> out(count);
      d_in.upload(in);
      if (in_place) {
        out = in;
        comm.allreduce(host_plan, std::span<T>(out), op);
        comm.allreduce(device_stream{}, device_plan, d_in.span(), op);
        if (!same_bits(to_host(d_in), out)) results.differ(what + ": output of call " + std::to_string(call));
      } else {
        comm.allreduce(host_plan, std::span<const T>(in), std::span<T>(out), op);
        comm.allreduce(device_stream{}, device_plan, std::span<const T>(d_in.span()), d_out.span(), op);
        if (!same_bits(to_host(d_out), out)) results.differ(what + ": output of call " + std::to_string(call));
        if (!same_bits(to_host(d_in), in)) results.differ(what + ": the input changed");
      }
    }
    using R = typename decltype(host_plan)::residual_type;
    const std::span<const R> host_residual = host_plan.worker_residual();
    if (!same_bits(residual_of<R>(device_plan.worker_residual()), std::vector<R>(host_residual.begin(), host_residual.end())))
      results.differ(what + ": worker residual");
    if (host_plan.last_call().bytes_sent != device_plan.last_call().bytes_sent) results.differ(what + ": bytes sent");
  };
  std::vector<std::exception_ptr> errors;
  if (topology) {
    errors = test::run_ranks<topologies::graph>(n, body, {}, topology).errors;
  } else {
    errors = test::run_ranks(n, body).errors;
  }
  for (std::size_t r = 0; r < n; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      BOOST_ERROR(what << ": rank " << r << " failed: " << e.what());
    }
  }
  results.check();
}

template <class Q, class T = typename Q::value_type>
void compressed_plan_case(std::size_t n, std::size_t count, reduce_op op, Q q, const char* name, bool ring_route,
                          bool in_place, compressed_allreduce_options options = {}) {
  const std::string what = describe(n, name, dtype_of<T>::value, count, ring_route ? " (ring route)" : " (direct)") +
                           (in_place ? ", in place" : "") + ", " + to_string(op);
  auto topology = ring_route ? std::function<topologies::graph(std::size_t)>(
                                   [](std::size_t size) { return topologies::graph(topologies::ring(size)); })
                             : std::function<topologies::graph(std::size_t)>();
  if (!ring_route) topology = [](std::size_t size) { return topologies::graph(topologies::fully_connected(size)); };
  compare_plans<T>(
      n, count, op, in_place, what,
      [&](auto& comm) { return compressed_allreduce_plan<Q, T>(comm, count, q, options); },
      [&](auto& comm) {
        return compressed_allreduce_plan<Q, T, execution::device_space>(device_stream{}, comm, count, q, options);
      },
      topology);
}

BOOST_AUTO_TEST_CASE(compressed_plans_equal_the_host_plans) {
  using namespace quantizers;
  for (std::size_t n : {2u, 3u, 4u})
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{4099}})
      for (bool ring_route : {false, true}) {
        compressed_plan_case(n, count, reduce_op::avg, one_bit{}, "one_bit", ring_route, false);
        compressed_plan_case(n, count, reduce_op::sum, k_level({.levels = 5, .group_size = 512}), "k_level", ring_route, true);
      }
  // Several chunks per stripe (the host plan's automatic chunk, 256 Ki values, for both:
  // the device plan's would be one chunk per stripe and other bytes sent; transport_worker's
  // device scenarios compare the automatic chunks' values). One rank count per route.
  const std::size_t large = sanitized ? 70001 : 1048579;
  compressed_plan_case(2, large, reduce_op::avg, one_bit{}, "one_bit", false, false,
                       {.chunk_values = compressed_allreduce_options::host_chunk_values});
  compressed_plan_case(4, large, reduce_op::sum, k_level({.levels = 5, .group_size = 512}), "k_level", true, true,
                       {.chunk_values = compressed_allreduce_options::host_chunk_values});
  {
    // The automatic chunk by where the plan's memory is.
    const topologies::fully_connected two(2);
    const compressed_allreduce_plan<one_bit> on_host(0, two, large, one_bit{});
    const compressed_allreduce_plan<one_bit, float, execution::device_space> on_device(0, two, large, one_bit{}, {}, {},
                                                                                       device_stream{});
    BOOST_TEST(on_host.chunk_values() == compressed_allreduce_options::host_chunk_values);
    BOOST_TEST(on_device.chunk_values() == compressed_allreduce_options::device_chunk_values);
  }
  compressed_plan_case(3, 100003, reduce_op::sum,
                       one_bit({.group_size = 256, .reconstruction_from = reconstruction_source::previous}),
                       "one_bit from the previous encode", false, false, {.chunk_values = 4096});
  compressed_plan_case(3, 100003, reduce_op::avg,
                       k_level({.levels = 16, .group_size = 128, .rounding = rounding::stochastic, .seed = 7}),
                       "stochastic k_level", true, false, {.chunk_values = 8192});
  compressed_plan_case(4, 100003, reduce_op::sum, bfp{}, "bfp", false, true);
  compressed_plan_case(2, 100003, reduce_op::sum, identity<float>{}, "identity", false, false);
  compressed_plan_case(3, 10007, reduce_op::sum, identity<double>{}, "identity<double>", true, false);
  compressed_plan_case<one_bit, bfloat16>(3, 100003, reduce_op::avg, one_bit{}, "one_bit", false, false);
  compressed_plan_case<k_level, float16>(2, 100003, reduce_op::sum, k_level{}, "k_level", true, true);
  // The owners summing on the grid (the device runtime's grid kernels), stripes that start
  // mid-block (groups of 104), doubles' two carriers, 16-bit buffers.
  const compressed_allreduce_options on_grid{.chunk_values = 4096, .reproducible = true};
  compressed_plan_case(3, 100003, reduce_op::avg, one_bit{}, "one_bit on the grid", true, false, on_grid);
  compressed_plan_case(4, 30011, reduce_op::sum, k_level({.levels = 5, .group_size = 104}), "k_level on the grid",
                       false, true, on_grid);
  compressed_plan_case(3, 10007, reduce_op::sum, identity<double>{}, "identity<double> on the grid", true, false,
                       on_grid);
  compressed_plan_case<one_bit, bfloat16>(2, 100003, reduce_op::avg, one_bit{}, "one_bit on the grid", false, false,
                                          on_grid);
}

BOOST_AUTO_TEST_CASE(fused_and_started_plans) {
  per_rank results;
  const std::vector<std::size_t> sizes{1000, 0, 4097, 30011};
  ranks(3, [&](test::inproc_communicator& comm) {
    compressed_allreduce_plan host_plan(comm, sizes, quantizers::one_bit{}, {.chunk_values = 4096});
    compressed_allreduce_plan device_plan(device_stream{}, comm, sizes, quantizers::one_bit{}, {.chunk_values = 4096});
    std::vector<std::vector<float>> host_tensors;
    std::vector<device_memory<float>> device_tensors;
    std::vector<std::span<float>> host_spans, device_spans;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host_tensors.push_back(inputs<float>(sizes[k], comm.rank(), static_cast<unsigned>(k)));
      device_tensors.push_back(on_device(host_tensors.back()));
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      host_spans.push_back(host_tensors[k]);
      device_spans.push_back(device_tensors[k].span());
    }
    comm.allreduce(host_plan, std::span<const std::span<float>>(host_spans), reduce_op::sum);
    comm.allreduce(device_stream{}, device_plan, std::span<const std::span<float>>(device_spans), reduce_op::sum);
    for (std::size_t k = 0; k < sizes.size(); ++k)
      if (!same_bits(to_host(device_tensors[k]), host_tensors[k])) results.differ("fused tensor " + std::to_string(k));
    // Started, on a stream of its own.
    execution::device_stream_owner stream("test");
    comm.start_allreduce(host_plan, std::span<const std::span<float>>(host_spans), reduce_op::avg);
    comm.start_allreduce(device_stream{stream.get()}, device_plan, std::span<const std::span<float>>(device_spans),
                         reduce_op::avg);
    host_plan.wait();
    device_plan.wait();
    for (std::size_t k = 0; k < sizes.size(); ++k)
      if (!same_bits(to_host(device_tensors[k]), host_tensors[k])) results.differ("started fused tensor " + std::to_string(k));
  });
  results.check();
}

BOOST_AUTO_TEST_CASE(grid_plans_equal_the_host_plans) {
  namespace topo = topologies;
  const topo::torus grid({2, 3}, {.nodes = {topo::degraded_node::fully(4)}});
  const topo::grid_routing routing = topo::route_grid(grid);
  per_rank results;
  const std::size_t count = 50021;
  ranks(6, [&](test::inproc_communicator& comm) {
    grid_allreduce_plan host_plan(comm, routing, count, quantizers::one_bit{});
    grid_allreduce_plan device_plan(device_stream{}, comm, routing, count, quantizers::one_bit{});
    if (!host_plan.included()) {
      std::vector<float> v(count);
      device_memory<float> d(count);
      bool host_refused = false, device_refused = false;
      try {
        comm.allreduce(host_plan, std::span<float>(v), reduce_op::sum);
      } catch (const qcoll::error&) {
        host_refused = true;
      }
      try {
        comm.allreduce(device_stream{}, device_plan, d.span(), reduce_op::sum);
      } catch (const qcoll::error&) {
        device_refused = true;
      }
      if (!host_refused || !device_refused) results.differ("an excluded rank was not refused");
      return;
    }
    for (unsigned call = 0; call < 2; ++call) {
      std::vector<float> out = inputs<float>(count, comm.rank(), call);
      device_memory<float> d = on_device(out);
      comm.allreduce(host_plan, std::span<float>(out), reduce_op::avg);
      comm.allreduce(device_stream{}, device_plan, d.span(), reduce_op::avg);
      if (!same_bits(to_host(d), out)) results.differ("grid plan, call " + std::to_string(call));
    }
  });
  results.check();
}

BOOST_AUTO_TEST_CASE(a_failed_call_leaves_output_and_residuals_as_they_were) {
  if (!emulated()) return;
  const device::emulated_census before = device::census();
  const std::size_t count = 200003;
  std::vector<std::error_code> codes(3);
  per_rank results;
  test::run_ranks(3, [&](test::inproc_communicator& comm) {
    compressed_allreduce_plan plan(device_stream{}, comm, count, quantizers::one_bit{}, {.chunk_values = 16384});
    const std::vector<float> in = inputs<float>(count, comm.rank());
    device_memory<float> d_in = on_device(in), d_out = on_device(std::vector<float>(count, -7.0f));
    comm.allreduce(device_stream{}, plan, std::span<const float>(d_in.span()), d_out.span(), reduce_op::sum);
    const std::vector<float> residual = to_host(plan.worker_residual()), out_before = to_host(d_out);
    // Rank 1's device fails a kernel midway through the next call (its own calls only).
    if (comm.rank() == 1) device::emulated_faults::inject_here(device::emulated_fault::kernel, 20);
    comm.allreduce(device_stream{}, plan, std::span<const float>(d_in.span()), d_out.span(), reduce_op::sum,
                   codes[comm.rank()]);
    if (!same_bits(to_host(d_out), out_before)) results.differ("rank " + std::to_string(comm.rank()) + ": output changed");
    if (!same_bits(to_host(plan.worker_residual()), residual))
      results.differ("rank " + std::to_string(comm.rank()) + ": residual changed");
  });
  device::emulated_faults::clear();
  for (std::size_t r = 0; r < 3; ++r) BOOST_TEST(static_cast<bool>(codes[r]), "rank " << r << " did not fail");
  BOOST_TEST(codes[1] == errc::device_error);
  results.check();
  // The plans and communicators are gone, and so is everything they had of the device.
  const device::emulated_census after = device::census();
  BOOST_TEST(after.allocations == before.allocations);
  BOOST_TEST(after.streams == before.streams);
  BOOST_TEST(after.events == before.events);
}

BOOST_AUTO_TEST_CASE(bad_input_to_a_plan_fails_on_every_rank) {
  const std::size_t count = 5000;
  // A host buffer on one rank; then ranks whose quantizers disagree (a frame that does not decode).
  std::vector<std::error_code> codes(2), mismatched(2);
  test::run_ranks(2, [&](test::inproc_communicator& comm) {
    compressed_allreduce_plan plan(device_stream{}, comm, count, quantizers::one_bit{});
    std::vector<float> host(count, 1.0f);
    device_memory<float> d(count);
    comm.allreduce(device_stream{}, plan, comm.rank() == 0 ? std::span<float>(host) : d.span(), reduce_op::sum,
                   codes[comm.rank()]);
  });
  BOOST_TEST(codes[0] == errc::invalid_argument);
  BOOST_TEST(codes[1] == errc::invalid_argument);
  test::run_ranks(2, [&](test::inproc_communicator& comm) {
    const quantizers::k_level q({.levels = comm.rank() == 0 ? 5u : 7u, .group_size = 64});
    compressed_allreduce_plan plan(device_stream{}, comm, count, q);
    device_memory<float> d = on_device(inputs<float>(count, comm.rank()));
    comm.allreduce(device_stream{}, plan, d.span(), reduce_op::sum, mismatched[comm.rank()]);
  });
  BOOST_TEST(mismatched[0] == errc::protocol_error);
  BOOST_TEST(mismatched[1] == errc::protocol_error);
  // A host plan meeting a device plan, both with the automatic chunk (256 Ki values on
  // the host, 4 Mi on the device): other frames — an error on both ranks, not a hang.
  const std::size_t two_chunks = 2 * compressed_allreduce_options::host_chunk_values + 2048;
  std::vector<std::error_code> mixed(2);
  test::run_ranks(2, [&](test::inproc_communicator& comm) {
    if (comm.rank() == 0) {
      compressed_allreduce_plan plan(comm, two_chunks * 2, quantizers::one_bit{});
      std::vector<float> host(two_chunks * 2, 1.0f);
      comm.allreduce(plan, std::span<float>(host), reduce_op::sum, mixed[0]);
    } else {
      compressed_allreduce_plan plan(device_stream{}, comm, two_chunks * 2, quantizers::one_bit{});
      device_memory<float> d(two_chunks * 2);
      comm.allreduce(device_stream{}, plan, d.span(), reduce_op::sum, mixed[1]);
    }
  });
  BOOST_TEST(mixed[0] == errc::protocol_error, mixed[0].message());
  BOOST_TEST(mixed[1] == errc::protocol_error, mixed[1].message());
  // An owner update rule is refused at creation: rules run on the host.
  test::run_ranks(1, [&](test::inproc_communicator& comm) {
    BOOST_CHECK_THROW((compressed_allreduce_plan<quantizers::one_bit, float, execution::device_space>(
                          comm.rank(), comm.topology(), count, quantizers::one_bit{}, {}, optimizers::momentum{.momentum = 0.9},
                          device_stream{})),
                      qcoll::error);
  });
}

BOOST_AUTO_TEST_SUITE_END()

// The child of handles_cross_processes_and_stale_ones_are_refused: opens the parent's
// memory and event, waits for the event, doubles the values, exports memory of its own
// and reports "ok <its handle>" (or what went wrong) on the pipe.
int ipc_child(const char* memory_hex, const char* event_hex, int out) {
  execution::use_device(device::emulated());
  const auto& rt = device::emulated();
  auto parse = [](std::string_view hex) {
    device::ipc_handle h;
    for (std::size_t i = 0; i + 1 < hex.size() && i / 2 < sizeof h.bytes; i += 2)
      h.bytes[i / 2] = static_cast<std::byte>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16));
    return h;
  };
  auto say = [&](const std::string& text) {
    (void)!::write(out, text.data(), text.size());
    return text.rfind("ok ", 0) == 0 ? 0 : 1;
  };
  const device::ipc_handle memory_handle = parse(memory_hex), event_handle = parse(event_hex);
  void* theirs = nullptr;
  device::event_handle written = nullptr;
  if (rt.open_memory(&memory_handle, &theirs) != 0) return say("cannot open the memory");
  if (rt.open_event(&event_handle, &written) != 0) return say("cannot open the event");
  if (rt.event_synchronize(written) != 0) return say("cannot wait for the event");
  std::vector<std::uint32_t> values(64);
  rt.copy(values.data(), theirs, 64 * sizeof(std::uint32_t), nullptr);
  rt.synchronize(nullptr);
  for (std::uint32_t i = 0; i < 64; ++i)
    if (values[i] != 0xC0FFEE00u + i) return say("the event completed before the memory was written");
  for (auto& v : values) v *= 2;
  rt.copy(theirs, values.data(), 64 * sizeof(std::uint32_t), nullptr);
  rt.synchronize(nullptr);
  rt.close_memory(theirs);
  rt.event_destroy(written);
  void* own = nullptr;
  device::ipc_handle own_handle;
  rt.allocate(256, &own);
  rt.export_memory(own, &own_handle);
  std::string text = "ok ";
  for (std::byte b : own_handle.bytes)
    text += "0123456789abcdef"[std::to_integer<int>(b) >> 4], text += "0123456789abcdef"[std::to_integer<int>(b) & 15];
  return say(text);
}

int main(int argc, char** argv) {
  if (argc == 5 && std::string_view(argv[1]) == "--ipc-child") return ipc_child(argv[2], argv[3], std::atoi(argv[4]));
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}
