#pragma once
/// @file
/// GPU memory through the CUDA backend's table, for code built by any compiler:
/// `device_memory<T>` owns `count` values on the current device (cudaMalloc), and
/// copies to and from host spans. Tests, benchmarks and plans allocate with it
/// once; no qcoll call allocates device memory per call.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace qcoll::execution {

template <class T>
class device_memory {
 public:
  device_memory() = default;
  /// @throws qcoll::error: invalid_argument without the CUDA backend or a GPU;
  /// device_error when the allocation fails.
  explicit device_memory(std::size_t count) : count_(count) {
    if (count == 0) return;
    const auto& cuda = cuda_kernels("device_memory");
    void* pointer = nullptr;
    check_cuda(cuda, cuda.allocate(count * sizeof(T), &pointer), "device_memory: cudaMalloc");
    data_ = static_cast<T*>(pointer);
  }
  device_memory(device_memory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  device_memory& operator=(device_memory&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
    return *this;
  }
  ~device_memory() {
    if (data_) linked_cuda_kernels()->release(data_);
  }

  std::span<T> span() const noexcept { return {data_, count_}; }
  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }

  /// Copies host values into the first from.size() values, and waits for the copy.
  void upload(std::span<const T> from) const {
    copy_and_wait(data_, from.data(), from.size_bytes(), "device_memory::upload");
  }
  /// Copies the first into.size() values to host memory, and waits for the copy.
  void download(std::span<T> into) const { copy_and_wait(into.data(), data_, into.size_bytes(), "device_memory::download"); }

 private:
  void copy_and_wait(void* to, const void* from, std::size_t bytes, const char* what) const {
    if (bytes > count_ * sizeof(T))
      detail::throw_error(errc::invalid_argument, "{}: {} bytes do not fit {} values", what, bytes, count_);
    if (bytes == 0) return;
    const auto& cuda = cuda_kernels(what);
    check_cuda(cuda, cuda.copy(to, from, bytes, nullptr), what);
    check_cuda(cuda, cuda.synchronize(nullptr), what);
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
};

/// A word of device memory a decode's check reports into, one per thread (kept for
/// the thread's life): a blocking decode reads it back once its stream has run.
inline std::uint32_t* status_word() {
  thread_local device_memory<std::uint32_t> word;
  if (word.size() == 0) word = device_memory<std::uint32_t>(1);
  return word.data();
}

}  // namespace qcoll::execution
