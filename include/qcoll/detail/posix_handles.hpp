#pragma once
/// @file
/// POSIX handles as move-only objects that release them on destruction — a memory
/// mapping and a file descriptor — and fetching another process's descriptor
/// (pidfd_getfd): what the shm transport's segment and shared buffers
/// (transports/shm.hpp, shm_shared_memory.hpp) and the emulated device's memory and
/// events (device/emulated/) share.

#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <utility>

namespace qcoll::detail {

/// A memory mapping (the job's segment, a shared buffer); unmapped on destruction.
class mapping {
 public:
  mapping() = default;
  mapping(void* base, std::size_t bytes) : base_(base), bytes_(bytes) {}
  mapping(mapping&& other) noexcept : base_(std::exchange(other.base_, nullptr)), bytes_(other.bytes_) {}
  mapping& operator=(mapping&& other) noexcept {
    std::swap(base_, other.base_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~mapping() {
    if (base_) ::munmap(base_, bytes_);
  }
  std::byte* base() const noexcept { return static_cast<std::byte*>(base_); }

 private:
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
};

class file_descriptor {
 public:
  explicit file_descriptor(int fd = -1) noexcept : fd_(fd) {}
  file_descriptor(file_descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  file_descriptor& operator=(file_descriptor&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~file_descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

/// A descriptor for process `pid` (pidfd_open); invalid (-1) when it is gone or the call is refused.
inline file_descriptor open_process(pid_t pid) noexcept {
  return file_descriptor(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
}

/// A copy of descriptor `fd` of the process behind `process` (pidfd_getfd, Linux 5.6;
/// the permission process_vm_readv needs); invalid (-1, errno set) when refused.
inline file_descriptor fetch_descriptor(const file_descriptor& process, int fd) noexcept {
  return file_descriptor(static_cast<int>(::syscall(SYS_pidfd_getfd, process.get(), fd, 0)));
}

}  // namespace qcoll::detail
