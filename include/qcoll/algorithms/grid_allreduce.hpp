#pragma once
/// @file
/// The grid allreduce on one rank: its part of a grid_schedule (every message of
/// the call, all ranks) compiled into a quantized_schedule, which run_schedule runs.
/// Every receive is posted before the first send; each step's sends go before its
/// receives, so no two ranks wait for each other.

#include <qcoll/algorithms/grid_schedule.hpp>
#include <qcoll/algorithms/quantized_schedule.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace qcoll::algorithms {

/// Compiles node `node`'s part of `schedule` (played by communicator ranks
/// `rank_of_node`) into a quantized schedule. The output is the work buffer: it
/// starts as the input; values that move in the forward and reduce phases are
/// encoded there with error feedback and added by the receiver; the leaves of the
/// core places this node plays are finished (avg: divided,) encoded once and
/// decoded, between the reduce and gather phases; every rank decodes the same leaf
/// frames. Frames: `outgoing` the encoded values sent, `incoming` those received,
/// `results` every leaf's frame. Every encode has its own part of the residual.
inline quantized_schedule compile_grid_allreduce(const grid_schedule& schedule, std::span<const rank_t> rank_of_node,
                                                 rank_t node) {
  const topologies::grid_routing& routing = schedule.routing();
  // The node that sends or receives for a transfer's end: the host of a core place.
  auto player = [&](rank_t v) { return routing.in_core(v) ? routing.host_of(v) : v; };
  auto leaf_frames = [&](std::size_t first, std::size_t last) {
    return frame_slice{frame_buffer::results, schedule.frame_offset(first),
                       schedule.frame_offset(last) - schedule.frame_offset(first)};
  };

  // This node's operations, by step: sends before receives; the own leaves are
  // finished between the reduce and gather phases.
  enum class kind : std::uint8_t { encode_send, receive_add, finish_leaf, send_frames, receive_frames };
  struct operation {
    kind what;
    rank_t peer;
    block_range values;
    std::size_t first_leaf, last_leaf;
    frame_slice frame;
    std::size_t residual_offset, request;
  };
  quantized_schedule s;
  std::vector<operation> ops;
  auto add_transfer = [&](const grid_transfer& t, bool sending) {
    const bool values = t.phase == grid_phase::forward || t.phase == grid_phase::reduce;
    operation op{values ? (sending ? kind::encode_send : kind::receive_add)
                        : (sending ? kind::send_frames : kind::receive_frames),
                 rank_of_node[player(sending ? t.to : t.from)], t.values, t.first_leaf, t.last_leaf, {}, 0,
                 s.new_request()};
    if (op.what == kind::encode_send) {
      op.frame = s.new_frame(frame_buffer::outgoing, t.bytes);
      op.residual_offset = s.new_residual(t.values.size);
    } else if (op.what == kind::receive_add) {
      op.frame = s.new_frame(frame_buffer::incoming, t.bytes);
    } else {
      op.frame = leaf_frames(t.first_leaf, t.last_leaf);
    }
    ops.push_back(op);
  };
  std::vector<std::size_t> own_leaves;
  for (std::size_t leaf = 0; leaf < routing.leaves(); ++leaf)
    if (routing.host_of(routing.core_of_leaf(leaf)) == node) own_leaves.push_back(leaf);
  auto finish_leaves = [&] {
    for (std::size_t leaf : own_leaves) {
      const block_range values = schedule.leaf_values(leaf);
      ops.push_back({kind::finish_leaf, 0, values, leaf, leaf + 1, leaf_frames(leaf, leaf + 1),
                     s.new_residual(values.size), 0});
    }
    own_leaves.clear();
  };
  const std::span<const grid_transfer> transfers = schedule.transfers();
  for (std::size_t begin = 0; begin < transfers.size();) {
    std::size_t end = begin;
    while (end < transfers.size() && transfers[end].step == transfers[begin].step) ++end;
    const grid_phase phase = transfers[begin].phase;
    if (phase == grid_phase::gather || phase == grid_phase::distribute) finish_leaves();
    for (std::size_t i = begin; i < end; ++i)
      if (player(transfers[i].from) == node) add_transfer(transfers[i], true);
    for (std::size_t i = begin; i < end; ++i)
      if (player(transfers[i].to) == node) add_transfer(transfers[i], false);
    begin = end;
  }
  finish_leaves();
  s.buffer_bytes[static_cast<int>(frame_buffer::results)] = schedule.total_frame_bytes();
  s.input_to_output = true;
  s.divisor = routing.divisor();
  // Encode i of call c draws at c · (operations) + i: distinct for every encode of every call.
  s.sequence_stride = ops.size();

  // The steps: every receive posted first, then the operations in order, then the
  // completion of every send.
  for (const operation& op : ops)
    if (op.what == kind::receive_add || op.what == kind::receive_frames)
      s.post_receive(op.request, op.peer, 0, op.frame);
  std::size_t encodes = 0;
  for (const operation& op : ops) {
    switch (op.what) {
      case kind::encode_send:
        s.encode(op.values, false, op.residual_offset, encodes++, op.frame);
        s.send(op.request, op.peer, 0, op.frame);
        break;
      case kind::receive_add:
        s.complete_receive(op.request, op.peer, op.frame);
        s.decode(op.frame, op.peer, op.values, true);
        break;
      case kind::finish_leaf:
        s.average(op.values);
        s.encode(op.values, false, op.residual_offset, encodes++, op.frame);
        s.decode(op.frame, rank_of_node[node], op.values, false);
        break;
      case kind::send_frames: s.send(op.request, op.peer, 0, op.frame); break;
      case kind::receive_frames:
        s.complete_receive(op.request, op.peer, op.frame);
        for (std::size_t leaf = op.first_leaf; leaf < op.last_leaf; ++leaf)
          s.decode(leaf_frames(leaf, leaf + 1), op.peer, schedule.leaf_values(leaf), false);
        break;
    }
  }
  for (const operation& op : ops)
    if (op.what == kind::encode_send || op.what == kind::send_frames) s.complete_send(op.request, op.peer, op.frame);
  return s;
}

}  // namespace qcoll::algorithms
