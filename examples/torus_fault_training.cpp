// Data-parallel training on a 4×4 torus that loses two nodes mid-run and goes on
// without them. The 16 nodes are local ranks: 16 threads of this one process, each
// with its own in-process endpoint, each standing for one node's training process.
// Every rank trains a replica of a small MLP on its shard of a synthetic, seeded
// classification problem; the gradients are averaged with the grid allreduce
// (include/qcoll/grid_allreduce.hpp) through the 1-bit quantizer with error feedback.
//
// At step --fail-at two nodes stop: b2 crashes (its thread returns and drops its
// endpoint, so peers waiting for it get errc::peer_lost) and b3 hangs (it keeps its
// endpoint but stops answering, so peers waiting for it get errc::timeout after the
// communicator's --timeout-ms). The first rank to notice aborts the communicator,
// which carries that first failure's code to every rank: with both failures at once
// the survivors all report peer_lost (b2's neighbours see it within a millisecond),
// and b3 is found by the membership round below, as is every node that fails without
// being noticed first. (The script lets b2 crash only once b3 has hung, so that both
// are lost in the same step, and it lets both stop only once every node has left the
// collectives of the step before: see failure_script.) `--failure hang` stops b3 alone
// and shows the timeout.
//
// Recovery, on every survivor:
//  1. Re-forming the group. An in-process membership service (a mutex and a condition
//     variable, below) stands in for what a multi-process job does through its launcher
//     or its rendezvous store: every survivor checks in with its node id after its
//     failure; the round closes when no new check-in has arrived for a grace period
//     (the communicator's timeout) or every node of the old group has checked in. The
//     nodes that did not check in are the degraded ones — spec degraded-torus.md §2's
//     "no answer within a time limit ⇒ degraded". The service makes a new in-process
//     world for the survivors; rank r is the r-th survivor in node order, the mapping
//     grid_allreduce_plan assumes when there are fewer ranks than grid nodes.
//  2. Re-routing. Each survivor builds topologies::torus({4, 4}) with the missing
//     nodes fully degraded, routes the reduction around them (the drawing shows how:
//     alive nodes forwarding to a smaller core, or neighbours hosting the lost nodes'
//     places in it) and makes a new grid_allreduce_plan on the new communicator.
//  3. Consistency. A step may have completed on some survivors and failed on others, so
//     the new rank 0 broadcasts its parameters, momentum and step number (an exact
//     broadcast) and the failed step is redone. The old plan's 1-bit residuals are
//     dropped with it: what is lost is at most one step's quantization error per
//     encode, which error feedback would otherwise have sent later.
// After recovery the training set is sharded over the survivors, so no sample is lost.
//
// Rank 0 of the group prints the learning curve (the row where the group re-formed is
// marked), what was detected and how fast, the membership and the new plan; at the end
// every survivor checks that all hold bitwise the same parameters (an exact all_gather
// of checksums). The rank threads share nothing but the transport, the membership
// service and the failure script (both behind a mutex); each writes its outcome to its
// own slot, which main reads after joining them.
//
//   torus_fault_training                      # b2 crashes and b3 hangs at step 100 of 300
//   torus_fault_training --no-failure         # the baseline: 16 nodes throughout
//   torus_fault_training --failure hang --timeout-ms 200
//
// Options: --steps N, --fail-at STEP (the nodes stop instead of doing step STEP, counted
// from 0; default a third of --steps), --timeout-ms N (communicator timeout, also the
// membership grace period), --seed S, --failure both|crash|hang, --no-failure.
// Exit status: 0 when the final test accuracy reaches the limit, 1 when it does not,
// 2 on errors.

#include <qcoll/communicator.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/grid_allreduce.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/router.hpp>
#include <qcoll/transports/inproc.hpp>

#include <fmt/format.h>

#include "synthetic_classification.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <numbers>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

namespace topo = qcoll::topologies;
namespace inproc = qcoll::transports::inproc;
using qcoll::rank_t;
using qcoll_examples::cluster_problem;
using qcoll_examples::dataset;
using qcoll_examples::random_stream;
using clock_type = std::chrono::steady_clock;
using communicator = qcoll::communicator<inproc::transport>;

