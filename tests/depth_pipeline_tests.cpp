// training::depth_pipeline (the Sideways schedule and backprop over the same blocks),
// ranks as threads over the in-process transport. The processes' run is
// examples/sideways_training (tests/schedules.cmake).

#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>
#include <qcoll/training/depth_pipeline.hpp>

#include "support/expect_failure.hpp"
#include "support/ranks.hpp"
#include "support/reference.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

using namespace qcoll;
using test::expect_every_rank_fails;
using test::quick;
using test::run_ranks;
using training::pipeline_mode;

namespace {

/// tanh(W·in + b), trained by SGD inside backward; records every backward call.
class dense_block {
 public:
  dense_block(std::size_t inputs, std::size_t outputs, std::uint64_t seed, float learning_rate)
      : inputs_(inputs), outputs_(outputs), learning_rate_(learning_rate),
        weights_(inputs * outputs), biases_(outputs, 0.0f), output_(outputs) {
    // Small enough that tanh does not saturate (a saturated block has zero gradients).
    for (std::size_t k = 0; k < weights_.size(); ++k)
      weights_[k] = 0.4f * std::sin(1.3f * float(k) + 7.1f * float(seed));
  }

  std::size_t input_size() const { return inputs_; }
  std::size_t output_size() const { return outputs_; }

  void forward(std::span<const float> in, std::span<float> out) {
    for (std::size_t j = 0; j < outputs_; ++j) {
      float sum = biases_[j];
      for (std::size_t i = 0; i < inputs_; ++i) sum += weights_[j * inputs_ + i] * in[i];
      out[j] = output_[j] = std::tanh(sum);
    }
  }

  void backward(std::span<const float> in, std::span<const float> out_grad, std::span<float> in_grad) {
    std::vector<float> delta(outputs_);
    for (std::size_t j = 0; j < outputs_; ++j) delta[j] = out_grad[j] * (1.0f - output_[j] * output_[j]);
    for (std::size_t i = 0; i < in_grad.size(); ++i) {
      float sum = 0;
      for (std::size_t j = 0; j < outputs_; ++j) sum += weights_[j * inputs_ + i] * delta[j];
      in_grad[i] = sum;
    }
    // The parameters' gradient is delta ⊗ in: recording delta and in records it.
    record.push_back({std::vector<float>(delta), std::vector<float>(in.begin(), in.end()),
                      std::vector<float>(in_grad.begin(), in_grad.end())});
    for (std::size_t j = 0; j < outputs_; ++j) {
      for (std::size_t i = 0; i < inputs_; ++i) weights_[j * inputs_ + i] -= learning_rate_ * delta[j] * in[i];
      biases_[j] -= learning_rate_ * delta[j];
    }
  }

  struct backward_call {
    std::vector<float> delta, input, input_grad;
    bool operator==(const backward_call&) const = default;  // floats compared as values: NaN never equal
  };
  std::vector<backward_call> record;

  const std::vector<float>& weights() const { return weights_; }

