// Seed 001 (Baidu, CN103150596A): four ranks in two groups train a DNN, and the result
// is exact backprop — after N steps the weights equal single-rank training on the full
// batch bit for bit, which the program checks. docs/schedules.md has the scheme, the
// gaps in the seed and the choices made here:
//   - groups as the seed's Fig. 6: backward group {0, 2}, update group {1, 3};
//   - forward: each rank computes every layer on a quarter of the batch and gathers
//     the layer's output (start_all_gather) while computing the next layer;
//   - backward: the backward ranks split the error E_l by batch rows; each broadcasts
//     its half to the update group on a sub-communicator of three (split), started;
//   - update: the update ranks split W_l by output neurons, apply SGD to their half and
//     broadcast it to all four ranks (the seed says the update group; the backward
//     group needs W too), started, into staging buffers, while the backward ranks
//     compute E_{l−1} with the old W_l (the seed's two-stage pipeline).
// Every float is computed by the same kernel, over the same rows in the same order,
// as in the single-rank reference, which is why the equality is bitwise. A started
// call's buffers are left alone until it has finished: each layer's quarter is computed
// into a buffer of its own and gathered from there, and a backward rank broadcasts a
// copy of its error half (a broadcast writes the root's buffer too).
// Then it trains the same model by 4-rank data parallelism (exact and 1-bit allreduce)
// for comparison, and prints steps/s and the bytes each scheme sends per step (measured:
// what the transport wrote).
//
//   qcoll-run -n 4 asymmetric_groups      # the scheme, checked, then data parallelism
//   qcoll-run -n 1 asymmetric_groups      # single-rank full-batch training: the baseline
//
// Options: --steps N, --batch N (divisible by 4), --hidden N, --layers N (hidden
// layers), --seed S, --lr X. Exit status: 0 when the weights equal the reference bit
// for bit on every rank, 1 when not, 2 on errors.

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <fmt/format.h>

#include "launched_main.hpp"
#include "synthetic_classification.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using qcoll_examples::dataset;

struct settings {
  std::size_t steps = 20;
  std::size_t batch = 256;
  std::size_t hidden = 256;
  std::size_t layers = 4;  // hidden layers, all `hidden` wide
  std::uint64_t seed = 1;
  float learning_rate = 0.05f;
};

constexpr qcoll_examples::cluster_problem_shape problem_shape{
    .features = 64, .classes = 16, .clusters_per_class = 2, .center_spread = 0.6};
constexpr std::size_t training_samples = 8192;

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const char* text = argv[i + 1];
    char* end = nullptr;
    if (flag == "--lr") {
      s.learning_rate = std::strtof(text, &end);
      if (*end != '\0' || !(s.learning_rate > 0)) throw std::invalid_argument("--lr takes a positive number");
      continue;
    }
    const unsigned long long count = std::strtoull(text, &end, 10);
    if (*end != '\0' || *text == '-' || count == 0)
      throw std::invalid_argument(fmt::format("{} takes a positive whole number, not '{}'", flag, text));
    if (flag == "--steps") s.steps = count;
    else if (flag == "--batch") s.batch = count;
    else if (flag == "--hidden") s.hidden = count;
    else if (flag == "--layers") s.layers = count;
    else if (flag == "--seed") s.seed = count;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  if (s.batch % 4 != 0) throw std::invalid_argument(fmt::format("--batch {} does not split in 4 quarters", s.batch));
  return s;
}

/// A half-open range of indices (batch rows or output neurons).
struct range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
range part(std::size_t count, std::size_t parts, std::size_t p) { return {count * p / parts, count * (p + 1) / parts}; }

/// The DNN: layer l maps width[l] inputs to width[l + 1] outputs, ReLU on all but the
/// last. Layer l's parameters are outputs × (inputs + 1): row j holds output j's weights
/// then its bias, so half of a layer's output neurons is one contiguous span.
struct network {
  std::vector<std::size_t> width;
  std::vector<std::size_t> offset;  // of each layer in `parameters`, and the total
  std::vector<float> parameters;

