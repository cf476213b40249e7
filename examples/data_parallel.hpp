#pragma once
// What the data-parallel training examples share (data_parallel_training on host
// buffers, gpu_data_parallel on device buffers): their options, one training run (a
// replica per rank, the same batches in the same order, each rank its shard, the
// gradients averaged by an exchange), and the side-by-side comparison of an exact and a
// compressed run that both print. An exchange is a class template over the
// communicator, made with (comm, model, settings), that has a `name`,
// layer_done(layer) (called as backprop finishes each layer), finish() (the averaged
// gradient is in model.gradients() when it returns) and bytes_sent_per_step().

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <fmt/format.h>

#include "mlp_classifier.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qcoll_examples {

constexpr double accuracy_limit_pp = 0.5;

// The defaults, measured with 4 ranks on 2 cores (shm; tcp gives the same numbers): a run
// takes 15–20 s, and over seeds 1–10 the 1-bit run ended 0.04–0.43 pp above the exact
// one. With 5 epochs it ended 0.02–0.41 pp above; with 3, up to 0.45 pp below.
struct settings {
  std::size_t epochs = 10;
  std::uint64_t seed = 1;
  std::size_t train_samples = 16384;
  std::size_t test_samples = 16384;
  std::size_t hidden = 256;
  std::size_t batch = 128;
  float learning_rate = 0.05f;
  qcoll::quantizers::reconstruction_source reconstruction_from = qcoll::quantizers::reconstruction_source::current;
};

inline settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const char* text = argv[i + 1];
    char* end = nullptr;
    const unsigned long long count = std::strtoull(text, &end, 10);
    const bool whole_number = *end == '\0' && *text != '-';
    if (flag == "--lr") {
      s.learning_rate = std::strtof(text, &end);
      if (*end != '\0' || !(s.learning_rate > 0)) throw std::invalid_argument("--lr takes a positive number");
      continue;
    }
    if (flag == "--reconstruction") {
      const std::string_view from = text;
      if (from != "current" && from != "previous")
        throw std::invalid_argument(fmt::format("--reconstruction is current or previous, not '{}'", from));
      s.reconstruction_from = from == "previous" ? qcoll::quantizers::reconstruction_source::previous
                                                 : qcoll::quantizers::reconstruction_source::current;
      continue;
    }
    if (!whole_number) throw std::invalid_argument(fmt::format("{} takes a whole number, not '{}'", flag, text));
    if (flag == "--epochs") s.epochs = count;
    else if (flag == "--seed") s.seed = count;
    else if (flag == "--samples") s.train_samples = count;
    else if (flag == "--test-samples") s.test_samples = count;
    else if (flag == "--hidden") s.hidden = count;
    else if (flag == "--batch") s.batch = count;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  if (s.epochs == 0 || s.hidden == 0 || s.test_samples == 0)
    throw std::invalid_argument("--epochs, --hidden and --test-samples must be positive");
  if (s.batch == 0 || s.train_samples < s.batch)
    throw std::invalid_argument("--batch must be positive and at most --samples");
  return s;
}

struct epoch_result {
  double train_loss = 0;     // mean over the epoch's samples, as they were trained on
  double test_accuracy = 0;  // percent
  double seconds = 0;        // training and evaluation on rank 0
};

/// One data-parallel training run: a replica per rank, all starting from the same
/// parameters and seeing the same batches in the same order, each rank its shard.
/// comm.allreduce of values in host memory — through device memory where the
/// communicator's transport moves only device memory (cuda_peer), as a user of NCCL moves
/// a loss to the GPU before reducing it.
template <class Communicator, class T>
void allreduce_host_values(Communicator& comm, std::span<T> values, qcoll::reduce_op op) {
  if constexpr (qcoll::moves_device_memory<typename Communicator::transport_type>) {
    const qcoll::execution::device_memory<T> on_device(values.size());
    on_device.upload(values);
    comm.allreduce(qcoll::execution::device_stream{}, on_device.span(), op);
    on_device.download(values);
  } else {
    comm.allreduce(values, op);
  }
}

