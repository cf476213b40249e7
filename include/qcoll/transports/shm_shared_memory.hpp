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
#include <qcoll/detail/posix_handles.hpp>

#include <fcntl.h>
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
#include <new>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::transports::shm {

namespace detail {
using qcoll::detail::file_descriptor;
using qcoll::detail::mapping;

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
  shared_memory(shared_memory&&) noexcept = default;  // the moved-from one maps nothing
  shared_memory& operator=(shared_memory&&) = delete;
  ~shared_memory() {
    if (!file_.base()) return;
    registry_->remove(serial_);
    header().freed.store(1, std::memory_order_release);  // before the unmap: peers read it through their mapping
  }

  std::span<std::byte> bytes() const noexcept {
    return file_.base() ? std::span<std::byte>(file_.base() + detail::region_header_bytes, bytes_)
                        : std::span<std::byte>();
  }

  /// A new region of `bytes` (callers: transport::allocate_shared).
  static shared_memory make(std::shared_ptr<detail::region_registry> registry, std::size_t bytes) {
    const std::size_t file_bytes = detail::region_file_bytes(bytes);
    detail::file_descriptor fd(
        static_cast<int>(::syscall(SYS_memfd_create, "qcoll-shared-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
    if (fd.get() < 0) detail::fail_region("memfd_create", bytes);
    if (::ftruncate(fd.get(), static_cast<off_t>(file_bytes)) != 0) detail::fail_region("ftruncate", bytes);
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
      detail::fail_region("sealing", bytes);
    // Faulted in now, as the peers' benchmarks do: a first touch inside a call costs a
    // page fault per 4 KiB (docs/transports-performance.md).
    void* file = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
    if (file == MAP_FAILED) detail::fail_region("mmap", bytes);
    shared_memory memory(std::move(registry), detail::mapping(file, file_bytes), std::move(fd), bytes);
    new (file) detail::region_header{detail::region_magic, memory.serial_, bytes, {0}};
    return memory;
  }

 private:
  shared_memory(std::shared_ptr<detail::region_registry> registry, detail::mapping file, detail::file_descriptor fd,
                std::size_t bytes)
      : registry_(std::move(registry)), file_(std::move(file)), fd_(std::move(fd)), bytes_(bytes),
        serial_(registry_->add(reinterpret_cast<std::uintptr_t>(this->bytes().data()), bytes, fd_.get())) {}

  detail::region_header& header() const noexcept { return *reinterpret_cast<detail::region_header*>(file_.base()); }

  std::shared_ptr<detail::region_registry> registry_;
  detail::mapping file_;       // the header page, then the caller's bytes
  detail::file_descriptor fd_;  // kept open: peers fetch it (pidfd_getfd) while the region lives
  std::size_t bytes_ = 0;
  std::uint64_t serial_ = 0;
};

namespace detail {

/// The peers' regions this rank has mapped, read-only, per owner.
class peer_regions {
 public:
  explicit peer_regions(std::vector<pid_t> pids)
      : pids_(std::move(pids)), by_peer_(pids_.size()), pidfds_(pids_.size()), refused_(pids_.size(), 0) {}

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
      std::erase_if(of_peer, [](const mapped& m) { return m.header().freed.load(std::memory_order_acquire) != 0; });
    std::vector<mapped>& regions = by_peer_[peer];
    auto found = std::find_if(regions.begin(), regions.end(), [&](const mapped& m) { return m.serial == region.serial; });
    if (found == regions.end()) {
      if (refused_[peer]) return {};
      mapped fresh = map(peer, region);
      if (!fresh.file.base()) return {};
      if (regions.size() >= max_mapped_regions_per_peer) regions.erase(regions.begin());
      regions.push_back(std::move(fresh));
      found = regions.end() - 1;
    }
    if (found->base != region.base || found->bytes != region.bytes) return {};
    return {found->file.base() + region_header_bytes + (address - region.base), bytes};
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
    mapping file;            // read-only: the header page, then the bytes
    const region_header& header() const noexcept { return *reinterpret_cast<const region_header*>(file.base()); }
  };

  /// Fetches the owner's descriptor and maps the region; one that maps nothing when that
  /// fails. A refused fetch (no permission, no such call) is not tried again for that peer.
  mapped map(rank_t peer, const shared_region& region) {
    if (pidfds_[peer].get() < 0) pidfds_[peer] = qcoll::detail::open_process(pids_[peer]);
    if (pidfds_[peer].get() < 0 || region.handle > static_cast<std::uint64_t>(INT32_MAX)) return {};
    const file_descriptor fd = qcoll::detail::fetch_descriptor(pidfds_[peer], static_cast<int>(region.handle));
    if (fd.get() < 0) {
      if (errno == EPERM || errno == ENOSYS) refused_[peer] = 1;
      return {};
    }
    // The descriptor must be the region described: the right size (sealed, so it stays
    // that) and, once mapped, the right header.
    const std::size_t file_bytes = region_file_bytes(region.bytes);
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0 || static_cast<std::size_t>(info.st_size) != file_bytes) return {};
    void* file = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
    if (file == MAP_FAILED) return {};
    mapped m{region.serial, region.base, region.bytes, mapping(file, file_bytes)};
    if (m.header().magic != region_magic || m.header().serial != region.serial || m.header().bytes != region.bytes ||
        m.header().freed.load(std::memory_order_acquire) != 0)
      return {};
    return m;
  }

  std::mutex mutex_;
  std::vector<pid_t> pids_;
  std::vector<std::vector<mapped>> by_peer_;
  std::vector<file_descriptor> pidfds_;  // opened at the first region of each peer
  std::vector<char> refused_;
};

}  // namespace detail

}  // namespace qcoll::transports::shm
