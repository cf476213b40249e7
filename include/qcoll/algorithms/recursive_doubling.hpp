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
#include <qcoll/kernels/cpu/reduce.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <span>

namespace qcoll::algorithms {

/// `data` holds this rank's contribution and receives the result; `scratch` has
/// data.size() elements. Ranks are numbered 0 … n − 1 (the channel's ranks).
template <transport Transport, arithmetic_element T>
void recursive_doubling_allreduce(primitives<Transport>& step, rank_t rank, std::size_t n, std::span<T> data,
                                  std::span<T> scratch, reduce_op op) {
  const std::size_t m = std::bit_floor(n);
  const std::size_t extra = n - m;
  if (rank >= m) {  // folded into rank − m, which returns the result
    // The receive is posted before the send, as in every step of qcoll's algorithms: a
    // peer that called something else then meets a receive, and the headers disagree
    // (operation_mismatch), instead of two blocked sends timing out.
    step.send_recv(rank - m, std::span<const T>(data), rank - m, scratch);
    std::copy(scratch.begin(), scratch.end(), data.begin());
    return;
  }
  if (rank < extra) {
    step.recv(rank + m, scratch);
    kernels::cpu::reduce<T>(op, data, scratch, data);
  }
  for (std::size_t distance = 1; distance < m; distance <<= 1) {
    const rank_t partner = rank ^ distance;
    step.send_recv(partner, std::span<const T>(data), partner, scratch);
    if (rank < partner) kernels::cpu::reduce<T>(op, data, scratch, data);
    else kernels::cpu::reduce<T>(op, scratch, data, data);
  }
  if (op == reduce_op::avg) kernels::cpu::finish_avg(data, n);
  if (rank < extra) step.send(rank + m, std::span<const T>(data));
}

}  // namespace qcoll::algorithms
