#pragma once
/// @file
/// Halving-doubling allreduce (Rabenseifner's): a reduce-scatter by recursive halving,
/// then an all-gather by recursive doubling. Each rank sends and receives
/// 2(m − 1)/m of the buffer, as in the ring, but in 2 log₂ m exchanges with one
/// partner each instead of the ring's 2(n − 1) steps, every one depending on a
/// different neighbour — which is what it saves where ranks share cores or a step
/// costs more than its bytes.
///
/// Fixed order, the same as recursive doubling's (recursive_doubling.hpp): let m be
/// the largest power of two ≤ n; rank m + i (i < n − m) first hands its buffer to rank
/// i, which folds it in on the right (yᵢ = xᵢ ⊕ x_{m+i}). Then, with the distance
/// doubling from 1 to m/2, partners split the range both hold at its middle
/// (⌊size/2⌋ elements below it), the rank without the distance's bit keeping the lower
/// half, and each adds what it keeps as lower ⊕ upper, the operand of the lower-numbered
/// partner on the left. Every element is summed once, by one rank, as the perfect
/// binary tree over y₀ … y_{m−1} in rank order, and copied from there: every rank holds
/// the same bits, which are recursive doubling's bit for bit. avg divides each rank's
/// range by n before the all-gather; ranks m … n − 1 get their copy at the end.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/recursive_doubling.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/execution/kernels.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <span>

namespace qcoll::algorithms {

/// `data` holds this rank's contribution and receives the result; `scratch` has at
/// least ⌈data.size() / 2⌉ elements (data.size() when n is not a power of two). Ranks
/// are numbered 0 … n − 1 (the channel's ranks).
template <transport Transport, arithmetic_element T>
void halving_doubling_allreduce(primitives<Transport>& step, rank_t rank, std::size_t n, std::span<T> data,
                                std::span<T> scratch, reduce_op op) {
  if (!fold_in_extra_ranks(step, rank, n, data, scratch, op)) return;
  const std::size_t m = std::bit_floor(n);
  struct range {
    std::size_t first, count;
  };
  struct halving {
    range whole;      // what this rank held before it
    bool kept_lower;  // and which part of it this rank kept
  };
  std::array<halving, 64> held{};  // one per distance
  range mine{0, data.size()};
  std::size_t level = 0;
  for (std::size_t distance = 1; distance < m; distance <<= 1, ++level) {
    const rank_t partner = rank ^ distance;
    const std::size_t lower = mine.count / 2;
    const bool keep_lower = (rank & distance) == 0;
    const range kept = keep_lower ? range{mine.first, lower} : range{mine.first + lower, mine.count - lower};
    const range given = keep_lower ? range{mine.first + lower, mine.count - lower} : range{mine.first, lower};
    const std::span<T> own = data.subspan(kept.first, kept.count);
    const std::span<T> theirs = scratch.first(kept.count);
    step.send_recv(partner, std::span<const T>(data.subspan(given.first, given.count)), partner, theirs);
    if (rank < partner) step.template reduce<T>(op, own, theirs, own);
    else step.template reduce<T>(op, theirs, own, own);
    held[level] = {mine, keep_lower};
    mine = kept;
  }
  if (op == reduce_op::avg) step.finish_avg(data.subspan(mine.first, mine.count), n);
  for (std::size_t distance = m >> 1; distance >= 1; distance >>= 1) {
    const rank_t partner = rank ^ distance;
    const auto [whole, kept_lower] = held[--level];
    // The partner holds the rest of the range both held before this distance's halving.
    const range partners = kept_lower ? range{whole.first + mine.count, whole.count - mine.count}
                                      : range{whole.first, whole.count - mine.count};
    step.send_recv(partner, std::span<const T>(data.subspan(mine.first, mine.count)), partner,
                   data.subspan(partners.first, partners.count));
    mine = whole;
  }
  return_to_folded_ranks(step, rank, n, data);
}

}  // namespace qcoll::algorithms
