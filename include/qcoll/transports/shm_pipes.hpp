#pragma once
/// @file
/// The shm transport's segment and its pipes (shm.hpp has the design): the layout of a
/// job's segment — a header, a doorbell per rank, a byte pipe per ordered pair of
/// ranks — its creation by rank 0 and attachment by the others, and shm_channels, the
/// stream engine's channels over those pipes. On its own because it is the part that
/// touches the shared memory; shm.hpp's transport joins the job and wires it up.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/detail/posix_handles.hpp>
#include <qcoll/transports/stream/engine.hpp>
#include <qcoll/tuning/table.hpp>

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qcoll::transports::shm {

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

}  // namespace qcoll::transports::shm
