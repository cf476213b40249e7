#pragma once
/// @file
/// The two-phase striped exchange (spec one-bit-exchange.md §7), compiled into a
/// quantized_schedule (quantized_schedule.hpp runs it). docs/compressed-allreduce.md explains the algorithm; in short, for n
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

#include <qcoll/algorithms/quantized_schedule.hpp>
#include <qcoll/algorithms/ring.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/reproducible/sum.hpp>
#include <qcoll/topologies/graph.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace qcoll {

/// How contributions reach a stripe's owner.
enum class stripe_route : std::uint8_t {
  direct,  ///< straight to the owner (every pair of ranks is linked)
  ring,    ///< hop by hop along the topology's ring, forwarded without re-quantizing
};

}  // namespace qcoll

namespace qcoll::algorithms {

/// The route a topology gives: direct when every pair of ranks is linked. O(n²).
inline stripe_route route_for(const topologies::graph& topology) {
  return topology.fully_linked() ? stripe_route::direct : stripe_route::ring;
}

/// Where stripes, chunks and their frames lie. Stripe j is block j of the buffer's
/// groups (block_of over whole groups), so no group straddles two stripes; chunks
/// cut a stripe every `chunk_values` values (a multiple of the group size), and each
/// chunk is one message.
///
/// The buffer may be several tensors laid end to end (a fused plan: one call for
/// many layers). A chunk is then cut again where a tensor ends, into *pieces*, each
/// encoded as a frame of its own from the tensor's memory (no staging copy); the
/// chunk's message is its pieces' frames end to end. With one tensor every chunk is
/// one piece.
class stripe_layout {
 public:
  /// A chunk's values inside one tensor, and where its frame lies in the chunk's bytes.
  struct piece {
    block_range values;       ///< of the whole buffer (the tensors end to end)
    std::size_t frame_offset = 0;  ///< bytes from the start of the chunk's message
    std::size_t frame_bytes = 0;
  };

  stripe_layout() = default;

  template <quantizer Q>
  stripe_layout(const Q& q, std::size_t count, std::size_t parts, std::size_t requested_chunk_values)
      : stripe_layout(q, std::span<const std::size_t>(&count, 1), parts, requested_chunk_values) {}

  /// Over `tensor_sizes` values laid end to end.
  template <quantizer Q>
  stripe_layout(const Q& q, std::span<const std::size_t> tensor_sizes, std::size_t parts,
                std::size_t requested_chunk_values) {
    tensor_starts_.reserve(tensor_sizes.size());
    for (const std::size_t size : tensor_sizes) {
      tensor_starts_.push_back(count_);
      count_ += size;
    }
    // A quantizer with no group (identity, whole-tensor bfp) may be cut anywhere.
    const std::size_t unit = q.group_size() == 0 ? 1 : q.group_size();
    const std::size_t groups = (count_ + unit - 1) / unit;
    const std::size_t chunk_units = std::max<std::size_t>(1, (requested_chunk_values + unit - 1) / unit);
    chunk_values_ = chunk_units * unit;
    stripes_.resize(parts);
    chunk_base_.assign(parts + 1, 0);
    for (std::size_t j = 0; j < parts; ++j) {
      const block_range units = block_of(groups, parts, j);
      const std::size_t begin = std::min(count_, units.offset * unit);
      const std::size_t end = std::min(count_, (units.offset + units.size) * unit);
      stripes_[j] = {begin, end - begin};
      chunk_base_[j + 1] = chunk_base_[j] + (end - begin + chunk_values_ - 1) / chunk_values_;
    }
    frame_begin_.assign(chunk_base_[parts] + 1, 0);
    piece_base_.assign(chunk_base_[parts] + 1, 0);
    for (std::size_t j = 0; j < parts; ++j)
      for (std::size_t c = 0; c < chunks(j); ++c) {
        const std::size_t g = global_chunk(j, c);
        const block_range whole = chunk(j, c);
        std::size_t bytes = 0;
        for (std::size_t at = whole.offset; at < whole.offset + whole.size;) {
          const std::size_t t = tensor_at(at);
          const std::size_t tensor_end = t + 1 < tensor_starts_.size() ? tensor_starts_[t + 1] : count_;
          const std::size_t end = std::min(whole.offset + whole.size, tensor_end);
          const std::size_t piece_bytes = q.encoded_size(end - at);
          pieces_.push_back({{at, end - at}, bytes, piece_bytes});
          bytes += piece_bytes;
          at = end;
        }
        piece_base_[g + 1] = pieces_.size();
        frame_begin_[g + 1] = frame_begin_[g] + bytes;
      }
  }