template <class Communicator, template <class> class Exchange>
class training_run {
 public:
  training_run(Communicator& comm, const cluster_problem& p, const settings& s, std::span<const std::size_t> widths)
      : comm_(comm), problem_(p), settings_(s), model_(widths, s.batch / comm.size(), s.seed),
        exchange_(comm, model_, s) {}

  std::string_view name() const { return Exchange<Communicator>::name; }
  std::size_t bytes_sent_per_step() const { return exchange_.bytes_sent_per_step(); }

  epoch_result train_epoch(std::size_t epoch) {
    const auto start = std::chrono::steady_clock::now();
    const std::size_t n = comm_.size(), shard = settings_.batch / n;
    const std::size_t steps = problem_.train.size() / settings_.batch;
    const std::vector<std::size_t> order = shuffled(epoch);
    double loss = 0;
    for (std::size_t step = 0; step < steps; ++step) {
      const auto mine = std::span(order).subspan(step * settings_.batch + comm_.rank() * shard, shard);
      loss += model_.train_batch(problem_.train, mine, [&](std::size_t l) { exchange_.layer_done(l); });
      exchange_.finish();
      optimizer_.step(model_.parameters(), model_.gradients(),
                      qcoll_examples::scheduled_learning_rate(settings_.learning_rate, epoch * steps + step, settings_.epochs * steps));
      model_.parameters_changed();
    }
    // Each rank tests its block of the test set; the sums make every rank's totals equal.
    const qcoll::block_range tested = qcoll::block_of(problem_.test.size(), n, comm_.rank());
    const std::size_t correct = model_.count_correct(problem_.test, tested.offset, tested.offset + tested.size);
    std::array<double, 2> totals{loss, double(correct)};
    allreduce_host_values(comm_, std::span<double>(totals), qcoll::reduce_op::sum);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    return {totals[0] / double(steps * shard * n), 100.0 * totals[1] / double(problem_.test.size()), took.count()};
  }

  /// Whether every rank holds the same parameters, as identical averaged gradients on
  /// every rank promise: each one's smallest and largest value over the ranks agree.
  bool replicas_identical() {
    const std::span<float> mine = model_.parameters();
    std::vector<float> smallest(mine.begin(), mine.end()), largest(mine.begin(), mine.end());
    allreduce_host_values(comm_, std::span(smallest), qcoll::reduce_op::min);
    allreduce_host_values(comm_, std::span(largest), qcoll::reduce_op::max);
    return std::equal(smallest.begin(), smallest.end(), largest.begin());
  }

 private:
  /// The epoch's sample order: the same on every rank and in both runs.
  std::vector<std::size_t> shuffled(std::size_t epoch) const {
    std::vector<std::size_t> order(problem_.train.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    random_stream random(settings_.seed, shuffle_stream + 16 * epoch);
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[random.below(i)]);
    return order;
  }

  Communicator& comm_;
  const cluster_problem& problem_;
  const settings& settings_;
  mlp model_;
  sgd optimizer_;
  Exchange<Communicator> exchange_;
};

