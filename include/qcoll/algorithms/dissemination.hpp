#pragma once
/// @file
/// Dissemination barrier: in round k every rank signals the rank 2ᵏ after it and waits
/// for the one 2ᵏ before it; after ⌈log₂ n⌉ rounds each rank has heard, transitively,
/// from every other since it entered. Header-only messages; the distances 2ᵏ < n are
/// distinct, so no two rounds talk to the same peer in the same direction.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/concepts.hpp>

#include <cstddef>
#include <span>

namespace qcoll::algorithms {

template <transport Transport>
void dissemination_barrier(primitives<Transport>& step, rank_t rank, std::size_t n) {
  for (std::size_t distance = 1; distance < n; distance <<= 1)
    step.send_recv((rank + distance) % n, std::span<const float>(), (rank + n - distance) % n, std::span<float>());
}

}  // namespace qcoll::algorithms
