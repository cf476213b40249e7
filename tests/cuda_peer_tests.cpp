// The CUDA peer transport (transports/cuda_peer.hpp) on the emulated device: ranks are
// threads over an in-process control transport, each with its own windows, stream and
// (with two emulated devices) GPU. Its protocol — windows that wrap, credits, messages
// cut into chunks and pipelined, several in flight per pair and tag, sizes that differ —
// and its failures: a host pointer, a window that cannot be opened, a peer that leaves
// mid-message, an abort; nothing leaks. Processes over shm: tests/multiprocess/worker.cpp.
// The same suite runs with QCOLL_DEVICE=cuda on a GPU (tools/gpu-check).

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>
#include <qcoll/device/emulated/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/topologies/ring.hpp>
#include <qcoll/transports/cuda_peer.hpp>
#include <qcoll/transports/inproc.hpp>
#include <qcoll/two_level_allreduce.hpp>

#include "support/device_values.hpp"
#include "support/expect_failure.hpp"
#include "support/ranks.hpp"

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace qcoll;
using execution::device_memory;

namespace {

using peer_transport = transports::cuda_peer::transport<transports::inproc::transport>;
using peer_request = peer_transport::request;
using peer_communicator = communicator<peer_transport>;
static_assert(qcoll::transport<peer_transport> && moves_device_memory<peer_transport>);

bool on_emulated_device() { return std::string_view(execution::device_runtime("cuda_peer_tests").name) == "emulated"; }

/// Bytes whose every position says who sent them, to whom, in which message.
std::vector<std::uint8_t> pattern(std::size_t bytes, rank_t from, rank_t to, std::size_t message) {
  std::vector<std::uint8_t> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::uint8_t>(i * 31 + from * 7 + to * 13 + message * 101);
  return v;
}

/// Runs fn(transport) on `n` ranks, each a thread with a cuda_peer transport over inproc;
/// returns each rank's failure ("" where it returned).
template <class Fn>
std::vector<std::string> run_peers(rank_t n, const transports::cuda_peer::options& settings, Fn&& fn,
                                   int devices = 1) {
  std::vector<std::string> failures(n);
  std::mutex mutex;
  const auto outcome = transports::inproc::run_ranks(n, [&](transports::inproc::transport control) {
    const rank_t r = control.rank();
    try {
      transports::cuda_peer::options mine = settings;
      mine.device = static_cast<int>(r) % devices;
      // The rank's buffers are made on its device too.
      execution::check_device(execution::device_runtime("run_peers"),
                              execution::device_runtime("run_peers").set_device(mine.device), "choosing a device");
      peer_transport t(std::move(control), mine);
      fn(t);
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      failures[r] = e.what();
    }
  });
  (void)outcome;
  return failures;
}

void expect_success(const std::vector<std::string>& failures) {
  for (std::size_t r = 0; r < failures.size(); ++r) BOOST_TEST(failures[r].empty(), "rank " << r << ": " << failures[r]);
}

deadline soon() { return clock::now() + std::chrono::seconds(20); }

void require_ok(std::error_code code, const char* what) {
  if (code) throw qcoll::error(code, std::string(what) + ": " + code.message());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cuda_peer)

// Every pair exchanges messages of sizes around the slot and window boundaries, all in
// flight at once on two tags, the receives posted in another order than the sends:
// every byte arrives, with its header, in order per pair and tag.
BOOST_AUTO_TEST_CASE(messages_of_every_size_arrive_whole_and_in_order) {
  const transports::cuda_peer::options settings{.slot_bytes = 4096, .slots = 3};
  const std::vector<std::size_t> sizes{0, 1, 4095, 4096, 4097, 3 * 4096, 3 * 4096 + 5, 10 * 4096 + 17, 65536 + 3};
  for (const int devices : {1, 2}) {
    if (!on_emulated_device() && devices == 2) break;
    if (on_emulated_device()) device::configure_emulated({.devices = devices, .delay = std::chrono::microseconds(20)});
    for (const rank_t n : {rank_t{2}, rank_t{3}, rank_t{4}}) {
      BOOST_TEST_CONTEXT(n << " ranks on " << devices << " device(s)") {
        expect_success(run_peers(n, settings, [&](peer_transport& t) {
          const rank_t me = t.rank();
          struct message {
            device_memory<std::uint8_t> data;
            peer_request request;
            rank_t peer = 0;
            std::size_t index = 0;
            bool send = false;
          };
          std::deque<message> messages;
          for (rank_t p = 0; p < n; ++p) {
            if (p == me) continue;
            // Receives first, tag 1's before tag 0's (in order within each tag: messages
            // with one tag arrive in order); then the sends, the tags interleaved.
            for (std::size_t j = 0; j < sizes.size(); ++j) {
              const std::size_t k = j < sizes.size() / 2 ? 2 * j + 1 : 2 * (j - sizes.size() / 2);
              message& m = messages.emplace_back();
              m.data = device_memory<std::uint8_t>(sizes[k]);
              m.peer = p;
              m.index = k;
              t.post_recv(m.request, p, static_cast<transports::tag_t>(k % 2), std::as_writable_bytes(m.data.span()));
            }
          }
          for (rank_t p = 0; p < n; ++p) {
            if (p == me) continue;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
              message& m = messages.emplace_back();
              m.data = test::on_device(pattern(sizes[k], me, p, k));
              m.peer = p;
              m.index = k;
              m.send = true;
              const transports::message_header header{.sequence = k, .count = sizes[k], .root = static_cast<std::uint32_t>(me)};
              t.post_send(m.request, p, static_cast<transports::tag_t>(k % 2), header, std::as_bytes(m.data.span()));
            }
          }
          for (message& m : messages) {
            require_ok(t.wait(m.request, soon()), m.send ? "a send" : "a receive");
            if (m.request.transferred() != sizes[m.index])
              qcoll::detail::throw_error(errc::protocol_error, "moved {} of {} bytes", m.request.transferred(), sizes[m.index]);
            if (m.send) continue;
            const transports::message_header& h = m.request.header();
            if (h.sequence != m.index || h.count != sizes[m.index] || h.root != m.peer)
              qcoll::detail::throw_error(errc::protocol_error, "message {} from rank {} came with the header of {} from {}",
                                         m.index, m.peer, h.sequence, h.root);
            if (test::to_host(m.data) != pattern(sizes[m.index], m.peer, me, m.index))
              qcoll::detail::throw_error(errc::protocol_error, "message {} ({} bytes) from rank {} differs", m.index,
                                         sizes[m.index], m.peer);
          }
          if (t.bytes_copied() == 0) qcoll::detail::throw_error(errc::protocol_error, "nothing went through the windows");
        }, devices));
      }
    }
  }
  if (on_emulated_device()) device::configure_emulated({.devices = 1, .delay = std::chrono::microseconds(50)});
}