/// Trains the same model from the same start on the same data twice, epoch by epoch
/// side by side — with the Exact exchange and with the Compressed one — prints both
/// learning curves, checks that every rank holds the same model, and returns 0 when
/// the compressed run's test accuracy is at most accuracy_limit_pp below the exact
/// run's (1 otherwise). `describe(layer sizes, layer groups, group)` gives the line that
/// says how the compressed run exchanges its gradients.
template <template <class> class Exact, template <class> class Compressed, class Communicator, class Describe>
int train_and_compare(Communicator& comm, const settings& s, std::string_view transport, Describe&& describe) {
  const std::size_t n = comm.size();
  if (s.batch % n != 0)
    throw std::invalid_argument(fmt::format("--batch {} does not split evenly over {} ranks", s.batch, n));
  const bool printing = comm.rank() == 0;
  const cluster_problem p =
      qcoll_examples::make_cluster_problem(problem_shape, s.seed, problem_stream, s.train_samples, s.test_samples);
  const std::array<std::size_t, 4> widths{problem_shape.features, s.hidden, s.hidden, problem_shape.classes};

  training_run<Communicator, Exact> exact(comm, p, s, widths);
  training_run<Communicator, Compressed> one_bit(comm, p, s, widths);
  std::size_t parameters = 0;
  std::string layer_sizes, layer_groups;
  const std::size_t group = qcoll::quantizers::one_bit{}.group_size();
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::size_t size = (widths[l] + 1) * widths[l + 1];
    parameters += size;
    layer_sizes += fmt::format("{}{}", l == 0 ? "" : ", ", size);
    layer_groups += fmt::format("{}{}", l == 0 ? "" : ", ", (size + group - 1) / group);
  }

  if (printing) {
    fmt::print("data-parallel training on {} ranks ({}): MLP {}-{}-{}-{} ({} parameters), {} training and {} test "
               "samples, batch {} ({} per rank), {} epochs, seed {}\n",
               n, transport, widths[0], widths[1], widths[2], widths[3], parameters, p.train.size(), p.test.size(),
               s.batch, s.batch / n, s.epochs, s.seed);
    fmt::print("{}\n", describe(layer_sizes, layer_groups, group));
    fmt::print("best possible test accuracy (the Bayes classifier, which knows the clusters): {:.2f} %\n\n",
               bayes_accuracy(p));
    fmt::print("       {:^32}   {:^32}\n", exact.name(), one_bit.name());
    fmt::print("{:>5}  {:>10} {:>10} {:>10}   {:>10} {:>10} {:>10}\n", "epoch", "train loss", "test acc", "time (s)",
               "train loss", "test acc", "time (s)");
  }
  // Interleaved, epoch by epoch, so the two curves come out side by side as they grow.
  epoch_result last_exact, last_one_bit;
  double exact_seconds = 0, one_bit_seconds = 0;
  for (std::size_t epoch = 0; epoch < s.epochs; ++epoch) {
    last_exact = exact.train_epoch(epoch);
    last_one_bit = one_bit.train_epoch(epoch);
    exact_seconds += last_exact.seconds;
    one_bit_seconds += last_one_bit.seconds;
    if (printing) {
      fmt::print("{:>5}  {:>10.4f} {:>8.2f} % {:>10.2f}   {:>10.4f} {:>8.2f} % {:>10.2f}\n", epoch + 1,
                 last_exact.train_loss, last_exact.test_accuracy, last_exact.seconds, last_one_bit.train_loss,
                 last_one_bit.test_accuracy, last_one_bit.seconds);
      std::fflush(stdout);
    }
  }
  if (!exact.replicas_identical() || !one_bit.replicas_identical())
    throw std::runtime_error("the model replicas differ between ranks after training");

  const double gap = last_exact.test_accuracy - last_one_bit.test_accuracy;  // negative: 1-bit did better
  const bool ok = gap <= accuracy_limit_pp;
  if (printing) {
    const std::size_t exact_bytes = exact.bytes_sent_per_step(), one_bit_bytes = one_bit.bytes_sent_per_step();
    fmt::print("\nbytes each rank sends per step: {} {}, {} {} ({:.1f}x fewer)\n", exact.name(), exact_bytes,
               one_bit.name(), one_bit_bytes, double(exact_bytes) / double(one_bit_bytes));
    fmt::print("time: {} {:.1f} s, {} {:.1f} s\n", exact.name(), exact_seconds, one_bit.name(), one_bit_seconds);
    fmt::print("final test accuracy: {} {:.2f} %, {} {:.2f} %; model replicas identical on all ranks\n",
               exact.name(), last_exact.test_accuracy, one_bit.name(), last_one_bit.test_accuracy);
    fmt::print("accuracy gap: {:.2f} pp (limit {:.2f}): {}\n", gap, accuracy_limit_pp, ok ? "ok" : "too large");
    std::fflush(stdout);
  }
  // Every rank returns the verdict, and qcoll-run stops the job as soon as one rank
  // fails: without this wait the others' exit could cut rank 0 off before it printed.
  comm.barrier();
  return ok ? 0 : 1;
}

}  // namespace qcoll_examples