  network(const settings& s) {
    width.push_back(problem_shape.features);
    for (std::size_t l = 0; l < s.layers; ++l) width.push_back(s.hidden);
    width.push_back(problem_shape.classes);
    offset.push_back(0);
    for (std::size_t l = 0; l + 1 < width.size(); ++l) offset.push_back(offset.back() + row_size(l) * width[l + 1]);
    parameters.resize(offset.back());
    qcoll_examples::random_stream random(s.seed, 0xd11);
    for (std::size_t l = 0; l < layers(); ++l) {
      const double scale = std::sqrt(2.0 / double(width[l]));  // He; biases 0
      for (std::size_t j = 0; j < width[l + 1]; ++j)
        for (std::size_t i = 0; i < width[l]; ++i) weights(l)[j * row_size(l) + i] = float(scale * random.normal());
    }
  }
  std::size_t layers() const { return width.size() - 1; }
  std::size_t row_size(std::size_t l) const { return width[l] + 1; }
  std::span<float> weights(std::size_t l) {
    return std::span(parameters).subspan(offset[l], offset[l + 1] - offset[l]);
  }
  /// Output neurons `outputs` of layer l: their rows of weights and bias.
  std::span<float> neurons(std::size_t l, range outputs) {
    return weights(l).subspan(outputs.begin * row_size(l), outputs.size() * row_size(l));
  }
};

// The kernels. Each computes whole rows (batch samples) or whole output neurons, so a
// split over rows or neurons computes every value exactly as the full range does.

/// out[r] = f(W · in[r] + b) for the rows; activations are batch × width row-major.
void forward_rows(network& net, std::size_t l, std::span<const float> in, std::span<float> out, range rows) {
  const std::size_t n_in = net.width[l], n_out = net.width[l + 1];
  const bool hidden = l + 1 < net.layers();
  const std::span<const float> w = net.weights(l);
  for (std::size_t r = rows.begin; r < rows.end; ++r)
    for (std::size_t j = 0; j < n_out; ++j) {
      const float* row = w.data() + j * (n_in + 1);
      float sum = row[n_in];
      for (std::size_t i = 0; i < n_in; ++i) sum += row[i] * in[r * n_in + i];
      out[r * n_out + j] = hidden ? std::max(sum, 0.0f) : sum;
    }
}

/// E = d mean loss / d logits for the rows (softmax cross-entropy); returns their summed loss.
double output_error_rows(std::span<const float> logits, std::span<const std::uint8_t> labels, std::size_t batch,
                         std::span<float> error, range rows) {
  const std::size_t classes = problem_shape.classes;
  double loss = 0;
  for (std::size_t r = rows.begin; r < rows.end; ++r) {
    const float* z = logits.data() + r * classes;
    const float largest = *std::max_element(z, z + classes);
    double total = 0;
    for (std::size_t k = 0; k < classes; ++k) total += std::exp(double(z[k] - largest));
    for (std::size_t k = 0; k < classes; ++k)
      error[r * classes + k] =
          float(std::exp(double(z[k] - largest)) / total - (k == labels[r] ? 1.0 : 0.0)) / float(batch);
    loss += std::log(total) - double(z[labels[r]] - largest);
  }
  return loss;
}

/// E_{l−1}[r] = (W_lᵀ E_l[r]) ⊙ relu'(in[r]) for the rows: the error one layer down.
void error_below_rows(network& net, std::size_t l, std::span<const float> error, std::span<const float> in,
                      std::span<float> below, range rows) {
  const std::size_t n_in = net.width[l], n_out = net.width[l + 1];
  const std::span<const float> w = net.weights(l);
  for (std::size_t r = rows.begin; r < rows.end; ++r) {
    float* b = below.data() + r * n_in;
    std::fill(b, b + n_in, 0.0f);
    for (std::size_t j = 0; j < n_out; ++j) {
      const float e = error[r * n_out + j];
      const float* row = w.data() + j * (n_in + 1);
      for (std::size_t i = 0; i < n_in; ++i) b[i] += row[i] * e;
    }
    for (std::size_t i = 0; i < n_in; ++i)
      if (in[r * n_in + i] <= 0.0f) b[i] = 0.0f;
  }
}

