#pragma once
/// @file
/// Shared-memory transport: ranks are processes on one host (Linux).
///
/// One POSIX shared-memory segment per job holds, for every ordered pair of ranks, a
/// single-producer single-consumer byte pipe (a ring of `options::pipe_bytes`), and
/// for every rank a futex doorbell. A message is copied once into the pipe by the
/// sender and once out of it into the posted buffer by the receiver, in chunks, so
/// messages of any size stream through a fixed-size ring. A rank that finds nothing
/// to do spins briefly, then sleeps on its doorbell; whoever moves bytes to or from
/// it rings it.
///
/// Lifetime: rank 0 creates the segment as `/qcoll-<job id>` (removing a stale one of
/// that name first, and stamping a fresh random nonce that the others check, so no
/// rank ever attaches to an old job's state), and unlinks the name as soon as every
/// rank has attached. From then on the memory lives exactly as long as some rank maps
/// it: nothing is left in /dev/shm after a normal exit or a crash. qcoll-run also
/// removes `/dev/shm/qcoll-<job id>*` after a job, for a crash during setup.
///
/// Single copy: where the kernel lets every rank read every other's memory (Linux
/// cross-memory attach, process_vm_readv, probed at join), the ring's large steps skip
/// the pipes: a rank sends where its data is, and the peer reads it straight into
/// place, or slice by slice into cache for a reduction (algorithm::ring_single_copy,
/// docs/algorithms.md). Where any pair is refused (Yama ptrace_scope 2 or 3, a
/// container without CAP_SYS_PTRACE, a non-dumpable process), every rank keeps the
/// two-copy path and rank 0 says why in one line on stderr. Under Yama ptrace_scope 1
/// join declares any process of the user a permitted reader (PR_SET_PTRACER_ANY, as
/// Open MPI's vader does); options::single_copy = false skips that and the probe.
/// Memory from allocate_shared (communicator::allocate) goes further: peers map it,
/// and a step reduces or copies straight out of it, with no kernel copy at all
/// (shm_shared_memory.hpp).
///
/// Failures: a peer that closes its transport ends its streams after the bytes it
/// wrote; a peer process that dies is noticed through a pidfd within one sleep slice
/// (10 ms). Either way the requests waiting on it fail with errc::peer_lost.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/store.hpp>
#include <qcoll/transports/stream/engine.hpp>
#include <qcoll/detail/posix_handles.hpp>
#include <qcoll/transports/process.hpp>
#include <qcoll/transports/shm_pipes.hpp>
#include <qcoll/transports/shm_segment.hpp>
#include <qcoll/transports/shm_shared_memory.hpp>
#include <qcoll/tuning/table.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qcoll::transports::shm {

struct options {
  /// Bytes of each pair's ring; a power of two ≥ 64 KiB. n(n − 1) rings per job.
  std::size_t pipe_bytes = std::size_t{2} << 20;
  /// Probe at join whether ranks may read each other's memory, and do so for large
  /// ring steps if every pair may. false: the pipes only.
  bool single_copy = true;
  stream::engine_options engine{};
};

/// One rank's endpoint: the type both the shm and the tcp join give (process.hpp).
using transport = process_transport;

namespace detail {

/// Each rank reads every peer's probe word; single copy is on only if every rank
/// read every word. Rank 0 says why not, once for the job.
template <rendezvous::store Store>
bool agree_on_single_copy(const rendezvous::job& job, Store& store, const detail::rank_slot* slots,
                          const std::vector<pid_t>& pids, deadline until) {
  std::string refused;
  for (rank_t p = 0; p < job.size && refused.empty(); ++p) {
    if (p == job.rank) continue;
    std::uint64_t seen = 0;
    const iovec local{&seen, sizeof seen};
    const iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(slots[p].probe_address.load())),
                       sizeof seen};
    const ssize_t n = ::process_vm_readv(pids[p], &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(sizeof seen))
      refused = qcoll::detail::format("rank {} may not read rank {}'s memory (process_vm_readv: {})", job.rank, p,
                                      n < 0 ? std::strerror(errno) : "short read");
    else if (seen != slots[p].probe_value.load())
      refused = qcoll::detail::format("rank {} read the wrong value from rank {}'s memory", job.rank, p);
  }
  store.set(qcoll::detail::format("qcoll/shm/single-copy/{}", job.rank), refused.empty() ? "yes" : refused);
  store.wait_all("qcoll/shm/single-copy/", job.size, until);
  std::string first_refusal;
  for (rank_t r = 0; r < job.size && first_refusal.empty(); ++r) {
    std::string answer = r == job.rank ? (refused.empty() ? "yes" : refused)
                                       : store.get(qcoll::detail::format("qcoll/shm/single-copy/{}", r), until);
    if (answer != "yes") first_refusal = std::move(answer);
  }
  if (!first_refusal.empty() && job.rank == 0)
    qcoll::detail::log_warning("qcoll: shm transport: single copy is off for this job: {}; large messages take "
                               "the two-copy path through the shared pipes (docs/transports.md, \"Single copy\")",
                               first_refusal);
  return first_refusal.empty();
}

}  // namespace detail

