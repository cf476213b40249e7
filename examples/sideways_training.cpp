// Depth-parallel training (seed 004, "Sideways"): a classifier of L blocks, one per
// rank, learns which of several classes a sequence of frames shows, from sequences of
// smoothly changing synthetic frames. It trains four times from the same start:
// Sideways and backprop (qcoll::training::depth_pipeline, docs/schedules.md), each on
// the smooth sequences and on a control with every sequence's frames shuffled. Sideways
// pairs a block's current input with a gradient computed 2(L − 1 − i) frames earlier,
// so it relies on neighbouring frames being alike; the shuffled control shows what
// happens when they are not. Rank 0 prints, per run: processing steps, wall time, the
// activations the schedule holds per block, the training loss and the test accuracy.
//
//   qcoll-run -n 4 sideways_training                   # L = 4 blocks, shared memory
//   qcoll-run -n 2 --transport tcp -- sideways_training --epochs 2
//
// Options: --epochs N, --seed S, --sequences N (training sequences), --frames N (per
// sequence), --width N (units per hidden block), --lr X, --drift X (radians a
// sequence's frame turns per step: the smoothness).
// Exit status: 0 when Sideways on smooth frames reaches backprop's test accuracy within
// 5 percentage points (what the method claims), 1 when it falls further behind, 2 on
// errors. The shuffled control is reported, not judged.

#include <qcoll/communicator.hpp>
#include <qcoll/training/depth_pipeline.hpp>

#include <fmt/format.h>

#include "launched_main.hpp"
#include "synthetic_classification.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using qcoll::training::pipeline_mode;
using qcoll_examples::random_stream;

struct settings {
  std::size_t epochs = 2;
  std::uint64_t seed = 1;
  std::size_t train_sequences = 192;
  std::size_t test_sequences = 32;
  std::size_t frames = 48;
  std::size_t width = 128;
  float learning_rate = 0.01f;
  float drift = 0.05f;
};

constexpr std::size_t features = 32, classes = 8;
constexpr double accuracy_limit_pp = 5.0;

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const char* text = argv[i + 1];
    char* end = nullptr;
    if (flag == "--lr" || flag == "--drift") {
      const float value = std::strtof(text, &end);
      if (*end != '\0' || !(value > 0)) throw std::invalid_argument(fmt::format("{} takes a positive number", flag));
      (flag == "--lr" ? s.learning_rate : s.drift) = value;
      continue;
    }
    const unsigned long long count = std::strtoull(text, &end, 10);
    if (*end != '\0' || *text == '-' || count == 0)
      throw std::invalid_argument(fmt::format("{} takes a positive whole number, not '{}'", flag, text));
    if (flag == "--epochs") s.epochs = count;
    else if (flag == "--seed") s.seed = count;
    else if (flag == "--sequences") s.train_sequences = count;
    else if (flag == "--frames") s.frames = count;
    else if (flag == "--width") s.width = count;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  return s;
}

/// Class c's frames turn in the plane of two prototypes: frame t of a sequence is
/// cos(φ + drift·t)·p_c + sin(φ + drift·t)·q_c + u + n_t, with an offset u drawn
/// once per sequence and a little noise n_t per frame. The class is the plane, not a
/// direction in it, so no linear classifier finds it; with a small drift neighbouring
/// frames are alike.
struct frame_source {
  static constexpr float offset_scale = 0.5f, frame_noise = 0.1f;
  std::vector<float> prototypes;  // 2 per class, `features` values each
  struct sequence {
    std::size_t label;
    float phase;
    std::uint64_t noise_seed;
    std::vector<std::size_t> order;  // frame shown at step t: order[t]
  };
  std::vector<sequence> train, test;
  float drift;
  std::size_t frames;

  frame_source(const settings& s) : drift(s.drift), frames(s.frames) {
    random_stream random(s.seed, 0x5eed5);
    prototypes.resize(2 * classes * features);
    for (float& p : prototypes) p = float(random.normal());
    auto draw = [&](std::size_t count) {
      std::vector<sequence> out(count);
      for (sequence& q : out) {
        q.label = random.below(classes);
        q.phase = float(2 * 3.14159265358979 * random.uniform());
        q.noise_seed = random.next();
        q.order.resize(frames);
        std::iota(q.order.begin(), q.order.end(), std::size_t{0});
      }
      return out;
    };
    train = draw(s.train_sequences);
    test = draw(s.test_sequences);
  }