/// The gradient of output neurons `outputs` of layer l over the rows, summed in row
/// order: grad[j] = Σ_r E[r][j] · (in[r], 1). `grad` holds those neurons' rows.
void gradient_neurons(network& net, std::size_t l, std::span<const float> error, std::span<const float> in,
                      std::span<float> grad, range outputs, range rows) {
  const std::size_t n_in = net.width[l], n_out = net.width[l + 1];
  std::fill(grad.begin(), grad.end(), 0.0f);
  for (std::size_t j = outputs.begin; j < outputs.end; ++j) {
    float* g = grad.data() + (j - outputs.begin) * (n_in + 1);
    for (std::size_t r = rows.begin; r < rows.end; ++r) {
      const float e = error[r * n_out + j];
      for (std::size_t i = 0; i < n_in; ++i) g[i] += in[r * n_in + i] * e;
      g[n_in] += e;
    }
  }
}

/// SGD: updated = current − lr · grad, element by element.
void sgd(std::span<const float> current, std::span<const float> grad, float learning_rate, std::span<float> updated) {
  for (std::size_t k = 0; k < current.size(); ++k) updated[k] = current[k] - learning_rate * grad[k];
}

/// Buffers of one training step over the full batch (every scheme uses them).
struct step_buffers {
  std::vector<std::vector<float>> activations;  // [0]: inputs; [l + 1]: layer l's output
  std::vector<std::vector<float>> errors;       // [l]: d loss / d layer l's pre-activation
  std::vector<std::uint8_t> labels;
  std::vector<float> gradient;                  // one layer's, or all layers' (data parallel)

  step_buffers(const network& net, std::size_t batch) {
    for (std::size_t w : net.width) activations.emplace_back(batch * w);
    for (std::size_t l = 0; l < net.layers(); ++l) errors.emplace_back(batch * net.width[l + 1]);
    labels.resize(batch);
    gradient.resize(net.parameters.size());
  }
  /// Training step `step`'s batch: consecutive samples of the data set, wrapping.
  void load(const dataset& data, std::size_t step, std::size_t batch) {
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t sample = (step * batch + b) % data.size();
      std::copy_n(data.input(sample), data.features, activations[0].begin() + std::ptrdiff_t(b * data.features));
      labels[b] = data.labels[sample];
    }
  }
};

/// One step of single-rank training on the full batch: the reference. Returns the mean loss.
double reference_step(network& net, step_buffers& buf, std::size_t batch, float learning_rate) {
  const range all{0, batch};
  const std::size_t L = net.layers();
  for (std::size_t l = 0; l < L; ++l) forward_rows(net, l, buf.activations[l], buf.activations[l + 1], all);
  const double loss = output_error_rows(buf.activations[L], buf.labels, batch, buf.errors[L - 1], all);
  for (std::size_t l = L; l-- > 0;) {
    // The gradient first, then the error below with the same (old) weights, then SGD.
    const range neurons{0, net.width[l + 1]};
    const std::span<float> grad = std::span(buf.gradient).first(net.weights(l).size());
    gradient_neurons(net, l, buf.errors[l], buf.activations[l], grad, neurons, all);
    if (l > 0) error_below_rows(net, l, buf.errors[l], buf.activations[l], buf.errors[l - 1], all);
    sgd(net.weights(l), grad, learning_rate, net.weights(l));
  }
  return loss / double(batch);
}

/// The seed's scheme on four ranks.
template <class Communicator>
class asymmetric_trainer {
 public:
  asymmetric_trainer(Communicator& world, const settings& s)
      : world_(world), s_(s), net_(s), buf_(net_, s.batch), staging_(net_.parameters.size()) {
    const std::size_t r = world.rank();
    backward_ = r % 2 == 0;  // Fig. 6: {0, 2} backward, {1, 3} update
    half_ = r / 2;           // this rank's half of E's rows (backward) or of W's neurons (update)
    // A started call's buffers are the library's until wait(); these copies keep what
    // this rank goes on reading apart from them (see step()).
    for (std::size_t l = 0; l < net_.layers(); ++l) {
      own_rows_.emplace_back(s.batch * net_.width[l + 1]);
      if (backward_) sent_error_.emplace_back(s.batch / 2 * net_.width[l + 1]);
    }
    // Error half h travels from backward rank 2h to the update ranks: {2h, 1, 3}, root first.
    for (std::size_t h = 0; h < 2; ++h) {
      const bool member = r == 2 * h || !backward_;
      error_group_[h] = world.split(member ? 0 : qcoll::no_color, r == 2 * h ? 0 : std::int64_t(r));
    }
  }

