#pragma once
/// @file
/// The two POSIX handles the shm transport owns — a memory mapping and a file
/// descriptor — as move-only objects that release them on destruction; shared by the
/// job's segment (shm.hpp) and the shared buffers (shm_shared_memory.hpp).

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <utility>

namespace qcoll::transports::shm::detail {

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

}  // namespace qcoll::transports::shm::detail