constexpr std::size_t grid_side = 4;
constexpr rank_t nodes = grid_side * grid_side;
constexpr rank_t crashing_node = 1 * grid_side + 1;  // b2
constexpr rank_t hanging_node = 1 * grid_side + 2;   // b3
// b2 and b3 are neighbours: a failed region, which the router routes around by
// forwarding (scattered faults would be hosted instead; the drawing shows which).
// Measured over seeds 1–10 with the failure: the defaults end at 0.917–0.952 (0.81–0.91
// at step 100); --steps 200 --fail-at 60, the test's run, ends at 0.896–0.937 and
// stands at 0.72–0.86 at the failure. So in the test a run that stopped learning at
// the failure falls short of the limit.
constexpr double accuracy_limit = 0.88;

enum class failure_kind { none, crash, hang, both };

struct settings {
  std::size_t steps = 300;
  std::optional<std::size_t> fail_at;  // default: steps / 3
  std::chrono::milliseconds timeout{500};
  std::uint64_t seed = 1;
  failure_kind failure = failure_kind::both;
  std::size_t train_samples = 8192;
  std::size_t test_samples = 2048;
  std::size_t batch_per_rank = 16;
  float learning_rate = 0.05f;

  std::size_t failure_step() const { return fail_at.value_or(steps / 3); }
  bool stops(rank_t node) const {
    return (node == crashing_node && (failure == failure_kind::crash || failure == failure_kind::both)) ||
           (node == hanging_node && (failure == failure_kind::hang || failure == failure_kind::both));
  }
  /// The rows of the learning curve: after every `report_every()` steps (about 15
  /// rows, a multiple of 5 steps apart where that is at least 5), and the last.
  std::size_t report_every() const {
    const std::size_t every = steps / 15;
    return every >= 5 ? every - every % 5 : std::max<std::size_t>(1, every);
  }
};

settings parse(int argc, char** argv) {
  settings s;
  bool no_failure = false, failure_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--no-failure") {
      no_failure = true;
      continue;
    }
    if (i + 1 == argc) throw std::invalid_argument(fmt::format("{} needs a value", flag));
    const std::string_view text = argv[++i];
    if (flag == "--failure") {
      failure_given = true;
      if (text == "both") s.failure = failure_kind::both;
      else if (text == "crash") s.failure = failure_kind::crash;
      else if (text == "hang") s.failure = failure_kind::hang;
      else throw std::invalid_argument(fmt::format("--failure takes both, crash or hang, not '{}'", text));
      continue;
    }
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text.data(), &end, 10);
    if (text.empty() || *end != '\0' || text.front() == '-' || text.front() == '+' || text.front() == ' ')
      throw std::invalid_argument(fmt::format("{} takes a whole number, not '{}'", flag, text));
    if (flag == "--steps") s.steps = value;
    else if (flag == "--fail-at") s.fail_at = value;
    else if (flag == "--timeout-ms") s.timeout = std::chrono::milliseconds(std::min(value, 3600000ull));
    else if (flag == "--seed") s.seed = value;
    else throw std::invalid_argument(fmt::format("unknown option {}", flag));
  }
  if (s.steps == 0) throw std::invalid_argument("--steps must be positive");
  if (s.timeout.count() == 0) throw std::invalid_argument("--timeout-ms must be positive");
  if (no_failure && (s.fail_at || failure_given))
    throw std::invalid_argument("--no-failure excludes --fail-at and --failure");
  if (no_failure) s.failure = failure_kind::none;
  if (s.failure != failure_kind::none && s.failure_step() >= s.steps)
    throw std::invalid_argument(
        fmt::format("--fail-at {} leaves no step after the failure (--steps {})", s.failure_step(), s.steps));
  return s;
}

// The batch of rank r at step t of a group of n draws from batch_stream + 16 · (t · 2^12 + r).
enum stream_purpose : std::uint64_t { problem_stream = 1, init_stream = 2, batch_stream = 3 };

constexpr qcoll_examples::cluster_problem_shape problem_shape{
    .features = 16, .classes = 8, .clusters_per_class = 3, .center_spread = 1.2};

/// features → hidden (ReLU) → classes (softmax cross-entropy). Parameters and
/// gradients are one vector each: W1 (features × hidden), b1, W2 (hidden × classes), b2.
class mlp {
 public:
  static constexpr std::size_t features = problem_shape.features, hidden = 64, classes = problem_shape.classes;
  static constexpr std::size_t w1 = 0, b1 = w1 + features * hidden, w2 = b1 + hidden, b2 = w2 + hidden * classes,
                               size = b2 + classes;

