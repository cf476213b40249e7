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

namespace detail {
using qcoll::detail::file_descriptor;
using qcoll::detail::mapping;

inline constexpr std::uint64_t segment_magic = 0x71636f6c6c73686dULL;  // "qcollshm"
inline constexpr std::uint32_t segment_version = 2;

struct segment_header {
  std::atomic<std::uint64_t> magic;  // written last by the creator
  std::uint32_t version;
  std::uint32_t size;
  std::uint64_t nonce;
  std::uint64_t pipe_bytes;
  std::uint64_t total_bytes;
};

struct alignas(64) rank_slot {
  std::atomic<std::uint32_t> doorbell;  // changes whenever bytes move to or from this rank
  std::atomic<std::uint32_t> sleepers;  // > 0 while this rank sleeps on the doorbell
  std::atomic<std::int32_t> pid;
  std::atomic<std::uint64_t> probe_address;  // where this rank keeps probe_value, for the single-copy probe
  std::atomic<std::uint64_t> probe_value;
};

struct pipe_header {
  alignas(64) std::atomic<std::uint64_t> head;  // bytes ever written (the producer's)
  alignas(64) std::atomic<std::uint64_t> tail;  // bytes ever read (the consumer's)
  alignas(64) std::atomic<std::uint32_t> writer_closed;
  std::atomic<std::uint32_t> reader_closed;
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

inline constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

/// Where everything lives in a segment for n ranks.
struct layout {
  std::size_t size;
  std::size_t pipe_bytes;