  /// The control: every training sequence's frames in a random order (the same frames).
  frame_source shuffled(std::uint64_t seed) const {
    frame_source copy = *this;
    random_stream random(seed, 0x5a0ff1e);
    for (sequence& q : copy.train)
      for (std::size_t t = frames; t > 1; --t) std::swap(q.order[t - 1], q.order[random.below(t)]);
    return copy;
  }

  void frame(const sequence& q, std::size_t step, std::span<float> x) const {
    const std::size_t t = q.order[step];
    const float angle = q.phase + drift * float(t);
    const float* p = prototypes.data() + 2 * q.label * features;
    random_stream offset(q.noise_seed, 0), noise(q.noise_seed, 1 + t);
    for (std::size_t f = 0; f < features; ++f)
      x[f] = std::cos(angle) * p[f] + std::sin(angle) * p[features + f] + offset_scale * float(offset.normal()) +
             frame_noise * float(noise.normal());
  }
};

/// One block: a dense layer, ReLU unless it is the last block (logits). Trained by
/// SGD, one update per backward call, as Sideways prescribes.
class dense_block {
 public:
  dense_block(std::size_t inputs, std::size_t outputs, bool relu, float learning_rate, std::uint64_t seed)
      : inputs_(inputs), outputs_(outputs), relu_(relu), learning_rate_(learning_rate), weights_(inputs * outputs),
        biases_(outputs, 0.0f), output_(outputs) {
    random_stream random(seed, 0xb10c);
    const double scale = std::sqrt(2.0 / double(inputs));  // He initialisation
    for (float& w : weights_) w = float(scale * random.normal());
  }

  std::size_t input_size() const { return inputs_; }
  std::size_t output_size() const { return outputs_; }

  void forward(std::span<const float> in, std::span<float> out) {
    for (std::size_t j = 0; j < outputs_; ++j) {
      const float* row = weights_.data() + j * inputs_;
      float sum = biases_[j];
      for (std::size_t i = 0; i < inputs_; ++i) sum += row[i] * in[i];
      out[j] = output_[j] = relu_ ? std::max(sum, 0.0f) : sum;
    }
  }

  void backward(std::span<const float> in, std::span<const float> out_grad, std::span<float> in_grad) {
    std::fill(in_grad.begin(), in_grad.end(), 0.0f);
    for (std::size_t j = 0; j < outputs_; ++j) {
      const float delta = relu_ && output_[j] <= 0.0f ? 0.0f : out_grad[j];
      if (delta == 0.0f) continue;
      float* row = weights_.data() + j * inputs_;
      for (std::size_t i = 0; i < in_grad.size(); ++i) in_grad[i] += row[i] * delta;
      for (std::size_t i = 0; i < inputs_; ++i) row[i] -= learning_rate_ * delta * in[i];
      biases_[j] -= learning_rate_ * delta;
    }
  }

 private:
  std::size_t inputs_, outputs_;
  bool relu_;
  float learning_rate_;
  std::vector<float> weights_, biases_, output_;
};

/// Softmax cross-entropy against `label`; returns the loss, writes d loss / d logits.
double cross_entropy(std::span<const float> logits, std::size_t label, std::span<float> grad) {
  const float largest = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (float z : logits) total += std::exp(double(z - largest));
  for (std::size_t k = 0; k < logits.size(); ++k)
    grad[k] = float(std::exp(double(logits[k] - largest)) / total - (k == label ? 1.0 : 0.0));
  return std::log(total) - double(logits[label] - largest);
}

struct run_result {
  std::size_t steps = 0;
  double seconds = 0;
  std::size_t activation_floats = 0;  // the largest over the blocks
  double mean_loss = 0;               // over the last epoch's frames
  double test_accuracy = 0;           // percent of test frames
};