/// Joins the job: rank 0 creates the segment, everyone attaches, and the name is
/// unlinked once all have. Collective: every rank of the job calls it, each with its
/// own connection to the job's store.
/// @par Errors
/// qcoll::error: invalid_argument (bad options, system call failures, named),
/// protocol_error (a segment that is not this job's), timeout (a rank never came),
/// and whatever the store throws.
// A template over the store rather than a virtual interface: it is the simpler of the
// two (no adapter class, one instantiation per store type, setup code run once), and
// it keeps this header free of the TCP store's Boost.Asio.
template <rendezvous::store Store>
process_transport join(const rendezvous::job& job, Store& store, const options& opts = {}) {
  if (opts.pipe_bytes < (std::size_t{64} << 10) || (opts.pipe_bytes & (opts.pipe_bytes - 1)) != 0)
    qcoll::detail::throw_error(errc::invalid_argument,
                               "shm transport: pipe_bytes = {} must be a power of two of at least 65536",
                               opts.pipe_bytes);
  const detail::layout shape{job.size, opts.pipe_bytes};
  const std::string name = segment_name(job.job_id);  // shm_segment.hpp
  const deadline until = clock::now() + job.timeout;

  detail::mapping segment;
  if (job.rank == 0) {
    std::random_device entropy;
    const std::uint64_t nonce = (std::uint64_t{entropy()} << 32) ^ entropy();
    segment = detail::create_segment(name, shape, nonce);
    store.set("qcoll/shm/segment", qcoll::detail::format("{} {} {}", name, nonce, opts.pipe_bytes));
  } else {
    const std::string announced = store.get("qcoll/shm/segment", until);
    const std::string expected_prefix = name + " ";
    std::uint64_t nonce = 0;
    std::size_t their_pipe_bytes = 0;
    if (announced.rfind(expected_prefix, 0) != 0 ||
        !detail::parse_two(std::string_view(announced).substr(expected_prefix.size()), nonce, their_pipe_bytes))
      qcoll::detail::throw_error(errc::protocol_error, "shm transport: rank 0 announced '{}', expected '{}…'",
                                 announced, expected_prefix);
    if (their_pipe_bytes != opts.pipe_bytes)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "shm transport: rank 0 uses pipe_bytes = {} but rank {} was given {}",
                                 their_pipe_bytes, job.rank, opts.pipe_bytes);
    segment = detail::attach_segment(name, shape, nonce);
  }
  auto* slots = reinterpret_cast<detail::rank_slot*>(segment.base() + shape.slots_offset());
  slots[job.rank].pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_release);
  // The probe word lives as long as the transport; its value is random, so a read of
  // the wrong process or address cannot pass for a successful one.
  auto probe = std::make_unique<std::uint64_t>((std::uint64_t{std::random_device{}()} << 32) | 0x9e3779b9u);
  slots[job.rank].probe_value.store(*probe, std::memory_order_relaxed);
  slots[job.rank].probe_address.store(reinterpret_cast<std::uintptr_t>(probe.get()), std::memory_order_release);
  if (opts.single_copy) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // EINVAL without Yama: fine
  store.set(qcoll::detail::format("qcoll/shm/attached/{}", job.rank), "1");
  store.wait_all("qcoll/shm/attached/", job.size, until);
  if (job.rank == 0) ::shm_unlink(name.c_str());  // everyone has it mapped: the name is no longer needed

  std::vector<pid_t> pids(job.size);
  for (rank_t r = 0; r < job.size; ++r) pids[r] = slots[r].pid.load(std::memory_order_acquire);
  const bool single_copy = opts.single_copy && detail::agree_on_single_copy(job, store, slots, pids, until);

  auto pipes = std::make_unique<detail::shm_channels>(std::move(segment), shape, job.rank);
  return process_transport(std::make_unique<stream::engine>(job.rank, job.size, std::move(pipes), "shm transport",
                                                            stream::resolve(opts.engine, job.local_size)),
                           job.timeout, rendezvous::transport_kind::shm, {std::move(pids), single_copy, std::move(probe)});
}

}  // namespace qcoll::transports::shm
