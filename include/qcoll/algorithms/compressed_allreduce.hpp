#pragma once
/// @file
/// The two-phase striped exchange (spec one-bit-exchange.md §7), as scripts of step
/// primitives. docs/compressed-allreduce.md explains the algorithm; in short, for n
/// ranks and the buffer cut into n stripes (stripe j owned by rank j):
///   phase 1  every rank encodes every stripe with its worker residual and sends
///            stripe j to rank j; rank j decodes and sums all contributions;
///   between  the owner (avg: divides by n and) encodes the sum with its server
///            residual, and decodes those bits into its own output;
///   phase 2  every owner's bits go to every rank, which decodes them.
/// Every rank decodes the same bits for every stripe, so the result is bitwise
/// identical everywhere. Frames are never re-quantized on the way: on a ring they
/// are forwarded hop by hop as they arrived.
///
/// Stripes and chunks are cut at whole quantizer groups. Each chunk is a frame of
/// its own, so chunks pipeline: encoding chunk k + 1 overlaps sending chunk k.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/quantized_steps.hpp>
#include <qcoll/algorithms/ring.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/core/partition.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace qcoll {

/// What one call of a compressed allreduce moved, as counted by the algorithm:
/// payload bytes handed to the transport (the transport's own framing, 40 bytes per
/// message on shm and TCP, is not included).
struct compressed_allreduce_statistics {
  std::size_t bytes_sent = 0;
  std::size_t bytes_received = 0;
  std::size_t messages_sent = 0;
  std::size_t messages_received = 0;
};

/// How contributions reach a stripe's owner.
enum class stripe_route : std::uint8_t {
  direct,  ///< straight to the owner (every pair of ranks is linked)
  ring,    ///< hop by hop along the topology's ring, forwarded without re-quantizing
};

}  // namespace qcoll

namespace qcoll::algorithms {

/// The route a topology gives: direct when every pair of ranks is linked. O(n²).
template <ring_topology Topology>
stripe_route route_for(const Topology& topology) {
  for (rank_t a = 0; a < topology.size(); ++a)
    for (rank_t b = 0; b < topology.size(); ++b)
      if (a != b && !topology.linked(a, b)) return stripe_route::ring;
  return stripe_route::direct;
}

/// Where stripes, chunks and their frames lie. Stripe j is block j of the buffer's
/// groups (block_of over whole groups), so no group straddles two stripes; chunks
/// cut a stripe every `chunk_values` values (a multiple of the group size).
class stripe_layout {
 public:
  stripe_layout() = default;

