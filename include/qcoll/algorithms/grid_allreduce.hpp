#pragma once
/// @file
/// The grid allreduce on one rank: its part of a grid_schedule compiled into a list
/// of operations once (grid_allreduce_state), and the call that runs them
/// (grid_exchange). Every receive is posted before the first send; each step's
/// sends go before its receives, so no two ranks wait for each other.

#include <qcoll/algorithms/compressed_allreduce.hpp>
#include <qcoll/algorithms/grid_schedule.hpp>
#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/quantized_steps.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/core/partition.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace qcoll::algorithms {

enum class grid_op_kind : std::uint8_t {
  encode_send,     ///< encode `values` with error feedback and send them
  receive_add,     ///< receive values and add them to `values`
  finish_leaf,     ///< (avg: divide,) encode the own leaf once for everyone, keep the decoded bits
  send_frames,     ///< send leaf frames [first_leaf, last_leaf) as they are
  receive_frames,  ///< receive leaf frames and decode them into the output
};

struct grid_op {
  grid_op_kind kind = grid_op_kind::encode_send;
  rank_t peer = 0;  ///< communicator rank
  block_range values{};
  std::size_t first_leaf = 0;
  std::size_t last_leaf = 0;
  std::size_t offset = 0;  ///< in the outgoing (encode_send) or incoming (receive_add) frames
  std::size_t bytes = 0;
  std::size_t residual_offset = 0;  ///< encode_send, finish_leaf
  std::size_t request = 0;
};

/// Everything a grid_allreduce_plan owns on one rank; built once, a call allocates nothing.
template <quantizer Q>
struct grid_allreduce_state {
  using value_type = typename Q::value_type;
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  Q quantizer;
  rank_t rank = 0;
  rank_t size = 1;
  rank_t node = 0;
  bool included = false;
  std::string exclusion;  // why not, when not included
  std::uint32_t fingerprint = 0;
  std::size_t count = 0;
  std::size_t divisor = 1;

  std::vector<grid_op> ops;
  std::vector<block_range> leaf_values;
  std::vector<std::size_t> frame_offset;  // of each leaf in `frames`, and the total
  std::size_t requests_needed = 0;

  std::vector<value_type> residual[2];  // one part per encode: committed and staging
  unsigned committed = 0;
  std::uint64_t calls = 0;  // successful calls: keys stochastic rounding

  std::vector<std::byte> frames;    // every leaf's frame
  std::vector<std::byte> outgoing;  // encoded values sent
  std::vector<std::byte> incoming;  // encoded values received
  compressed_allreduce_statistics last_call{};

  /// This rank's operations from the schedule: by step, sends before receives;
  /// the own leaf is finished between the reduce and gather phases.
  void build(const grid_schedule& schedule, std::span<const rank_t> rank_of_node) {
    const topologies::reduction_plan& plan = schedule.plan();
    count = schedule.count();
    divisor = plan.divisor();
    fingerprint = plan.fingerprint();
    leaf_values.clear();
    frame_offset.assign(1, 0);
    for (std::size_t leaf = 0; leaf < schedule.leaves(); ++leaf) {
      leaf_values.push_back(schedule.leaf_values(leaf));
      frame_offset.push_back(schedule.frame_offset(leaf + 1));
    }
    ops.clear();
    std::size_t outgoing_bytes = 0, incoming_bytes = 0, residual_values = 0, requests = 0;
    auto add_transfer = [&](const grid_transfer& t, bool sending) {
      grid_op op;
      const bool values = t.phase == grid_phase::forward || t.phase == grid_phase::reduce;
      op.kind = values ? (sending ? grid_op_kind::encode_send : grid_op_kind::receive_add)
                       : (sending ? grid_op_kind::send_frames : grid_op_kind::receive_frames);
      op.peer = rank_of_node[player(plan, sending ? t.to : t.from)];
      op.values = t.values;
      op.first_leaf = t.first_leaf;
      op.last_leaf = t.last_leaf;
      op.bytes = t.bytes;
      op.request = requests++;
      if (op.kind == grid_op_kind::encode_send) {
        op.offset = outgoing_bytes, outgoing_bytes += t.bytes;
        op.residual_offset = residual_values, residual_values += t.values.size;
      } else if (op.kind == grid_op_kind::receive_add) {
        op.offset = incoming_bytes, incoming_bytes += t.bytes;
      }
      ops.push_back(op);
    };
    // The leaves this node finishes: those of the core places it plays.
    std::vector<std::size_t> own_leaves;
    for (std::size_t leaf = 0; leaf < plan.leaves(); ++leaf)
      if (plan.host_of(plan.core_of_leaf(leaf)) == node) own_leaves.push_back(leaf);
    auto finish_leaves = [&] {
      for (std::size_t leaf : own_leaves) add_finish_leaf(leaf, residual_values);
      own_leaves.clear();
    };
    const std::span<const grid_transfer> transfers = schedule.transfers();
    for (std::size_t begin = 0; begin < transfers.size();) {
      std::size_t end = begin;
      while (end < transfers.size() && transfers[end].step == transfers[begin].step) ++end;
      const grid_phase phase = transfers[begin].phase;
      if (phase == grid_phase::gather || phase == grid_phase::distribute) finish_leaves();
      for (std::size_t i = begin; i < end; ++i)
        if (player(plan, transfers[i].from) == node) add_transfer(transfers[i], true);
      for (std::size_t i = begin; i < end; ++i)
        if (player(plan, transfers[i].to) == node) add_transfer(transfers[i], false);
      begin = end;
    }
    finish_leaves();
    requests_needed = requests;
    if constexpr (Q::keeps_residual)
      for (auto& r : residual) r.assign(residual_values, value_type{});
    committed = 0;
    calls = 0;
    frames.assign(frame_offset.back(), std::byte{});
    outgoing.assign(outgoing_bytes, std::byte{});
    incoming.assign(incoming_bytes, std::byte{});
  }