// A receive of another size than the message fails with protocol_error and the sender's
// size and header, as on every transport; the send completes; the pair stays usable.
BOOST_AUTO_TEST_CASE(a_receive_of_another_size_fails_and_the_pair_goes_on) {
  expect_success(run_peers(2, {.slot_bytes = 1024, .slots = 2}, [](peer_transport& t) {
    device_memory<std::uint8_t> data = test::on_device(pattern(5000, t.rank(), 1 - t.rank(), 0));
    device_memory<std::uint8_t> short_buffer(4000), whole(5000);
    peer_request first, second;
    if (t.rank() == 0) {
      t.post_send(first, 1, 0, {.sequence = 7}, std::as_bytes(data.span()));
      require_ok(t.wait(first, soon()), "the refused send");
      t.post_send(second, 1, 0, {.sequence = 8}, std::as_bytes(data.span()));
      require_ok(t.wait(second, soon()), "the next send");
      return;
    }
    t.post_recv(first, 0, 0, std::as_writable_bytes(short_buffer.span()));
    const std::error_code refused = t.wait(first, soon());
    if (refused != errc::protocol_error || first.transferred() != 5000 || first.header().sequence != 7)
      qcoll::detail::throw_error(errc::protocol_error, "the short receive got {} ({} bytes, sequence {})",
                                 refused.message(), first.transferred(), first.header().sequence);
    t.post_recv(second, 0, 0, std::as_writable_bytes(whole.span()));
    require_ok(t.wait(second, soon()), "the next receive");
    if (test::to_host(whole) != pattern(5000, 0, 1, 0)) qcoll::detail::throw_error(errc::protocol_error, "the next message differs");
  }));
}