  template <quantizer Q>
  stripe_layout(const Q& q, std::size_t count, std::size_t parts, std::size_t requested_chunk_values)
      : count_(count) {
    // A quantizer with no group (identity, whole-tensor bfp) may be cut anywhere.
    const std::size_t unit = q.group_size() == 0 ? 1 : q.group_size();
    const std::size_t groups = (count + unit - 1) / unit;
    const std::size_t chunk_units = std::max<std::size_t>(1, (requested_chunk_values + unit - 1) / unit);
    chunk_values_ = chunk_units * unit;
    stripes_.resize(parts);
    chunk_base_.assign(parts + 1, 0);
    for (std::size_t j = 0; j < parts; ++j) {
      const block_range units = block_of(groups, parts, j);
      const std::size_t begin = std::min(count, units.offset * unit);
      const std::size_t end = std::min(count, (units.offset + units.size) * unit);
      stripes_[j] = {begin, end - begin};
      chunk_base_[j + 1] = chunk_base_[j] + (end - begin + chunk_values_ - 1) / chunk_values_;
    }
    frame_begin_.assign(chunk_base_[parts] + 1, 0);
    for (std::size_t j = 0; j < parts; ++j)
      for (std::size_t c = 0; c < chunks(j); ++c) {
        const std::size_t g = global_chunk(j, c);
        frame_begin_[g + 1] = frame_begin_[g] + q.encoded_size(chunk(j, c).size);
      }
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t parts() const noexcept { return stripes_.size(); }
  std::size_t chunk_values() const noexcept { return chunk_values_; }
  block_range stripe(std::size_t j) const noexcept { return stripes_[j]; }
  std::size_t chunks(std::size_t j) const noexcept { return chunk_base_[j + 1] - chunk_base_[j]; }
  std::size_t total_chunks() const noexcept { return chunk_base_.back(); }
  std::size_t max_chunks() const noexcept {
    std::size_t most = 0;
    for (std::size_t j = 0; j < parts(); ++j) most = std::max(most, chunks(j));
    return most;
  }
  /// Index of chunk c of stripe j among all chunks, stripes in order.
  std::size_t global_chunk(std::size_t j, std::size_t c) const noexcept { return chunk_base_[j] + c; }

  /// The values of chunk c of stripe j, as a range of the whole buffer.
  block_range chunk(std::size_t j, std::size_t c) const noexcept {
    const std::size_t begin = c * chunk_values_;
    return {stripes_[j].offset + begin, std::min(chunk_values_, stripes_[j].size - begin)};
  }

  /// Bytes of the frames of all stripes, laid end to end in stripe order.
  std::size_t total_frame_bytes() const noexcept { return frame_begin_.back(); }
  std::size_t stripe_frame_bytes(std::size_t j) const noexcept {
    return frame_begin_[chunk_base_[j + 1]] - frame_begin_[chunk_base_[j]];
  }
  std::size_t frame_bytes(std::size_t j, std::size_t c) const noexcept {
    const std::size_t g = global_chunk(j, c);
    return frame_begin_[g + 1] - frame_begin_[g];
  }
  /// Chunk c of stripe j's frame in a buffer of total_frame_bytes().
  std::span<std::byte> frame(std::span<std::byte> all, std::size_t j, std::size_t c) const noexcept {
    return all.subspan(frame_begin_[global_chunk(j, c)], frame_bytes(j, c));
  }

 private:
  std::size_t count_ = 0;
  std::size_t chunk_values_ = 1;
  std::vector<block_range> stripes_;
  std::vector<std::size_t> chunk_base_;   // first global chunk of each stripe, and the total
  std::vector<std::size_t> frame_begin_;  // byte offset of each global chunk's frame, and the total
};

/// Everything a plan owns: the layout, both residuals (committed and staging),
/// the frame buffers and the receive schedule's slots. Built once; a call
/// allocates nothing.
template <quantizer Q>
struct compressed_allreduce_state {
  using value_type = typename Q::value_type;

  Q quantizer;
  stripe_layout layout;
  rank_t rank = 0;
  rank_t size = 1;
  stripe_route route = stripe_route::direct;
  std::vector<rank_t> ring_order;  // the ring the frames travel (route::ring)

  // Residuals double-buffered: a call encodes from the committed residual into the
  // staging one and swaps them only once the whole call succeeded (failure atomicity).
  std::vector<value_type> worker_residual[2];  // one value per buffer value
  std::vector<value_type> server_residual[2];  // one value per value of the own stripe
  unsigned committed = 0;

  std::vector<std::byte> contributions;    // this rank's encoded buffer, all stripes
  std::vector<std::byte> aggregates;       // every stripe's encoded sum (own: written here)
  std::vector<std::byte> incoming;         // phase-1 frames received (to sum, or forward)
  std::vector<std::size_t> incoming_frame;  // byte offset of each, in receive order, and the end
  std::size_t requests_needed = 0;
  std::uint64_t calls = 0;  // successful calls: keys stochastic rounding
  compressed_allreduce_statistics last_call{};

  /// This rank's place on the ring the frames travel.
  ring_view ring() const { return ring_view(ring_order, rank); }

  /// Calls visit(source step s, destination rank d, chunk c) for every phase-1 frame
  /// this rank receives, in the order they arrive. Direct: stripe `rank` from rank
  /// − s. Ring: at step s, from the previous rank, the frames of the rank s places
  /// back for the n − s ranks from this one on (the first is this rank's own).
  template <class Visit>
  void for_each_incoming(Visit&& visit) const {
    const ring_view places = ring();
    for (std::size_t s = 1; s < size; ++s) {
      const std::size_t destinations = route == stripe_route::direct ? 1 : size - s;
      for (std::size_t k = 0; k < destinations; ++k) {
        const rank_t d = route == stripe_route::direct ? rank : places.rank_at(static_cast<std::ptrdiff_t>(k));
        for (std::size_t c = 0; c < layout.chunks(d); ++c) visit(s, d, c);
      }
    }
  }

