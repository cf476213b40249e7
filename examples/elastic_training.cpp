// Elastic data-parallel training: the MLP of data_parallel_training, its gradients
// averaged with the 1-bit compressed allreduce (one plan per layer), on ranks that may
// die. When ranks die, every survivor's call fails; the survivors agree on who is left
// (qcoll::launch::elastic_job::shrink), rejoin in a smaller world, roll back to the last
// step every one of them finished, rebuild their plans for the new world, carry the old
// plans' error-feedback residual into the step they redo, and train on. The global batch
// stays the same, split over whoever is left, so no sample is skipped.
//
//   qcoll-run -n 6 --keep-going -- elastic_training --kill 0,3@150     # shared memory
//   qcoll-run -n 6 --keep-going --transport tcp -- elastic_training --kill 0,3@150
//   qcoll-run -n 6 elastic_training                                    # unbroken
//
// --kill RANKS@STEP: those ranks SIGKILL themselves as step STEP starts (a real death: no
// goodbye, no cleanup); rank 0, which served the job's store, may be one of them.
// Other options: --epochs N, --seed S, --samples N, --test-samples N, --hidden N,
// --batch N (global), --lr X, --reference ACC (an unbroken run's final test accuracy:
// exit status 1 when this run ends more than --margin percentage points below it).
// Rank 0 of the current world prints the learning curve, one line per epoch with the
// world size, and what each recovery found. Exit status: 0, 1 (below the reference), 2
// on errors, 3 when this rank cannot go on (too few survivors).

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/launch/elastic.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mlp_classifier.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace qcoll_examples;
using plan_type = qcoll::compressed_allreduce_plan<qcoll::quantizers::one_bit>;

// Measured with 6 ranks on 2 cores (shm), seeds 1–5: docs/recovery.md.
struct settings {
  std::size_t epochs = 6;
  std::uint64_t seed = 1;
  std::size_t train_samples = 12000;
  std::size_t test_samples = 8192;
  std::size_t hidden = 128;
  std::size_t batch = 120;  // splits evenly over 6, 5, 4, 3 and 2 ranks (any split works)
  float learning_rate = 0.05f;
  std::vector<qcoll::rank_t> kill;
  std::size_t kill_step = 0;
  double reference = -1;  // percent; < 0: none
  double margin = 1.0;    // percentage points
};

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::string text = argv[i + 1];
    if (flag == "--kill") {
      const std::size_t at = text.find('@');
      if (at == std::string::npos) throw std::invalid_argument("--kill takes RANKS@STEP, e.g. 0,3@150");
      for (std::size_t from = 0; from < at;) {
        const std::size_t comma = std::min(text.find(',', from), at);
        s.kill.push_back(static_cast<qcoll::rank_t>(std::stoul(text.substr(from, comma - from))));
        from = comma + 1;
      }
      s.kill_step = std::stoul(text.substr(at + 1));
      continue;
    }
    if (flag == "--lr" || flag == "--reference" || flag == "--margin") {
      const double value = std::stod(text);
      if (flag == "--lr") s.learning_rate = float(value);
      else if (flag == "--reference") s.reference = value;
      else s.margin = value;
      continue;
    }
    const std::size_t count = std::stoul(text);
    if (flag == "--epochs") s.epochs = count;
    else if (flag == "--seed") s.seed = count;
    else if (flag == "--samples") s.train_samples = count;
    else if (flag == "--test-samples") s.test_samples = count;
    else if (flag == "--hidden") s.hidden = count;
    else if (flag == "--batch") s.batch = count;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  if (s.epochs == 0 || s.hidden == 0 || s.test_samples == 0 || s.batch == 0 || s.train_samples < s.batch)
    throw std::invalid_argument("--epochs, --hidden, --test-samples and --batch must be positive, --batch ≤ --samples");
  return s;
}

/// Everything a rank keeps from world to world: the model, the optimizer, where
/// training stands, and the state at the last two step boundaries (a survivor may have
/// finished one step more than another; it rolls back to the other's).
class elastic_trainer {
 public:
  elastic_trainer(const settings& s, qcoll::rank_t first_rank)
      : s_(s), first_rank_(first_rank),
        problem_(make_cluster_problem(problem_shape, s.seed, problem_stream, s.train_samples, s.test_samples)),
        widths_{problem_shape.features, s.hidden, s.hidden, problem_shape.classes},
        model_(widths_, s.batch, s.seed), carried_(model_.parameters().size(), 0.0f) {
    steps_per_epoch_ = problem_.train.size() / s.batch;
    save(boundary_[0]);
  }

