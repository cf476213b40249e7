#pragma once
/// @file
/// value_view: the values of one call of a plan, whatever plan — one span, or a fused
/// call's tensors laid end to end. Shared by every plan (plan_base.hpp hands it to a
/// plan's algorithm) and the quantized schedules' runner.

#include <qcoll/core/partition.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

namespace qcoll::algorithms {

/// The values a call reads or writes: one span, or a fused plan's tensors laid end
/// to end (tensor k starts at starts[k] of the whole). Every step's values lie in
/// one tensor (stripe_layout cuts pieces where tensors end).
template <class T>
class value_view {
 public:
  using tensor = std::span<std::remove_const_t<T>>;

  value_view(std::span<T> whole) noexcept : whole_(whole) {}  // NOLINT: a span is a view of one tensor
  value_view(std::span<const tensor> tensors, std::span<const std::size_t> starts) noexcept
      : tensors_(tensors), starts_(starts) {}

  std::span<T> of(block_range r) const noexcept {
    if (tensors_.empty()) return r.of(whole_);
    const std::size_t k =
        static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), r.offset) - starts_.begin()) - 1;
    return std::span<T>(tensors_[k]).subspan(r.offset - starts_[k], r.size);
  }
  /// Whether both name the same memory (a call in place).
  template <class U>
  bool same_as(const value_view<U>& other) const noexcept {
    return static_cast<const void*>(whole_.data()) == static_cast<const void*>(other.whole_.data()) &&
           tensors_.data() == other.tensors_.data();
  }
  /// Copies every value into `into` (the same tensors' sizes).
  void copy_to(const value_view<std::remove_const_t<T>>& into) const {
    if (tensors_.empty()) {
      std::copy(whole_.begin(), whole_.end(), into.whole_.begin());
      return;
    }
    for (std::size_t k = 0; k < tensors_.size(); ++k) std::copy(tensors_[k].begin(), tensors_[k].end(), into.of({starts_[k], tensors_[k].size()}).begin());
  }

 private:
  template <class>
  friend class value_view;
  std::span<T> whole_;
  std::span<const tensor> tensors_;
  std::span<const std::size_t> starts_;
};

}  // namespace qcoll::algorithms