  double step(const dataset& data, std::size_t step) {
    const std::size_t B = s_.batch, L = net_.layers(), me = world_.rank();
    buf_.load(data, step, B);

    // Forward: my quarter of every layer, into own_rows_ (only my rows are used), and
    // gathered from there into the full-batch activations while layer l + 1 computes
    // from own_rows_[l]: the gather only reads that buffer.
    std::vector<qcoll::collective_handle> gathers(L);
    const range quarter = part(B, 4, me);
    for (std::size_t l = 0; l < L; ++l) {
      const std::span<const float> in = l == 0 ? std::span<const float>(buf_.activations[0]) : own_rows_[l - 1];
      forward_rows(net_, l, in, own_rows_[l], quarter);
      const std::size_t w = net_.width[l + 1];
      world_.start_all_gather(std::span<const float>(own_rows_[l]).subspan(quarter.begin * w, quarter.size() * w),
                              std::span(buf_.activations[l + 1]), gathers[l]);
    }
    for (auto& g : gathers) g.wait();

    // The output error: every rank holds every logit; each computes the rows it needs.
    const range rows = backward_ ? part(B, 2, half_) : range{0, B};
    const double loss = output_error_rows(buf_.activations[L], buf_.labels, B, buf_.errors[L - 1], rows);

    std::vector<qcoll::collective_handle> handles(4 * L);  // per layer: 2 error halves, then 2 weight halves
    for (std::size_t l = L; l-- > 0;) {
      const std::size_t w = net_.width[l + 1];
      auto error_half = [&](std::size_t h) {
        return std::span(buf_.errors[l]).subspan(part(B, 2, h).begin * w, B / 2 * w);
      };
      if (backward_) {
        // A copy: the broadcast writes its buffer on the root too (the ring's all-gather
        // hands the root its own blocks back), and E_l is read below meanwhile.
        if (l + 1 < L) {
          std::copy(error_half(half_).begin(), error_half(half_).end(), sent_error_[l].begin());
          start_error_broadcast(sent_error_[l], half_, handles[4 * l + half_]);
        }
      } else if (l + 1 < L) {
        for (std::size_t h = 0; h < 2; ++h) start_error_broadcast(error_half(h), h, handles[4 * l + h]);
        handles[4 * l].wait();
        handles[4 * l + 1].wait();
      }
      if (!backward_) {  // my half of W_l's neurons, into staging
        const range neurons = part(w, 2, half_);
        const std::span<float> grad = std::span(buf_.gradient).first(neurons.size() * net_.row_size(l));
        gradient_neurons(net_, l, buf_.errors[l], buf_.activations[l], grad, neurons, {0, B});
        sgd(net_.neurons(l, neurons), grad, s_.learning_rate, staging(l, neurons));
      }
      for (std::size_t h = 0; h < 2; ++h)  // W_l's halves from update ranks 1 and 3 to all four
        world_.start_broadcast(staging(l, part(w, 2, h)), 2 * h + 1, handles[4 * l + 2 + h]);
      if (backward_ && l > 0)  // meanwhile, with the old W_l
        error_below_rows(net_, l, buf_.errors[l], buf_.activations[l], buf_.errors[l - 1], rows);
    }
    for (auto& h : handles) h.wait();
    net_.parameters.swap(staging_);
    return loss / double(rows.size());
  }

  network& net() { return net_; }

 private:
  std::span<float> staging(std::size_t l, range neurons) {
    const std::size_t row = net_.row_size(l);
    return std::span(staging_).subspan(net_.offset[l] + neurons.begin * row, neurons.size() * row);
  }

  /// Starts the broadcast of error half h on its group of three (root: its backward rank).
  void start_error_broadcast(std::span<float> half, std::size_t h, qcoll::collective_handle& handle) {
    error_group_[h]->start_broadcast(half, 0, handle);
  }

  Communicator& world_;
  settings s_;
  network net_;
  step_buffers buf_;
  std::vector<float> staging_;
  bool backward_ = false;
  std::size_t half_ = 0;
  std::optional<Communicator> error_group_[2];
  std::vector<std::vector<float>> own_rows_;    // [l]: layer l's output, my quarter's rows
  std::vector<std::vector<float>> sent_error_;  // [l]: my half of E_l as broadcast (backward ranks)
};