  explicit mlp(std::uint64_t seed) : parameters_(size, 0.0f), gradients_(size, 0.0f) {
    random_stream random(seed, init_stream);  // He initialisation, biases 0
    for (std::size_t k = 0; k < features * hidden; ++k)
      parameters_[w1 + k] = float(std::sqrt(2.0 / features) * random.normal());
    for (std::size_t k = 0; k < hidden * classes; ++k)
      parameters_[w2 + k] = float(std::sqrt(0.1 / hidden) * random.normal());
  }

  std::span<float> parameters() noexcept { return parameters_; }
  std::span<const float> parameters() const noexcept { return parameters_; }
  std::span<float> gradients() noexcept { return gradients_; }

  /// Leaves the gradient of the samples' mean loss in gradients(); returns the summed loss.
  double train_batch(const dataset& data, std::span<const std::size_t> samples) {
    std::fill(gradients_.begin(), gradients_.end(), 0.0f);
    std::array<float, hidden> h, dh;
    std::array<float, classes> logits;
    const float scale = 1.0f / float(samples.size());
    double loss = 0;
    for (std::size_t i : samples) {
      const float* x = data.input(i);
      forward(x, h, logits);
      const float largest = *std::max_element(logits.begin(), logits.end());
      double total = 0;
      for (float z : logits) total += std::exp(double(z - largest));
      const std::size_t label = data.labels[i];
      loss += std::log(total) - double(logits[label] - largest);
      std::array<float, classes> d;  // d loss / d logit, for the batch mean
      for (std::size_t k = 0; k < classes; ++k)
        d[k] = scale * float(std::exp(double(logits[k] - largest)) / total - (k == label ? 1.0 : 0.0));
      for (std::size_t j = 0; j < hidden; ++j) {
        float back = 0;
        for (std::size_t k = 0; k < classes; ++k) {
          gradients_[w2 + j * classes + k] += h[j] * d[k];
          back += parameters_[w2 + j * classes + k] * d[k];
        }
        dh[j] = h[j] > 0 ? back : 0.0f;
      }
      for (std::size_t k = 0; k < classes; ++k) gradients_[b2 + k] += d[k];
      for (std::size_t f = 0; f < features; ++f)
        for (std::size_t j = 0; j < hidden; ++j) gradients_[w1 + f * hidden + j] += x[f] * dh[j];
      for (std::size_t j = 0; j < hidden; ++j) gradients_[b1 + j] += dh[j];
    }
    return loss;
  }

  /// How many of the samples [begin, end) the model classifies correctly.
  std::size_t count_correct(const dataset& data, std::size_t begin, std::size_t end) const {
    std::array<float, hidden> h;
    std::array<float, classes> logits;
    std::size_t correct = 0;
    for (std::size_t i = begin; i < end; ++i) {
      forward(data.input(i), h, logits);
      correct += std::size_t(std::max_element(logits.begin(), logits.end()) - logits.begin()) == data.labels[i];
    }
    return correct;
  }

 private:
  void forward(const float* x, std::array<float, hidden>& h, std::array<float, classes>& logits) const {
    std::copy_n(parameters_.begin() + b1, hidden, h.begin());
    for (std::size_t f = 0; f < features; ++f)
      for (std::size_t j = 0; j < hidden; ++j) h[j] += x[f] * parameters_[w1 + f * hidden + j];
    for (float& v : h) v = std::max(v, 0.0f);
    std::copy_n(parameters_.begin() + b2, classes, logits.begin());
    for (std::size_t j = 0; j < hidden; ++j)
      for (std::size_t k = 0; k < classes; ++k) logits[k] += h[j] * parameters_[w2 + j * classes + k];
  }

  std::vector<float> parameters_;
  std::vector<float> gradients_;
};

/// What a replica carries from step to step: the recovery broadcast copies all of it.
struct training_state {
  explicit training_state(std::uint64_t seed) : model(seed), velocity(mlp::size, 0.0f) {}

  mlp model;
  std::vector<float> velocity;  // SGD momentum
  std::size_t step = 0;         // steps done

  static constexpr float momentum = 0.9f;

