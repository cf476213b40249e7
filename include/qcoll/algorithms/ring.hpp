#pragma once
/// @file
/// Ring algorithms, each a short script of step primitives. Positions are places on
/// the topology's ring; the block a position owns is the block of the rank standing
/// there, so reduce_scatter leaves block r on rank r whatever the ring order.
///
/// Fixed order: block b is the left fold, in ring order, of the contributions
/// starting with the rank after b's owner and ending with b's owner:
///   ((x[owner+1] ⊕ x[owner+2]) ⊕ …) ⊕ x[owner]      (positions modulo n)
/// All-gather copies the owner's bits to every rank, so every rank holds the same
/// bits, and the same inputs give the same bits on every run.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/core/partition.hpp>

#include <cstddef>
#include <span>

namespace qcoll::algorithms {

/// This rank's place on the ring.
class ring_view {
 public:
  ring_view(std::span<const rank_t> order, rank_t self) : order_(order) {
    for (std::size_t p = 0; p < order_.size(); ++p)
      if (order_[p] == self) position_ = p;
  }

  std::size_t size() const noexcept { return order_.size(); }
  rank_t next() const noexcept { return rank_at(1); }
  rank_t prev() const noexcept { return rank_at(-1); }

  /// The rank `offset` places after this one (negative: before).
  rank_t rank_at(std::ptrdiff_t offset) const noexcept {
    const auto n = static_cast<std::ptrdiff_t>(order_.size());
    const std::ptrdiff_t p = (static_cast<std::ptrdiff_t>(position_) + offset % n + n) % n;
    return order_[static_cast<std::size_t>(p)];
  }

  /// The block owned by the rank `offset` places away, when `count` elements are split.
  block_range block_at(std::size_t count, std::ptrdiff_t offset) const noexcept {
    return block_of(count, order_.size(), rank_at(offset));
  }

 private:
  std::span<const rank_t> order_;
  std::size_t position_ = 0;
};

namespace ring_detail {  // not `detail`: that would hide qcoll::detail from this namespace

/// What a step reduces into a received partial: buffers.contribution(b) where the
/// buffers have it (16-bit input, added to float partials without a widened copy),
/// else own(b).
template <class Buffers>
auto contribution(Buffers& buffers, block_range b) {
  if constexpr (requires { buffers.contribution(b); }) return buffers.contribution(b);
  else return buffers.own(b);
}

}  // namespace ring_detail

/// Reduce-scatter in n − 1 steps. At step s this rank sends its partial of the block
/// owned s + 1 places back and receives the partial of the block s + 2 places back.
/// `buffers` says where things live:
///   own(b)          this rank's contribution to block b, as T (sent at step 0)
///   contribution(b) optional: the same values as the step reduces them (of another
///                   element type, which send_recv_reduce widens); own(b) if absent
///   incoming(s, b)  where the partial of b received at step s lands
///   partial(s, b)   where incoming ⊕ own goes (may be incoming(s, b) or own(b))
/// After the last step partial(n − 2, own block) is the reduced block (avg divided).
template <transport Transport, element T, class Buffers>
void ring_reduce_scatter(primitives<Transport>& step, const ring_view& ring, std::size_t count, reduce_op op,
                         Buffers& buffers) {
  const std::size_t n = ring.size();
  const auto sent = [&](std::size_t s) { return ring.block_at(count, -1 - static_cast<std::ptrdiff_t>(s)); };
  const auto received = [&](std::size_t s) { return ring.block_at(count, -2 - static_cast<std::ptrdiff_t>(s)); };
  const auto outgoing = [&](std::size_t s) -> std::span<const T> {
    return s == 0 ? buffers.own(sent(0)) : buffers.partial(s - 1, sent(s));
  };
  if (step.pipelined() && n > 1) {
    step.template ring_phase<T>(
        ring.next(), ring.prev(), n - 1, outgoing, [&](std::size_t s) { return buffers.incoming(s, received(s)); },
        [&](std::size_t s, std::size_t offset, std::size_t length) {
          const block_range b = received(s);
          const std::span<const T> arrived = std::span<const T>(buffers.incoming(s, b)).subspan(offset, length);
          step.reduce_into(op, arrived, ring_detail::contribution(buffers, b).subspan(offset, length),
                                             buffers.partial(s, b).subspan(offset, length));
        });
  } else {
    for (std::size_t s = 0; s + 1 < n; ++s) {
      // Step s's partial only feeds step s + 1; the last one is the result.
      if (s + 2 < n) step.redirect_next_result();
      step.send_recv_reduce(ring.next(), outgoing(s), ring.prev(), buffers.incoming(s, received(s)),
                            ring_detail::contribution(buffers, received(s)), buffers.partial(s, received(s)), op);
    }
  }
  if (op == reduce_op::avg && n > 1) step.finish_avg(buffers.partial(n - 2, ring.block_at(count, 0)), n);
}

/// All-gather in place in n − 1 steps: `data` holds this rank's block and receives
/// the others'. At step s this rank forwards the block that started s places back.
template <transport Transport, element T>
void ring_all_gather(primitives<Transport>& step, const ring_view& ring, std::span<T> data) {
  const std::size_t count = data.size();
  const auto outgoing = [&](std::size_t s) {
    return std::span<const T>(ring.block_at(count, -static_cast<std::ptrdiff_t>(s)).of(data));
  };
  const auto incoming = [&](std::size_t s) { return ring.block_at(count, -1 - static_cast<std::ptrdiff_t>(s)).of(data); };
  if (step.pipelined() && ring.size() > 1) {
    step.template ring_phase<T>(ring.next(), ring.prev(), ring.size() - 1, outgoing, incoming,
                                [](std::size_t, std::size_t, std::size_t) {});
    return;
  }
  for (std::size_t s = 0; s + 1 < ring.size(); ++s) step.send_recv(ring.next(), outgoing(s), ring.prev(), incoming(s));
}

/// Scatter from `root` along the ring in n − 1 pipelined steps: afterwards every rank
/// holds its own block of root's `data`. The block for the farthest rank goes first,
/// so every link is busy at every step.
template <transport Transport, element T>
void ring_scatter(primitives<Transport>& step, const ring_view& ring, rank_t root, std::span<T> data) {
  const std::size_t n = ring.size();
  const std::size_t count = data.size();
  std::ptrdiff_t from_root = 0;  // how many places this rank stands after root
  while (ring.rank_at(-from_root) != root) ++from_root;
  // The block owned by the rank `distance` places after root.
  auto block_for = [&](std::ptrdiff_t distance) { return ring.block_at(count, distance - from_root).of(data); };

  const auto last = static_cast<std::ptrdiff_t>(n) - 1;
  if (from_root == 0) {
    for (std::ptrdiff_t d = last; d >= 1; --d) step.send(ring.next(), std::span<const T>(block_for(d)));
    return;
  }
  step.recv(ring.prev(), block_for(last));
  for (std::ptrdiff_t d = last; d > from_root; --d)
    step.send_recv(ring.next(), std::span<const T>(block_for(d)), ring.prev(), block_for(d - 1));
}

}  // namespace qcoll::algorithms
