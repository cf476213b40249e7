#pragma once
/// @file
/// Requests a plan owns for whichever transport runs it: the plan is not a template
/// over the transport, so its requests are kept type-erased and made again only
/// when a larger number, or another transport's kind, is asked for. Requests do not
/// move while posted: the array is reallocated only between calls, when none is.

#include <cstddef>
#include <span>
#include <utility>

namespace qcoll::detail {

class request_storage {
 public:
  request_storage() = default;
  request_storage(request_storage&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        kind_(std::exchange(other.kind_, nullptr)),
        destroy_(std::exchange(other.destroy_, nullptr)) {}
  request_storage& operator=(request_storage&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      kind_ = std::exchange(other.kind_, nullptr);
      destroy_ = std::exchange(other.destroy_, nullptr);
    }
    return *this;
  }
  ~request_storage() { release(); }

  /// `count` requests of type `Request`, default-constructed when first made.
  template <class Request>
  std::span<Request> get(std::size_t count) {
    if (kind_ != &kind_of<Request> || size_ < count) {
      release();
      data_ = new Request[count];
      size_ = count;
      kind_ = &kind_of<Request>;
      destroy_ = [](void* p) noexcept { delete[] static_cast<Request*>(p); };
    }
    return {static_cast<Request*>(data_), count};
  }

 private:
  template <class Request>
  static constexpr char kind_of = 0;  // its address names the type

  void release() noexcept {
    if (destroy_ != nullptr) destroy_(data_);
    data_ = nullptr;
    size_ = 0;
    kind_ = nullptr;
    destroy_ = nullptr;
  }

  void* data_ = nullptr;
  std::size_t size_ = 0;
  const char* kind_ = nullptr;
  void (*destroy_)(void*) noexcept = nullptr;
};

}  // namespace qcoll::detail
