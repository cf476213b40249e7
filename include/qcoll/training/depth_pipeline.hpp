#pragma once
/// @file
/// Depth-parallel training of a stack of blocks, one block per rank: the "Sideways"
/// schedule (Malinowski et al., CVPR 2020; seed 004 in docs/schedules.md), and
/// standard backprop over the same blocks for comparison.
///
/// Blocks are numbered 0 … L−1 by communicator rank; items of a sequence 0 … k−1.
/// Sideways, at processing step t, block i
///   - runs forward on item f = t − i: block 0 reads it from the input, block i > 0
///     takes what block i − 1 produced at step t − 1;
///   - runs backward for item g = t − 2L + 2 + i: the last block's gradient comes from
///     the loss of the output it has just produced (g = f there, exact), block i < L − 1
///     takes what block i + 1 sent back at step t − 1, and combines it with its
///     *current* input (item f, or item k − 1 once the inputs have run out): the
///     approximation that lets every block work at every step;
///   - sends its output to i + 1 and its input gradient to i − 1, both for step t + 1.
/// Work whose item lies outside [0, k) is skipped, and both ends of a message compute
/// the same predicate, so nothing is sent that is not received. The last gradient
/// reaches block 0 at t = k + 2L − 3: a sequence takes k + 2L − 2 steps (backprop:
/// k (2L − 1)). Every block reads only values of step t − 1 and writes values of step
/// t: the exchange at the end of a step moves them, so ranks never share memory.

#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::training {

/// A block of layers: a stage of the pipeline, held by one rank.
/// - `forward(in, out)`: out = B(in), at the block's current parameters.
/// - `backward(in, out_grad, in_grad)`: given d loss / d out, writes d loss / d in
///   into `in_grad` (empty on the first block, which has no one to send it to),
///   computes the parameters' gradient, and then applies its update. `in` is always
///   the input of this block's latest forward call, so a block may reuse what that
///   call computed (activations, masks).
template <class B>
concept pipeline_block = requires(B& block, const B& const_block, std::span<const float> in, std::span<float> out,
                                  std::span<const float> out_grad, std::span<float> in_grad) {
  { const_block.input_size() } -> std::convertible_to<std::size_t>;
  { const_block.output_size() } -> std::convertible_to<std::size_t>;
  block.forward(in, out);
  block.backward(in, out_grad, in_grad);
};

/// `input(item, x)` writes item `item` of the sequence into `x` (first block only).
template <class F>
concept sequence_input = std::invocable<F&, std::size_t, std::span<float>>;

/// `loss(item, output, output_grad)` returns item `item`'s loss for the last block's
/// `output` and writes d loss / d output into `output_grad` (last block only).
template <class F>
concept sequence_loss = requires(F& loss, std::size_t item, std::span<const float> output, std::span<float> grad) {
  { loss(item, output, grad) } -> std::convertible_to<double>;
};

enum class pipeline_mode : std::uint8_t {
  sideways,  ///< every block at every step, gradients against current activations
  backprop,  ///< one item at a time: forward through every block, then backward
};

/// What one rank did for one sequence.
struct sequence_stats {
  std::size_t items = 0;
  std::size_t steps = 0;      ///< processing steps of the schedule, the same on every rank
  std::size_t forwards = 0;   ///< this block's forward calls (k)
  std::size_t backwards = 0;  ///< this block's backward calls (k)
  double loss = 0;            ///< the last block: summed over the items; others 0
  /// Floats of activations and gradients the schedule holds on this rank between
  /// calls to the block (inputs kept for backward, messages in and out).
  std::size_t activation_floats = 0;
};

/// The steps a sequence of `items` takes on `blocks` ranks (docs/schedules.md).
constexpr std::size_t pipeline_steps(pipeline_mode mode, std::size_t items, std::size_t blocks) noexcept {
  return mode == pipeline_mode::sideways ? items + 2 * blocks - 2 : items * (2 * blocks - 1);
}

/// Trains `block` as stage `comm.rank()` of a pipeline over every rank of `comm`
/// (a world or a sub-communicator). Construction is collective: it checks that each
/// block's output size is the next block's input size.
/// @par Errors
/// invalid_argument on every rank when the sizes do not chain, or when the ranks
/// pass different item counts or modes to train(). When a block, the input or the
/// loss throws on one rank, that rank aborts the communicator (so the others fail
/// at once with `aborted`, naming it) and rethrows.
template <class Communicator, pipeline_block Block>
class depth_pipeline {
 public:
  depth_pipeline(Communicator& comm, Block& block)
      : comm_(comm), block_(block), rank_(comm.rank()), blocks_(comm.size()) {
    const auto sizes = gather({double(block.input_size()), double(block.output_size())});
    for (std::size_t i = 0; i + 1 < blocks_; ++i)
      if (sizes[2 * i + 1] != sizes[2 * (i + 1)])
        detail::throw_error(errc::invalid_argument,
                            "qcoll depth_pipeline on rank {} of {}: block {} outputs {} values but block {} takes {}",
                            rank_, blocks_, i, std::size_t(sizes[2 * i + 1]), i + 1, std::size_t(sizes[2 * (i + 1)]));
  }

