#pragma once
/// @file
/// Every rank is linked to every other (a crossbar, a switch, shared memory).

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>

#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

namespace qcoll::topologies {

class fully_connected {
 public:
  static constexpr std::size_t max_fan_out = std::dynamic_extent;

  explicit fully_connected(rank_t size) : order_(size) {
    if (size == 0)
      detail::throw_error(errc::invalid_argument, "fully_connected topology: size must be at least 1");
    std::iota(order_.begin(), order_.end(), rank_t{0});
  }

  rank_t size() const noexcept { return order_.size(); }
  bool linked(rank_t a, rank_t b) const noexcept { return a != b && a < size() && b < size(); }
  /// Ring algorithms run over ranks in their natural order.
  std::span<const rank_t> ring_order() const noexcept { return order_; }

 private:
  std::vector<rank_t> order_;
};

static_assert(ring_topology<fully_connected>);

}  // namespace qcoll::topologies