  void apply_gradient(float learning_rate) {
    const std::span<float> parameters = model.parameters(), gradients = model.gradients();
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      velocity[k] = momentum * velocity[k] + gradients[k];
      parameters[k] -= learning_rate * velocity[k];
    }
  }

  /// FNV-1a over the parameters' bytes.
  std::uint64_t checksum() const {
    std::uint64_t h = 1469598103934665603ull;
    for (float v : model.parameters()) {
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (int i = 0; i < 4; ++i) h = (h ^ (bits >> (8 * i) & 0xff)) * 1099511628211ull;
    }
    return h;
  }
};

/// A linear warm-up over the first tenth of the run (the 1-bit exchange lags most
/// while gradients are large), then a cosine down to a tenth of the peak.
float learning_rate(const settings& s, std::size_t step) {
  const std::size_t warm_up = std::max<std::size_t>(1, s.steps / 10);
  if (step < warm_up) return s.learning_rate * float(step + 1) / float(warm_up);
  const double progress = double(step - warm_up) / double(std::max<std::size_t>(1, s.steps - warm_up));
  return float(s.learning_rate * (0.1 + 0.45 * (1.0 + std::cos(std::numbers::pi * progress))));
}

/// A group of ranks: which nodes play in it, in rank order, and this rank's endpoint.
struct group {
  std::size_t generation = 0;  // 0: all nodes; +1 at each re-forming
  std::vector<rank_t> nodes;   // ascending; rank r plays nodes[r]
  inproc::transport endpoint;
  double membership_seconds = 0;  // from the round's first check-in until it closed
};

/// The in-process membership service. A survivor checks in with its node id after its
/// group failed and blocks until the round closes: when every node of the old group has
/// checked in, or when none has for `grace`. Those that checked in form the next
/// group, over a new in-process world. A multi-process job does the same through its
/// launcher or its rendezvous store.
/// Thread safety: every member function may be called from any thread.
class membership_service {
 public:
  explicit membership_service(std::chrono::milliseconds grace) : grace_(grace) {}

  /// Checks `node` in after the group of `failed_generation` (of `old_size` nodes)
  /// failed. Returns the next group, or nothing when the round closed without this node
  /// (it came too late: the others went on without it).
  std::optional<group> check_in(std::size_t failed_generation, rank_t node, std::size_t old_size) {
    std::unique_lock lock(mutex_);
    round& r = rounds_[failed_generation];
    if (r.closed) return std::nullopt;
    const clock_type::time_point now = clock_type::now();
    if (r.nodes.empty()) r.first = now;
    r.nodes.push_back(node);
    r.last = now;
    changed_.notify_all();
    while (!r.closed) {
      if (r.nodes.size() == old_size || clock_type::now() >= r.last + grace_) {
        std::sort(r.nodes.begin(), r.nodes.end());
        r.world.emplace(rank_t(r.nodes.size()));
        r.closed = true;
        r.closed_at = clock_type::now();
        changed_.notify_all();
      } else {
        changed_.wait_until(lock, r.last + grace_);
      }
    }
    const auto rank = rank_t(std::lower_bound(r.nodes.begin(), r.nodes.end(), node) - r.nodes.begin());
    const std::chrono::duration<double> took = r.closed_at - r.first;
    return group{failed_generation + 1, r.nodes, r.world->endpoint(rank), took.count()};
  }

  /// Blocks until the round after `failed_generation` closed, or `limit` passed.
  void wait_closed(std::size_t failed_generation, std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, limit, [&] { return rounds_[failed_generation].closed; });
  }

 private:
  struct round {
    std::vector<rank_t> nodes;  // checked in
    clock_type::time_point first, last, closed_at;
    bool closed = false;
    std::optional<inproc::world> world;
  };

  const std::chrono::milliseconds grace_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::size_t, round> rounds_;  // by the generation that failed
};

/// The orderings the scripted failure needs, so that every run reports the same failure:
///  - The stopping nodes stop only once every node has reached step --fail-at, that is
///    has left all collectives of the step before (its row of the learning curve
///    included). A node that finishes a collective may return before its peers do;
///    had it stopped then, a peer that went on to the next step would notice the loss
///    and abort the world while rank 0 was still in the row's allreduce, and the row,
///    which rank 0 prints after that allreduce, would be lost with it (1 run in 20).
///  - With both failures b2 crashes only once b3 has hung. Otherwise b3 could still be
///    finishing its last collective when b2's loss aborts it, see the failure itself,
///    and survive as a fifteenth node.
/// A real job has no such script: there a failure at a step boundary may still cut
/// the collectives before it short on some ranks, and recovery copes with that (the
/// step count goes up before the report for this reason).
class failure_script {
 public:
  explicit failure_script(rank_t nodes) : nodes_(nodes) {}