  std::size_t slots_offset() const noexcept { return round_up(sizeof(segment_header), 64); }
  std::size_t pipes_offset() const noexcept { return round_up(slots_offset() + size * sizeof(rank_slot), 4096); }
  std::size_t pipe_stride() const noexcept { return round_up(sizeof(pipe_header), 4096) + pipe_bytes; }
  std::size_t total() const noexcept { return pipes_offset() + size * (size - 1) * pipe_stride(); }
  std::size_t pipe_offset(rank_t from, rank_t to) const noexcept {
    const std::size_t index = from * (size - 1) + (to < from ? to : to - 1);
    return pipes_offset() + index * pipe_stride();
  }
};

inline long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) noexcept {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

/// The stream engine's pipes over one segment.
class shm_channels final : public stream::channels {
 public:
  shm_channels(mapping segment, layout shape, rank_t rank) : segment_(std::move(segment)), shape_(shape), rank_(rank) {
    gone_.assign(shape.size, 0);
    empty_polls_.assign(shape.size, 0);
    next_liveness_check_.assign(shape.size, deadline{});
    for (rank_t p = 0; p < shape.size; ++p) {
      const std::int32_t pid = slot(p).pid.load(std::memory_order_acquire);
      pids_.push_back(pid);
      // A pidfd turns readable when the process exits, zombie or not, and never names a
      // recycled pid; kill(pid, 0) is the fallback where pidfd_open is unavailable.
      pidfds_.push_back(p == rank ? file_descriptor() : qcoll::detail::open_process(pid));
    }
  }

  std::size_t write_some(rank_t peer, std::span<const std::byte> bytes, std::string& lost) override {
    pipe_header& pipe = pipe_of(rank_, peer);
    if (pipe.reader_closed.load(std::memory_order_acquire)) {
      lost = "it closed its transport";
      return 0;
    }
    const std::uint64_t head = pipe.head.load(std::memory_order_relaxed);
    const std::uint64_t tail = pipe.tail.load(std::memory_order_acquire);
    const std::size_t room = shape_.pipe_bytes - static_cast<std::size_t>(head - tail);
    const std::size_t n = std::min(room, bytes.size());
    if (n == 0) {
      if (died_lately(peer)) lost = death_notice(peer);
      return 0;
    }
    std::byte* const ring_bytes = ring_of(rank_, peer);
    for (std::size_t done = 0; done < n;) {
      const std::size_t piece = std::min(n - done, qcoll::tuning_table::pipe_publish_bytes);
      copy_into_ring(ring_bytes, head + done, bytes.subspan(done, piece));
      done += piece;
      pipe.head.store(head + done, std::memory_order_release);
    }
    return n;
  }

  std::size_t read_some(rank_t peer, std::span<std::byte> into, std::string& lost) override {
    pipe_header& pipe = pipe_of(peer, rank_);
    const std::uint64_t tail = pipe.tail.load(std::memory_order_relaxed);
    const std::uint64_t head = pipe.head.load(std::memory_order_acquire);
    const std::size_t n = std::min(static_cast<std::size_t>(head - tail), into.size());
    if (n == 0) {
      if (!into.empty() && (closed_toward(peer) || died_lately(peer)) && pipe.head.load(std::memory_order_acquire) == tail)
        lost = pipe.writer_closed.load(std::memory_order_acquire) ? "it closed its transport" : death_notice(peer);
      return 0;
    }
    const std::byte* const ring_bytes = ring_of(peer, rank_);
    for (std::size_t done = 0; done < n;) {
      const std::size_t piece = std::min(n - done, qcoll::tuning_table::pipe_publish_bytes);
      copy_out_of_ring(ring_bytes, tail + done, into.subspan(done, piece));
      done += piece;
      pipe.tail.store(tail + done, std::memory_order_release);
    }
    return n;
  }

  void notify(rank_t peer) noexcept override { ring(peer); }

  bool peer_gone(rank_t peer) override { return closed_toward(peer) || died(peer); }

  std::uint64_t activity() override { return slot(rank_).doorbell.load(std::memory_order_seq_cst); }

  void wait_for_activity(std::uint64_t seen, std::span<const char>, std::span<const char>, deadline until) override {
    rank_slot& mine = slot(rank_);
    const auto expected = static_cast<std::uint32_t>(seen);
    mine.sleepers.fetch_add(1, std::memory_order_seq_cst);
    // Sleep in slices: a peer that dies rings nobody, so liveness is checked between them.
    for (;;) {
      if (mine.doorbell.load(std::memory_order_seq_cst) != expected) break;
      const deadline now = clock::now();
      if (now >= until) break;
      const auto slice = std::min<clock::duration>(until - now, std::chrono::milliseconds(10));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      const timespec timeout{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      futex(&mine.doorbell, FUTEX_WAIT, expected, &timeout);
      if (any_newly_dead()) break;
    }
    mine.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }

  void close(rank_t peer) noexcept override {
    pipe_of(rank_, peer).writer_closed.store(1, std::memory_order_release);
    pipe_of(peer, rank_).reader_closed.store(1, std::memory_order_release);
    ring(peer);
  }

 private:
  rank_slot& slot(rank_t r) const noexcept {
    return reinterpret_cast<rank_slot*>(segment_.base() + shape_.slots_offset())[r];
  }
  pipe_header& pipe_of(rank_t from, rank_t to) const noexcept {
    return *reinterpret_cast<pipe_header*>(segment_.base() + shape_.pipe_offset(from, to));
  }
  std::byte* ring_of(rank_t from, rank_t to) const noexcept {
    return segment_.base() + shape_.pipe_offset(from, to) + shape_.pipe_stride() - shape_.pipe_bytes;
  }

  void copy_into_ring(std::byte* ring_bytes, std::uint64_t at_byte, std::span<const std::byte> bytes) const noexcept {
    const std::size_t at = static_cast<std::size_t>(at_byte % shape_.pipe_bytes);
    const std::size_t first = std::min(bytes.size(), shape_.pipe_bytes - at);
    std::memcpy(ring_bytes + at, bytes.data(), first);
    std::memcpy(ring_bytes, bytes.data() + first, bytes.size() - first);
  }

  void copy_out_of_ring(const std::byte* ring_bytes, std::uint64_t at_byte, std::span<std::byte> into) const noexcept {
    const std::size_t at = static_cast<std::size_t>(at_byte % shape_.pipe_bytes);
    const std::size_t first = std::min(into.size(), shape_.pipe_bytes - at);
    std::memcpy(into.data(), ring_bytes + at, first);
    std::memcpy(into.data() + first, ring_bytes, into.size() - first);
  }

  /// Bytes moved to or from `peer`: wake it if it sleeps.
  void ring(rank_t peer) const noexcept {
    rank_slot& theirs = slot(peer);
    theirs.doorbell.fetch_add(1, std::memory_order_seq_cst);
    if (theirs.sleepers.load(std::memory_order_seq_cst) != 0) futex(&theirs.doorbell, FUTEX_WAKE, INT_MAX, nullptr);
  }

  /// Whether either direction to `peer` was closed.
  bool closed_toward(rank_t peer) const noexcept {
    return pipe_of(peer, rank_).writer_closed.load(std::memory_order_acquire) != 0 ||
           pipe_of(rank_, peer).reader_closed.load(std::memory_order_acquire) != 0;
  }

  /// died(), asked by an empty read or write: only every 64th, since reading the clock
  /// on every poll took a third of a polling wait's time (perf, 2 ranks, 4 KiB). A
  /// sleeping wait asks died() itself, every sleep slice.
  bool died_lately(rank_t peer) {
    if (gone_[peer]) return true;
    if (++empty_polls_[peer] % 64 != 0) return false;
    return died(peer);
  }

  /// Whether the peer's process ended. Asked at most once per millisecond per peer: an
  /// empty read asks, and a poll(2) per empty read cost more than the message (measured).
  bool died(rank_t peer) {
    if (gone_[peer]) return true;
    const deadline now = clock::now();
    if (now < next_liveness_check_[peer]) return false;
    next_liveness_check_[peer] = now + std::chrono::milliseconds(1);
    if (pidfds_[peer].get() >= 0) {
      pollfd probe{pidfds_[peer].get(), POLLIN, 0};
      gone_[peer] = ::poll(&probe, 1, 0) > 0;
    } else {
      gone_[peer] = ::kill(pids_[peer], 0) != 0 && errno == ESRCH;
    }
    return gone_[peer] != 0;
  }

  bool any_newly_dead() {
    bool news = false;
    for (rank_t p = 0; p < shape_.size; ++p)
      if (p != rank_ && !gone_[p] && died(p)) news = true;
    return news;
  }

  std::string death_notice(rank_t peer) const {
    return qcoll::detail::format("its process (pid {}) exited without closing its transport", pids_[peer]);
  }

  mapping segment_;
  layout shape_;
  rank_t rank_;
  std::vector<std::int32_t> pids_;
  std::vector<file_descriptor> pidfds_;
  std::vector<char> gone_;
  std::vector<std::uint32_t> empty_polls_;
  std::vector<deadline> next_liveness_check_;
};

/// "A B": two decimal numbers separated by one space, nothing else.
inline bool parse_two(std::string_view text, std::uint64_t& a, std::size_t& b) noexcept {
  const char* end = text.data() + text.size();
  auto first = std::from_chars(text.data(), end, a);
  if (first.ec != std::errc() || first.ptr == end || *first.ptr != ' ') return false;
  auto second = std::from_chars(first.ptr + 1, end, b);
  return second.ec == std::errc() && second.ptr == end;
}

[[noreturn]] inline void fail_system(const char* what, const std::string& name) {
  qcoll::detail::throw_error(errc::invalid_argument, "shm transport: {} '{}' failed: {}", what, name,
                             std::strerror(errno));
}

inline mapping map_segment(int fd, std::size_t bytes, const std::string& name) {
  // Pre-faulted: otherwise a job's first few hundred calls pay a page fault per 4 KiB of
  // ring (measured: 4 KiB allreduce 11–14 µs → 7 µs, docs/transports-performance.md).
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) fail_system("mmap of", name);
  return mapping(base, bytes);
}

/// Rank 0: a fresh segment, initialised, its magic published last.
inline mapping create_segment(const std::string& name, const layout& shape, std::uint64_t nonce) {
  ::shm_unlink(name.c_str());  // a stale segment of a crashed job with this id
  file_descriptor fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (fd.get() < 0) fail_system("shm_open (create) of", name);
  if (::ftruncate(fd.get(), static_cast<off_t>(shape.total())) != 0) {
    ::shm_unlink(name.c_str());
    fail_system("ftruncate of", name);
  }
  mapping segment = map_segment(fd.get(), shape.total(), name);
  std::byte* base = segment.base();
  auto* header = new (base) segment_header{};
  header->version = segment_version;
  header->size = static_cast<std::uint32_t>(shape.size);
  header->nonce = nonce;
  header->pipe_bytes = shape.pipe_bytes;
  header->total_bytes = shape.total();
  for (rank_t r = 0; r < shape.size; ++r) new (base + shape.slots_offset() + r * sizeof(rank_slot)) rank_slot{};
  for (rank_t from = 0; from < shape.size; ++from)
    for (rank_t to = 0; to < shape.size; ++to)
      if (from != to) new (base + shape.pipe_offset(from, to)) pipe_header{};
  header->magic.store(segment_magic, std::memory_order_release);
  return segment;
}

/// Other ranks: the segment rank 0 announced, checked to be exactly that one.
inline mapping attach_segment(const std::string& name, const layout& shape, std::uint64_t nonce) {
  file_descriptor fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (fd.get() < 0) fail_system("shm_open of", name);
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) fail_system("fstat of", name);
  if (static_cast<std::size_t>(info.st_size) != shape.total())
    qcoll::detail::throw_error(errc::protocol_error, "shm transport: segment '{}' has {} bytes, expected {}", name,
                               info.st_size, shape.total());
  mapping segment = map_segment(fd.get(), shape.total(), name);
  const auto* header = reinterpret_cast<const segment_header*>(segment.base());
  if (header->magic.load(std::memory_order_acquire) != segment_magic || header->version != segment_version ||
      header->nonce != nonce || header->size != shape.size || header->pipe_bytes != shape.pipe_bytes)
    qcoll::detail::throw_error(errc::protocol_error,
                               "shm transport: segment '{}' is not this job's (stale or foreign state)", name);
  return segment;
}

}  // namespace detail