  std::size_t count() const noexcept { return count_; }
  std::size_t parts() const noexcept { return stripes_.size(); }
  std::size_t chunk_values() const noexcept { return chunk_values_; }
  /// Where each tensor starts in the whole buffer.
  std::span<const std::size_t> tensor_starts() const noexcept { return tensor_starts_; }
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
  /// Chunk c of stripe j cut where tensors end, in order.
  std::span<const piece> pieces(std::size_t j, std::size_t c) const noexcept {
    const std::size_t g = global_chunk(j, c);
    return std::span(pieces_).subspan(piece_base_[g], piece_base_[g + 1] - piece_base_[g]);
  }

  /// Bytes of the frames of all stripes, laid end to end in stripe order.
  std::size_t total_frame_bytes() const noexcept { return frame_begin_.back(); }
  std::size_t stripe_frame_bytes(std::size_t j) const noexcept {
    return frame_begin_[chunk_base_[j + 1]] - frame_begin_[chunk_base_[j]];
  }
  /// Bytes of chunk c of stripe j's message (its pieces' frames).
  std::size_t frame_bytes(std::size_t j, std::size_t c) const noexcept {
    const std::size_t g = global_chunk(j, c);
    return frame_begin_[g + 1] - frame_begin_[g];
  }
  /// Where chunk c of stripe j's message starts in a buffer of total_frame_bytes().
  std::size_t frame_offset(std::size_t j, std::size_t c) const noexcept { return frame_begin_[global_chunk(j, c)]; }

 private:
  /// The tensor that holds value `at` (< count): the last one starting at or before it,
  /// so empty tensors are skipped.
  std::size_t tensor_at(std::size_t at) const noexcept {
    return static_cast<std::size_t>(std::upper_bound(tensor_starts_.begin(), tensor_starts_.end(), at) -
                                    tensor_starts_.begin()) - 1;
  }

  std::size_t count_ = 0;
  std::size_t chunk_values_ = 1;
  std::vector<std::size_t> tensor_starts_;
  std::vector<block_range> stripes_;
  std::vector<std::size_t> chunk_base_;   // first global chunk of each stripe, and the total
  std::vector<std::size_t> frame_begin_;  // byte offset of each global chunk's message, and the total
  std::vector<std::size_t> piece_base_;   // first piece of each global chunk, and the total
  std::vector<piece> pieces_;
};

/// Compiles rank `rank`'s part of the exchange over `layout` into a schedule.
/// Frames: `outgoing` holds this rank's encoded contributions and `results` every
/// stripe's encoded sum, both laid out as the layout's frames; `incoming` the
/// phase-1 frames received, in receive order. Residual: the worker residual (one
/// value per buffer value), then the server residual (one per value of the own
/// stripe). Encodes draw stochastic rounding at sequence 2·call (contributions) and
/// 2·call + 1 (the owner's re-encode). With an owner update, the owner applies it
/// to its sum before re-encoding; its state is `owner_state_per_value` values per
/// value of the own stripe.
///
/// `on_grid`: the owner sums the decoded contributions on one grid per block of
/// reproducible_block values from its stripe's start (a block also ends where a piece
/// does), so the sum — the same bits in any order — does not depend on the route; every
/// other rank's decoded contribution goes to a scratch slot of the stripe's size first.
/// Chunks that are whole blocks keep it independent of the chunking too.
class compressed_schedule_builder {
 public:
  /// Phase-2 messages have a tag of their own: a fast owner's phase-2 chunk may
  /// reach a rank before the last phase-1 chunk from the same peer. Phase 1 uses the
  /// exact collectives' tag, so a rank that called another collective is told so
  /// (operation_mismatch) instead of waiting for a message that never comes.
  static constexpr transports::tag_t contribution_tag = 0;
  static constexpr transports::tag_t aggregate_tag = 1;

