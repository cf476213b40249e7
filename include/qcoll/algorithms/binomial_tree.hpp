#pragma once
/// @file
/// Binomial tree broadcast, for small buffers: ⌈log₂ n⌉ rounds of whole-buffer
/// messages instead of the ring's 2(n − 1) steps of blocks. Number ranks relative to
/// the root, v = (rank − root) mod n: rank v receives from v with its lowest set bit
/// cleared, then sends to v + 2ᵏ for every 2ᵏ below that bit (the farthest first, as
/// its subtree is the deepest). Every rank gets root's bits.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/concepts.hpp>

#include <bit>
#include <cstddef>
#include <span>

namespace qcoll::algorithms {

template <transport Transport, element T>
void binomial_tree_broadcast(primitives<Transport>& step, rank_t rank, std::size_t n, rank_t root,
                             std::span<T> data) {
  const std::size_t relative = (rank + n - root) % n;
  // The lowest set bit of `relative` is the distance to the parent; the root's
  // children span the whole tree.
  const std::size_t parent_distance = relative == 0 ? std::bit_ceil(n) : (relative & (~relative + 1));
  if (relative != 0) step.recv((rank + n - parent_distance) % n, data);
  for (std::size_t distance = parent_distance >> 1; distance > 0; distance >>= 1)
    if (relative + distance < n) step.send((rank + distance) % n, std::span<const T>(data));
}

}  // namespace qcoll::algorithms