// Host memory where device memory is due is a clear error, before anything is posted.
BOOST_AUTO_TEST_CASE(host_memory_is_refused) {
  expect_success(run_peers(2, {}, [](peer_transport& t) {
    std::vector<std::byte> host(64);
    peer_request r;
    try {
      if (t.rank() == 0) t.post_send(r, 1, 0, {}, host);
      else t.post_recv(r, 0, 0, host);
    } catch (const qcoll::error& refused) {
      if (refused.code() == errc::invalid_argument && std::string_view(refused.what()).find("host memory") != std::string_view::npos)
        return;
      throw;
    }
    qcoll::detail::throw_error(errc::protocol_error, "host memory was accepted");
  }));
}

// A rank that leaves while a message to it is half-moved (its windows full): the sender
// fails with peer_lost well before its deadline, not a hang; nothing leaks.
BOOST_AUTO_TEST_CASE(a_peer_that_leaves_mid_message_fails_the_sender) {
  const device::emulated_census before = on_emulated_device() ? device::census() : device::emulated_census{};
  std::error_code sender_got;
  clock::duration took{};
  const auto failures = run_peers(2, {.slot_bytes = 1024, .slots = 2},
                                  [&](peer_transport& t) {
    device_memory<std::uint8_t> data(64 * 1024);
    peer_request r;
    if (t.rank() == 0) {
      const auto start = clock::now();
      t.post_send(r, 1, 0, {}, std::as_bytes(data.span()));
      sender_got = t.wait(r, clock::now() + std::chrono::seconds(20));
      took = clock::now() - start;
      return;
    }
    t.post_recv(r, 0, 0, std::as_writable_bytes(data.span()));
    while (r.transferred() == 0) t.test(r);
    // Leaves with the receive half-moved: withdrawn, which aborts, then the transport goes.
  });
  BOOST_TEST(failures[0].empty(), failures[0]);
  BOOST_TEST((sender_got == errc::peer_lost || sender_got == errc::aborted), sender_got.message());
  BOOST_TEST(std::chrono::duration<double>(took).count() < 10.0);
  if (on_emulated_device()) {
    const device::emulated_census after = device::census();
    BOOST_TEST(after.allocations == before.allocations);
    BOOST_TEST(after.streams == before.streams);
    BOOST_TEST(after.events == before.events);
  }
}

// An abort on one rank reaches every rank waiting on the transport, with its reason.
BOOST_AUTO_TEST_CASE(an_abort_reaches_every_rank) {
  std::vector<std::error_code> got(3);
  std::vector<std::string> reasons(3);
  expect_success(run_peers(3, {.slot_bytes = 1024, .slots = 2}, [&](peer_transport& t) {
    device_memory<std::uint8_t> data(8192);
    peer_request r;
    // Every rank connected first (a rank's connect ends once it has every peer's window):
    // an empty message from each to rank 0.
    if (t.rank() == 0) {
      for (rank_t from : {rank_t{1}, rank_t{2}}) {
        peer_request hello;
        t.post_recv(hello, from, 1, {});
        require_ok(t.wait(hello, soon()), "a hello");
      }
      t.abort(make_error_code(errc::aborted), "rank 0 gives up");
      got[0] = make_error_code(errc::aborted);
      reasons[0] = t.failure().reason;
      return;
    }
    peer_request hello;
    t.post_send(hello, 0, 1, {}, {});
    require_ok(t.wait(hello, soon()), "a hello");
    t.post_recv(r, 0, 0, std::as_writable_bytes(data.span()));
    got[t.rank()] = t.wait(r, soon());
    reasons[t.rank()] = t.failure().reason;
  }));
  for (rank_t r = 0; r < 3; ++r) {
    BOOST_TEST(got[r] == errc::aborted, "rank " << r << ": " << got[r].message());
    BOOST_TEST(reasons[r] == "rank 0 gives up");
  }
}

