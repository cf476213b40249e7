#pragma once
/// @file
/// Shared buffers of the shm transport: memory a rank allocates through its transport
/// (communicator::allocate) that the job's other ranks map into their own address
/// space, so a single-copy ring step reduces or copies straight from the peer's buffer
/// instead of through the kernel's cross-memory-attach copy, the copy that caps the
/// single-copy path on user memory (docs/transports-performance.md).
///
/// A region is an anonymous memfd — no name in /dev/shm, so nothing is left behind by a
/// crash — sealed against resizing, so a peer's mapping can never fault past its end,
/// with one header page before the caller's bytes. A peer fetches the descriptor from
/// the owner's process with pidfd_getfd, which needs the permission process_vm_readv
/// needs (join probed it), maps it read-only once and keeps the mapping, keyed by the
/// region's serial, until the owner frees the region: the owner then sets `freed` in the
/// header, and the peer drops the mapping at its next step that maps peer memory (or
/// when the transport ends). Where the fetch fails (a kernel older than 5.6, a seccomp filter),
/// the step reads with process_vm_readv as before.

#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::transports::shm {

namespace detail {

inline constexpr std::uint64_t region_magic = 0x71636f6c6c627566ULL;  // "qcollbuf"
/// The header takes a whole page, so the caller's bytes start page-aligned.
inline constexpr std::size_t region_header_bytes = 4096;
/// A peer keeps at most this many mappings of one owner's live regions; past it the
/// oldest is dropped (and mapped again if a step needs it).
inline constexpr std::size_t max_mapped_regions_per_peer = 64;

struct region_header {
  std::uint64_t magic;
  std::uint64_t serial;
  std::uint64_t bytes;             // the caller's bytes, after the header page
  std::atomic<std::uint32_t> freed;  // set by the owner before it unmaps: peers drop their mapping
};

inline std::size_t region_file_bytes(std::size_t bytes) noexcept {
  return region_header_bytes + (bytes + region_header_bytes - 1) / region_header_bytes * region_header_bytes;
}

/// This rank's live regions, found by address. Shared by the transport and every
/// region (a buffer may outlive its transport); allocations and lookups may come from
/// different threads (a started collective runs on the progress thread).
class region_registry {
 public:
  std::uint64_t add(std::uintptr_t begin, std::size_t bytes, int fd) {
    std::lock_guard lock(mutex_);
    entries_.push_back({begin, bytes, next_serial_, fd});
    return next_serial_++;
  }
  void remove(std::uint64_t serial) {
    std::lock_guard lock(mutex_);
    std::erase_if(entries_, [&](const entry& e) { return e.serial == serial; });
  }
  /// The region that holds all of `data`; serial 0 when none does.
  shared_region find(std::span<const std::byte> data) const {
    const auto begin = reinterpret_cast<std::uintptr_t>(data.data());
    std::lock_guard lock(mutex_);
    for (const entry& e : entries_)
      if (begin >= e.begin && data.size() <= e.bytes && begin - e.begin <= e.bytes - data.size())
        return {e.serial, static_cast<std::uint64_t>(e.fd), e.begin, e.bytes};
    return {};
  }

 private:
  struct entry {
    std::uintptr_t begin;
    std::size_t bytes;
    std::uint64_t serial;
    int fd;
  };
  mutable std::mutex mutex_;
  std::vector<entry> entries_;
  std::uint64_t next_serial_ = 1;
};

[[noreturn]] inline void fail_region(const char* what, std::size_t bytes) {
  qcoll::detail::throw_error(errc::invalid_argument, "shm transport: allocating {} shared bytes: {} failed: {}", bytes,
                             what, std::strerror(errno));
}

}  // namespace detail

/// Memory from transport::allocate_shared that the job's other ranks can map. Move-only;
/// zero-filled and faulted in when made; page-aligned.
class shared_memory {
 public:
  shared_memory() = default;
  shared_memory(shared_memory&& other) noexcept
      : registry_(std::move(other.registry_)), file_(std::exchange(other.file_, nullptr)),
        file_bytes_(other.file_bytes_), bytes_(other.bytes_), fd_(std::exchange(other.fd_, -1)),
        serial_(other.serial_) {}
  shared_memory& operator=(shared_memory other) noexcept {
    std::swap(registry_, other.registry_);
    std::swap(file_, other.file_);
    std::swap(file_bytes_, other.file_bytes_);
    std::swap(bytes_, other.bytes_);
    std::swap(fd_, other.fd_);
    std::swap(serial_, other.serial_);
    return *this;
  }
  ~shared_memory() {
    if (!file_) return;
    registry_->remove(serial_);
    header().freed.store(1, std::memory_order_release);  // before the unmap: peers read it through their mapping
    ::munmap(file_, file_bytes_);
    ::close(fd_);
  }

  std::span<std::byte> bytes() const noexcept {
    return file_ ? std::span<std::byte>(static_cast<std::byte*>(file_) + detail::region_header_bytes, bytes_)
                 : std::span<std::byte>();
  }