  void build(std::size_t count, std::size_t chunk_values) {
    layout = stripe_layout(quantizer, count, size, chunk_values);
    if constexpr (Q::keeps_residual) {
      for (auto& r : worker_residual) r.assign(count, value_type{});
      for (auto& r : server_residual) r.assign(layout.stripe(rank).size, value_type{});
    }
    contributions.assign(layout.total_frame_bytes(), std::byte{});
    aggregates.assign(layout.total_frame_bytes(), std::byte{});
    incoming_frame.assign(1, 0);
    for_each_incoming([&](std::size_t, rank_t d, std::size_t c) {
      incoming_frame.push_back(incoming_frame.back() + layout.frame_bytes(d, c));
    });
    incoming.assign(incoming_frame.back(), std::byte{});
    const std::size_t received = incoming_frame.size() - 1;
    // Request slots, see the scripts: receives of both phases, then sends.
    requests_needed = route == stripe_route::direct ? 2 * received + 2 * layout.total_chunks()
                                                    : 2 * received + 3 * layout.total_chunks();
  }

  std::span<std::byte> incoming_slot(std::size_t index) noexcept {
    return std::span(incoming).subspan(incoming_frame[index], incoming_frame[index + 1] - incoming_frame[index]);
  }
};

/// One call's work over a plan's state; the route's script drives it.
template <transport Transport, quantizer Q>
class compressed_exchange {
 public:
  using T = typename Q::value_type;
  using request = typename Transport::request;

  /// Phase-2 messages have a tag of their own: a fast owner's phase-2 chunk may
  /// reach a rank before the last phase-1 chunk from the same peer. Phase 1 uses the
  /// exact collectives' tag, so a rank that called another collective is told so
  /// (operation_mismatch) instead of waiting for a message that never comes.
  static constexpr transports::tag_t contribution_tag = 0;
  static constexpr transports::tag_t aggregate_tag = 1;

  compressed_exchange(primitives<Transport>& step, compressed_allreduce_state<Q>& state, std::span<request> requests,
                      std::span<const T> in, std::span<T> out, reduce_op op)
      : step_(step), s_(state), requests_(requests), in_(in), out_(out), op_(op) {
    s_.last_call = {};
  }

  void run() {
    if (s_.route == stripe_route::direct)
      run_direct();
    else
      run_ring();
  }

 private:
  const stripe_layout& layout() const noexcept { return s_.layout; }
  rank_t after(std::size_t r) const noexcept { return static_cast<rank_t>((s_.rank + r) % s_.size); }
  rank_t before(std::size_t r) const noexcept { return static_cast<rank_t>((s_.rank + s_.size - r) % s_.size); }
  std::span<std::byte> contribution(std::size_t j, std::size_t c) { return layout().frame(s_.contributions, j, c); }
  std::span<std::byte> aggregate(std::size_t j, std::size_t c) { return layout().frame(s_.aggregates, j, c); }
  std::span<T> out_chunk(std::size_t j, std::size_t c) { return layout().chunk(j, c).of(out_); }

  // ---- the steps both routes are made of ----

  /// Encodes chunk c of stripe j of the input with the worker residual.
  void encode_contribution(std::size_t j, std::size_t c) {
    const block_range values = layout().chunk(j, c);
    staged(values.of(in_), s_.worker_residual, values, contribution(j, c), {2 * s_.calls, values.offset});
  }

  /// The sum starts as this rank's own decoded contribution, in the output.
  void start_sum(std::size_t c) { decode(contribution(s_.rank, c), out_chunk(s_.rank, c), false, s_.rank); }

  void add_to_sum(std::span<const std::byte> frame, std::size_t c, rank_t from) {
    decode(frame, out_chunk(s_.rank, c), true, from);
  }

  /// Between the phases: the owner (divides and) re-encodes its sum with the server
  /// residual, then keeps the decoded bits, exactly what every other rank will decode.
  void finish_sum(std::size_t c) {
    const std::span<T> sum = out_chunk(s_.rank, c);
    if (op_ == reduce_op::avg) kernels::cpu::finish_avg(sum, s_.size);
    const block_range values = layout().chunk(s_.rank, c);
    staged(sum, s_.server_residual, {values.offset - layout().stripe(s_.rank).offset, values.size},
           aggregate(s_.rank, c), {2 * s_.calls + 1, values.offset});
    decode(aggregate(s_.rank, c), sum, false, s_.rank);
  }

  void staged(std::span<const T> values, std::vector<T> (&residual)[2], block_range at, std::span<std::byte> frame,
              quantizers::encode_position position) {
    staged_encode(s_.quantizer, values, residual, s_.committed, at, frame, position);
  }

  void decode(std::span<const std::byte> frame, std::span<T> into, bool accumulate, rank_t from) {
    decode_or_fail(step_, s_.quantizer, frame, into, accumulate, from);
  }