  compressed_schedule_builder(const stripe_layout& layout, rank_t rank, stripe_route route,
                              std::span<const rank_t> ring_order, bool owner_update = false,
                              std::size_t owner_state_per_value = 0, bool on_grid = false)
      : layout_(layout), rank_(rank), size_(static_cast<rank_t>(layout.parts())), route_(route),
        ring_(ring_order, rank), owner_update_(owner_update), owner_state_per_value_(owner_state_per_value),
        on_grid_(on_grid) {
    if (owner_update_) s_.owner_state_values = layout.stripe(rank).size * owner_state_per_value_;
    if (on_grid_) {
      s_.scratch_stride = layout.stripe(rank).size;
      s_.scratch_values = (size_ - 1) * s_.scratch_stride;
    }
    s_.sequence_stride = 2;
    s_.divisor = size_;
    s_.buffer_bytes[static_cast<int>(frame_buffer::outgoing)] = layout.total_frame_bytes();
    s_.buffer_bytes[static_cast<int>(frame_buffer::results)] = layout.total_frame_bytes();
    s_.residual_values = layout.count() + layout.stripe(rank).size;
    incoming_begin_.assign(1, 0);
    for_each_incoming([&](std::size_t, rank_t d, std::size_t c) {
      incoming_begin_.push_back(incoming_begin_.back() + layout.frame_bytes(d, c));
    });
    s_.buffer_bytes[static_cast<int>(frame_buffer::incoming)] = incoming_begin_.back();
  }

  quantized_schedule build() && {
    if (route_ == stripe_route::direct)
      build_direct();
    else
      build_ring();
    return std::move(s_);
  }

 private:
  rank_t after(std::size_t r) const noexcept { return static_cast<rank_t>((rank_ + r) % size_); }
  rank_t before(std::size_t r) const noexcept { return static_cast<rank_t>((rank_ + size_ - r) % size_); }
  std::size_t received() const noexcept { return incoming_begin_.size() - 1; }

  frame_slice contribution(std::size_t j, std::size_t c) const noexcept {
    return {frame_buffer::outgoing, layout_.frame_offset(j, c), layout_.frame_bytes(j, c)};
  }
  frame_slice aggregate(std::size_t j, std::size_t c) const noexcept {
    return {frame_buffer::results, layout_.frame_offset(j, c), layout_.frame_bytes(j, c)};
  }
  frame_slice incoming(std::size_t index) const noexcept {
    return {frame_buffer::incoming, incoming_begin_[index], incoming_begin_[index + 1] - incoming_begin_[index]};
  }

  /// Calls visit(source step s, destination rank d, chunk c) for every phase-1 frame
  /// this rank receives, in the order they arrive. Direct: stripe `rank` from rank
  /// − s. Ring: at step s, from the previous rank, the frames of the rank s places
  /// back for the n − s ranks from this one on (the first is this rank's own).
  template <class Visit>
  void for_each_incoming(Visit&& visit) const {
    for (std::size_t s = 1; s < size_; ++s) {
      const std::size_t destinations = route_ == stripe_route::direct ? 1 : size_ - s;
      for (std::size_t k = 0; k < destinations; ++k) {
        const rank_t d = route_ == stripe_route::direct ? rank_ : ring_.rank_at(static_cast<std::ptrdiff_t>(k));
        for (std::size_t c = 0; c < layout_.chunks(d); ++c) visit(s, d, c);
      }
    }
  }

  // ---- the steps both routes are made of ----

  /// Piece p of the message `chunk` (a chunk's frames).
  static frame_slice frame_of(frame_slice chunk, const stripe_layout::piece& p) noexcept {
    return {chunk.buffer, chunk.offset + p.frame_offset, p.frame_bytes};
  }
  /// Where the owner's state of a value of its stripe starts.
  std::size_t within_stripe(const stripe_layout::piece& p) const noexcept {
    return p.values.offset - layout_.stripe(rank_).offset;
  }