template <class Communicator>
run_result train_and_test(Communicator& comm, const settings& s, const frame_source& data, pipeline_mode mode) {
  const std::size_t L = comm.size(), i = comm.rank();
  const bool last = i + 1 == L;
  dense_block block(i == 0 ? features : s.width, last ? classes : s.width, !last, s.learning_rate, s.seed * 64 + i);
  qcoll::training::depth_pipeline pipeline(comm, block);

  run_result result;
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  double loss = 0;
  for (std::size_t epoch = 0; epoch < s.epochs; ++epoch) {
    loss = 0;
    for (const auto& q : data.train) {
      const auto stats = pipeline.train(
          s.frames, [&](std::size_t t, std::span<float> x) { data.frame(q, t, x); },
          [&](std::size_t, std::span<const float> out, std::span<float> grad) {
            return cross_entropy(out, q.label, grad);
          },
          mode);
      result.steps += stats.steps;
      result.activation_floats = stats.activation_floats;
      loss += stats.loss;
    }
  }
  comm.barrier();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::size_t correct = 0;
  for (const auto& q : data.test)
    pipeline.evaluate(s.frames, [&](std::size_t t, std::span<float> x) { data.frame(q, t, x); },
                      [&](std::size_t, std::span<const float> logits) {
                        correct += std::size_t(std::max_element(logits.begin(), logits.end()) - logits.begin()) ==
                                   q.label;
                      });
  // The loss and the accuracy are the last block's; the memory, the largest block's.
  std::vector<double> mine{loss, double(correct), double(result.activation_floats)}, all(3 * L);
  comm.all_gather(std::span<const double>(mine), std::span<double>(all));
  const double frames = double(s.frames);
  result.mean_loss = all[3 * (L - 1)] / (frames * double(data.train.size()));
  result.test_accuracy = 100.0 * all[3 * (L - 1) + 1] / (frames * double(data.test.size()));
  for (std::size_t r = 0; r < L; ++r)
    result.activation_floats = std::max(result.activation_floats, std::size_t(all[3 * r + 2]));
  return result;
}

template <class Communicator>
int compare(Communicator& comm, const settings& s, std::string_view transport) {
  const frame_source smooth(s);
  const frame_source shuffled = smooth.shuffled(s.seed);
  const bool printing = comm.rank() == 0;
  const std::size_t L = comm.size();
  if (printing) {
    fmt::print("depth-parallel training on {} ranks ({}): {} blocks ({} → {} hidden units per block → {} classes), "
               "{} training sequences of {} frames, {} epochs, drift {} rad/frame, seed {}\n",
               L, transport, L, features, s.width, classes, s.train_sequences, s.frames, s.epochs, s.drift, s.seed);
    fmt::print("a sequence: Sideways {} steps (k + 2L − 2), backprop {} (k (2L − 1)); chance accuracy {:.1f} %\n\n",
               qcoll::training::pipeline_steps(pipeline_mode::sideways, s.frames, L),
               qcoll::training::pipeline_steps(pipeline_mode::backprop, s.frames, L), 100.0 / classes);
    fmt::print("{:<10} {:<9} {:>8} {:>9} {:>10} {:>16} {:>10} {:>9}\n", "schedule", "frames", "steps", "time (s)",
               "frames/s", "held (floats)", "train loss", "test acc");
  }
  double smooth_accuracy[2] = {};
  for (const frame_source* data : {&smooth, &shuffled})
    for (pipeline_mode mode : {pipeline_mode::sideways, pipeline_mode::backprop}) {
      const run_result r = train_and_test(comm, s, *data, mode);
      if (data == &smooth) smooth_accuracy[mode == pipeline_mode::sideways ? 0 : 1] = r.test_accuracy;
      if (printing) {
        const double frames = double(s.epochs * s.train_sequences * s.frames);
        fmt::print("{:<10} {:<9} {:>8} {:>9.2f} {:>10.0f} {:>16} {:>10.4f} {:>7.2f} %\n",
                   mode == pipeline_mode::sideways ? "sideways" : "backprop", data == &smooth ? "smooth" : "shuffled",
                   r.steps, r.seconds, frames / r.seconds, r.activation_floats, r.mean_loss, r.test_accuracy);
        std::fflush(stdout);
      }
    }
  const double gap = smooth_accuracy[1] - smooth_accuracy[0];
  const bool ok = gap <= accuracy_limit_pp;
  if (printing) {
    fmt::print("\nsmooth frames: backprop − Sideways test accuracy = {:.2f} pp (limit {:.2f}): {}\n", gap,
               accuracy_limit_pp, ok ? "ok" : "too far");
    std::fflush(stdout);
  }
  comm.barrier();
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return qcoll_examples::launched_main("sideways_training", argc, argv, parse,
                                       [](auto& comm, const settings& s, std::string_view transport) {
                                         return compare(comm, s, transport);
                                       });
}