  /// Trains until the end on `comm`; throws what a failed call throws.
  template <class Communicator>
  int train(Communicator& comm, const qcoll::launch::elastic_job& job) {
    const bool printing = comm.rank() == 0;
    if (s_.batch < comm.size())
      throw std::invalid_argument(fmt::format("--batch {} is smaller than the {} ranks", s_.batch, comm.size()));
    plans_.clear();
    for (std::size_t l = 0; l < model_.layers(); ++l)
      plans_.emplace_back(comm, model_.layer_gradients(l).size(), qcoll::quantizers::one_bit{});
    if (job.epoch() == 0 && printing) {
      fmt::print("elastic data-parallel training on {} ranks: MLP {}-{}-{}-{}, {} training and {} test samples, "
                 "batch {} (split over the ranks), {} epochs of {} steps, seed {}, 1-bit compressed allreduce\n",
                 comm.size(), widths_[0], widths_[1], widths_[2], widths_[3], problem_.train.size(),
                 problem_.test.size(), s_.batch, s_.epochs, steps_per_epoch_, s_.seed);
      if (!s_.kill.empty())
        fmt::print("ranks {} will die as step {} starts\n", fmt::join(s_.kill, ", "), s_.kill_step);
      fmt::print("best possible test accuracy (the Bayes classifier): {:.2f} %\n\n{:>5} {:>5} {:>10} {:>10} {:>9}\n",
                 bayes_accuracy(problem_), "epoch", "ranks", "train loss", "test acc", "time (s)");
    }
    if (job.epoch() > 0) roll_back_to_common_step(comm, printing);

    const std::size_t total = s_.epochs * steps_per_epoch_;
    while (done_ < total) {
      // In whatever world it reaches the step: over TCP a rank that dies may take its last
      // sends with it (its kernel resets connections that hold unread data), so another
      // doomed rank can fail the step before, shrink with the survivors, redo it, and die
      // at the start of this step in the new world. Survivors then shrink twice.
      if (done_ == s_.kill_step && std::find(s_.kill.begin(), s_.kill.end(), first_rank_) != s_.kill.end()) {
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      step(comm);
      if (recovered_at_) {
        const std::chrono::duration<double, std::milli> took = clock::now() - *recovered_at_;
        if (printing) fmt::print("      training again {:.0f} ms after this rank's call failed\n", took.count());
        recovered_at_.reset();
      }
      if (done_ % steps_per_epoch_ == 0) epoch_done(comm, printing);
      save(boundary_[done_ % 2]);
    }
    if (printing) {
      fmt::print("\nfinal test accuracy: {:.2f} % on {} ranks", last_accuracy_, comm.size());
      if (s_.reference >= 0)
        fmt::print(" (unbroken run: {:.2f} %, {:+.2f} pp, margin {:.2f})", s_.reference, last_accuracy_ - s_.reference,
                   s_.margin);
      fmt::print("\n");
      std::fflush(stdout);
    }
    comm.barrier();  // rank 0 prints before anyone's exit can end the job
    return s_.reference >= 0 && last_accuracy_ < s_.reference - s_.margin ? 1 : 0;
  }

  void failed(const qcoll::error& e) {
    fmt::print(stderr, "elastic_training: rank {} (first world): step {} failed: {}\n", first_rank_, done_,
               e.what());
    recovered_at_ = clock::now();
  }

  void recovered(const qcoll::launch::shrink_report& report) {
    if (report.new_rank == 0) fmt::print("      recovery: {}\n", report.describe());
  }

 private:
  using clock = std::chrono::steady_clock;

  struct boundary {  // the state after some number of steps
    std::size_t done = 0;
    std::vector<float> parameters, velocity, owed;  // owed: the residual mass, by parameter
    double epoch_loss = 0;
    std::chrono::duration<double> epoch_seconds{};
  };

  void save(boundary& b) {
    b.done = done_;
    b.parameters.assign(model_.parameters().begin(), model_.parameters().end());
    b.velocity = optimizer_.velocity;
    b.owed = carried_;
    for (std::size_t l = 0; l < plans_.size(); ++l) plans_[l].add_residual_mass(layer_of(b.owed, l));
    b.epoch_loss = epoch_loss_;
    b.epoch_seconds = epoch_seconds_;
  }

  std::span<float> layer_of(std::vector<float>& flat, std::size_t l) {
    const std::span<float> all = model_.gradients();
    const std::span<float> layer = model_.layer_gradients(l);
    return std::span(flat).subspan(std::size_t(layer.data() - all.data()), layer.size());
  }

  /// The survivors go back to the last step boundary all of them reached; what the old
  /// plans still owed there is added to this rank's contribution to the redone step.
  template <class Communicator>
  void roll_back_to_common_step(Communicator& comm, bool printing) {
    std::array<double, 1> fewest{double(done_)};  // small integers: exact in double
    comm.allreduce(std::span<double>(fewest), qcoll::reduce_op::min);
    const auto common = static_cast<std::size_t>(fewest[0]);
    const boundary& b = boundary_[common % 2];
    if (b.done != common) throw std::logic_error("no saved state for the common step");
    done_ = common;
    std::copy(b.parameters.begin(), b.parameters.end(), model_.parameters().begin());
    model_.parameters_changed();
    optimizer_.velocity = b.velocity;
    carried_ = b.owed;
    epoch_loss_ = b.epoch_loss;
    epoch_seconds_ = b.epoch_seconds;
    if (printing) fmt::print("      {} ranks go on from step {}\n", comm.size(), done_);
  }

  template <class Communicator>
  void step(Communicator& comm) {
    const auto started = clock::now();
    const std::size_t epoch = done_ / steps_per_epoch_, within = done_ % steps_per_epoch_;
    if (within == 0 || order_epoch_ != epoch) shuffle(epoch);
    const qcoll::block_range mine = qcoll::block_of(s_.batch, comm.size(), comm.rank());
    const auto samples = std::span(order_).subspan(within * s_.batch + mine.offset, mine.size);
    // Each rank's gradient is the mean over its shard; scaled by its share of the global
    // batch, the sum over the ranks is the global batch's mean gradient.
    const float share = float(mine.size) / float(s_.batch);
    std::array<double, 1> loss{model_.train_batch(problem_.train, samples, [&](std::size_t l) {
      std::span<float> g = model_.layer_gradients(l);
      const std::span<float> owed = layer_of(carried_, l);
      for (std::size_t k = 0; k < g.size(); ++k) g[k] = g[k] * share + owed[k];
      comm.start_allreduce(plans_[l], g, qcoll::reduce_op::sum);
    })};
    for (plan_type& p : plans_) p.wait();
    // The batch's loss, summed now: a rank that dies takes its own sums with it.
    comm.allreduce(std::span<double>(loss), qcoll::reduce_op::sum);
    epoch_loss_ += loss[0];
    std::fill(carried_.begin(), carried_.end(), 0.0f);
    optimizer_.step(model_.parameters(), model_.gradients(),
                    scheduled_learning_rate(s_.learning_rate, done_, s_.epochs * steps_per_epoch_));
    model_.parameters_changed();
    ++done_;
    epoch_seconds_ += clock::now() - started;
  }

  template <class Communicator>
  void epoch_done(Communicator& comm, bool printing) {
    const qcoll::block_range tested = qcoll::block_of(problem_.test.size(), comm.size(), comm.rank());
    std::array<double, 1> correct{double(model_.count_correct(problem_.test, tested.offset, tested.offset + tested.size))};
    comm.allreduce(std::span<double>(correct), qcoll::reduce_op::sum);
    last_accuracy_ = 100.0 * correct[0] / double(problem_.test.size());
    if (printing) {
      fmt::print("{:>5} {:>5} {:>10.4f} {:>8.2f} % {:>9.2f}\n", done_ / steps_per_epoch_, comm.size(),
                 epoch_loss_ / double(steps_per_epoch_ * s_.batch), last_accuracy_, epoch_seconds_.count());
      std::fflush(stdout);
    }
    epoch_loss_ = 0;
    epoch_seconds_ = {};
  }

  void shuffle(std::size_t epoch) {
    order_.resize(problem_.train.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = i;
    random_stream random(s_.seed, shuffle_stream + 16 * epoch);
    for (std::size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[random.below(i)]);
    order_epoch_ = epoch;
  }

  const settings& s_;
  qcoll::rank_t first_rank_;
  cluster_problem problem_;
  std::array<std::size_t, 4> widths_;
  mlp model_;
  sgd optimizer_;
  std::vector<plan_type> plans_;
  std::vector<float> carried_;  // residual mass the old world's plans owed, by parameter
  std::size_t steps_per_epoch_ = 0, done_ = 0, order_epoch_ = ~std::size_t{0};
  std::vector<std::size_t> order_;
  double epoch_loss_ = 0, last_accuracy_ = 0;
  std::chrono::duration<double> epoch_seconds_{};
  std::array<boundary, 2> boundary_;  // after steps done and done − 1, by done % 2
  std::optional<clock::time_point> recovered_at_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const settings s = parse(argc, argv);
    qcoll::launch::elastic_job job = qcoll::launch::elastic_job::from_environment();
    elastic_trainer trainer(s, job.job().rank);
    for (;;) {
      try {
        return job.join([&](auto transport) {
          // The job's timeout (QCOLL_TIMEOUT_MS) bounds every step: a rank whose link
          // goes down is noticed only by a deadline.
          qcoll::communicator comm(std::move(transport), qcoll::communicator_options{job.job().timeout});
          return trainer.train(comm, job);
        });
      } catch (const qcoll::error& e) {
        if (!qcoll::launch::recoverable(e)) throw;
        trainer.failed(e);
        try {
          trainer.recovered(job.shrink());
        } catch (const qcoll::error& refused) {
          fmt::print(stderr, "elastic_training: cannot go on: {}\n", refused.what());
          return 3;
        }
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "elastic_training: {}\n", e.what());
    return 2;
  }
}