  /// Encodes chunk c of stripe j of the input with the worker residual.
  void encode_contribution(std::size_t j, std::size_t c) {
    for (const auto& p : layout_.pieces(j, c))
      s_.encode(p.values, true, p.values.offset, 0, frame_of(contribution(j, c), p));
  }
  /// Decodes the message `chunk` from `from`, chunk c of stripe j, into the output.
  void decode_chunk(frame_slice chunk, rank_t from, std::size_t j, std::size_t c, bool accumulate) {
    for (const auto& p : layout_.pieces(j, c)) s_.decode(frame_of(chunk, p), from, p.values, accumulate);
  }
  /// The sum starts as this rank's own decoded contribution, in the output.
  void start_sum(std::size_t c) { decode_chunk(contribution(rank_, c), rank_, rank_, c, false); }
  /// Adds the message `chunk` from `from`, chunk c of the own stripe, to the sum — on the
  /// grid: decoded into scratch slot `slot` (1 … n − 1) until finish_sum adds them all.
  void add_contribution(frame_slice chunk, rank_t from, std::size_t slot, std::size_t c) {
    if (!on_grid_) return decode_chunk(chunk, from, rank_, c, true);
    for (const auto& p : layout_.pieces(rank_, c))
      s_.decode_to_scratch(frame_of(chunk, p), from, p.values, (slot - 1) * s_.scratch_stride + within_stripe(p));
  }
  /// On the grid: the output's values = their sum with the scratch slots', a block at a
  /// time — the piece's first values up to a block's end (stripe-relative), then the rest.
  void sum_on_grid(const stripe_layout::piece& p) {
    const std::size_t into = within_stripe(p) % reproducible_block;
    const std::size_t head = into == 0 ? 0 : std::min(p.values.size, reproducible_block - into);
    if (head != 0) s_.sum_on_grid({p.values.offset, head}, within_stripe(p), size_);
    if (p.values.size > head)
      s_.sum_on_grid({p.values.offset + head, p.values.size - head}, within_stripe(p) + head, size_);
  }
  /// Between the phases: the owner (sums on the grid,) (divides, applies its update rule
  /// and) re-encodes its sum with the server residual, then keeps the decoded bits,
  /// exactly what every other rank will decode.
  void finish_sum(std::size_t c) {
    for (const auto& p : layout_.pieces(rank_, c)) {
      if (on_grid_) sum_on_grid(p);
      s_.average(p.values);
      if (owner_update_) s_.update(p.values, within_stripe(p) * owner_state_per_value_);
      s_.encode(p.values, false, layout_.count() + within_stripe(p), 1, frame_of(aggregate(rank_, c), p));
    }
    decode_chunk(aggregate(rank_, c), rank_, rank_, c, false);
  }

  // ---- direct: round r sends to rank + r and receives from rank − r ----
  // Request slots: [phase-1 receives | phase-2 receives (by global chunk) |
  //                 phase-1 sends (by global chunk) | phase-2 sends (by receive index)]

  void build_direct() {
    const std::size_t n = size_;
    const std::size_t own = rank_;
    const std::size_t own_chunks = layout_.chunks(own);
    const std::size_t second_receives = received();  // (n − 1) · own_chunks
    const std::size_t first_sends = second_receives + layout_.total_chunks();
    const std::size_t second_sends = first_sends + layout_.total_chunks();
    s_.requests = second_sends + received();
    auto incoming_index = [&](std::size_t r, std::size_t c) { return (r - 1) * own_chunks + c; };

    for (std::size_t r = 1; r < n; ++r)
      for (std::size_t c = 0; c < own_chunks; ++c)
        s_.post_receive(incoming_index(r, c), before(r), contribution_tag, incoming(incoming_index(r, c)));
    for (std::size_t r = 1; r < n; ++r)
      for (std::size_t c = 0; c < layout_.chunks(before(r)); ++c)
        s_.post_receive(second_receives + layout_.global_chunk(before(r), c), before(r), aggregate_tag,
                        aggregate(before(r), c));

    // Stage t: encode and send chunk t of every stripe; sum, re-encode and send the
    // own stripe's chunk t − 1; decode the other owners' chunk t − 2. All ranks run
    // the same stages, so what a stage waits for was sent in an earlier one.
    for (std::size_t t = 0; t < layout_.max_chunks() + 2; ++t) {
      for (std::size_t r = 0; r < n; ++r) {
        const rank_t j = after(r);
        if (t >= layout_.chunks(j)) continue;
        encode_contribution(j, t);
        if (r != 0) s_.send(first_sends + layout_.global_chunk(j, t), j, contribution_tag, contribution(j, t));
      }
      if (t >= 1 && t - 1 < own_chunks) {
        const std::size_t c = t - 1;
        start_sum(c);
        for (std::size_t r = 1; r < n; ++r) {
          const std::size_t index = incoming_index(r, c);
          s_.complete_receive(index, before(r), incoming(index));
          add_contribution(incoming(index), before(r), r, c);
        }
        finish_sum(c);
        for (std::size_t r = 1; r < n; ++r)
          s_.send(second_sends + incoming_index(r, c), after(r), aggregate_tag, aggregate(own, c));
      }
      if (t >= 2) {
        const std::size_t c = t - 2;
        for (std::size_t r = 1; r < n; ++r) {
          const rank_t j = before(r);
          if (c >= layout_.chunks(j)) continue;
          s_.complete_receive(second_receives + layout_.global_chunk(j, c), j, aggregate(j, c));
          decode_chunk(aggregate(j, c), j, j, c, false);
        }
      }
    }
    for (std::size_t r = 1; r < n; ++r) {
      for (std::size_t c = 0; c < layout_.chunks(after(r)); ++c)
        s_.complete_send(first_sends + layout_.global_chunk(after(r), c), after(r), contribution(after(r), c));
      for (std::size_t c = 0; c < own_chunks; ++c)
        s_.complete_send(second_sends + incoming_index(r, c), after(r), aggregate(own, c));
    }
  }

