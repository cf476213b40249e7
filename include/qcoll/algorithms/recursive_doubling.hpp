#pragma once
/// @file
/// Recursive doubling allreduce, for small buffers: ⌈log₂ n⌉ exchanges of the whole
/// buffer (two more when n is not a power of two) instead of the ring's 2(n − 1)
/// steps, so latency, not bytes, sets its cost.
///
/// Fixed order: let m be the largest power of two ≤ n. Rank m + i (i < n − m) first
/// hands its buffer to rank i, which folds it in on the right: yᵢ = xᵢ ⊕ x_{m+i};
/// the other ranks below m start with yᵢ = xᵢ. Then, with the distance doubling from
/// 1 to m/2, partners exchange and each computes lower ⊕ upper — the operand of the
/// lower-numbered partner on the left — so both hold the same bits. The result is the
/// perfect binary tree over y₀ … y_{m−1} in rank order:
///   n = 4: (y₀ ⊕ y₁) ⊕ (y₂ ⊕ y₃);   n = 6: ((x₀⊕x₄) ⊕ (x₁⊕x₅)) ⊕ (x₂ ⊕ x₃)
/// avg divides the sum by n once, on each rank below m, before ranks m … n − 1 get
/// their copy. Every rank holds the same bits; they differ from the ring's (another
/// order) wherever float addition is not associative.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/execution/kernels.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <span>

namespace qcoll::algorithms {

/// The fold both doubling algorithms start with (m the largest power of two ≤ n):
/// rank m + i hands its buffer to rank i, which folds it in on the right, and later
/// receives the result (return_to_folded_ranks). False on ranks m … n − 1, which then
/// hold the result already; `scratch` has data.size() elements when n is not 2^k.
template <transport Transport, arithmetic_element T>
bool fold_in_extra_ranks(primitives<Transport>& step, rank_t rank, std::size_t n, std::span<T> data,
                         std::span<T> scratch, reduce_op op) {
  const std::size_t m = std::bit_floor(n);
  const std::span<T> landing = scratch.first(rank >= m || rank < n - m ? data.size() : 0);
  if (rank >= m) {  // folded into rank − m, which returns the result
    // The receive is posted before the send, as in every step of qcoll's algorithms: a
    // peer that called something else then meets a receive, and the headers disagree
    // (operation_mismatch), instead of two blocked sends timing out.
    step.send_recv(rank - m, std::span<const T>(data), rank - m, landing);
    step.copy(std::span<const T>(landing), data);
    return false;
  }
  if (rank < n - m) {
    step.recv(rank + m, landing);
    step.template reduce<T>(op, data, landing, data);
  }
  return true;
}

/// Ranks below n − m send the result to the rank they folded in.
template <transport Transport, arithmetic_element T>
void return_to_folded_ranks(primitives<Transport>& step, rank_t rank, std::size_t n, std::span<T> data) {
  if (rank < n - std::bit_floor(n)) step.send(rank + std::bit_floor(n), std::span<const T>(data));
}

/// `data` holds this rank's contribution and receives the result; `scratch` has
/// data.size() elements. Ranks are numbered 0 … n − 1 (the channel's ranks).
template <transport Transport, arithmetic_element T>
void recursive_doubling_allreduce(primitives<Transport>& step, rank_t rank, std::size_t n, std::span<T> data,
                                  std::span<T> scratch, reduce_op op) {
  if (!fold_in_extra_ranks(step, rank, n, data, scratch, op)) return;
  const std::size_t m = std::bit_floor(n);
  for (std::size_t distance = 1; distance < m; distance <<= 1) {
    const rank_t partner = rank ^ distance;
    step.send_recv(partner, std::span<const T>(data), partner, scratch);
    if (rank < partner) step.template reduce<T>(op, data, scratch, data);
    else step.template reduce<T>(op, scratch, data, data);
  }
  if (op == reduce_op::avg) step.finish_avg(data, n);
  return_to_folded_ranks(step, rank, n, data);
}

}  // namespace qcoll::algorithms
