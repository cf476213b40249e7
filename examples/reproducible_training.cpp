// The same model and global batch trained on 1, 2, 4 and 8 ranks: with the reproducible
// accumulator (qcoll/reproducible.hpp) the weights end bitwise identical on every world
// size; with ordinary float sums they do not, and the program says where they first differ.
//
//   reproducible_training [--steps N]                  1, 2, 4 and 8 ranks as threads, one table;
//                                                      then a 4×4 torus, healthy and degraded
//   qcoll-run -n N reproducible_training --job [...]   N processes (shm or tcp), checked
//                                                      against rank 0 training alone
//
// Each step's global batch is 16 micro-batches of 4 samples; micro-batch k goes to rank
// k mod N, which computes its gradient (the same code on the same samples on any rank:
// the same bits) and adds it to the accumulator; the accumulator's allreduce averages all
// 16 onto one grid, whatever rank holds which. The ordinary run sums its micro-batches
// in float, then allreduces the sums: the grouping, and so the rounding, follows N.
// On the torus (threads too) the accumulators are summed by reproducible_grid_allreduce:
// 16 ranks on the healthy grid, then the 14 that play the nodes left when two are
// degraded — the grid's routes change, the weights do not.
// Exit status: 0 when every reproducible run matches 1 rank's bits, 1 otherwise.

#include "launched_main.hpp"
#include "mlp_classifier.hpp"

#include <qcoll/communicator.hpp>
#include <qcoll/reproducible.hpp>
#include <qcoll/reproducible_grid.hpp>
#include <qcoll/topologies/router.hpp>
#include <qcoll/transports/inproc.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace qcoll_examples;

constexpr std::size_t micro_batches = 16, micro_batch = 4, train_samples = 4096;
constexpr std::size_t widths[] = {problem_shape.features, 64, problem_shape.classes};

struct options {
  std::size_t steps = 40;
  bool job = false;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--job") o.job = true;
    else if (arg == "--steps" && i + 1 < argc) o.steps = std::stoul(argv[++i]);
    else throw std::invalid_argument(fmt::format("unknown argument '{}' (--steps N, --job)", arg));
  }
  if (o.steps == 0) throw std::invalid_argument("--steps must be positive");
  return o;
}

/// The parameters after every step of one run.
using trajectory = std::vector<std::vector<float>>;

/// `steps` steps on rank `rank` of `ranks`: its micro-batches' gradients, then `average`
/// (every rank's micro-batch gradients → their mean), then SGD. A world of one rank
/// takes every micro-batch. Returns the parameters after each step.
template <class Average>
trajectory train(const cluster_problem& problem, std::size_t steps, std::size_t rank, std::size_t ranks,
                 Average&& average) {
  mlp model(widths, micro_batch, 1);
  sgd optimizer;
  std::vector<float> mean(model.parameters().size());
  std::vector<std::vector<float>> mine;  // this rank's micro-batch gradients of the step
  trajectory path;
  for (std::size_t step = 0; step < steps; ++step) {
    mine.clear();
    for (std::size_t k = rank; k < micro_batches; k += ranks) {
      std::size_t samples[micro_batch];
      for (std::size_t b = 0; b < micro_batch; ++b)
        samples[b] = ((step * micro_batches + k) * micro_batch + b) % train_samples;
      model.train_batch(problem.train, samples, [](std::size_t) {});
      mine.emplace_back(model.gradients().begin(), model.gradients().end());
    }
    average(mine, std::span(mean));
    optimizer.step(model.parameters(), mean, scheduled_learning_rate(0.05f, step, steps));
    model.parameters_changed();
    path.emplace_back(model.parameters().begin(), model.parameters().end());
  }
  return path;
}

/// The two ways to average: the reproducible accumulator, and float sums then an allreduce.
template <class Communicator>
auto reproducible_over(Communicator& comm) {
  return [&comm](const std::vector<std::vector<float>>& mine, std::span<float> mean) {
    qcoll::reproducible_accumulator<float> sum(mean.size());
    for (const auto& g : mine) sum.add(g);
    sum.allreduce(comm, mean, qcoll::reduce_op::avg);
  };
}
template <class Communicator>
auto ordinary_over(Communicator& comm) {
  return [&comm](const std::vector<std::vector<float>>& mine, std::span<float> mean) {
    std::fill(mean.begin(), mean.end(), 0.0f);
    for (const auto& g : mine)
      for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += g[i];
    comm.allreduce(mean, qcoll::reduce_op::sum);
    for (float& x : mean) x /= float(micro_batches);
  };
}
/// The reproducible accumulator summed over a grid routing.
template <class Communicator>
auto reproducible_over_grid(Communicator& comm, qcoll::reproducible_grid_allreduce<float>& grid) {
  return [&comm, &grid](const std::vector<std::vector<float>>& mine, std::span<float> mean) {
    qcoll::reproducible_accumulator<float> sum(mean.size());
    for (const auto& g : mine) sum.add(g);
    grid.allreduce(comm, sum, mean, qcoll::reduce_op::avg);
  };
}
/// One rank alone: every micro-batch here.
auto reproducible_alone() {
  return [](const std::vector<std::vector<float>>& all, std::span<float> mean) {
    qcoll::reproducible_accumulator<float> sum(mean.size());
    for (const auto& g : all) sum.add(g);
    sum.sum(mean, qcoll::reduce_op::avg);
  };
}
auto ordinary_alone() {
  return [](const std::vector<std::vector<float>>& all, std::span<float> mean) {
    std::fill(mean.begin(), mean.end(), 0.0f);
    for (const auto& g : all)
      for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += g[i];
    for (float& x : mean) x /= float(micro_batches);
  };
}