  // ---- ring: everything goes to the next rank and comes from the previous one ----
  // Request slots: [phase-1 receives (receive order) | phase-2 receives (global chunk) |
  //                 own contributions sent (global chunk) | forwards (receive order) |
  //                 phase-2 sends (global chunk)]

  void build_ring() {
    const std::size_t n = size_;
    const rank_t own = rank_;
    const rank_t next = ring_.next();
    const rank_t prev = ring_.prev();
    const std::size_t second_receives = received();
    const std::size_t first_sends = second_receives + layout_.total_chunks();
    const std::size_t forwards = first_sends + layout_.total_chunks();
    const std::size_t second_sends = forwards + received();
    s_.requests = second_sends + layout_.total_chunks();
    auto back = [&](std::size_t s) { return ring_.rank_at(-static_cast<std::ptrdiff_t>(s)); };

    std::size_t index = 0;
    for_each_incoming([&](std::size_t, rank_t, std::size_t) {
      s_.post_receive(index, prev, contribution_tag, incoming(index));
      ++index;
    });
    // Phase 2 is a ring all-gather: at step s the stripe of the rank s places back arrives.
    for (std::size_t s = 1; s < n; ++s)
      for (std::size_t c = 0; c < layout_.chunks(back(s)); ++c)
        s_.post_receive(second_receives + layout_.global_chunk(back(s), c), prev, aggregate_tag, aggregate(back(s), c));

    // Step 1: this rank's contributions for the ranks 1 … n − 1 places on.
    for (std::size_t k = 1; k < n; ++k) {
      const rank_t d = ring_.rank_at(static_cast<std::ptrdiff_t>(k));
      for (std::size_t c = 0; c < layout_.chunks(d); ++c) {
        encode_contribution(d, c);
        s_.send(first_sends + layout_.global_chunk(d, c), next, contribution_tag, contribution(d, c));
      }
    }
    for (std::size_t c = 0; c < layout_.chunks(own); ++c) {
      encode_contribution(own, c);
      start_sum(c);
    }
    // Later steps: a frame for this rank is summed (from the rank s places back at
    // step s: the same order as the direct route), any other one is passed on as it is.
    index = 0;
    for_each_incoming([&](std::size_t step, rank_t d, std::size_t c) {
      s_.complete_receive(index, prev, incoming(index));
      if (d == own)
        add_contribution(incoming(index), back(step), step, c);
      else
        s_.send(forwards + index, next, contribution_tag, incoming(index));
      ++index;
    });
    for (std::size_t c = 0; c < layout_.chunks(own); ++c) {
      finish_sum(c);
      if (n > 1) s_.send(second_sends + layout_.global_chunk(own, c), next, aggregate_tag, aggregate(own, c));
    }
    for (std::size_t s = 1; s < n; ++s) {
      const rank_t owner = back(s);
      for (std::size_t c = 0; c < layout_.chunks(owner); ++c) {
        const std::size_t slot = layout_.global_chunk(owner, c);
        s_.complete_receive(second_receives + slot, prev, aggregate(owner, c));
        decode_chunk(aggregate(owner, c), owner, owner, c, false);
        if (s + 1 < n) s_.send(second_sends + slot, next, aggregate_tag, aggregate(owner, c));
      }
    }

    // Every send posted above, in the same walks.
    for (std::size_t k = 1; k < n; ++k) {
      const rank_t d = ring_.rank_at(static_cast<std::ptrdiff_t>(k));
      for (std::size_t c = 0; c < layout_.chunks(d); ++c)
        s_.complete_send(first_sends + layout_.global_chunk(d, c), next, contribution(d, c));
    }
    index = 0;
    for_each_incoming([&](std::size_t, rank_t d, std::size_t) {
      if (d != own) s_.complete_send(forwards + index, next, incoming(index));
      ++index;
    });
    for (std::size_t s = 0; s + 1 < n; ++s)
      for (std::size_t c = 0; c < layout_.chunks(back(s)); ++c)
        s_.complete_send(second_sends + layout_.global_chunk(back(s), c), next, aggregate(back(s), c));
  }

  const stripe_layout& layout_;
  rank_t rank_;
  rank_t size_;
  stripe_route route_;
  ring_view ring_;
  bool owner_update_;
  std::size_t owner_state_per_value_;
  bool on_grid_;
  std::vector<std::size_t> incoming_begin_;  // byte offset of each received frame, in receive order, and the end
  quantized_schedule s_;
};

}  // namespace qcoll::algorithms