// A rank that cannot open a peer's window (the handle lost or stale): every rank fails
// at connect, and says why; nothing leaks.
BOOST_AUTO_TEST_CASE(a_window_that_cannot_be_opened_fails_every_rank) {
  if (!on_emulated_device()) return;
  const device::emulated_census before = device::census();
  std::vector<std::string> failures(3);
  std::mutex mutex;
  transports::inproc::run_ranks(3, [&](transports::inproc::transport control) {
    const rank_t r = control.rank();
    if (r == 1) device::emulated_faults::inject_here(device::emulated_fault::lost_handle);
    try {
      peer_transport t(std::move(control), {.slot_bytes = 1024, .slots = 2});
    } catch (const qcoll::error& e) {
      std::lock_guard lock(mutex);
      failures[r] = e.what();
    }
    device::emulated_faults::clear();
  });
  BOOST_TEST(failures[1].find("cannot open the window of rank 0") != std::string::npos, failures[1]);
  BOOST_TEST(failures[0].find("rank 1 could not open") != std::string::npos, failures[0]);
  BOOST_TEST(failures[2].find("rank 1 could not open") != std::string::npos, failures[2]);
  const device::emulated_census after = device::census();
  BOOST_TEST(after.allocations == before.allocations);
  BOOST_TEST(after.streams == before.streams);
  BOOST_TEST(after.events == before.events);
}

// Reserved tags and peers out of range are refused; so is one transport of one rank.
BOOST_AUTO_TEST_CASE(bad_arguments_are_refused) {
  expect_success(run_peers(2, {}, [](peer_transport& t) {
    device_memory<std::uint8_t> data(16);
    peer_request r;
    const auto refused = [&](auto&& post) {
      try {
        post();
      } catch (const qcoll::error& e) {
        return e.code() == errc::invalid_argument;
      }
      return false;
    };
    if (!refused([&] { t.post_send(r, 1 - t.rank(), transports::cuda_peer::protocol_tag, {}, std::as_bytes(data.span())); }))
      qcoll::detail::throw_error(errc::protocol_error, "a reserved tag was accepted");
    if (!refused([&] { t.post_recv(r, t.rank(), 0, std::as_writable_bytes(data.span())); }))
      qcoll::detail::throw_error(errc::protocol_error, "a receive from itself was accepted");
  }));
}

// The window's size from the environment: read, bounded, and refused with the variable's
// name when malformed; ranks that read different values are refused at connect.
BOOST_AUTO_TEST_CASE(window_settings_from_the_environment) {
  const auto with = [](const char* slot_bytes, const char* slots) {
    ::setenv("QCOLL_CUDA_PEER_SLOT_BYTES", slot_bytes, 1);
    ::setenv("QCOLL_CUDA_PEER_SLOTS", slots, 1);
  };
  const auto refusal = [](const char* name) {
    try {
      (void)transports::cuda_peer::options::from_environment();
    } catch (const qcoll::error& e) {
      return e.code() == errc::invalid_argument && std::string_view(e.what()).find(name) != std::string_view::npos;
    }
    return false;
  };
  with("", "");
  const transports::cuda_peer::options defaults = transports::cuda_peer::options::from_environment();
  BOOST_TEST(defaults.slot_bytes == transports::cuda_peer::options{}.slot_bytes);
  BOOST_TEST(defaults.slots == transports::cuda_peer::options{}.slots);
  with("4M", "16");
  const transports::cuda_peer::options set = transports::cuda_peer::options::from_environment();
  BOOST_TEST(set.slot_bytes == std::size_t{4} << 20);
  BOOST_TEST(set.slots == 16u);
  for (const char* bad : {"1K", "2G", "off", "lots"}) {
    with(bad, "8");
    BOOST_TEST(refusal("QCOLL_CUDA_PEER_SLOT_BYTES"), bad);
  }
  for (const char* bad : {"0", "65", "x"}) {
    with("1M", bad);
    BOOST_TEST(refusal("QCOLL_CUDA_PEER_SLOTS"), bad);
  }
  ::unsetenv("QCOLL_CUDA_PEER_SLOT_BYTES");
  ::unsetenv("QCOLL_CUDA_PEER_SLOTS");

  // Rank 1 read other settings than rank 0: both refuse at connect, naming the windows.
  std::vector<std::string> failures(2);
  (void)transports::inproc::run_ranks(2, [&](transports::inproc::transport control) {
    const rank_t r = control.rank();
    try {
      peer_transport t(std::move(control), {.slot_bytes = 8192, .slots = 2 + r, .device = 0});
    } catch (const qcoll::error& e) {
      failures[r] = e.what();
    }
  });
  for (rank_t r = 0; r < 2; ++r)
    BOOST_TEST(failures[r].find("has windows of") != std::string::npos, "rank " << r << ": '" << failures[r] << "'");
}

// ---- collectives over the transport