 private:
  std::size_t inputs_, outputs_;
  float learning_rate_;
  std::vector<float> weights_, biases_, output_;
};

constexpr std::size_t width = 6;

/// Item t of a sequence: smooth in t, or the same for every t.
void sequence_item(std::size_t t, std::span<float> x, bool constant) {
  for (std::size_t f = 0; f < x.size(); ++f) x[f] = std::sin(0.3f * float(f) + (constant ? 0.0f : 0.2f * float(t)));
}

/// Squared error against a target that depends on the item.
double squared_error(std::size_t item, std::span<const float> output, std::span<float> grad) {
  double loss = 0;
  for (std::size_t j = 0; j < output.size(); ++j) {
    const float error = output[j] - std::cos(0.5f * float(j + item));
    grad[j] = error;
    loss += 0.5 * double(error) * double(error);
  }
  return loss;
}

struct run_result {
  std::vector<std::vector<dense_block::backward_call>> records;  // per block
  std::vector<std::vector<float>> weights;                       // per block
  std::vector<training::sequence_stats> stats;                   // per block, last sequence
};

/// `blocks` dense blocks on as many ranks, trained on `sequences` sequences of `items`.
run_result train_dense(std::size_t blocks, pipeline_mode mode, std::size_t items, float learning_rate, bool constant,
                       std::size_t sequences = 1) {
  run_result result{std::vector<std::vector<dense_block::backward_call>>(blocks),
                    std::vector<std::vector<float>>(blocks), std::vector<training::sequence_stats>(blocks)};
  const auto outcome = run_ranks(blocks, [&](auto& comm) {
    dense_block block(width, width, 100 + comm.rank(), learning_rate);
    training::depth_pipeline pipeline(comm, block);
    for (std::size_t s = 0; s < sequences; ++s)
      result.stats[comm.rank()] = pipeline.train(
          items, [&](std::size_t t, std::span<float> x) { sequence_item(t, x, constant); }, squared_error, mode);
    result.records[comm.rank()] = block.record;
    result.weights[comm.rank()] = block.weights();
  });
  BOOST_REQUIRE(outcome.all_succeeded());
  return result;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A block that passes (sequence, item) tags through and checks what it is given:
/// input tags travel forward, gradient tags backward.
class tracer_block {
 public:
  std::size_t input_size() const { return 2; }
  std::size_t output_size() const { return 2; }
  void forward(std::span<const float> in, std::span<float> out) {
    forwards.push_back({in[0], in[1]});
    out[0] = in[0];
    out[1] = in[1];
  }
  void backward(std::span<const float> in, std::span<const float> out_grad, std::span<float> in_grad) {
    backwards.push_back({in[0], in[1], out_grad[0], out_grad[1]});
    if (!in_grad.empty()) {
      in_grad[0] = out_grad[0];
      in_grad[1] = out_grad[1];
    }
  }
  std::vector<std::vector<float>> forwards, backwards;  // {sequence, item(, sequence, item)}
};

}  // namespace

BOOST_AUTO_TEST_SUITE(depth_pipeline)

// With one block, Sideways is backprop: forward, loss and backward of item t at step t.
BOOST_AUTO_TEST_CASE(one_block_equals_backprop_bit_for_bit) {
  const auto sideways = train_dense(1, pipeline_mode::sideways, 9, 0.1f, false, 2);
  const auto backprop = train_dense(1, pipeline_mode::backprop, 9, 0.1f, false, 2);
  BOOST_TEST(bitwise_equal(sideways.weights[0], backprop.weights[0]));
  BOOST_TEST(sideways.stats[0].loss == backprop.stats[0].loss);
  BOOST_TEST(sideways.records[0].size() == 18u);
  BOOST_TEST((sideways.records[0] == backprop.records[0]));
  BOOST_TEST(sideways.stats[0].steps == 9u);
}

// Constant input and frozen parameters make every item's forward pass the same, so
// every gradient Sideways computes equals backprop's: at block i in each of the k
// steps t = 2L − 2 − i … k + 2L − 3 − i where a gradient arrives.
BOOST_AUTO_TEST_CASE(with_constant_input_and_frozen_parameters_every_gradient_equals_backprop) {
  for (std::size_t blocks : {2, 3, 4}) {
    const std::size_t items = 7;
    const auto sideways = train_dense(blocks, pipeline_mode::sideways, items, 0.0f, true);
    const auto backprop = train_dense(blocks, pipeline_mode::backprop, items, 0.0f, true);
    for (std::size_t i = 0; i < blocks; ++i) {
      BOOST_TEST(sideways.records[i].size() == items);
      BOOST_TEST((sideways.records[i] == backprop.records[i]), "block " << i << " of " << blocks);
      BOOST_TEST(std::abs(sideways.records[i].back().delta[0]) > 1e-3f);  // a gradient, not a saturated zero
    }
  }
}

// The same with a changing input: the last block's gradients stay exact (its input
// and its loss belong to one item); the earlier blocks' are approximations, which is
// what makes the equality above a property of the constant input.
BOOST_AUTO_TEST_CASE(with_a_changing_input_only_the_last_block_is_exact) {
  const std::size_t blocks = 3, items = 7;
  const auto sideways = train_dense(blocks, pipeline_mode::sideways, items, 0.0f, false);
  const auto backprop = train_dense(blocks, pipeline_mode::backprop, items, 0.0f, false);
  BOOST_TEST((sideways.records[blocks - 1] == backprop.records[blocks - 1]));
  for (std::size_t i = 0; i + 1 < blocks; ++i) BOOST_TEST((sideways.records[i] != backprop.records[i]), "block " << i);
}

namespace {

/// Sideways written out in one process, from the schedule's definition (seed 004,
/// Malinowski et al. Fig. 2) rather than from depth_pipeline: all L blocks in lockstep,
/// each step reading only what the blocks produced at the step before. At step t block
/// i forwards item t − i (block 0 from the sequence, block i from block i − 1's output
/// of step t − 1) and runs backward for item g = t − 2L + 2 + i against its latest
/// input, with the gradient block i + 1 produced at step t − 1 (the last block: its
/// loss on item g, whose output it has just produced).
run_result train_sideways_in_one_process(std::size_t blocks, std::size_t items, float learning_rate,
                                         std::size_t sequences) {
  std::vector<dense_block> stack;
  for (std::size_t i = 0; i < blocks; ++i) stack.emplace_back(width, width, 100 + i, learning_rate);
  run_result result{{}, std::vector<std::vector<float>>(blocks), std::vector<training::sequence_stats>(blocks)};
  const auto active = [&](std::size_t t, std::size_t lag) { return t >= lag && t - lag < items; };
  for (std::size_t s = 0; s < sequences; ++s) {
    std::vector<std::vector<float>> input(blocks, std::vector<float>(width)), output = input, in_grad = input;
    std::vector<std::vector<float>> previous_output = output, previous_in_grad = in_grad;
    std::vector<float> out_grad(width);
    std::vector<double> loss(blocks, 0.0);
    for (std::size_t t = 0; t < items + 2 * blocks - 2; ++t) {
      for (std::size_t i = 0; i < blocks; ++i) {
        if (active(t, i)) {  // forward of item t − i
          if (i == 0) sequence_item(t, input[0], false);
          else input[i] = previous_output[i - 1];
          stack[i].forward(input[i], output[i]);
        }
        const std::size_t backward_lag = 2 * blocks - 2 - i;
        if (active(t, backward_lag)) {  // backward of item t − backward_lag
          if (i + 1 == blocks) loss[i] += squared_error(t - backward_lag, output[i], out_grad);
          else out_grad = previous_in_grad[i + 1];
          stack[i].backward(input[i], out_grad, i == 0 ? std::span<float>() : std::span<float>(in_grad[i]));
        }
      }
      previous_output = output;
      previous_in_grad = in_grad;
    }
    for (std::size_t i = 0; i < blocks; ++i) result.stats[i].loss = loss[i];
  }
  for (std::size_t i = 0; i < blocks; ++i) result.weights[i] = stack[i].weights();
  return result;
}

}  // namespace

// With learning, a changing input and L > 1 the ranks' weights equal, bit for bit, those
// of the schedule run in one process by its definition: the distributed schedule moves
// the right values at the right steps (fill, steady state, drain, two sequences).
BOOST_AUTO_TEST_CASE(learning_equals_the_schedule_written_out_in_one_process) {
  for (std::size_t blocks : {2, 3, 4})
    for (std::size_t items : {3, 11}) {
      const auto distributed = train_dense(blocks, pipeline_mode::sideways, items, 0.05f, false, 2);
      const auto reference = train_sideways_in_one_process(blocks, items, 0.05f, 2);
      for (std::size_t i = 0; i < blocks; ++i) {
        BOOST_TEST_INFO("block " << i << " of " << blocks << ", " << items << " items");
        BOOST_TEST(bitwise_equal(distributed.weights[i], reference.weights[i]));
        BOOST_TEST(!bitwise_equal(distributed.weights[i], dense_block(width, width, 100 + i, 0.0f).weights()));
      }
      BOOST_TEST(distributed.stats[blocks - 1].loss == reference.stats[blocks - 1].loss);
    }
}

BOOST_AUTO_TEST_CASE(a_sequence_of_k_items_takes_k_plus_2L_minus_2_steps) {
  for (std::size_t blocks : {1, 2, 4})
    for (std::size_t items : {1, 2, 5}) {
      const auto sideways = train_dense(blocks, pipeline_mode::sideways, items, 0.05f, false);
      const auto backprop = train_dense(blocks, pipeline_mode::backprop, items, 0.05f, false);
      for (std::size_t i = 0; i < blocks; ++i) {
        BOOST_TEST(sideways.stats[i].steps == items + 2 * blocks - 2);
        BOOST_TEST(backprop.stats[i].steps == items * (2 * blocks - 1));
        BOOST_TEST(sideways.stats[i].forwards == items);
        BOOST_TEST(sideways.stats[i].backwards == items);
        BOOST_TEST(backprop.stats[i].backwards == items);
      }
      BOOST_TEST(sideways.stats[blocks - 1].loss > 0);
    }
}

// Tags show what every call was given. A short sequence (k < L: fill and drain
// overlap) follows a long one, then another long one: block i's backward for item g
// uses its latest input, item min(g + 2(L − 1 − i), k − 1) of the same sequence, and
// no call ever sees a value of another sequence or an unset (NaN) register.
BOOST_AUTO_TEST_CASE(fill_and_drain_leave_no_stale_activation) {
  const std::size_t blocks = 4;
  const std::vector<std::size_t> lengths{6, 2, 5};
  for (pipeline_mode mode : {pipeline_mode::sideways, pipeline_mode::backprop}) {
    std::vector<tracer_block> tracers(blocks);
    std::vector<std::vector<std::string>> problems(blocks);
    const auto outcome = run_ranks(blocks, [&](auto& comm) {
      tracer_block& tracer = tracers[comm.rank()];
      training::depth_pipeline pipeline(comm, tracer);
      for (std::size_t s = 0; s < lengths.size(); ++s) {
        const auto input = [&](std::size_t t, std::span<float> x) {
          x[0] = float(s);
          x[1] = float(t);
        };
        const auto loss = [&](std::size_t item, std::span<const float> out, std::span<float> grad) {
          if (out[0] != float(s) || out[1] != float(item))
            problems[comm.rank()].push_back("loss of item " + std::to_string(item) + " got another output");
          grad[0] = out[0];
          grad[1] = out[1];
          return 1.0;
        };
        pipeline.train(lengths[s], input, loss, mode);
      }
    });
    BOOST_REQUIRE(outcome.all_succeeded());
    for (std::size_t i = 0; i < blocks; ++i) {
      // The message operand is evaluated even when the check passes: no front() of an empty vector.
      BOOST_TEST(problems[i].empty(), (problems[i].empty() ? std::string() : problems[i].front()));
      const auto& backwards = tracers[i].backwards;
      std::size_t call = 0;
      for (std::size_t s = 0; s < lengths.size(); ++s) {
        const std::size_t k = lengths[s];
        for (std::size_t g = 0; g < k; ++g, ++call) {
          BOOST_REQUIRE(call < backwards.size());
          const std::size_t lag = mode == pipeline_mode::sideways ? 2 * (blocks - 1 - i) : 0;
          const std::vector<float> expected{float(s), float(std::min(g + lag, k - 1)), float(s), float(g)};
          BOOST_TEST(backwards[call] == expected, "block " << i << ", sequence " << s << ", gradient of item " << g);
        }
      }
      BOOST_TEST(backwards.size() == call);
    }
  }
}

// evaluate() is the forward half: each item's output, in item order, the one a
// training call's loss sees when the parameters do not change.
BOOST_AUTO_TEST_CASE(evaluate_gives_each_item_its_forward_output) {
  const std::size_t blocks = 3, items = 5;
  std::vector<std::vector<float>> trained, evaluated;
  std::vector<std::size_t> order;
  std::vector<training::sequence_stats> stats(blocks);
  const auto outcome = run_ranks(blocks, [&](auto& comm) {
    dense_block block(width, width, 100 + comm.rank(), 0.0f);
    training::depth_pipeline pipeline(comm, block);
    const auto input = [](std::size_t t, std::span<float> x) { sequence_item(t, x, false); };
    pipeline.train(items, input, [&](std::size_t item, std::span<const float> out, std::span<float> grad) {
      trained.emplace_back(out.begin(), out.end());
      return squared_error(item, out, grad);
    }, pipeline_mode::backprop);
    stats[comm.rank()] = pipeline.evaluate(items, input, [&](std::size_t item, std::span<const float> out) {
      order.push_back(item);
      evaluated.emplace_back(out.begin(), out.end());
    });
  });
  BOOST_REQUIRE(outcome.all_succeeded());
  BOOST_TEST(order == (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  BOOST_REQUIRE(evaluated.size() == items);
  for (std::size_t t = 0; t < items; ++t) BOOST_TEST(bitwise_equal(evaluated[t], trained[t]), "item " << t);
  for (std::size_t i = 0; i < blocks; ++i) {
    BOOST_TEST(stats[i].steps == items + blocks - 1);
    BOOST_TEST(stats[i].forwards == items);
    BOOST_TEST(stats[i].backwards == 0u);
  }
}

BOOST_AUTO_TEST_CASE(a_pipeline_runs_on_a_sub_communicator_as_on_a_world_of_its_size) {
  const auto world = train_dense(3, pipeline_mode::sideways, 6, 0.1f, false);
  std::vector<std::vector<float>> weights(5);
  const auto outcome = run_ranks(5, [&](auto& comm) {
    auto group = comm.split(std::int64_t(comm.rank() % 2), std::int64_t(comm.rank()));
    dense_block block(width, width, 100 + group->rank(), 0.1f);
    training::depth_pipeline pipeline(*group, block);
    pipeline.train(6, [](std::size_t t, std::span<float> x) { sequence_item(t, x, false); }, squared_error);
    weights[comm.rank()] = block.weights();
  });
  BOOST_REQUIRE(outcome.all_succeeded());
  for (std::size_t i = 0; i < 3; ++i) BOOST_TEST(bitwise_equal(weights[2 * i], world.weights[i]), "block " << i);
}

BOOST_AUTO_TEST_CASE(blocks_that_do_not_chain_fail_on_every_rank) {
  const auto outcome = run_ranks(3, [](auto& comm) {
    dense_block block(comm.rank() == 2 ? 4 : width, width, 1, 0.1f);
    training::depth_pipeline pipeline(comm, block);
  });
  expect_every_rank_fails(outcome, errc::invalid_argument, {"block 1 outputs 6 values but block 2 takes 4"});
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_about_the_sequence_fail_on_every_rank) {
  const auto input = [](std::size_t t, std::span<float> x) { sequence_item(t, x, false); };
  const auto items = run_ranks(3, [&](auto& comm) {
    dense_block block(width, width, 1, 0.1f);
    training::depth_pipeline pipeline(comm, block);
    pipeline.train(comm.rank() == 1 ? 4 : 5, input, squared_error);
  });
  expect_every_rank_fails(items, errc::invalid_argument, {"rank 0 trains 5 items (sideways), rank 1 4 items"});
  const auto modes = run_ranks(2, [&](auto& comm) {
    dense_block block(width, width, 1, 0.1f);
    training::depth_pipeline pipeline(comm, block);
    pipeline.train(5, input, squared_error, comm.rank() == 0 ? pipeline_mode::sideways : pipeline_mode::backprop);
  });
  expect_every_rank_fails(modes, errc::invalid_argument, {"(backprop)"});
  const auto empty = run_ranks(2, [&](auto& comm) {
    dense_block block(width, width, 1, 0.1f);
    training::depth_pipeline pipeline(comm, block);
    pipeline.train(0, input, squared_error);
  });
  expect_every_rank_fails(empty, errc::invalid_argument, {"a sequence of 0 items"});
}

// A block that throws on one rank: that rank gets its exception, the others an abort
// that names the block, at once (not after a timeout; `quick` bounds the wait).
BOOST_AUTO_TEST_CASE(a_block_that_throws_stops_every_rank) {
  struct failing_block : dense_block {
    using dense_block::dense_block;
    std::size_t calls = 0;
    void forward(std::span<const float> in, std::span<float> out) {
      if (++calls == 3) throw std::runtime_error("out of memory in layer 7");
      dense_block::forward(in, out);
    }
  };
  for (pipeline_mode mode : {pipeline_mode::sideways, pipeline_mode::backprop}) {
    const auto outcome = run_ranks(
        4,
        [&](auto& comm) {
          failing_block block(width, width, 1, 0.1f);
          block.calls = comm.rank() == 1 ? 0 : 100;
          training::depth_pipeline pipeline(comm, block);
          pipeline.train(8, [](std::size_t t, std::span<float> x) { sequence_item(t, x, false); }, squared_error,
                         mode);
        },
        quick);
    for (std::size_t r = 0; r < 4; ++r) {
      const auto [code, what] = outcome.failure(r);
      if (r == 1) {
        BOOST_TEST(what == "out of memory in layer 7");
      } else {
        BOOST_TEST(code == make_error_code(errc::aborted), "rank " << r << ": " << what);
        BOOST_TEST(what.find("depth_pipeline block 1 failed: out of memory in layer 7") != std::string::npos, what);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