  std::span<std::byte> leaf_frames(std::size_t first, std::size_t last) noexcept {
    return std::span(frames).subspan(frame_offset[first], frame_offset[last] - frame_offset[first]);
  }

 private:
  /// The node that sends or receives for a transfer's end: the host of a core place.
  static rank_t player(const topologies::reduction_plan& plan, rank_t node) {
    return plan.in_core(node) ? plan.host_of(node) : node;
  }

  void add_finish_leaf(std::size_t leaf, std::size_t& residual_values) {
    grid_op op;
    op.kind = grid_op_kind::finish_leaf;
    op.values = leaf_values[leaf];
    op.first_leaf = leaf;
    op.last_leaf = leaf + 1;
    op.residual_offset = residual_values;
    residual_values += op.values.size;
    ops.push_back(op);
  }
};

/// One call over a grid plan's state.
template <transport Transport, quantizer Q>
class grid_exchange {
 public:
  using T = typename Q::value_type;
  using request = typename Transport::request;

  grid_exchange(primitives<Transport>& step, grid_allreduce_state<Q>& state, std::span<request> requests,
                std::span<const T> in, std::span<T> out, reduce_op op)
      : step_(step), s_(state), requests_(requests), in_(in), out_(out), op_(op) {
    s_.last_call = {};
  }

  void run() {
    // The output is the work buffer: it starts as this rank's contribution.
    if (in_.data() != out_.data()) std::copy(in_.begin(), in_.end(), out_.begin());
    for (const grid_op& op : s_.ops) {
      if (op.kind == grid_op_kind::receive_add)
        step_.post_recv(requests_[op.request], op.peer, 0, incoming(op));
      else if (op.kind == grid_op_kind::receive_frames)
        step_.post_recv(requests_[op.request], op.peer, 0, s_.leaf_frames(op.first_leaf, op.last_leaf));
    }
    std::size_t encodes = 0;
    for (const grid_op& op : s_.ops) {
      switch (op.kind) {
        case grid_op_kind::encode_send:
          encode(op.values.of(std::span<const T>(out_)), op, outgoing(op), encodes++);
          send(op, outgoing(op));
          break;
        case grid_op_kind::receive_add:
          receive(op);
          decode_or_fail(step_, s_.quantizer, incoming(op), op.values.of(out_), true, op.peer);
          break;
        case grid_op_kind::finish_leaf: {
          const std::span<T> sum = op.values.of(out_);
          if (op_ == reduce_op::avg) kernels::cpu::finish_avg(sum, s_.divisor);
          const std::span<std::byte> frame = s_.leaf_frames(op.first_leaf, op.last_leaf);
          encode(std::span<const T>(sum), op, frame, encodes++);
          decode_or_fail(step_, s_.quantizer, frame, sum, false, s_.rank);
          break;
        }
        case grid_op_kind::send_frames: send(op, s_.leaf_frames(op.first_leaf, op.last_leaf)); break;
        case grid_op_kind::receive_frames:
          receive(op);
          for (std::size_t leaf = op.first_leaf; leaf < op.last_leaf; ++leaf)
            decode_or_fail(step_, s_.quantizer, s_.leaf_frames(leaf, leaf + 1), s_.leaf_values[leaf].of(out_), false,
                           op.peer);
          break;
      }
    }
    for (const grid_op& op : s_.ops)
      if (op.kind == grid_op_kind::encode_send || op.kind == grid_op_kind::send_frames)
        step_.complete_send(requests_[op.request], op.peer, op.bytes);
  }

 private:
  std::span<std::byte> outgoing(const grid_op& op) { return std::span(s_.outgoing).subspan(op.offset, op.bytes); }
  std::span<std::byte> incoming(const grid_op& op) { return std::span(s_.incoming).subspan(op.offset, op.bytes); }

  /// Every encode has its own part of the residual and its own place in the
  /// stochastic-rounding sequence (the call count times the encodes per call).
  void encode(std::span<const T> values, const grid_op& op, std::span<std::byte> frame, std::size_t index) {
    const std::size_t encodes_per_call = s_.ops.size();
    staged_encode(s_.quantizer, values, s_.residual, s_.committed, {op.residual_offset, op.values.size}, frame,
                  {s_.calls * encodes_per_call + index, op.values.offset});
  }

  void send(const grid_op& op, std::span<const std::byte> frame) {
    step_.post_send(requests_[op.request], op.peer, 0, frame);
    s_.last_call.bytes_sent += frame.size();
    ++s_.last_call.messages_sent;
    step_.poll(requests_[op.request]);  // moves what is queued while this rank computes
  }
  void receive(const grid_op& op) {
    step_.complete_recv(requests_[op.request], op.peer, op.bytes);
    s_.last_call.bytes_received += op.bytes;
    ++s_.last_call.messages_received;
  }

  primitives<Transport>& step_;
  grid_allreduce_state<Q>& s_;
  std::span<request> requests_;
  std::span<const T> in_;
  std::span<T> out_;
  reduce_op op_;
};

}  // namespace qcoll::algorithms