namespace {

/// Values whose sums depend on the order they are added in.
template <class T>
std::vector<T> values_of(std::size_t n, rank_t rank, unsigned salt) {
  std::mt19937 gen(static_cast<unsigned>(n * 131 + rank * 7 + salt));
  std::uniform_real_distribution<double> value(-3.0, 3.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(static_cast<float>(value(gen) * (1.0 + static_cast<double>(rank))));
  return v;
}

/// Every result one rank got, in call order, as bytes.
using results = std::vector<std::vector<std::uint8_t>>;

template <class T>
void keep(results& into, const std::vector<T>& values) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(values.data());
  into.emplace_back(bytes, bytes + values.size() * sizeof(T));
}

/// One collective on host buffers (`device` false) or on device buffers: `call(in, out)`
/// with `out` of `out_count` values; the result kept.
template <class T, class Call>
void run_one(bool device, const std::vector<T>& in, std::size_t out_count, results& into, Call&& call) {
  if (!device) {
    std::vector<T> out(out_count);
    call(std::span<const T>(in), std::span<T>(out));
    return keep(into, out);
  }
  const device_memory<T> d_in = test::on_device(in);
  device_memory<T> d_out(out_count);
  call(std::span<const T>(d_in.span()), d_out.span());
  keep(into, test::to_host(d_out));
}

/// Every exact collective of `count` values by `op` on one rank, each algorithm forced
/// in turn, host or device forms.
template <class T, class Communicator>
void every_collective(Communicator& comm, bool device, std::size_t count, reduce_op op, results& into) {
  const auto where = [&] { return execution::device_stream{}; };
  const std::vector<T> in = values_of<T>(count, comm.rank(), static_cast<unsigned>(op));
  for (const algorithm a : {algorithm::ring, algorithm::recursive_doubling, algorithm::halving_doubling}) {
    comm.set_tuning(test::forcing(a, a == algorithm::ring ? algorithm::ring : algorithm::binomial_tree));
    run_one<T>(device, in, count, into, [&](std::span<const T> i, std::span<T> o) {
      if (device) comm.allreduce(where(), i, o, op);
      else comm.allreduce(i, o, op);
    });
    if (op != reduce_op::sum && op != reduce_op::avg) continue;
    const block_range mine = block_of(count, comm.size(), comm.rank());
    run_one<T>(device, in, mine.size, into, [&](std::span<const T> i, std::span<T> o) {
      if (device) comm.reduce_scatter(where(), i, o, op);
      else comm.reduce_scatter(i, o, op);
    });
    run_one<T>(device, in, count, into, [&](std::span<const T> i, std::span<T> o) {
      if (device) comm.all_gather(where(), mine.of(i), o);
      else comm.all_gather(mine.of(i), o);
    });
    const rank_t root = comm.size() - 1;
    if (device) {
      device_memory<T> d = test::on_device(in);
      comm.broadcast(where(), d.span(), root);
      keep(into, test::to_host(d));
    } else {
      std::vector<T> data = in;
      comm.broadcast(std::span<T>(data), root);
      keep(into, data);
    }
  }
}

/// Every collective of every case, on `n` ranks: over inproc on host buffers, then over
/// cuda_peer on device buffers; each rank's results, in order.
template <class Cases>
void host_and_device(rank_t n, const transports::cuda_peer::options& settings, Cases&& cases,
                     const std::function<topologies::graph(std::size_t)>& topology = [](std::size_t size) {
                       return topologies::graph(topologies::ring(size));
                     }) {
  std::vector<results> host(n), device(n);
  const auto failed = [](const test::rank_outcomes& outcome) {
    for (std::size_t r = 0; r < outcome.errors.size(); ++r)
      if (outcome.errors[r]) BOOST_ERROR("rank " << r << " failed: " << outcome.failure(r).second);
  };
  failed(test::run_ranks<topologies::graph>(
      n, [&](test::inproc_communicator& comm) { cases(comm, false, host[comm.rank()]); }, {}, topology));
  failed({transports::inproc::run_ranks(n, [&](transports::inproc::transport control) {
    const rank_t r = control.rank();
    peer_communicator comm(peer_transport(std::move(control), settings), topology(n));
    cases(comm, true, device[r]);
  })});
  BOOST_TEST(!host[0].empty());  // the cases ran
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST_CONTEXT(n << " ranks, rank " << r) {
      BOOST_TEST_REQUIRE(host[r].size() == device[r].size());
      for (std::size_t k = 0; k < host[r].size(); ++k)
        BOOST_TEST((host[r][k] == device[r][k]), "result " << k << " differs");
    }
  }
}