  /// A new region of `bytes` (callers: transport::allocate_shared).
  static shared_memory make(std::shared_ptr<detail::region_registry> registry, std::size_t bytes) {
    shared_memory memory;
    memory.registry_ = std::move(registry);
    memory.bytes_ = bytes;
    memory.file_bytes_ = detail::region_file_bytes(bytes);
    memory.fd_ = static_cast<int>(::syscall(SYS_memfd_create, "qcoll-shared-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (memory.fd_ < 0) detail::fail_region("memfd_create", bytes);
    if (::ftruncate(memory.fd_, static_cast<off_t>(memory.file_bytes_)) != 0) detail::fail_region("ftruncate", bytes);
    if (::fcntl(memory.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      detail::fail_region("sealing", bytes);
    // Faulted in now, as the peers' benchmarks do: a first touch inside a call costs a
    // page fault per 4 KiB (docs/transports-performance.md).
    void* file = ::mmap(nullptr, memory.file_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memory.fd_, 0);
    if (file == MAP_FAILED) detail::fail_region("mmap", bytes);
    memory.file_ = file;
    const auto begin = reinterpret_cast<std::uintptr_t>(memory.bytes().data());
    memory.serial_ = memory.registry_->add(begin, bytes, memory.fd_);
    auto* header = new (file) detail::region_header{detail::region_magic, memory.serial_, bytes, {0}};
    (void)header;
    return memory;
  }

 private:
  detail::region_header& header() const noexcept { return *static_cast<detail::region_header*>(file_); }

  std::shared_ptr<detail::region_registry> registry_;
  void* file_ = nullptr;
  std::size_t file_bytes_ = 0;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  std::uint64_t serial_ = 0;
};

namespace detail {

/// The peers' regions this rank has mapped, read-only, per owner.
class peer_regions {
 public:
  explicit peer_regions(std::vector<pid_t> pids) : pids_(std::move(pids)), by_peer_(pids_.size()) {
    pidfds_.assign(pids_.size(), -1);
    refused_.assign(pids_.size(), 0);
  }
  peer_regions(const peer_regions&) = delete;
  peer_regions& operator=(const peer_regions&) = delete;
  ~peer_regions() {
    for (auto& regions : by_peer_)
      for (mapped& m : regions) m.unmap();
    for (const int fd : pidfds_)
      if (fd >= 0) ::close(fd);
  }

  /// `bytes` at `address` of the region `peer` described, mapped here; empty when the
  /// description does not hold the range or the region cannot be mapped (the caller
  /// then reads through the kernel).
  std::span<const std::byte> view(rank_t peer, const shared_region& region, std::uint64_t address,
                                  std::size_t bytes) {
    if (region.serial == 0 || peer >= pids_.size() || address < region.base || bytes > region.bytes ||
        address - region.base > region.bytes - bytes)
      return {};
    std::lock_guard lock(mutex_);
    // Drop what any owner has freed since: its pages go back to the system only once
    // every mapping of them is gone. A load per mapping, against a step of ≥ 256 KiB.
    for (std::vector<mapped>& of_peer : by_peer_)
      std::erase_if(of_peer, [](mapped& m) {
        if (m.header().freed.load(std::memory_order_acquire) == 0) return false;
        m.unmap();
        return true;
      });
    std::vector<mapped>& regions = by_peer_[peer];
    auto found = std::find_if(regions.begin(), regions.end(), [&](const mapped& m) { return m.serial == region.serial; });
    if (found == regions.end()) {
      if (refused_[peer]) return {};
      mapped fresh = map(peer, region);
      if (!fresh.file) return {};
      if (regions.size() >= max_mapped_regions_per_peer) {
        regions.front().unmap();
        regions.erase(regions.begin());
      }
      regions.push_back(fresh);
      found = regions.end() - 1;
    }
    if (found->base != region.base || found->bytes != region.bytes) return {};
    return {found->file + region_header_bytes + (address - region.base), bytes};
  }

  /// How many peer regions are mapped now (all peers).
  std::size_t mapped_count() {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& regions : by_peer_) n += regions.size();
    return n;
  }

 private:
  struct mapped {
    std::uint64_t serial = 0;
    std::uint64_t base = 0;  // where the caller's bytes lie in the owner's address space
    std::size_t bytes = 0;
    std::byte* file = nullptr;
    std::size_t file_bytes = 0;
    const region_header& header() const noexcept { return *reinterpret_cast<const region_header*>(file); }
    void unmap() noexcept {
      if (file) ::munmap(file, file_bytes);
      file = nullptr;
    }
  };

  /// Fetches the owner's descriptor and maps the region; {} when that fails. A refused
  /// fetch (no permission, no such call) is not tried again for that peer.
  mapped map(rank_t peer, const shared_region& region) {
    if (pidfds_[peer] < 0) pidfds_[peer] = static_cast<int>(::syscall(SYS_pidfd_open, pids_[peer], 0));
    if (pidfds_[peer] < 0 || region.handle > static_cast<std::uint64_t>(INT32_MAX)) return {};
    const int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfds_[peer], static_cast<int>(region.handle), 0));
    if (fd < 0) {
      if (errno == EPERM || errno == ENOSYS) refused_[peer] = 1;
      return {};
    }
    mapped m{region.serial, region.base, region.bytes, nullptr, region_file_bytes(region.bytes)};
    struct stat info {};
    // The descriptor must be the region described: the right size (sealed, so it stays
    // that) and, once mapped, the right header.
    if (::fstat(fd, &info) == 0 && static_cast<std::size_t>(info.st_size) == m.file_bytes) {
      void* file = ::mmap(nullptr, m.file_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (file != MAP_FAILED) m.file = static_cast<std::byte*>(file);
    }
    ::close(fd);
    if (m.file && (m.header().magic != region_magic || m.header().serial != region.serial ||
                   m.header().bytes != region.bytes || m.header().freed.load(std::memory_order_acquire) != 0))
      m.unmap();
    return m;
  }

  std::mutex mutex_;
  std::vector<pid_t> pids_;
  std::vector<std::vector<mapped>> by_peer_;
  std::vector<int> pidfds_;  // opened at the first region of each peer
  std::vector<char> refused_;
};

}  // namespace detail

}  // namespace qcoll::transports::shm