  void send(std::size_t slot, rank_t to, transports::tag_t tag, std::span<const std::byte> frame) {
    step_.post_send(requests_[slot], to, tag, frame);
    s_.last_call.bytes_sent += frame.size();
    ++s_.last_call.messages_sent;
    step_.poll(requests_[slot]);  // moves what is queued while this rank computes
  }
  void receive(std::size_t slot, rank_t from, transports::tag_t tag, std::span<std::byte> frame) {
    step_.post_recv(requests_[slot], from, tag, frame);
  }
  void complete_receive(std::size_t slot, rank_t from, std::size_t bytes) {
    step_.complete_recv(requests_[slot], from, bytes);
    s_.last_call.bytes_received += bytes;
    ++s_.last_call.messages_received;
  }
  void complete_send(std::size_t slot, rank_t to, std::size_t bytes) { step_.complete_send(requests_[slot], to, bytes); }

  // ---- direct: round r sends to rank + r and receives from rank − r ----
  // Request slots: [phase-1 receives | phase-2 receives (by global chunk) |
  //                 phase-1 sends (by global chunk) | phase-2 sends (by receive index)]

  void run_direct() {
    const std::size_t n = s_.size;
    const std::size_t own = s_.rank;
    const std::size_t own_chunks = layout().chunks(own);
    const std::size_t received = s_.incoming_frame.size() - 1;  // (n − 1) · own_chunks
    const std::size_t second_receives = received;
    const std::size_t first_sends = second_receives + layout().total_chunks();
    const std::size_t second_sends = first_sends + layout().total_chunks();
    auto incoming_index = [&](std::size_t r, std::size_t c) { return (r - 1) * own_chunks + c; };

    for (std::size_t r = 1; r < n; ++r)
      for (std::size_t c = 0; c < own_chunks; ++c)
        receive(incoming_index(r, c), before(r), contribution_tag, s_.incoming_slot(incoming_index(r, c)));
    for (std::size_t r = 1; r < n; ++r)
      for (std::size_t c = 0; c < layout().chunks(before(r)); ++c)
        receive(second_receives + layout().global_chunk(before(r), c), before(r), aggregate_tag,
                aggregate(before(r), c));

    // Stage t: encode and send chunk t of every stripe; sum, re-encode and send the
    // own stripe's chunk t − 1; decode the other owners' chunk t − 2. All ranks run
    // the same stages, so what a stage waits for was sent in an earlier one.
    for (std::size_t t = 0; t < layout().max_chunks() + 2; ++t) {
      for (std::size_t r = 0; r < n; ++r) {
        const rank_t j = after(r);
        if (t >= layout().chunks(j)) continue;
        encode_contribution(j, t);
        if (r != 0) send(first_sends + layout().global_chunk(j, t), j, contribution_tag, contribution(j, t));
      }
      if (t >= 1 && t - 1 < own_chunks) {
        const std::size_t c = t - 1;
        start_sum(c);
        for (std::size_t r = 1; r < n; ++r) {
          const std::size_t index = incoming_index(r, c);
          complete_receive(index, before(r), s_.incoming_slot(index).size());
          add_to_sum(s_.incoming_slot(index), c, before(r));
        }
        finish_sum(c);
        for (std::size_t r = 1; r < n; ++r)
          send(second_sends + incoming_index(r, c), after(r), aggregate_tag, aggregate(own, c));
      }
      if (t >= 2) {
        const std::size_t c = t - 2;
        for (std::size_t r = 1; r < n; ++r) {
          const rank_t j = before(r);
          if (c >= layout().chunks(j)) continue;
          complete_receive(second_receives + layout().global_chunk(j, c), j, layout().frame_bytes(j, c));
          decode(aggregate(j, c), out_chunk(j, c), false, j);
        }
      }
    }
    for (std::size_t r = 1; r < n; ++r) {
      for (std::size_t c = 0; c < layout().chunks(after(r)); ++c)
        complete_send(first_sends + layout().global_chunk(after(r), c), after(r), layout().frame_bytes(after(r), c));
      for (std::size_t c = 0; c < own_chunks; ++c)
        complete_send(second_sends + incoming_index(r, c), after(r), layout().frame_bytes(own, c));
    }
  }

  // ---- ring: everything goes to the next rank and comes from the previous one ----
  // Request slots: [phase-1 receives (receive order) | phase-2 receives (global chunk) |
  //                 own contributions sent (global chunk) | forwards (receive order) |
  //                 phase-2 sends (global chunk)]

