#pragma once
/// @file
/// qcoll::buffer: memory for a collective's data, from communicator::allocate — where
/// the transport can, memory the peers map (the shm transport's shared buffers, so a
/// large step reads it in place), else ordinary memory. In the spirit of
/// MPI_Alloc_mem and ncclMemAlloc: collectives take any span; this memory makes them
/// faster where the transport knows how.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <utility>

namespace qcoll {

/// `count` elements of T that own their memory: zero-filled, at least 64-byte aligned,
/// faulted in when made. A contiguous range that converts to std::span<T>; move-only.
template <class T>
class buffer {
 public:
  buffer() = default;
  /// `values`, kept alive by `owner` (what allocated them).
  buffer(std::span<T> values, std::shared_ptr<void> owner) : values_(values), owner_(std::move(owner)) {}
  buffer(buffer&& other) noexcept
      : values_(std::exchange(other.values_, {})), owner_(std::move(other.owner_)) {}
  buffer& operator=(buffer&& other) noexcept {
    values_ = std::exchange(other.values_, {});
    owner_ = std::move(other.owner_);
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  /// `count` elements of ordinary memory (what transports without shared memory get).
  static buffer on_heap(std::size_t count) {
    const std::size_t bytes = checked_bytes(count);
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    void* memory = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
    if (rounded != 0 && !memory) throw std::bad_alloc();
    if (memory) std::memset(memory, 0, rounded);
    return buffer({static_cast<T*>(memory), count}, std::shared_ptr<void>(memory, [](void* p) { std::free(p); }));
  }

  /// count · sizeof(T), or invalid_argument when it does not fit a size_t.
  static std::size_t checked_bytes(std::size_t count) {
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T))
      detail::throw_error(errc::invalid_argument, "buffer of {} elements of {} bytes: the size overflows", count,
                          sizeof(T));
    return count * sizeof(T);
  }

  T* data() const noexcept { return values_.data(); }
  std::size_t size() const noexcept { return values_.size(); }
  bool empty() const noexcept { return values_.empty(); }
  T* begin() const noexcept { return values_.data(); }
  T* end() const noexcept { return values_.data() + values_.size(); }
  T& operator[](std::size_t i) const noexcept { return values_[i]; }
  std::span<T> span() const noexcept { return values_; }
  operator std::span<T>() const noexcept { return values_; }
  operator std::span<const T>() const noexcept { return values_; }

 private:
  std::span<T> values_;
  std::shared_ptr<void> owner_;
};

}  // namespace qcoll