/// One rank's endpoint. Models qcoll::transport; move-only.
class transport : public stream::endpoint {
 public:
  /// Its name in QCOLL_TRANSPORT and qcoll-run --transport (rendezvous::named_transports).
  static constexpr rendezvous::transport_kind kind = rendezvous::transport_kind::shm;

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
  static transport join(const rendezvous::job& job, Store& store, const options& opts = {}) {
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
    const bool single_copy = opts.single_copy && agree_on_single_copy(job, store, slots, pids, until);

    auto pipes = std::make_unique<detail::shm_channels>(std::move(segment), shape, job.rank);
    return transport(std::make_unique<stream::engine>(job.rank, job.size, std::move(pipes), "shm transport",
                                                      stream::resolve(opts.engine, job.local_size)),
                     job.timeout, std::move(pids), single_copy, std::move(probe));
  }

  /// Whether every pair of ranks may read each other's memory (agreed at join).
  bool single_copy() const noexcept { return single_copy_; }

  /// Memory the other ranks can map, for a collective's data (communicator::allocate):
  /// single-copy steps read it in place instead of through the kernel. Without single
  /// copy it is ordinary memory to the collectives. Any thread; it may outlive the
  /// transport.
  shared_memory allocate_shared(std::size_t bytes) { return shared_memory::make(regions_, bytes); }