/// "identical" or where `run` first leaves `reference`: the step and the parameter.
std::string compared(const trajectory& run, const trajectory& reference) {
  for (std::size_t s = 0; s < reference.size(); ++s)
    for (std::size_t p = 0; p < reference[s].size(); ++p)
      if (std::memcmp(&run[s][p], &reference[s][p], sizeof(float)) != 0)
        return fmt::format("differ from step {}, parameter {} ({:.9g} against {:.9g})", s + 1, p, run[s][p],
                           reference[s][p]);
  return "identical";
}

std::uint64_t fingerprint(const std::vector<float>& v) {  // FNV-1a of the bytes
  std::uint64_t h = 14695981039346656037ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

cluster_problem problem() { return make_cluster_problem(problem_shape, 1, problem_stream, train_samples, 256); }

/// Threads: 1, 2, 4 and 8 ranks in this process.
int on_threads(const options& o) {
  const cluster_problem p = problem();
  const trajectory reproducible_1 = train(p, o.steps, 0, 1, reproducible_alone());
  const trajectory ordinary_1 = train(p, o.steps, 0, 1, ordinary_alone());
  fmt::print("{} steps of {} micro-batches of {} samples, {} parameters; final weights against 1 rank:\n", o.steps,
             micro_batches, micro_batch, reproducible_1.back().size());
  fmt::print("{:>5}  {:<58}  {}\n", "ranks", "reproducible accumulator", "ordinary float sums");
  bool all_identical = true;
  for (const std::size_t ranks : {1, 2, 4, 8}) {
    trajectory reproducible, ordinary;
    const auto errors = qcoll::transports::inproc::run_ranks(ranks, [&](qcoll::transports::inproc::transport t) {
      qcoll::communicator comm(std::move(t));
      trajectory r = train(p, o.steps, comm.rank(), ranks, reproducible_over(comm));
      trajectory d = train(p, o.steps, comm.rank(), ranks, ordinary_over(comm));
      if (comm.rank() == 0) reproducible = std::move(r), ordinary = std::move(d);
    });
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    const std::string r = compared(reproducible, reproducible_1), d = compared(ordinary, ordinary_1);
    all_identical = all_identical && r == "identical";
    fmt::print("{:>5}  {:<58}  {}\n", ranks, fmt::format("{} ({:016x})", r, fingerprint(reproducible.back())), d);
  }
  fmt::print("reproducible weights identical on 1, 2, 4 and 8 ranks: {}\n", all_identical ? "yes" : "NO");

  // A 4×4 torus, healthy, then with two nodes degraded: one rank per node left, the
  // routes around the holes; the weights against 1 rank's.
  namespace topo = qcoll::topologies;
  bool grids_identical = true;
  for (const bool degraded : {false, true}) {
    topo::grid_faults faults;
    if (degraded) faults.nodes = {topo::degraded_node::fully(5), topo::degraded_node::fully(10)};
    const topo::grid_routing routing = topo::route_grid(topo::torus({4, 4}, faults));
    const std::size_t ranks = routing.included().size();
    trajectory reproducible;
    const auto errors = qcoll::transports::inproc::run_ranks(ranks, [&](qcoll::transports::inproc::transport t) {
      qcoll::communicator comm(std::move(t), qcoll::topologies::fully_connected(ranks));
      qcoll::reproducible_grid_allreduce<float> grid(comm, routing, reproducible_1.back().size());
      trajectory r = train(p, o.steps, comm.rank(), ranks, reproducible_over_grid(comm, grid));
      if (comm.rank() == 0) reproducible = std::move(r);
    });
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    const std::string r = compared(reproducible, reproducible_1);
    grids_identical = grids_identical && r == "identical";
    fmt::print("4x4 torus, {:<28} {:>2} ranks: {} ({:016x})\n",
               degraded ? fmt::format("nodes {} and {} degraded,", routing.shape().name(5), routing.shape().name(10))
                        : std::string("healthy,"),
               ranks, r, fingerprint(reproducible.back()));
  }
  fmt::print("reproducible weights identical on the healthy and the degraded torus: {}\n",
             grids_identical ? "yes" : "NO");
  return all_identical && grids_identical ? 0 : 1;
}

/// A launched job: every rank trains its share; rank 0 also trains alone and compares.
template <class Communicator>
int in_job(Communicator& comm, const options& o, std::string_view transport) {
  const cluster_problem p = problem();
  const std::size_t ranks = comm.size();
  const trajectory reproducible = train(p, o.steps, comm.rank(), ranks, reproducible_over(comm));
  const trajectory ordinary = train(p, o.steps, comm.rank(), ranks, ordinary_over(comm));
  bool identical = true;
  if (comm.rank() == 0) {
    const std::string r = compared(reproducible, train(p, o.steps, 0, 1, reproducible_alone()));
    const std::string d = compared(ordinary, train(p, o.steps, 0, 1, ordinary_alone()));
    identical = r == "identical";
    fmt::print("{} ranks over {}, {} steps: reproducible accumulator: {} to 1 rank ({:016x}); ordinary float sums: "
               "{}\n",
               ranks, transport, o.steps, r, fingerprint(reproducible.back()), d);
  }
  // Every rank's final weights are rank 0's (the same bits everywhere), and rank 0's verdict.
  std::vector<double> verdict{identical ? 0.0 : 1.0};
  comm.allreduce(std::span(verdict), qcoll::reduce_op::max);
  return verdict[0] == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "--job")
      return launched_main("reproducible_training", argc, argv, parse,
                           [](auto& comm, const options& o, std::string_view transport) {
                             return in_job(comm, o, transport);
                           });
  try {
    return on_threads(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "reproducible_training: {}\n", e.what());
    return 2;
  }
}
