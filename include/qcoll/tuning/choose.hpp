#pragma once
/// @file
/// Which algorithm an exact collective runs: every rule in one place, as plain
/// functions of the tuning values, the world and the call's bytes, so a choice is
/// made and tested without a communicator (NCCL likewise keeps its choice in one
/// file). The result is the same on every rank given the same tuning: it depends on
/// nothing a rank sees alone. Each choice carries the rule that made it, the words
/// QCOLL_DEBUG=INFO prints after the call (docs/algorithms.md, "Choosing an
/// algorithm"). A new algorithm adds its threshold to table.hpp and its branch here.

#include <qcoll/core/types.hpp>
#include <qcoll/tuning/table.hpp>

#include <bit>
#include <cstddef>

namespace qcoll::choose {  // not `qcoll::tuning`: that is the values' struct

/// An algorithm and the rule that chose it (for the QCOLL_DEBUG=INFO line).
struct choice {
  qcoll::algorithm algorithm = qcoll::algorithm::unspecified;
  const char* rule = "";
};

/// What a choice knows of the communicator besides the tuning.
struct world {
  rank_t size = 1;
  bool fully_linked = true;         ///< the topology links every pair of ranks
  bool reads_peers_memory = false;  ///< the transport reads peers' memory (its single_copy())
};

/// The ring where nothing else runs the collective.
inline choice only_ring() { return {algorithm::ring, "the only algorithm"}; }

/// The ring, its steps read from the peer's memory where the transport can and a step
/// moves at least single_copy_bytes (the same on every rank: the transport's join
/// agreed on single_copy(), and the block size follows from the count).
inline choice ring(const tuning& values, std::size_t step_bytes, bool reads_peers_memory) {
  if (reads_peers_memory && step_bytes >= values.single_copy_bytes)
    return {algorithm::ring_single_copy, "steps of >= single_copy_bytes, and the transport reads peers' memory"};
  return only_ring();
}

/// Where every pair of ranks is linked: small buffers by recursive doubling, medium
/// ones on 2^k ≥ 4 ranks by halving-doubling unless the ring's steps would be read
/// straight from the peers' memory; the ring otherwise. `bytes` is the buffer's size,
/// `step_bytes` what one ring step moves (the largest block).
inline choice allreduce(const tuning& values, const world& w, std::size_t bytes, std::size_t step_bytes) {
  if (values.allreduce == algorithm::recursive_doubling || values.allreduce == algorithm::halving_doubling)
    return {values.allreduce, "forced (QCOLL_ALLREDUCE_ALGO or set_tuning)"};
  const choice ring_way = ring(values, step_bytes, w.reads_peers_memory);
  if (values.allreduce == algorithm::ring) return {ring_way.algorithm, "forced (QCOLL_ALLREDUCE_ALGO or set_tuning)"};
  if (w.size == 1) return only_ring();
  if (!w.fully_linked) return {ring_way.algorithm, "the topology does not link every pair"};
  if (bytes <= values.allreduce_small_bytes) return {algorithm::recursive_doubling, "bytes <= allreduce_small_bytes"};
  if (bytes > values.allreduce_halving_bytes) return {ring_way.algorithm, "bytes > allreduce_halving_bytes"};
  if (ring_way.algorithm == algorithm::ring_single_copy) return ring_way;
  if (w.size < 4 || !std::has_single_bit(w.size))
    return {ring_way.algorithm, "bytes > allreduce_small_bytes, and halving-doubling needs 2^k >= 4 ranks"};
  return {algorithm::halving_doubling, "bytes <= allreduce_halving_bytes, 2^k >= 4 ranks, steps through the transport"};
}

/// Small buffers by a binomial tree where every pair is linked, the ring otherwise.
inline choice broadcast(const tuning& values, const world& w, std::size_t bytes) {
  if (values.broadcast != algorithm::unspecified) return {values.broadcast, "forced (QCOLL_BROADCAST_ALGO or set_tuning)"};
  if (bytes > values.broadcast_small_bytes) return {algorithm::ring, "bytes > broadcast_small_bytes"};
  if (!w.fully_linked) return {algorithm::ring, "the topology does not link every pair"};
  return {algorithm::binomial_tree, "bytes <= broadcast_small_bytes"};
}

/// Dissemination where every pair is linked, the ring otherwise.
inline choice barrier(const tuning& values, const world& w) {
  if (values.barrier != algorithm::unspecified) return {values.barrier, "forced (QCOLL_BARRIER_ALGO or set_tuning)"};
  if (!w.fully_linked) return {algorithm::ring, "the topology does not link every pair"};
  return {algorithm::dissemination, "every pair linked"};
}

}  // namespace qcoll::choose