  /// Trains on one sequence of `items` items; collective, with the same `items` and
  /// `mode` on every rank. Registers start empty: nothing of an earlier sequence is used.
  template <sequence_input Input, sequence_loss Loss>
  sequence_stats train(std::size_t items, Input&& input, Loss&& loss, pipeline_mode mode = pipeline_mode::sideways) {
    agree(items, mode == pipeline_mode::sideways ? operation::sideways : operation::backprop);
    reset(mode == pipeline_mode::sideways ? operation::sideways : operation::backprop);
    sequence_stats stats{.items = items, .steps = pipeline_steps(mode, items, blocks_)};
    guarded([&] {
      if (mode == pipeline_mode::sideways) run_sideways(items, input, loss, stats);
      else run_backprop(items, input, loss, stats);
    });
    stats.activation_floats = held_floats();
    return stats;
  }

  /// Forward only, as the Sideways forward pass (k + L − 1 steps): the last block
  /// hands each item's output to `output(item, values)`; no block's backward runs.
  /// Collective, with the same `items` on every rank.
  template <sequence_input Input, std::invocable<std::size_t, std::span<const float>> Output>
  sequence_stats evaluate(std::size_t items, Input&& input, Output&& output) {
    agree(items, operation::evaluate);
    reset(operation::evaluate);
    sequence_stats stats{.items = items, .steps = items + blocks_ - 1};
    guarded([&] {
      const std::size_t lag = rank_;
      for (std::size_t t = 0; t < stats.steps; ++t) {
        const bool forward = active(items, t, lag);
        if (forward) {
          run_forward(t - lag, input, stats);
          if (last()) output(t - lag, std::span<const float>(output_));
        }
        exchange(forward && !last(), std::span<const float>(output_), rank_ + 1,  //
                 !first() && active(items, t + 1, lag), std::span<float>(input_), rank_ - 1);
      }
    });
    stats.activation_floats = held_floats();
    return stats;
  }

  std::size_t blocks() const noexcept { return blocks_; }

 private:
  enum class operation : std::uint8_t { sideways, backprop, evaluate };

  /// Runs `work`; when the block, the input, the loss or the output throws, aborts the
  /// communicator so the other ranks stop at once.
  template <class Work>
  void guarded(Work&& work) {
    try {
      work();
    } catch (const error&) {
      throw;  // the communicator's own: every rank has been told already
    } catch (const std::exception& e) {
      comm_.abort(qcoll::detail::format("depth_pipeline block {} failed: {}", rank_, e.what()));
      throw;
    } catch (...) {
      comm_.abort(qcoll::detail::format("depth_pipeline block {} failed", rank_));
      throw;
    }
  }

  bool first() const noexcept { return rank_ == 0; }
  bool last() const noexcept { return rank_ + 1 == blocks_; }

  /// Every rank's values, rank after rank.
  std::vector<double> gather(std::vector<double> mine) {
    std::vector<double> all(mine.size() * blocks_);
    comm_.all_gather(std::span<const double>(mine), std::span<double>(all));
    return all;
  }

  void agree(std::size_t items, operation what) {
    const auto all = gather({double(items), double(what)});
    for (std::size_t r = 0; r < blocks_; ++r)
      if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
        detail::throw_error(errc::invalid_argument,
                            "qcoll depth_pipeline on rank {} of {}: rank 0 trains {} items ({}), rank {} {} items ({})",
                            rank_, blocks_, std::size_t(all[0]), name(operation(all[1])), r,
                            std::size_t(all[2 * r]), name(operation(all[2 * r + 1])));
    if (items == 0)
      detail::throw_error(errc::invalid_argument, "qcoll depth_pipeline on rank {} of {}: a sequence of 0 items",
                          rank_, blocks_);
  }

  static const char* name(operation what) noexcept {
    switch (what) {
      case operation::sideways: return "sideways";
      case operation::backprop: return "backprop";
      case operation::evaluate: return "evaluate";
    }
    return "?";
  }