  /// A node of the first group has reached the failure step.
  void reached_failure_step() {
    std::lock_guard lock(mutex_);
    ++reached_;
    changed_.notify_all();
  }
  /// Blocks until every node has reached the failure step, or `limit` passed (then a
  /// node failed before it; the run goes on and its output tells).
  void wait_for_everyone(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, limit, [&] { return reached_ == nodes_; });
  }
  void hung() {
    std::lock_guard lock(mutex_);
    hung_ = true;
    changed_.notify_all();
  }
  void wait_for_hang() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return hung_; });
  }

 private:
  const rank_t nodes_;
  std::mutex mutex_;
  std::condition_variable changed_;
  rank_t reached_ = 0;
  bool hung_ = false;
};

/// What one rank saw fail.
struct failure_seen {
  qcoll::errc code = qcoll::errc::invalid_argument;
  double seconds = 0;  // from entering the failed call until it threw
  clock_type::time_point detected_at;
  std::size_t step = 0;  // the step being done
  std::string call;      // "the gradient allreduce", …
  std::string message;
};

/// How a node's thread ended; each thread writes only its own slot.
struct node_outcome {
  enum class end { finished, crashed, hung, left_out } how = end::finished;
  bool accuracy_ok = false;
  std::exception_ptr error;
};

struct shared_setup {
  const settings& s;
  const cluster_problem& p;
  membership_service& membership;
  failure_script& script;
  clock_type::time_point start;
};

std::string node_list(const topo::grid_shape& shape, std::span<const rank_t> list) {
  std::string text;
  for (std::size_t i = 0; i < list.size(); ++i)
    text += (i == 0 ? "" : i + 1 == list.size() ? " and " : ", ") + shape.name(list[i]);
  return text;
}

/// One node's process: trains in its group until the run ends, and re-joins a new
/// group whenever the current one fails.
class node_process {
 public:
  node_process(const shared_setup& setup, rank_t node) : setup_(setup), s_(setup.s), node_(node), state_(s_.seed) {}

  node_outcome::end run(group first) {
    std::optional<group> current(std::move(first));
    for (;;) {
      std::optional<failure_seen> seen;
      {
        communicator comm(std::move(current->endpoint), qcoll::communicator_options{s_.timeout});
        try {
          return train(comm, *current);
        } catch (const qcoll::error& e) {
          if (e.code() != qcoll::condition::transport_failure) throw;
          const std::chrono::duration<double> took = clock_type::now() - call_started_;
          seen = failure_seen{qcoll::errc(e.code().value()), took.count(), clock_type::now(), state_.step,
                              std::string(call_), e.what()};
        }
      }  // the failed communicator goes, and this rank's endpoint of the old world with it
      const std::size_t generation = current->generation, old_size = current->nodes.size();
      current.reset();
      std::optional<group> next = setup_.membership.check_in(generation, node_, old_size);
      if (!next) return node_outcome::end::left_out;
      current.emplace(std::move(*next));
      seen_ = std::move(seen);
    }
  }

  bool accuracy_ok() const noexcept { return accuracy_ok_; }

 private:
  node_outcome::end train(communicator& comm, const group& g) {
    const bool printing = comm.rank() == 0;
    const topo::grid_routing routing = routing_for(g);
    // Rank r plays the r-th node that is not fully degraded: the plan's default mapping.
    qcoll::grid_allreduce_plan exchange(comm, routing, mlp::size, qcoll::quantizers::one_bit{});
    if (g.generation == 0) {
      if (printing) print_introduction(routing);
    } else {
      recover(comm, g, routing);
    }

    double loss = 0, trained = 0;  // since the last row
    while (state_.step < s_.steps) {
      if (g.generation == 0 && s_.failure != failure_kind::none && state_.step == s_.failure_step()) {
        setup_.script.reached_failure_step();
        if (s_.stops(node_)) return stop();
      }
      std::vector<std::size_t> batch = batch_of(comm);
      loss += state_.model.train_batch(setup_.p.train, batch);
      trained += double(batch.size());
      calling("the gradient allreduce");
      comm.allreduce(exchange, state_.model.gradients(), qcoll::reduce_op::avg);
      state_.apply_gradient(learning_rate(s_, state_.step));
      ++state_.step;  // before the report: a failure there must not make the step count twice
      if (state_.step % s_.report_every() == 0 || state_.step == s_.steps) {
        const double accuracy = test_accuracy(comm, loss, trained);
        if (printing) print_row(exchange.divisor(), loss / trained, accuracy, "");
        loss = trained = 0;
        final_accuracy_ = accuracy;
      }
    }
    finish(comm, g);
    return node_outcome::end::finished;
  }