/// Three calls of a plan made by make(comm, where) — a host plan, or one on device
/// memory over cuda_peer — of `count` values by `op`, out of place; the outputs kept.
template <class T, class Communicator, class Make>
void three_plan_calls(Communicator& comm, bool device, std::size_t count, reduce_op op, results& into, Make&& make) {
  auto plan = make(comm);
  for (unsigned call = 0; call < 3; ++call) {
    const std::vector<T> in = values_of<T>(count, comm.rank(), call);
    run_one<T>(device, in, count, into, [&](std::span<const T> i, std::span<T> o) {
      if constexpr (requires { comm.allreduce(execution::device_stream{}, plan, i, o, op); })
        comm.allreduce(execution::device_stream{}, plan, i, o, op);
      else
        comm.allreduce(plan, i, o, op);
    });
  }
}

}  // namespace

// Every exact collective over cuda_peer on device buffers gives the host transport's
// bits on host buffers: every algorithm, op and element type, sizes around the ring's
// blocks and the transport's slots (small slots: messages wrap the windows).
BOOST_AUTO_TEST_CASE(every_collective_equals_the_host_transport) {
  const transports::cuda_peer::options settings{.slot_bytes = 16384, .slots = 3};
  for (const rank_t n : {rank_t{2}, rank_t{3}, rank_t{4}}) {
    host_and_device(n, settings, [](auto& comm, bool on_device, results& into) {
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{4097}, std::size_t{70001}})
        for (const reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product})
          every_collective<float>(comm, on_device, count, op, into);
      for (const std::size_t count : {std::size_t{1000}, std::size_t{30001}}) {
        every_collective<double>(comm, on_device, count, reduce_op::sum, into);
        every_collective<bfloat16>(comm, on_device, count, reduce_op::avg, into);
        every_collective<float16>(comm, on_device, count, reduce_op::sum, into);
      }
    });
  }
}

// Both plans over cuda_peer on device memory, frames moving GPU to GPU, give the host
// plans' bits over the host transport: the compressed allreduce on both routes (direct
// and ring) with error feedback across calls, 16-bit values, owners summing on the
// shared grid, and the grid allreduce on a degraded torus.
BOOST_AUTO_TEST_CASE(both_plans_equal_the_host_plans) {
  using namespace quantizers;
  const transports::cuda_peer::options settings{.slot_bytes = 16384, .slots = 3};
  const auto compressed = [](auto q, auto value, bool on_grid = false) {
    return [q, on_grid](auto& comm, bool on_device, results& into) {
      using Q = std::remove_cvref_t<decltype(q)>;
      using T = decltype(value);
      for (const std::size_t count : {std::size_t{1}, std::size_t{4099}, std::size_t{70001}})
        three_plan_calls<T>(comm, on_device, count, reduce_op::avg, into, [&](auto& c) {
          if constexpr (std::same_as<std::remove_cvref_t<decltype(c)>, peer_communicator>)
            return compressed_allreduce_plan<Q, T, execution::device_space>(
                execution::device_stream{}, c, count, q, {.chunk_values = 8192, .reproducible = on_grid});
          else
            return compressed_allreduce_plan<Q, T>(c, count, q, {.chunk_values = 8192, .reproducible = on_grid});
        });
    };
  };
  const auto fully_connected = [](std::size_t size) { return topologies::graph(topologies::fully_connected(size)); };
  for (const rank_t n : {rank_t{2}, rank_t{3}, rank_t{4}}) {
    host_and_device(n, settings, compressed(one_bit{}, float{}), fully_connected);
    host_and_device(n, settings, compressed(k_level({.levels = 5, .group_size = 512}), float{}));
  }
  host_and_device(3, settings, compressed(one_bit{}, bfloat16{}), fully_connected);
  host_and_device(3, settings, compressed(k_level({.levels = 5, .group_size = 104}), float{}, true));
  // The grid plan: a 2 × 3 torus with node 4 down.
  const topologies::torus grid({2, 3}, {.nodes = {topologies::degraded_node::fully(4)}});
  const topologies::grid_routing routing = topologies::route_grid(grid);
  host_and_device(6, settings, [&](auto& comm, bool on_device, results& into) {
    constexpr std::size_t count = 50021;
    if (comm.rank() == 4) return;  // excluded
    three_plan_calls<float>(comm, on_device, count, reduce_op::sum, into, [&](auto& c) {
      if constexpr (std::same_as<std::remove_cvref_t<decltype(c)>, peer_communicator>)
        return grid_allreduce_plan(execution::device_stream{}, c, routing, count, one_bit{});
      else
        return grid_allreduce_plan(c, routing, count, one_bit{});
    });
  });
}