  /// Which of this rank's shared regions holds all of `data` (serial 0: none).
  shared_region region_of(std::span<const std::byte> data) const { return regions_->find(data); }

  /// `bytes` at `address` in the region `peer` described, mapped read-only into this
  /// process (once; kept until the owner frees it); empty when it cannot be mapped.
  std::span<const std::byte> map_peer(rank_t peer, const shared_region& region, std::uint64_t address,
                                      std::size_t bytes) {
    if (!single_copy_ || peer == rank()) return {};
    return peer_regions_->view(peer, region, address, bytes);
  }

  /// How many of the peers' shared regions this rank has mapped now.
  std::size_t mapped_peer_regions() const { return peer_regions_->mapped_count(); }

  /// Copies into.size() bytes from `address` in `peer`'s memory (process_vm_readv).
  /// peer_lost when its process is gone or the memory no longer mapped (it left the call).
  std::error_code read_peer(rank_t peer, std::uint64_t address, std::span<std::byte> into) {
    if (!single_copy_ || peer >= pids_.size() || peer == rank()) return make_error_code(errc::invalid_argument);
    std::size_t done = 0;
    while (done < into.size()) {
      const iovec local{into.data() + done, into.size() - done};
      const iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + done)), into.size() - done};
      const ssize_t n = ::process_vm_readv(pids_[peer], &local, 1, &remote, 1, 0);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return make_error_code(errno == ESRCH || errno == EFAULT || n == 0 ? errc::peer_lost : errc::invalid_argument);
    }
    return {};
  }

 private:
  transport(std::unique_ptr<stream::engine> core, std::chrono::milliseconds job_timeout, std::vector<pid_t> pids,
            bool single_copy, std::unique_ptr<std::uint64_t> probe)
      : stream::endpoint(std::move(core), job_timeout), pids_(std::move(pids)), single_copy_(single_copy), probe_(std::move(probe)),
        peer_regions_(std::make_unique<detail::peer_regions>(pids_)) {}

  /// Each rank reads every peer's probe word; single copy is on only if every rank
  /// read every word. Rank 0 says why not, once for the job.
  template <rendezvous::store Store>
  static bool agree_on_single_copy(const rendezvous::job& job, Store& store, const detail::rank_slot* slots,
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

  std::vector<pid_t> pids_;
  bool single_copy_ = false;
  std::unique_ptr<std::uint64_t> probe_;  // read by the peers' probes at join
  std::shared_ptr<detail::region_registry> regions_ = std::make_shared<detail::region_registry>();
  std::unique_ptr<detail::peer_regions> peer_regions_;  // behind a pointer: it holds a mutex, the transport moves
};

static_assert(qcoll::shared_memory_transport<transport>);

}  // namespace qcoll::transports::shm