  static bool active(std::size_t items, std::size_t t, std::size_t lag) noexcept { return t >= lag && t - lag < items; }

  /// Buffers for a new sequence, filled with NaN: a value of an earlier sequence (or
  /// none) that leaked into a computation would show.
  void reset(operation what) {
    const std::size_t in = block_.input_size(), out = block_.output_size();
    const bool sideways = what == operation::sideways, gradients = what != operation::evaluate;
    const float none = std::numeric_limits<float>::quiet_NaN();
    input_.assign(in, none);
    incoming_input_.assign(sideways && !first() ? in : 0, none);
    output_.assign(out, none);
    output_grad_.assign(gradients ? out : 0, none);
    incoming_grad_.assign(sideways && !last() ? out : 0, none);
    input_grad_.assign(gradients && !first() ? in : 0, none);
  }

  std::size_t held_floats() const noexcept {
    return input_.size() + incoming_input_.size() + output_.size() + output_grad_.size() + incoming_grad_.size() +
           input_grad_.size();
  }

  template <class Input, class Loss>
  void run_sideways(std::size_t items, Input& input, Loss& loss, sequence_stats& stats) {
    const auto active = [items](std::size_t t, std::size_t lag) { return depth_pipeline::active(items, t, lag); };
    const std::size_t forward_lag = rank_, backward_lag = 2 * blocks_ - 2 - rank_;
    for (std::size_t t = 0; t < stats.steps; ++t) {
      const bool forward = active(t, forward_lag), backward = active(t, backward_lag);
      if (forward) {
        if (!first()) input_.swap(incoming_input_);
        run_forward(t, input, stats);
      }
      if (backward) {
        if (last())
          stats.loss += double(loss(t - backward_lag, std::span<const float>(output_), std::span<float>(output_grad_)));
        else output_grad_.swap(incoming_grad_);
        block_.backward(std::span<const float>(input_), std::span<const float>(output_grad_),
                        std::span<float>(input_grad_));
        ++stats.backwards;
      }
      // The values of step t, to the neighbours that use them at step t + 1: the same
      // predicates, evaluated for the neighbour, decide what is received.
      exchange(forward && !last(), std::span<const float>(output_), rank_ + 1,  //
               !first() && active(t + 1, forward_lag), std::span<float>(incoming_input_), rank_ - 1);
      exchange(backward && !first(), std::span<const float>(input_grad_), rank_ - 1,  //
               !last() && active(t + 1, backward_lag), std::span<float>(incoming_grad_), rank_ + 1);
    }
  }

  template <class Input, class Loss>
  void run_backprop(std::size_t items, Input& input, Loss& loss, sequence_stats& stats) {
    for (std::size_t item = 0; item < items; ++item) {
      if (!first()) comm_.recv(std::span<float>(input_), rank_ - 1);
      run_forward(item, input, stats);
      if (last()) {
        stats.loss += double(loss(item, std::span<const float>(output_), std::span<float>(output_grad_)));
      } else {
        comm_.send(std::span<const float>(output_), rank_ + 1);
        comm_.recv(std::span<float>(output_grad_), rank_ + 1);
      }
      block_.backward(std::span<const float>(input_), std::span<const float>(output_grad_),
                      std::span<float>(input_grad_));
      ++stats.backwards;
      if (!first()) comm_.send(std::span<const float>(input_grad_), rank_ - 1);
    }
  }

  /// The block's forward on the register; the first block reads item `item` into it.
  template <class Input>
  void run_forward(std::size_t item, Input& input, sequence_stats& stats) {
    if (first()) input(item, std::span<float>(input_));
    block_.forward(std::span<const float>(input_), std::span<float>(output_));
    ++stats.forwards;
  }

  /// One message each way, or either alone, or none.
  void exchange(bool sending, std::span<const float> outgoing, rank_t to, bool receiving, std::span<float> incoming,
                rank_t from) {
    if (sending && receiving) comm_.send_recv(outgoing, to, incoming, from);
    else if (sending) comm_.send(outgoing, to);
    else if (receiving) comm_.recv(incoming, from);
  }

  Communicator& comm_;
  Block& block_;
  rank_t rank_;
  std::size_t blocks_;
  std::vector<float> input_;           // the register: the input of the latest forward
  std::vector<float> incoming_input_;  // sideways: block i − 1's output of step t, for step t + 1
  std::vector<float> output_;
  std::vector<float> output_grad_;
  std::vector<float> incoming_grad_;   // sideways: block i + 1's input gradient of step t
  std::vector<float> input_grad_;      // empty on the first block
};

}  // namespace qcoll::training
