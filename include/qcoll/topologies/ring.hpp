#pragma once
/// @file
/// Ranks on a ring: each rank is linked to the one before and the one after it.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>

#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

namespace qcoll::topologies {

class ring {
 public:
  static constexpr std::size_t max_fan_out = 2;

  /// Ranks 0, 1, …, size − 1 in order.
  explicit ring(rank_t size) : order_(size), position_(size) {
    if (size == 0) detail::throw_error(errc::invalid_argument, "ring topology: size must be at least 1");
    std::iota(order_.begin(), order_.end(), rank_t{0});
    std::iota(position_.begin(), position_.end(), rank_t{0});
  }

  /// A ring in a given order (say, to follow the physical layout): order[p] is the
  /// rank at position p. It must be a permutation of 0 … size − 1.
  explicit ring(std::vector<rank_t> order) : order_(std::move(order)), position_(order_.size()) {
    if (order_.empty()) detail::throw_error(errc::invalid_argument, "ring topology: size must be at least 1");
    std::vector<bool> seen(order_.size(), false);
    for (std::size_t p = 0; p < order_.size(); ++p) {
      const rank_t r = order_[p];
      if (r >= order_.size() || seen[r])
        detail::throw_error(errc::invalid_argument,
                            "ring topology: order is not a permutation of 0..{} (rank {} at position {})",
                            order_.size() - 1, r, p);
      seen[r] = true;
      position_[r] = p;
    }
  }

  rank_t size() const noexcept { return order_.size(); }
  std::span<const rank_t> ring_order() const noexcept { return order_; }
  rank_t position_of(rank_t r) const { return position_.at(r); }

  bool linked(rank_t a, rank_t b) const {
    const std::size_t n = size();
    const rank_t pa = position_.at(a);
    const rank_t pb = position_.at(b);
    return a != b && ((pa + 1) % n == pb || (pb + 1) % n == pa);
  }

 private:
  std::vector<rank_t> order_;
  std::vector<rank_t> position_;
};

static_assert(ring_topology<ring>);

}  // namespace qcoll::topologies