// The two-level allreduce with a CUDA peer node inside a host-transport world, on
// device buffers, gives the bits of the host one (nodes split from an inproc world) —
// both exchanges, error feedback across calls — and a bad call on one rank fails every
// rank at once: the node's abort crosses into the world.
BOOST_AUTO_TEST_CASE(two_level_allreduce_equals_the_host_one) {
  using quantizers::one_bit;
  const transports::cuda_peer::options settings{.slot_bytes = 16384, .slots = 3};
  constexpr std::size_t count = 30001;
  constexpr rank_t n = 4, per_node = 2;
  const communicator_options patient{.timeout = std::chrono::seconds(30)};
  for (const two_level_exchange exchange : {two_level_exchange::shards, two_level_exchange::leaders})
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg})
      BOOST_TEST_CONTEXT((exchange == two_level_exchange::shards ? "shards, " : "leaders, ") << to_string(op)) {
        std::vector<results> host(n), device(n);
        const two_level_options options{.exchange = exchange, .compressed = {.chunk_values = 4096}};
        const auto host_run = test::run_ranks<topologies::fully_connected>(n, [&](test::inproc_communicator& world) {
          auto node = world.split(static_cast<std::int64_t>(world.rank() / per_node), world.rank());
          two_level_allreduce bucket(*node, world, count, one_bit{}, options);
          for (unsigned call = 0; call < 3; ++call) {
            const std::vector<float> in = values_of<float>(count, world.rank(), call);
            std::vector<float> out(count);
            bucket.allreduce(std::span<const float>(in), std::span(out), op);
            keep(host[world.rank()], out);
          }
        });
        BOOST_TEST_REQUIRE(host_run.all_succeeded());
        transports::inproc::world first(per_node), second(per_node);
        const auto device_run = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
          const rank_t r = endpoint.rank();
          test::inproc_communicator world(std::move(endpoint), topologies::fully_connected(n), patient);
          peer_communicator node(peer_transport((r < per_node ? first : second).endpoint(r % per_node), settings),
                                 topologies::fully_connected(per_node), patient);
          two_level_allreduce bucket(execution::device_stream{}, node, world, count, one_bit{}, options);
          for (unsigned call = 0; call < 3; ++call) {
            const device_memory<float> in = test::on_device(values_of<float>(count, r, call));
            device_memory<float> out(count);
            bucket.allreduce(execution::device_stream{}, std::span<const float>(in.span()), out.span(), op);
            keep(device[r], test::to_host(out));
          }
        });
        for (const auto& e : device_run)
          if (e) std::rethrow_exception(e);
        for (rank_t r = 0; r < n; ++r) {
          BOOST_TEST_REQUIRE(host[r].size() == device[r].size());
          for (std::size_t k = 0; k < host[r].size(); ++k)
            BOOST_TEST((host[r][k] == device[r][k]), "rank " << r << ", call " << k << " differs");
        }
      }

  transports::inproc::world first(per_node), second(per_node);
  std::vector<std::error_code> codes(n);
  const auto started = std::chrono::steady_clock::now();
  const auto bad_call = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    const rank_t r = endpoint.rank();
    test::inproc_communicator world(std::move(endpoint), topologies::fully_connected(n), patient);
    peer_communicator node(peer_transport((r < per_node ? first : second).endpoint(r % per_node), settings),
                           topologies::fully_connected(per_node), patient);
    device_memory<float> data(r == 3 ? count - 1 : count);
    try {
      two_level_allreduce bucket(execution::device_stream{}, node, world, count, one_bit{});
      bucket.allreduce(execution::device_stream{}, data.span(), reduce_op::sum);
    } catch (const std::system_error& e) {
      codes[r] = e.code();
    }
  });
  for (const auto& e : bad_call)
    if (e) std::rethrow_exception(e);
  test::expect_culprit_fails_everyone(codes, 3, errc::invalid_argument, started);
}

BOOST_AUTO_TEST_SUITE_END()