  /// The failure this node was told to have at step --fail-at.
  node_outcome::end stop() {
    setup_.script.wait_for_everyone(10 * s_.timeout + std::chrono::seconds(10));
    if (node_ == crashing_node) {
      if (s_.failure == failure_kind::both) setup_.script.wait_for_hang();
      return node_outcome::end::crashed;  // the communicator and its endpoint go with it
    }
    // Hung: holds its endpoint and answers nothing, until the others have re-formed
    // without it (in a real job the launcher would kill it then).
    setup_.script.hung();
    setup_.membership.wait_closed(0, 10 * s_.timeout + std::chrono::seconds(10));
    return node_outcome::end::hung;
  }

  topo::grid_routing routing_for(const group& g) const {
    topo::grid_faults faults;
    for (rank_t v = 0; v < nodes; ++v)
      if (!std::binary_search(g.nodes.begin(), g.nodes.end(), v)) faults.nodes.push_back(topo::degraded_node::fully(v));
    return topo::route_grid(topo::torus({grid_side, grid_side}, std::move(faults)));
  }

  /// This rank's samples of the step: drawn from its shard of the training set (the
  /// shards are cut anew for every group), the same whichever rank asks again.
  std::vector<std::size_t> batch_of(const communicator& comm) const {
    const qcoll::block_range shard = qcoll::block_of(setup_.p.train.size(), comm.size(), comm.rank());
    random_stream random(s_.seed, batch_stream + 16 * ((state_.step << 12) | comm.rank()));
    std::vector<std::size_t> batch(s_.batch_per_rank);
    for (std::size_t& i : batch) i = shard.offset + random.below(shard.size);
    return batch;
  }

  /// Test accuracy of the current parameters, each rank testing its block; also sums
  /// the training loss over the ranks (`loss` and `trained` become the totals).
  double test_accuracy(communicator& comm, double& loss, double& trained) {
    const qcoll::block_range tested = qcoll::block_of(setup_.p.test.size(), comm.size(), comm.rank());
    const std::size_t correct = state_.model.count_correct(setup_.p.test, tested.offset, tested.offset + tested.size);
    std::array<double, 3> totals{loss, trained, double(correct)};
    calling("the allreduce of the loss and accuracy");
    comm.allreduce(std::span<double>(totals), qcoll::reduce_op::sum);
    loss = totals[0];
    trained = totals[1];
    return totals[2] / double(setup_.p.test.size());
  }

  void recover(communicator& comm, const group& g, const topo::grid_routing& routing) {
    const bool printing = comm.rank() == 0;
    // What each survivor saw: its error code and how long the failed call ran.
    std::array<double, 2> mine{-1, 0};
    if (seen_) mine = {double(seen_->code), seen_->seconds};
    std::vector<double> all(2 * comm.size());
    calling("the all_gather of what failed");
    comm.all_gather(std::span<const double>(mine), std::span(all));
    if (printing) print_detection(g, routing, all);

    // Rank 0's parameters, momentum and step count for everyone.
    std::vector<float> carried(2 * mlp::size);
    std::copy_n(state_.model.parameters().begin(), mlp::size, carried.begin());
    std::copy_n(state_.velocity.begin(), mlp::size, carried.begin() + mlp::size);
    std::array<double, 1> step{double(state_.step)};
    calling("the broadcast of the training state");
    comm.broadcast(std::span<float>(carried), 0);
    comm.broadcast(std::span<double>(step), 0);
    std::copy_n(carried.begin(), mlp::size, state_.model.parameters().begin());
    std::copy_n(carried.begin() + mlp::size, mlp::size, state_.velocity.begin());
    state_.step = std::size_t(step[0]);

    double loss = 0, trained = 0;
    const double accuracy = test_accuracy(comm, loss, trained);
    if (printing) {
      fmt::print("group {}: {} ranks; rank 0 ({}) broadcast its parameters, momentum and step count ({}); "
                 "the old plan's 1-bit residuals are dropped; step {} is redone\n",
                 g.generation, comm.size(), routing.shape().name(g.nodes[0]), state_.step, state_.step);
      if (seen_) {
        const std::chrono::duration<double> took = clock_type::now() - seen_->detected_at;
        fmt::print("recovery: {:.2f} s from detecting the failure to training again (mostly the membership grace)\n",
                   took.count());
      }
      fmt::print("\n");
      print_header();
      print_row(routing.divisor(), -1, accuracy, "  <- re-formed here: training goes on without the lost nodes");
    }
  }

