#pragma once
/// @file
/// Device objects through the active device runtime (execution/dispatch.hpp), for code
/// built by any compiler, each released by the runtime that made it:
/// - `device_memory<T>`: `count` values on the current device (cudaMalloc), with
///   copies to and from host spans;
/// - `pinned_memory<T>`: page-locked host memory (cudaMallocHost), what copies between
///   the host and the device overlap with other work through;
/// - `device_stream_owner` and `device_event`: a stream and an event.
/// Tests, benchmarks, communicators and plans make them once; no qcoll call makes
/// one per call.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace qcoll::execution {

namespace memory_detail {

/// Bytes one runtime allocated, released by it.
class allocation {
 public:
  enum class kind : std::uint8_t { device, pinned };

  allocation() = default;
  allocation(kind where, std::size_t bytes, const char* what) : kind_(where) {
    if (bytes == 0) return;
    runtime_ = &device_runtime(what);
    void* pointer = nullptr;
    const int code = where == kind::device ? runtime_->allocate(bytes, &pointer) : runtime_->allocate_host(bytes, &pointer);
    if (code != 0)
      detail::throw_error(errc::device_error, "{}: {} of {} bytes failed: {} error {}: {}", what,
                          where == kind::device ? "allocating device memory" : "allocating pinned host memory", bytes,
                          runtime_->name, code, runtime_->error_string(code));
    data_ = pointer;
  }
  allocation(allocation&& other) noexcept
      : runtime_(std::exchange(other.runtime_, nullptr)), data_(std::exchange(other.data_, nullptr)), kind_(other.kind_) {}
  allocation& operator=(allocation&& other) noexcept {
    std::swap(runtime_, other.runtime_);
    std::swap(data_, other.data_);
    std::swap(kind_, other.kind_);
    return *this;
  }
  ~allocation() {
    if (data_) kind_ == kind::device ? runtime_->release(data_) : runtime_->release_host(data_);
  }

  void* data() const noexcept { return data_; }
  const device::runtime* runtime() const noexcept { return runtime_; }

 private:
  const device::runtime* runtime_ = nullptr;
  void* data_ = nullptr;
  kind kind_ = kind::device;
};

}  // namespace memory_detail

template <class T>
class device_memory {
 public:
  device_memory() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when
  /// the allocation fails.
  explicit device_memory(std::size_t count)
      : memory_(memory_detail::allocation::kind::device, count * sizeof(T), "device_memory"), count_(count) {}
  device_memory(device_memory&& other) noexcept
      : memory_(std::move(other.memory_)), count_(std::exchange(other.count_, 0)) {}
  device_memory& operator=(device_memory&& other) noexcept {
    memory_ = std::move(other.memory_);
    std::swap(count_, other.count_);
    return *this;
  }

  std::span<T> span() const noexcept { return {data(), count_}; }
  T* data() const noexcept { return static_cast<T*>(memory_.data()); }
  std::size_t size() const noexcept { return count_; }

  /// Copies host values into the first from.size() values, and waits for the copy. It
  /// runs on the device's default stream, after the work queued there (work on other
  /// streams is the caller's to wait for first).
  void upload(std::span<const T> from) const {
    copy_and_wait(data(), from.data(), from.size_bytes(), "device_memory::upload");
  }
  /// Copies the first into.size() values to host memory, and waits for the copy (on the
  /// default stream, as upload).
  void download(std::span<T> into) const { copy_and_wait(into.data(), data(), into.size_bytes(), "device_memory::download"); }

 private:
  void copy_and_wait(void* to, const void* from, std::size_t bytes, const char* what) const {
    if (bytes > count_ * sizeof(T))
      detail::throw_error(errc::invalid_argument, "{}: {} bytes do not fit {} values", what, bytes, count_);
    if (bytes == 0) return;
    const auto& device = *memory_.runtime();
    check_device(device, device.copy(to, from, bytes, nullptr), what);
    check_device(device, device.synchronize(nullptr), what);
  }

  memory_detail::allocation memory_;
  std::size_t count_ = 0;
};

/// Page-locked host memory: copies between it and the device run while the host
/// does other work (a copy from ordinary memory may not).
template <class T>
class pinned_memory {
 public:
  pinned_memory() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when
  /// the allocation fails.
  explicit pinned_memory(std::size_t count)
      : memory_(memory_detail::allocation::kind::pinned, count * sizeof(T), "pinned_memory"), count_(count) {}
  pinned_memory(pinned_memory&& other) noexcept
      : memory_(std::move(other.memory_)), count_(std::exchange(other.count_, 0)) {}
  pinned_memory& operator=(pinned_memory&& other) noexcept {
    memory_ = std::move(other.memory_);
    std::swap(count_, other.count_);
    return *this;
  }

  std::span<T> span() const noexcept { return {data(), count_}; }
  T* data() const noexcept { return static_cast<T*>(memory_.data()); }
  std::size_t size() const noexcept { return count_; }

 private:
  memory_detail::allocation memory_;
  std::size_t count_ = 0;
};

/// A stream of the active runtime, on the current device; destroyed with the object
/// (after the work queued on it has run).
class device_stream_owner {
 public:
  device_stream_owner() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when it refuses.
  explicit device_stream_owner(const char* what) : runtime_(&device_runtime(what)) {
    check_device(*runtime_, runtime_->stream_create(&stream_), what);
  }
  device_stream_owner(device_stream_owner&& other) noexcept
      : runtime_(std::exchange(other.runtime_, nullptr)), stream_(std::exchange(other.stream_, nullptr)) {}
  device_stream_owner& operator=(device_stream_owner&& other) noexcept {
    std::swap(runtime_, other.runtime_);
    std::swap(stream_, other.stream_);
    return *this;
  }
  ~device_stream_owner() {
    if (stream_) runtime_->stream_destroy(stream_);
  }

  device::stream_handle get() const noexcept { return stream_; }
  explicit operator bool() const noexcept { return stream_ != nullptr; }

 private:
  const device::runtime* runtime_ = nullptr;
  device::stream_handle stream_ = nullptr;
};

/// An event of the active runtime (no timing).
class device_event {
 public:
  device_event() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when it refuses.
  explicit device_event(const char* what, bool interprocess = false) : runtime_(&device_runtime(what)) {
    check_device(*runtime_, runtime_->event_create(&event_, interprocess), what);
  }
  device_event(device_event&& other) noexcept
      : runtime_(std::exchange(other.runtime_, nullptr)), event_(std::exchange(other.event_, nullptr)) {}
  device_event& operator=(device_event&& other) noexcept {
    std::swap(runtime_, other.runtime_);
    std::swap(event_, other.event_);
    return *this;
  }
  ~device_event() {
    if (event_) runtime_->event_destroy(event_);
  }

  device::event_handle get() const noexcept { return event_; }
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  const device::runtime* runtime_ = nullptr;
  device::event_handle event_ = nullptr;
};

/// A word of device memory a decode's check reports into, one per thread (kept for
/// the thread's life): a blocking decode reads it back once its stream has run.
inline std::uint32_t* status_word() {
  thread_local device_memory<std::uint32_t> word;
  if (word.size() == 0) word = device_memory<std::uint32_t>(1);
  return word.data();
}

}  // namespace qcoll::execution