/// Data parallelism: each rank a quarter of the batch, gradients averaged.
template <class Communicator>
class data_parallel_trainer {
 public:
  data_parallel_trainer(Communicator& comm, const settings& s, bool one_bit)
      : comm_(comm), s_(s), net_(s), buf_(net_, s.batch / comm.size()) {
    if (one_bit)
      for (std::size_t l = 0; l < net_.layers(); ++l)
        plans_.emplace_back(comm, net_.weights(l).size(), qcoll::quantizers::one_bit{});
  }

  double step(const dataset& data, std::size_t step) {
    const std::size_t n = comm_.size(), local = s_.batch / n, L = net_.layers();
    // This rank's quarter of the global batch `step`.
    for (std::size_t b = 0; b < local; ++b) {
      const std::size_t sample = (step * s_.batch + comm_.rank() * local + b) % data.size();
      std::copy_n(data.input(sample), data.features, buf_.activations[0].begin() + std::ptrdiff_t(b * data.features));
      buf_.labels[b] = data.labels[sample];
    }
    const range all{0, local};
    for (std::size_t l = 0; l < L; ++l) forward_rows(net_, l, buf_.activations[l], buf_.activations[l + 1], all);
    const double loss = output_error_rows(buf_.activations[L], buf_.labels, local, buf_.errors[L - 1], all);
    for (std::size_t l = L; l-- > 0;) {
      const std::span<float> grad = std::span(buf_.gradient).subspan(net_.offset[l], net_.weights(l).size());
      gradient_neurons(net_, l, buf_.errors[l], buf_.activations[l], grad, {0, net_.width[l + 1]}, all);
      if (!plans_.empty()) comm_.start_allreduce(plans_[l], grad, qcoll::reduce_op::avg);  // overlaps the layers below
      if (l > 0) error_below_rows(net_, l, buf_.errors[l], buf_.activations[l], buf_.errors[l - 1], all);
    }
    if (plans_.empty()) comm_.allreduce(std::span(buf_.gradient), qcoll::reduce_op::avg);
    for (auto& p : plans_) p.wait();
    sgd(net_.parameters, buf_.gradient, s_.learning_rate, net_.parameters);
    return loss / double(local);
  }

  network& net() { return net_; }

 private:
  Communicator& comm_;
  settings s_;
  network net_;
  step_buffers buf_;
  std::vector<qcoll::compressed_allreduce_plan<qcoll::quantizers::one_bit>> plans_;
};

/// What `timed` measured: steps per second, the first and the last step's mean loss
/// over the samples this rank computed it for, and (timed_job) the bytes this rank's
/// transport wrote per step, record headers included: what it really sent, whichever
/// algorithm each collective chose.
struct timing {
  double rate = 0, first_loss = 0, last_loss = 0, bytes_per_step = 0;
};

template <class Step>
timing timed(std::size_t steps, Step&& train) {
  const auto start = std::chrono::steady_clock::now();
  timing t;
  for (std::size_t step = 0; step < steps; ++step) {
    t.last_loss = train(step);
    if (step == 0) t.first_loss = t.last_loss;
  }
  t.rate = double(steps) / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return t;
}

template <class Communicator, class Step>
timing timed_job(Communicator& comm, std::size_t steps, Step&& train) {
  const std::uint64_t written = comm.transport().bytes_written();
  timing t = timed(steps, std::forward<Step>(train));
  t.bytes_per_step = double(comm.transport().bytes_written() - written) / double(steps);
  return t;
}

double max_difference(std::span<const float> a, std::span<const float> b) {
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(double(a[k]) - double(b[k])));
  return worst;
}

