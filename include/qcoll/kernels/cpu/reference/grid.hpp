#pragma once
/// @file
/// The reference kernels of the reproducible sum's float conversions: the per-value rules
/// of kernels/group/grid.hpp, one value at a time. Every other backend matches these bit
/// for bit.

#include <qcoll/kernels/group/grid.hpp>

#include <cstddef>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

struct grid_kernels {
  /// Raises exponents[b] to cover block b of `values` (exponents.size() blocks).
  static void cover(std::span<const float> values, std::span<double> exponents) noexcept {
    for (std::size_t b = 0; b < exponents.size(); ++b) {
      const std::size_t first = b * grid_detail::block;
      const std::size_t n = values.size() - first < grid_detail::block ? values.size() - first : grid_detail::block;
      exponents[b] = grid_detail::cover_block(values.data() + first, n, exponents[b]);
    }
  }

  /// sums[i] (+)= values[i] on its block's grid: written if `first`, else added.
  static void add(std::span<const float> values, std::span<const double> exponents, std::span<double> sums,
                  bool first) noexcept {
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double q = grid_detail::on_grid(values[i], grid_detail::to_grid(exponents[i / grid_detail::block]));
      sums[i] = first ? q : add_double(sums[i], q);
    }
  }

  /// out[i] = sums[i] back from the grid of block (first_index + i) / block, divided by
  /// `divide`.
  static void round(std::span<const double> sums, std::span<const double> exponents, double divide,
                    std::span<float> out, std::size_t first_index) noexcept {
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = grid_detail::rounded(sums[i], grid_detail::from_grid(exponents[(first_index + i) / grid_detail::block]),
                                    divide);
  }

 private:
  static double add_double(double a, double b) noexcept { return qcoll::kernels::add(a, b); }
};

}  // namespace reference
QCOLL_CPU_KERNELS_END
