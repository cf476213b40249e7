#pragma once
// Sequential references for the collectives, written independently of the
// library's kernels and in the order the library documents.

#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

namespace qcoll::test {

inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max,
                                       reduce_op::product};

/// 0, 1, …, n − 1: the ring order of topologies::ring(n) and fully_connected(n).
inline std::vector<rank_t> natural_order(std::size_t n) {
  std::vector<rank_t> order(n);
  std::iota(order.begin(), order.end(), rank_t{0});
  return order;
}

template <class T>
T apply(reduce_op op, T a, T b) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return a + b;
    case reduce_op::min: return std::isnan(a) ? a : std::isnan(b) ? b : (a < b ? a : b);
    case reduce_op::max: return std::isnan(a) ? a : std::isnan(b) ? b : (a > b ? a : b);
    case reduce_op::product: return a * b;
  }
  return a;
}

/// The documented result: element i of block b is the left fold, in ring order,
/// starting with the rank after b's owner and ending with the owner.
/// inputs[r] is rank r's buffer; ring[p] is the rank at position p.
template <class T>
std::vector<T> reference_reduce(const std::vector<std::vector<T>>& inputs, std::span<const rank_t> ring,
                                reduce_op op) {
  const std::size_t n = inputs.size();
  const std::size_t count = inputs.at(0).size();
  std::vector<T> out(count);
  for (std::size_t owner_position = 0; owner_position < n; ++owner_position) {
    const block_range block = block_of(count, n, ring[owner_position]);
    for (std::size_t i = block.offset; i < block.offset + block.size; ++i) {
      T acc = inputs[ring[(owner_position + 1) % n]][i];
      for (std::size_t k = 2; k <= n; ++k) acc = apply(op, acc, inputs[ring[(owner_position + k) % n]][i]);
      if (op == reduce_op::avg) acc = acc / static_cast<T>(n);
      out[i] = acc;
    }
  }
  return out;
}

/// The documented recursive-doubling order: with m the largest power of two ≤ n,
/// leaves yᵢ = xᵢ ⊕ x_{m+i} (xᵢ where m + i ≥ n), then the perfect binary tree over
/// y₀ … y_{m−1} in rank order, lower ⊕ upper at every node.
template <class T>
std::vector<T> reference_recursive_doubling(const std::vector<std::vector<T>>& inputs, reduce_op op) {
  const std::size_t n = inputs.size();
  std::size_t m = 1;
  while (m * 2 <= n) m *= 2;
  std::vector<std::vector<T>> level(inputs.begin(), inputs.begin() + static_cast<std::ptrdiff_t>(m));
  for (std::size_t i = 0; i + m < n; ++i)
    for (std::size_t k = 0; k < level[i].size(); ++k) level[i][k] = apply(op, level[i][k], inputs[i + m][k]);
  while (level.size() > 1) {
    std::vector<std::vector<T>> next(level.size() / 2);
    for (std::size_t j = 0; j < next.size(); ++j) {
      next[j] = level[2 * j];
      for (std::size_t k = 0; k < next[j].size(); ++k) next[j][k] = apply(op, level[2 * j][k], level[2 * j + 1][k]);
    }
    level = std::move(next);
  }
  if (op == reduce_op::avg)
    for (T& x : level[0]) x = x / static_cast<T>(n);
  return level[0];
}

/// Random values of mixed sign and magnitude; sums of them depend on the order.
template <class T>
std::vector<T> random_values(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<T> mantissa(-1, 1);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<T> v(count);
  for (auto& x : v) x = std::ldexp(mantissa(gen), exponent(gen));
  return v;
}

template <class T>
bool bitwise_equal(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

}  // namespace qcoll::test