  void run_ring() {
    const std::size_t n = s_.size;
    const rank_t own = s_.rank;
    const ring_view ring = s_.ring();
    const rank_t next = ring.next();
    const rank_t prev = ring.prev();
    const std::size_t received = s_.incoming_frame.size() - 1;
    const std::size_t second_receives = received;
    const std::size_t first_sends = second_receives + layout().total_chunks();
    const std::size_t forwards = first_sends + layout().total_chunks();
    const std::size_t second_sends = forwards + received;

    std::size_t index = 0;
    s_.for_each_incoming([&](std::size_t, rank_t, std::size_t) {
      receive(index, prev, contribution_tag, s_.incoming_slot(index));
      ++index;
    });
    // Phase 2 is a ring all-gather: at step s the stripe of the rank s places back arrives.
    for (std::size_t s = 1; s < n; ++s) {
      const rank_t owner = ring.rank_at(-static_cast<std::ptrdiff_t>(s));
      for (std::size_t c = 0; c < layout().chunks(owner); ++c)
        receive(second_receives + layout().global_chunk(owner, c), prev, aggregate_tag, aggregate(owner, c));
    }

    // Step 1: this rank's contributions for the ranks 1 … n − 1 places on.
    for (std::size_t k = 1; k < n; ++k) {
      const rank_t d = ring.rank_at(static_cast<std::ptrdiff_t>(k));
      for (std::size_t c = 0; c < layout().chunks(d); ++c) {
        encode_contribution(d, c);
        send(first_sends + layout().global_chunk(d, c), next, contribution_tag, contribution(d, c));
      }
    }
    for (std::size_t c = 0; c < layout().chunks(own); ++c) {
      encode_contribution(own, c);
      start_sum(c);
    }
    // Later steps: a frame for this rank is summed (from the rank s places back at
    // step s: the same order as the direct route), any other one is passed on as it is.
    index = 0;
    s_.for_each_incoming([&](std::size_t step, rank_t d, std::size_t c) {
      const std::span<std::byte> frame = s_.incoming_slot(index);
      complete_receive(index, prev, frame.size());
      if (d == own)
        add_to_sum(frame, c, ring.rank_at(-static_cast<std::ptrdiff_t>(step)));
      else
        send(forwards + index, next, contribution_tag, frame);
      ++index;
    });
    for (std::size_t c = 0; c < layout().chunks(own); ++c) {
      finish_sum(c);
      if (n > 1) send(second_sends + layout().global_chunk(own, c), next, aggregate_tag, aggregate(own, c));
    }
    for (std::size_t s = 1; s < n; ++s) {
      const rank_t owner = ring.rank_at(-static_cast<std::ptrdiff_t>(s));
      for (std::size_t c = 0; c < layout().chunks(owner); ++c) {
        const std::size_t slot = layout().global_chunk(owner, c);
        complete_receive(second_receives + slot, prev, layout().frame_bytes(owner, c));
        decode(aggregate(owner, c), out_chunk(owner, c), false, owner);
        if (s + 1 < n) send(second_sends + slot, next, aggregate_tag, aggregate(owner, c));
      }
    }

    // Every send posted above, in the same walks.
    for (std::size_t k = 1; k < n; ++k) {
      const rank_t d = ring.rank_at(static_cast<std::ptrdiff_t>(k));
      for (std::size_t c = 0; c < layout().chunks(d); ++c)
        complete_send(first_sends + layout().global_chunk(d, c), next, layout().frame_bytes(d, c));
    }
    index = 0;
    s_.for_each_incoming([&](std::size_t, rank_t d, std::size_t c) {
      if (d != own) complete_send(forwards + index, next, layout().frame_bytes(d, c));
      ++index;
    });
    for (std::size_t s = 0; s + 1 < n; ++s) {
      const rank_t owner = ring.rank_at(-static_cast<std::ptrdiff_t>(s));
      for (std::size_t c = 0; c < layout().chunks(owner); ++c)
        complete_send(second_sends + layout().global_chunk(owner, c), next, layout().frame_bytes(owner, c));
    }
  }

  primitives<Transport>& step_;
  compressed_allreduce_state<Q>& s_;
  std::span<request> requests_;
  std::span<const T> in_;
  std::span<T> out_;
  reduce_op op_;
};

}  // namespace qcoll::algorithms