template <class Communicator>
int run(Communicator& comm, const settings& s, std::string_view transport) {
  const auto problem = qcoll_examples::make_cluster_problem(problem_shape, s.seed, 0xa5, training_samples, 0);
  const dataset& data = problem.train;
  const bool printing = comm.rank() == 0;
  network reference(s);
  if (printing)
    fmt::print("DNN {}-{}x{}-{} ({} parameters), batch {}, {} steps of SGD (lr {}), seed {}, {} rank(s) ({})\n",
               problem_shape.features, s.layers, s.hidden, problem_shape.classes, reference.parameters.size(), s.batch,
               s.steps, s.learning_rate, s.seed, comm.size(), transport);

  if (comm.size() != 1 && comm.size() != 4)
    throw std::invalid_argument(fmt::format("the scheme runs on 4 ranks (or 1 for the baseline), not {}", comm.size()));

  // The reference: single-rank training on the full batch, on rank 0 while the others
  // wait (blocked, not spinning, after the transport's short spin).
  timing single;
  if (printing) {
    step_buffers buffers(reference, s.batch);
    single = timed(s.steps, [&](std::size_t t) {
      buffers.load(data, t, s.batch);
      return reference_step(reference, buffers, s.batch, s.learning_rate);
    });
  }
  const auto print_row = [](std::string_view scheme, double rate, double first_loss, double last_loss,
                             const std::string& rest) {
    fmt::print("{:<34} {:>9.2f} steps/s   loss {:.4f} -> {:.4f}{}\n", scheme, rate, first_loss, last_loss, rest);
  };
  if (comm.size() == 1) {
    print_row("single rank, full batch", single.rate, single.first_loss, single.last_loss, "   sends 0 B per step");
    return 0;
  }

  comm.broadcast(std::span(reference.parameters), 0);
  asymmetric_trainer<Communicator> asymmetric(comm, s);
  comm.barrier();
  const timing asym = timed_job(comm, s.steps, [&](std::size_t t) { return asymmetric.step(data, t); });
  const bool equal = std::memcmp(asymmetric.net().parameters.data(), reference.parameters.data(),
                                 reference.parameters.size() * sizeof(float)) == 0;

  data_parallel_trainer<Communicator> exact(comm, s, false), one_bit(comm, s, true);
  comm.barrier();
  const timing exact_timing = timed_job(comm, s.steps, [&](std::size_t t) { return exact.step(data, t); });
  comm.barrier();
  const timing one_bit_timing = timed_job(comm, s.steps, [&](std::size_t t) { return one_bit.step(data, t); });
  comm.barrier();

  // Every rank's verdict, bytes (the asymmetric ranks differ by role) and losses.
  constexpr std::size_t fields = 8;
  const std::vector<double> mine{equal ? 1.0 : 0.0,       asym.bytes_per_step,
                                 asym.first_loss,          asym.last_loss,
                                 exact_timing.first_loss,  exact_timing.last_loss,
                                 one_bit_timing.first_loss, one_bit_timing.last_loss};
  std::vector<double> all(fields * comm.size());
  comm.all_gather(std::span<const double>(mine), std::span(all));
  const auto field = [&](std::size_t rank, std::size_t k) { return all[fields * rank + k]; };
  const auto quarters_mean = [&](std::size_t k) {  // the batch mean from the ranks' quarter means
    return (field(0, k) + field(1, k) + field(2, k) + field(3, k)) / 4;
  };
  bool all_equal = true;
  for (std::size_t r = 0; r < comm.size(); ++r) all_equal = all_equal && field(r, 0) == 1.0;
  if (printing) {
    fmt::print("losses: mean over the full batch of the step's samples, first step -> last step\n");
    print_row("single rank, full batch (rank 0)", single.rate, single.first_loss, single.last_loss, "");
    // An update rank (1) computes the output error, and so the loss, of every row.
    print_row("asymmetric groups, 4 ranks", asym.rate, field(1, 2), field(1, 3),
              fmt::format("   sends {} / {} B per step (backward / update rank)", std::size_t(field(0, 1)),
                          std::size_t(field(1, 1))));
    print_row("data parallel, exact allreduce", exact_timing.rate, quarters_mean(4), quarters_mean(5),
              fmt::format("   sends {:.0f} B per step; weights differ by ≤ {:.2e}", exact_timing.bytes_per_step,
                          max_difference(exact.net().parameters, reference.parameters)));
    print_row("data parallel, 1-bit allreduce", one_bit_timing.rate, quarters_mean(6), quarters_mean(7),
              fmt::format("   sends {:.0f} B per step; weights differ by ≤ {:.2e}", one_bit_timing.bytes_per_step,
                          max_difference(one_bit.net().parameters, reference.parameters)));
    fmt::print("weights after {} steps {} single-rank full-batch training bit for bit on every rank\n", s.steps,
               all_equal ? "equal" : "do NOT equal");
    std::fflush(stdout);
  }
  comm.barrier();
  return all_equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return qcoll_examples::launched_main("asymmetric_groups", argc, argv, parse,
                                       [](auto& comm, const settings& s, std::string_view transport) {
                                         return run(comm, s, transport);
                                       });
}
