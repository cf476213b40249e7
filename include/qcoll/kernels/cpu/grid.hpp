#pragma once
/// @file
/// The reproducible sum's conversions (kernels/group/grid.hpp's rules): float, bfloat16
/// and float16 values with the kernels the dispatch chose — 16-bit values widened to
/// float, exactly, a piece at a time on the stack, and results narrowed the same way, so
/// no widened copy goes to memory — and doubles (two carriers each) one value at a time.

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/cpu/convert.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/kernels/group/grid.hpp>

#include <concepts>
#include <cstddef>
#include <span>

namespace qcoll::kernels::cpu {

/// Values widened or narrowed at once: 8 blocks, 8 KiB of floats (in L1 between passes).
inline constexpr std::size_t grid_piece = 8 * grid_detail::block;

/// Raises exponents[b] to cover block b of `values`.
template <class T>
void grid_cover(std::span<const T> values, std::span<double> exponents) noexcept {
  if constexpr (std::same_as<T, double>) {
    for (std::size_t b = 0; b < exponents.size(); ++b) {
      const std::size_t first = b * grid_detail::block;
      const std::size_t last = values.size() - first < grid_detail::block ? values.size() : first + grid_detail::block;
      int e = static_cast<int>(exponents[b]);
      for (std::size_t i = first; i < last; ++i) e = grid_detail::covered_wide(e, values[i]);
      exponents[b] = e;
    }
  } else if constexpr (std::same_as<T, float>) {
    active_kernels().grid_cover(values, exponents);
  } else {
    alignas(64) float wide[grid_piece];
    for (std::size_t i = 0; i < values.size(); i += grid_piece) {
      const std::size_t m = values.size() - i < grid_piece ? values.size() - i : grid_piece;
      widen(values.subspan(i, m), std::span<float>(wide, m));
      active_kernels().grid_cover(std::span<const float>(wide, m),
                                  exponents.subspan(i / grid_detail::block, (m + grid_detail::block - 1) / grid_detail::block));
    }
  }
}

/// sums[i] = (first) or += (else) values[i] on its block's grid. Doubles: two planes of
/// values.size(), sums[i] the high carriers and sums[n + i] the low ones.
template <class T>
void grid_add(std::span<const T> values, std::span<const double> exponents, std::span<double> sums,
              bool first) noexcept {
  if constexpr (std::same_as<T, double>) {
    const std::size_t n = values.size();
    for (std::size_t i = 0; i < n; ++i) {
      const grid_detail::wide_carriers q = grid_detail::on_wide_grid(values[i], exponents[i / grid_detail::block]);
      sums[i] = first ? q.high : sums[i] + q.high;
      sums[n + i] = first ? q.low : sums[n + i] + q.low;
    }
  } else if constexpr (std::same_as<T, float>) {
    active_kernels().grid_add(values, exponents, sums, first);
  } else {
    alignas(64) float wide[grid_piece];
    for (std::size_t i = 0; i < values.size(); i += grid_piece) {
      const std::size_t m = values.size() - i < grid_piece ? values.size() - i : grid_piece;
      widen(values.subspan(i, m), std::span<float>(wide, m));
      active_kernels().grid_add(std::span<const float>(wide, m), exponents.subspan(i / grid_detail::block),
                                sums.subspan(i, m), first);
    }
  }
}

/// out[i] = sums[i] (doubles: the carriers sums[i] and low[i]) from the grid of block
/// (first_index + i) / block, divided by `divide`.
template <class T>
void grid_round(std::span<const double> sums, std::span<const double> low, std::span<const double> exponents,
                double divide, std::span<T> out, std::size_t first_index) noexcept {
  if constexpr (std::same_as<T, double>) {
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = grid_detail::rounded_wide(sums[i], low[i], exponents[(first_index + i) / grid_detail::block], divide);
  } else if constexpr (std::same_as<T, float>) {
    active_kernels().grid_round(sums, exponents, divide, out, first_index);
  } else {
    alignas(64) float narrow_from[grid_piece];
    for (std::size_t i = 0; i < out.size(); i += grid_piece) {
      const std::size_t m = out.size() - i < grid_piece ? out.size() - i : grid_piece;
      active_kernels().grid_round(sums.subspan(i, m), exponents, divide, std::span<float>(narrow_from, m),
                                  first_index + i);
      narrow(std::span<const float>(narrow_from, m), out.subspan(i, m));
    }
  }
}

}  // namespace qcoll::kernels::cpu
