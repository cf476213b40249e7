#pragma once
/// @file
/// The emulated device's memory: device allocations are host memory that the
/// registry knows as device memory of one ordinal, so `locate` tells them from any
/// other host memory and a host pointer given where device memory is due is refused.
/// Each device allocation is an anonymous memfd mapped shared, so another process can
/// open it through an IPC handle (pidfd_getfd, as the shm transport's shared buffers);
/// pinned host memory is an anonymous mapping the registry knows as pinned. Work
/// queued on a stream is checked against the registry: a kernel or copy that reaches
/// past an allocation is an illegal-address error, as compute-sanitizer would report.

#include <qcoll/detail/posix_handles.hpp>
#include <qcoll/device/emulated/codes.hpp>
#include <qcoll/device/emulated/memfd.hpp>
#include <qcoll/device/runtime.hpp>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

namespace qcoll::device::emulated_detail {

enum class memory_kind : std::uint8_t { device, pinned, opened };

/// One allocation: where it is, what it is, and (device memory) the memfd behind it.
struct allocation {
  std::size_t bytes = 0;    ///< what the caller asked for
  std::size_t mapped = 0;   ///< what is mapped (whole pages, at least one)
  memory_kind kind = memory_kind::device;
  int ordinal = -1;         ///< its device (device and opened memory)
  std::uint64_t id = 0;     ///< names the memfd, so an IPC handle can be checked
  detail::file_descriptor fd;  ///< device memory: kept open while it lives, for export
};

/// What an IPC handle of emulated memory carries.
struct memory_handle {
  std::uint64_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::uint64_t id;
  std::uint64_t bytes;
  std::int32_t ordinal;
};
inline constexpr std::uint64_t memory_handle_magic = 0x71636f6c6c646d65ULL;  // "qcolldme"
static_assert(sizeof(memory_handle) <= sizeof(ipc_handle));

/// Every allocation of this process, by start address.
class memory_registry {
 public:
  memory_registry() {
    // A descriptor per device allocation: lift the soft limit to the hard one, once.
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &files);
    }
  }

  int allocate_device(std::size_t bytes, int ordinal, void** pointer) {
    *pointer = nullptr;
    if (bytes == 0) return success;  // as cudaMalloc(0): no memory, no error
    const std::uint64_t id = next_id();
    detail::file_descriptor fd = make_memfd(memfd_name("device", ::getpid(), id));
    const std::size_t mapped = whole_pages(bytes);
    if (fd.get() < 0 || ::ftruncate(fd.get(), static_cast<off_t>(mapped)) != 0) return out_of_memory;
    void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (memory == MAP_FAILED) return out_of_memory;
    add(memory, {bytes, mapped, memory_kind::device, ordinal, id, std::move(fd)});
    *pointer = memory;
    return success;
  }

  int allocate_pinned(std::size_t bytes, void** pointer) {
    *pointer = nullptr;
    if (bytes == 0) return success;
    const std::size_t mapped = whole_pages(bytes);
    void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return out_of_memory;
    add(memory, {bytes, mapped, memory_kind::pinned, -1, next_id(), detail::file_descriptor()});
    *pointer = memory;
    return success;
  }

  /// Unmaps the allocation of `kind` that starts at `pointer`.
  int release(void* pointer, memory_kind kind) {
    if (pointer == nullptr) return success;
    std::unique_lock lock(mutex_);
    const auto found = allocations_.find(address(pointer));
    if (found == allocations_.end() || found->second.kind != kind) return invalid_value;
    const std::size_t mapped = found->second.mapped;
    allocations_.erase(found);  // closes the memfd: the memory lives on only in other processes' mappings
    lock.unlock();
    ::munmap(pointer, mapped);
    return success;
  }

  pointer_facts locate(const void* pointer) const {
    std::lock_guard lock(mutex_);
    const auto* hit = find(address(pointer), 1);
    if (!hit || hit->kind == memory_kind::pinned) return {};
    return {true, hit->ordinal};
  }

  /// Whether [pointer, pointer + bytes) lies in one allocation a kernel may touch:
  /// device memory (`ordinal`'s, unless −1) or pinned host memory.
  bool reachable(const void* pointer, std::size_t bytes, int ordinal = -1) const {
    if (bytes == 0) return true;
    std::lock_guard lock(mutex_);
    const auto* hit = find(address(pointer), bytes);
    return hit && (hit->kind == memory_kind::pinned || ordinal < 0 || hit->ordinal == ordinal);
  }

  /// Whether any byte of the range is in a device allocation (copies check these).
  bool touches_device(const void* pointer, std::size_t bytes) const {
    if (bytes == 0) return false;
    std::lock_guard lock(mutex_);
    const std::uintptr_t begin = address(pointer), end = begin + bytes;
    auto next = allocations_.upper_bound(begin);
    if (next != allocations_.begin()) {
      const auto at = std::prev(next);
      if (at->second.kind != memory_kind::pinned && begin < at->first + at->second.bytes) return true;
    }
    return next != allocations_.end() && next->first < end && next->second.kind != memory_kind::pinned;
  }

  int export_memory(void* base, ipc_handle* handle) const {
    std::lock_guard lock(mutex_);
    const auto found = allocations_.find(address(base));
    if (found == allocations_.end() || found->second.kind != memory_kind::device) return invalid_value;
    const allocation& a = found->second;
    const memory_handle described{memory_handle_magic, static_cast<std::int32_t>(::getpid()), a.fd.get(), a.id,
                                  a.bytes, a.ordinal};
    *handle = {};
    std::memcpy(handle->bytes, &described, sizeof described);
    return success;
  }

  /// Maps the memory another process exported. A handle whose process is gone, or whose
  /// descriptor now names another memfd (a stale handle of an earlier job), is refused.
  int open_memory(const ipc_handle& handle, void** pointer) {
    *pointer = nullptr;
    memory_handle described{};
    std::memcpy(&described, handle.bytes, sizeof described);
    if (described.magic != memory_handle_magic || described.bytes == 0) return invalid_handle;
    const detail::file_descriptor process = detail::open_process(described.pid);
    if (process.get() < 0) return invalid_handle;
    detail::file_descriptor fd = detail::fetch_descriptor(process, described.fd);
    if (fd.get() < 0 || !names_memfd(fd, memfd_name("device", described.pid, described.id))) return invalid_handle;
    const std::size_t mapped = whole_pages(static_cast<std::size_t>(described.bytes));
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0 || static_cast<std::size_t>(info.st_size) != mapped) return invalid_handle;
    void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (memory == MAP_FAILED) return out_of_memory;
    add(memory, {static_cast<std::size_t>(described.bytes), mapped, memory_kind::opened, described.ordinal,
                 described.id, detail::file_descriptor()});
    *pointer = memory;
    return success;
  }

  /// Device and pinned allocations not released (opened mappings not counted).
  std::size_t owned() const {
    std::lock_guard lock(mutex_);
    std::size_t count = 0;
    for (const auto& [begin, a] : allocations_) count += a.kind != memory_kind::opened;
    return count;
  }

  static std::size_t whole_pages(std::size_t bytes) noexcept {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    return bytes == 0 ? page : (bytes + page - 1) / page * page;
  }

 private:
  static std::uintptr_t address(const void* pointer) noexcept { return reinterpret_cast<std::uintptr_t>(pointer); }

  std::uint64_t next_id() {
    std::lock_guard lock(mutex_);
    return ++last_id_;
  }

  void add(void* memory, allocation entry) {
    std::lock_guard lock(mutex_);
    allocations_.emplace(address(memory), std::move(entry));
  }

  /// The allocation that holds all of [begin, begin + bytes), or null.
  const allocation* find(std::uintptr_t begin, std::size_t bytes) const {
    auto next = allocations_.upper_bound(begin);
    if (next == allocations_.begin()) return nullptr;
    const auto at = std::prev(next);
    const std::uintptr_t offset = begin - at->first;
    if (offset >= at->second.bytes || bytes > at->second.bytes - offset) return nullptr;
    return &at->second;
  }

  mutable std::mutex mutex_;
  std::map<std::uintptr_t, allocation> allocations_;
  std::uint64_t last_id_ = 0;
};

}  // namespace qcoll::device::emulated_detail