  void finish(communicator& comm, const group& g) {
    const std::uint64_t sum = state_.checksum();
    const std::array<double, 2> mine{double(sum >> 32), double(sum & 0xffffffffu)};
    std::vector<double> all(2 * comm.size());
    calling("the all_gather of the parameter checksums");
    comm.all_gather(std::span<const double>(mine), std::span(all));
    for (std::size_t r = 0; r < comm.size(); ++r)
      if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
        throw std::runtime_error(fmt::format("the model replicas differ: rank {} holds other parameters than rank 0",
                                             r));
    accuracy_ok_ = final_accuracy_ >= accuracy_limit;
    if (comm.rank() == 0) {
      const std::chrono::duration<double> took = clock_type::now() - setup_.start;
      fmt::print("\nmodel replicas identical on all {} {}ranks\n", comm.size(), g.generation > 0 ? "surviving " : "");
      fmt::print("time: {:.2f} s\n", took.count());
      const std::string group_text =
          g.generation == 0 ? fmt::format("{} nodes", nodes) : fmt::format("{} → {} nodes", nodes, comm.size());
      fmt::print("final accuracy: {:.3f} ({}, limit {:.2f}): {}\n", final_accuracy_, group_text, accuracy_limit,
                 accuracy_ok_ ? "ok" : "too low");
      std::fflush(stdout);
    }
  }

  void calling(std::string_view what) {
    call_ = what;
    call_started_ = clock_type::now();
  }

  void print_introduction(const topo::grid_routing& routing) const {
    fmt::print("data-parallel training on a {}×{} torus of {} local ranks (threads of this process, one in-process "
               "endpoint each)\n",
               grid_side, grid_side, nodes);
    fmt::print("model: MLP {}-{}-{} ({} parameters); {} training samples sharded over the ranks, {} held out; {} "
               "samples per rank and step; {} steps; seed {}\n",
               mlp::features, mlp::hidden, mlp::classes, mlp::size, setup_.p.train.size(), setup_.p.test.size(),
               s_.batch_per_rank, s_.steps, s_.seed);
    fmt::print("gradients: grid allreduce, 1-bit quantizer with error feedback; communicator timeout {} ms\n",
               s_.timeout.count());
    const topo::grid_shape& shape = routing.shape();
    switch (s_.failure) {
      case failure_kind::none: fmt::print("no failure (the baseline)\n"); break;
      case failure_kind::crash:
        fmt::print("at step {}: {} crashes (drops its endpoint)\n", s_.failure_step(), shape.name(crashing_node));
        break;
      case failure_kind::hang:
        fmt::print("at step {}: {} hangs (keeps its endpoint, answers nothing)\n", s_.failure_step(),
                   shape.name(hanging_node));
        break;
      case failure_kind::both:
        fmt::print("at step {}: {} crashes (drops its endpoint) and {} hangs (keeps its endpoint, answers nothing)\n",
                   s_.failure_step(), shape.name(crashing_node), shape.name(hanging_node));
        break;
    }
    fmt::print("\n");
    print_header();
    std::fflush(stdout);
  }

  static void print_header() {
    fmt::print("{:>5} {:>6} {:>11} {:>9} {:>9}\n", "step", "nodes", "train loss", "test acc", "time (s)");
  }

  void print_row(std::size_t divisor, double loss, double accuracy, std::string_view mark) const {
    const std::chrono::duration<double> elapsed = clock_type::now() - setup_.start;
    const std::string loss_text = loss < 0 ? std::string("-") : fmt::format("{:.4f}", loss);
    fmt::print("{:>5} {:>6} {:>11} {:>9.4f} {:>9.2f}{}\n", state_.step, divisor, loss_text, accuracy,
               elapsed.count(), mark);
    std::fflush(stdout);
  }

