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

/// `count` values of T in one allocation of `Kind`: what device_memory and
/// pinned_memory share.
template <class T, allocation::kind Kind>
class typed_allocation {
 public:
  typed_allocation() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when
  /// the allocation fails.
  typed_allocation(std::size_t count, const char* what) : memory_(Kind, count * sizeof(T), what), count_(count) {}
  typed_allocation(typed_allocation&& other) noexcept
      : memory_(std::move(other.memory_)), count_(std::exchange(other.count_, 0)) {}
  typed_allocation& operator=(typed_allocation&& other) noexcept {
    memory_ = std::move(other.memory_);
    std::swap(count_, other.count_);
    return *this;
  }

  std::span<T> span() const noexcept { return {data(), count_}; }
  T* data() const noexcept { return static_cast<T*>(memory_.data()); }
  std::size_t size() const noexcept { return count_; }

 protected:
  const device::runtime* runtime() const noexcept { return memory_.runtime(); }

 private:
  allocation memory_;
  std::size_t count_ = 0;
};

}  // namespace memory_detail

template <class T>
class device_memory : public memory_detail::typed_allocation<T, memory_detail::allocation::kind::device> {
  using base = memory_detail::typed_allocation<T, memory_detail::allocation::kind::device>;

 public:
  device_memory() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when
  /// the allocation fails.
  explicit device_memory(std::size_t count) : base(count, "device_memory") {}

  /// Copies host values into the first from.size() values, and waits for the copy. It
  /// runs on the device's default stream, after the work queued there (work on other
  /// streams is the caller's to wait for first).
  void upload(std::span<const T> from) const {
    copy_and_wait(this->data(), from.data(), from.size_bytes(), "device_memory::upload");
  }
  /// Copies the first into.size() values to host memory, and waits for the copy (on the
  /// default stream, as upload).
  void download(std::span<T> into) const {
    copy_and_wait(into.data(), this->data(), into.size_bytes(), "device_memory::download");
  }

 private:
  void copy_and_wait(void* to, const void* from, std::size_t bytes, const char* what) const {
    if (bytes > this->size() * sizeof(T))
      detail::throw_error(errc::invalid_argument, "{}: {} bytes do not fit {} values", what, bytes, this->size());
    if (bytes == 0) return;
    const auto& device = *this->runtime();
    check_device(device, device.copy(to, from, bytes, nullptr), what);
    check_device(device, device.synchronize(nullptr), what);
  }
};

/// Page-locked host memory: copies between it and the device run while the host
/// does other work (a copy from ordinary memory may not).
template <class T>
class pinned_memory : public memory_detail::typed_allocation<T, memory_detail::allocation::kind::pinned> {
  using base = memory_detail::typed_allocation<T, memory_detail::allocation::kind::pinned>;

 public:
  pinned_memory() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when
  /// the allocation fails.
  explicit pinned_memory(std::size_t count) : base(count, "pinned_memory") {}
};

namespace memory_detail {

/// A stream or an event of one runtime (Kind says which: how to make and destroy one),
/// destroyed by the runtime that made it.
template <class Kind>
class runtime_object {
 public:
  using handle = typename Kind::handle;

  runtime_object() = default;
  /// @throws qcoll::error: invalid_argument without a device runtime; device_error when it refuses.
  explicit runtime_object(const char* what, bool interprocess = false) : runtime_(&device_runtime(what)) {
    check_device(*runtime_, Kind::make(*runtime_, &handle_, interprocess), what);
  }
  runtime_object(runtime_object&& other) noexcept
      : runtime_(std::exchange(other.runtime_, nullptr)), handle_(std::exchange(other.handle_, nullptr)) {}
  runtime_object& operator=(runtime_object&& other) noexcept {
    std::swap(runtime_, other.runtime_);
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~runtime_object() {
    if (handle_) Kind::destroy(*runtime_, handle_);
  }

  handle get() const noexcept { return handle_; }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

 private:
  const device::runtime* runtime_ = nullptr;
  handle handle_ = nullptr;
};

struct stream_kind {
  using handle = device::stream_handle;
  static int make(const device::runtime& runtime, handle* made, bool) { return runtime.stream_create(made); }
  static int destroy(const device::runtime& runtime, handle gone) { return runtime.stream_destroy(gone); }
};
struct event_kind {
  using handle = device::event_handle;
  static int make(const device::runtime& runtime, handle* made, bool interprocess) {
    return runtime.event_create(made, interprocess);
  }
  static int destroy(const device::runtime& runtime, handle gone) { return runtime.event_destroy(gone); }
};

}  // namespace memory_detail

/// A stream of the active runtime, on the current device; destroyed with the object
/// (after the work queued on it has run).
using device_stream_owner = memory_detail::runtime_object<memory_detail::stream_kind>;

/// An event of the active runtime (no timing; `interprocess`: one another process may open).
using device_event = memory_detail::runtime_object<memory_detail::event_kind>;

/// Runs `make()` with device `ordinal` current on the calling thread, then makes the
/// previous one current again: memory, streams and events belong to the device that was
/// current when they were made, and a call's belong to its stream's device.
/// @throws qcoll::error (device_error) when the runtime refuses the device; what `make` throws.
template <class Make>
decltype(auto) with_current_device(const device::runtime& runtime, int ordinal, Make&& make) {
  int previous = 0;
  check_device(runtime, runtime.current_device(&previous), "finding the current device");
  if (previous == ordinal) return make();
  check_device(runtime, runtime.set_device(ordinal), "choosing a device");
  struct restore {
    const device::runtime& runtime;
    int ordinal;
    ~restore() { runtime.set_device(ordinal); }
  } const back{runtime, previous};
  return make();
}

/// A word of device memory a decode's check reports into, one per thread (kept for
/// the thread's life): a blocking decode reads it back once its stream has run.
inline std::uint32_t* status_word() {
  thread_local device_memory<std::uint32_t> word;
  if (word.size() == 0) word = device_memory<std::uint32_t>(1);
  return word.data();
}

}  // namespace qcoll::execution