  void print_detection(const group& g, const topo::grid_routing& routing, std::span<const double> all) const {
    const topo::grid_shape& shape = routing.shape();
    double fastest = 1e300, slowest = 0;
    std::map<int, std::size_t> codes;
    for (std::size_t r = 0; r < all.size() / 2; ++r) {
      ++codes[int(all[2 * r])];
      fastest = std::min(fastest, all[2 * r + 1]);
      slowest = std::max(slowest, all[2 * r + 1]);
    }
    std::string code_text;
    for (auto [code, count] : codes)
      code_text += fmt::format("{}{} on {} rank{}", code_text.empty() ? "" : ", ",
                               code < 0 ? std::string("nothing") : qcoll::make_error_code(qcoll::errc(code)).message(),
                               count, count == 1 ? "" : "s");
    fmt::print("\n--- failure at step {}\n", seen_ ? seen_->step : state_.step);
    fmt::print("detected: {} of the survivors' calls threw ({}), {:.1f} to {:.1f} ms after entering the call\n",
               all.size() / 2, code_text, 1e3 * fastest, 1e3 * slowest);
    if (seen_) fmt::print("  rank 0 ({}) in {}: {}\n", shape.name(node_), seen_->call, seen_->message);
    std::vector<rank_t> missing;
    for (rank_t v = 0; v < nodes; ++v)
      if (!std::binary_search(g.nodes.begin(), g.nodes.end(), v)) missing.push_back(v);
    fmt::print("membership: {} of {} nodes checked in; the round closed {:.2f} s after the first check-in (grace {} "
               "ms); no answer, so degraded: {}\n",
               g.nodes.size(), nodes, g.membership_seconds, s_.timeout.count(), node_list(shape, missing));
    fmt::print("re-planned for the {} survivors (#: core; A, B, …: forwarding sub-networks; X: degraded; < > ^ v: "
               "forwarding hops):\n",
               g.nodes.size());
    fmt::print("{}", routing.draw());
    const std::string text = routing.describe();
    for (std::size_t begin = 0; begin < text.size();) {
      const std::size_t end = std::min(text.find('\n', begin), text.size());
      const std::string_view line(text.data() + begin, end - begin);
      if (line.starts_with("core") || line.starts_with("included") || line.starts_with("excluded"))
        fmt::print("{}\n", line);
      begin = end + 1;
    }
    std::fflush(stdout);
  }

  const shared_setup& setup_;
  const settings& s_;
  const rank_t node_;
  training_state state_;
  std::optional<failure_seen> seen_;  // the failure that made the current group
  std::string_view call_ = "";
  clock_type::time_point call_started_;
  double final_accuracy_ = 0;
  bool accuracy_ok_ = false;
};

}  // namespace

int main(int argc, char** argv) try {
  const settings s = parse(argc, argv);
  // Every rank reads the same problem; each trains on its shard of `train`.
  const cluster_problem p =
      qcoll_examples::make_cluster_problem(problem_shape, s.seed, problem_stream, s.train_samples, s.test_samples);
  membership_service membership(s.timeout);
  failure_script script(nodes);
  const shared_setup setup{s, p, membership, script, clock_type::now()};

  inproc::world world(nodes);
  std::vector<rank_t> everyone(nodes);
  for (rank_t v = 0; v < nodes; ++v) everyone[v] = v;
  std::vector<node_outcome> outcomes(nodes);
  {
    std::vector<std::jthread> threads;
    for (rank_t v = 0; v < nodes; ++v)
      threads.emplace_back([&, v, endpoint = world.endpoint(v)]() mutable {
        try {
          node_process process(setup, v);
          outcomes[v].how = process.run(group{0, everyone, std::move(endpoint), 0});
          outcomes[v].accuracy_ok = process.accuracy_ok();
        } catch (...) {
          outcomes[v].error = std::current_exception();
        }
      });
  }  // joins

  bool failed = false, ok = true;
  for (rank_t v = 0; v < nodes; ++v) {
    if (outcomes[v].error) {
      failed = true;
      try {
        std::rethrow_exception(outcomes[v].error);
      } catch (const std::exception& e) {
        fmt::print(stderr, "torus_fault_training: node {}: {}\n", v, e.what());
      }
    } else if (outcomes[v].how == node_outcome::end::finished) {
      ok = ok && outcomes[v].accuracy_ok;
    }
  }
  return failed ? 2 : ok ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "torus_fault_training: {}\n", e.what());
  return 2;
}
