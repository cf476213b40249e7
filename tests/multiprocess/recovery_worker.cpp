// One rank of a job that loses ranks and goes on, started by `qcoll-run --keep-going`.
//
//   recovery_worker residuals <dead ranks, e.g. 0,3> <directory>
//     Steps of a 1-bit compressed allreduce (sum) over deterministic inputs, summed into
//     a running sum. At step fail_step the dead ranks write what they owe (their residual
//     mass) into <directory> and SIGKILL themselves; the survivors' call fails, they
//     shrink, rejoin, agree on the step to redo (ranks that finished it roll back), build
//     a new plan for the new world, carry the old plan's residual mass into their next
//     contribution and go on. At the end every survivor checks, value by value:
//       running sum = Σ inputs that were reduced − Σ survivors' mass − Σ dead ranks' mass
//     (the inputs: every rank's before the failure, the survivors' after), within float
//     rounding, and that the mass carried over is large enough for the check to fail if
//     it were dropped. Each survivor prints "recovered: …" and "residual mass kept: …".
//   recovery_worker cut <cut rank> <directory>
//     For benchmarks/netlab --link-down: 60 steps of a 1-bit allreduce, 50 ms apart,
//     while the lab takes the cut rank's link down. The others' call fails within the
//     communicator's deadline, they shrink (the cut rank is unreachable), rejoin and go
//     on, each printing "recovered: …" and "finished …"; the cut rank's shrink finds no
//     one and fails for want of a majority (exit status 3).
//   Every survivor also prints "training again <t> ms after the failure", <t> from the
//   earliest failure_time.* file in <directory> (the dying rank's, or the lab's, in ns of
//   the system clock) to its first step finished in the new world.
//   recovery_worker quorum <dead ranks> <directory>
//     The dead ranks die at the first step; the survivors' shrink must fail for want of a
//     majority, saying so (exit status 3).

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/grid_allreduce.hpp>
#include <qcoll/launch/elastic.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/topologies/grid.hpp>
#include <qcoll/topologies/router.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using namespace qcoll;

constexpr std::size_t count = 100003;  // no group size divides it
constexpr double rounding_tolerance = 1e-3;  // the sums are O(10); float rounding is O(1e-5)

[[noreturn]] void fail(const std::string& why) {
  fmt::print(stderr, "FAILED: {}\n", why);
  std::exit(1);
}

/// Rank r's input at step t: uniform in [−1, 1), the same from every standard library.
float input(rank_t r, unsigned t, std::size_t i) {
  std::uint64_t z = (r + 1) * 0x9e3779b97f4a7c15u ^ (std::uint64_t{t} << 40) ^ i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  z ^= z >> 31;
  return static_cast<float>(double(z >> 11) * 0x1.0p-52 - 1.0);
}

std::vector<rank_t> parse_ranks(std::string_view text) {
  std::vector<rank_t> ranks;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    ranks.push_back(static_cast<rank_t>(std::stoul(std::string(text.substr(0, comma)))));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

std::string mass_file(const std::string& directory, rank_t r) { return fmt::format("{}/mass.{}", directory, r); }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The earliest failure_time.* in the directory, or 0.
std::int64_t failure_time(const std::string& directory) {
  std::int64_t earliest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    if (!entry.path().filename().string().starts_with("failure_time.")) continue;
    std::int64_t t = 0;
    if (std::ifstream(entry.path()) >> t && t > 0 && (earliest == 0 || t < earliest)) earliest = t;
  }
  return earliest;
}

struct scenario {
  unsigned steps;
  unsigned die_at;                   // the dead ranks die at the start of this step
  std::chrono::milliseconds pause;   // between steps
  bool check_residuals;
};

/// What a rank keeps across worlds: its running sum and, per step, what it owed when the
/// step started, so a rank that finished a step the others did not can roll back.
struct rank_state {
  rank_t first_rank = 0;  // in the first world: names its inputs
  unsigned done = 0;      // steps finished
  std::vector<double> running = std::vector<double>(count, 0.0);
  std::vector<float> carried = std::vector<float>(count, 0.0f);  // mass to add to the next contribution
  struct snapshot {
    std::vector<double> running;
    std::vector<float> mass;  // carried + the plan's residual mass at the start of the step
  };
  std::array<snapshot, 2> at_step_start;  // steps done and done − 1
  double largest_carried = 0;
  std::vector<rank_t> first_ranks;  // of the current world's ranks, in order
};

/// The first world's ranks as the nodes of a 2 × (n / 2) torus: after a shrink the lost
/// ones are degraded, the survivors play their old nodes (survivors in node order are
/// what grid_allreduce_plan maps by default), and an exact grid allreduce must give the
/// survivors' sum.
template <class Comm>
void grid_after_shrink(Comm& comm, const rank_state& s, rank_t first_size) {
  if (first_size % 2 != 0) fail("the grid check needs an even number of ranks (a 2 x n/2 torus)");
  std::vector<topologies::degraded_node> lost;
  for (rank_t r = 0; r < first_size; ++r)
    if (!std::binary_search(s.first_ranks.begin(), s.first_ranks.end(), r)) lost.push_back(topologies::degraded_node::fully(r));
  const topologies::torus torus({2, first_size / 2}, {.nodes = lost});
  const topologies::grid_routing routing = topologies::route_grid(torus, {});
  constexpr std::size_t values = 4099;
  grid_allreduce_plan plan(comm, routing, values, quantizers::identity<float>{});
  std::vector<float> in(values), out(values);
  for (std::size_t i = 0; i < values; ++i) in[i] = float((s.first_rank + 1) * (i % 97));
  // Some sets of lost nodes leave a survivor's node without a route: the routing
  // excludes it, its call is refused (and only its), and the sum is the included nodes'.
  if (!routing.is_included(s.first_rank)) {
    try {
      comm.allreduce(plan, std::span<const float>(in), std::span(out), reduce_op::sum);
    } catch (const qcoll::error& e) {
      if (e.code() != errc::invalid_argument || std::string_view(e.what()).find("excludes") == std::string_view::npos)
        throw;
      fmt::print("rank {}: grid allreduce re-planned around {} lost node(s) of the 2x{} torus: this node excluded\n",
                 s.first_rank, lost.size(), first_size / 2);
      return;
    }
    fail("grid allreduce after the shrink: a node the routing excludes took part");
  }
  comm.allreduce(plan, std::span<const float>(in), std::span(out), reduce_op::sum);
  for (std::size_t i = 0; i < values; ++i) {
    float sum = 0;
    for (rank_t r : routing.included()) sum += float((r + 1) * (i % 97));
    if (out[i] != sum) fail(fmt::format("grid allreduce after the shrink: value {} is {}, not {}", i, out[i], sum));
  }
  fmt::print("rank {}: grid allreduce re-planned around {} lost node(s) of the 2x{} torus: correct\n", s.first_rank,
             lost.size(), first_size / 2);
}

template <class Comm>
int run_steps(Comm& comm, rank_state& s, launch::elastic_job& job, std::span<const rank_t> dead,
              const std::string& directory, const scenario& plan_of_steps) {
  const unsigned steps = plan_of_steps.steps, die_at = plan_of_steps.die_at;
  bool timed = job.epoch() == 0;
  compressed_allreduce_plan plan(comm, count, quantizers::one_bit{});
  if (job.epoch() > 0) {
    // Redo the first step some survivor did not finish; ranks that finished it roll back.
    std::array<double, 1> fewest{double(s.done)};  // small integers: exact
    comm.allreduce(std::span<double>(fewest), reduce_op::min);
    if (fewest[0] + 1 < double(s.done)) fail(fmt::format("{} steps done here, {} on another survivor", s.done, fewest[0]));
    if (double(s.done) > fewest[0]) fmt::print("rank {}: rolls back step {}\n", s.first_rank, s.done);
    s.done = static_cast<unsigned>(fewest[0]);
    const rank_state::snapshot& start = s.at_step_start[s.done % 2];
    s.running = start.running;
    s.carried = start.mass;  // the old plan's mass at the start of the step we redo
    for (float m : s.carried) s.largest_carried = std::max(s.largest_carried, double(std::abs(m)));
  }
  std::vector<float> in(count), out(count);
  for (; s.done < steps; ++s.done) {
    rank_state::snapshot& start = s.at_step_start[s.done % 2];
    start.running = s.running;
    start.mass = s.carried;
    plan.add_residual_mass(start.mass);
    if (s.done == die_at && std::binary_search(dead.begin(), dead.end(), s.first_rank)) {
      std::ofstream(mass_file(directory, s.first_rank), std::ios::binary)
          .write(reinterpret_cast<const char*>(start.mass.data()), std::streamsize(count * sizeof(float)));
      // Let the peers read the last step's messages first: over TCP, a process that dies
      // with unread data resets its connections, and a reset discards what it sent before.
      // Then every survivor fails the same step and shrinks once, as the test expects
      // (examples/elastic_training shows the other case).
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::ofstream(fmt::format("{}/failure_time.{}", directory, s.first_rank)) << now_ns() << '\n';
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    for (std::size_t i = 0; i < count; ++i) in[i] = input(s.first_rank, s.done, i) + s.carried[i];
    comm.allreduce(plan, std::span<const float>(in), std::span(out), reduce_op::sum);
    std::fill(s.carried.begin(), s.carried.end(), 0.0f);
    for (std::size_t i = 0; i < count; ++i) s.running[i] += out[i];
    if (!timed) {
      timed = true;
      if (const std::int64_t failed_at = failure_time(directory); failed_at != 0)
        fmt::print("rank {}: training again {:.0f} ms after the failure\n", s.first_rank,
                   double(now_ns() - failed_at) / 1e6);
    }
    std::this_thread::sleep_for(plan_of_steps.pause);
  }
  if (!plan_of_steps.check_residuals) {
    fmt::print("rank {}: finished {} steps in a world of {}\n", s.first_rank, steps, comm.size());
    return 0;
  }

  // Σ inputs reduced − what the survivors still owe − what the dead owed when they died.
  std::vector<float> owed(s.carried);
  plan.add_residual_mass(owed);
  comm.allreduce(std::span(owed), reduce_op::sum);
  std::vector<float> dead_mass(count, 0.0f);
  for (rank_t d : dead) {  // "residuals": the dead died
    std::vector<float> theirs(count);
    std::ifstream file(mass_file(directory, d), std::ios::binary);
    if (!file.read(reinterpret_cast<char*>(theirs.data()), std::streamsize(count * sizeof(float))))
      fail(fmt::format("rank {} left no {}", d, mass_file(directory, d)));
    for (std::size_t i = 0; i < count; ++i) dead_mass[i] += theirs[i];
  }
  const rank_t first_size = static_cast<rank_t>(job.job().size + dead.size());
  double worst = 0, largest_dead = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double reduced = 0;
    for (unsigned t = 0; t < steps; ++t)
      for (rank_t r = 0; r < first_size; ++r)
        if (t < die_at || !std::binary_search(dead.begin(), dead.end(), r)) reduced += input(r, t, i);
    worst = std::max(worst, std::abs(s.running[i] - (reduced - owed[i] - dead_mass[i])));
    largest_dead = std::max(largest_dead, double(std::abs(dead_mass[i])));
  }
  if (worst > rounding_tolerance) fail(fmt::format("the running sum is off by {} (tolerance {})", worst, rounding_tolerance));
  // Dropping the carried or the dead ranks' mass must break the check, or it proves nothing.
  if (s.largest_carried < 100 * rounding_tolerance || largest_dead < 100 * rounding_tolerance)
    fail(fmt::format("the masses are too small to test anything: carried {}, dead {}", s.largest_carried, largest_dead));
  if (job.epoch() > 0) grid_after_shrink(comm, s, first_size);
  fmt::print("rank {}: residual mass kept: running sum = inputs − survivors' mass − dead ranks' mass within {:.1e} "
             "(largest carried {:.3f}, dead {:.3f})\n",
             s.first_rank, worst, s.largest_carried, largest_dead);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 4) fail("usage: recovery_worker residuals|quorum|cut <ranks> <directory>");
  const std::string_view name = argv[1];
  const std::vector<rank_t> dead = parse_ranks(argv[2]);
  const std::string directory = argv[3];
  scenario chosen{};
  if (name == "residuals") chosen = {10, 4, std::chrono::milliseconds(0), true};
  else if (name == "quorum") chosen = {10, 0, std::chrono::milliseconds(0), false};
  else if (name == "cut") chosen = {60, ~0u, std::chrono::milliseconds(50), false};
  else fail(fmt::format("unknown scenario '{}'", name));
  // A cut rank does not die: it is lost all the same.
  const std::size_t lost_ranks = dead.size();

  launch::elastic_job job = launch::elastic_job::from_environment();
  rank_state state;
  state.first_rank = job.job().rank;
  for (rank_t r = 0; r < job.job().size; ++r) state.first_ranks.push_back(r);
  launch::shrink_options shrink;
  shrink.timeout = std::chrono::seconds(10);
  for (;;) {
    try {
      return job.join([&](auto transport) {
        // QCOLL_TIMEOUT_MS bounds each step too, not only the setup: a cut link is
        // noticed only by a deadline.
        communicator comm(std::move(transport), communicator_options{job.job().timeout});
        return run_steps(comm, state, job, dead, directory, chosen);
      });
    } catch (const qcoll::error& e) {
      if (!launch::recoverable(e)) throw;
      fmt::print("rank {}: step {} failed: {}\n", state.first_rank, state.done, e.code().message());
      try {
        const launch::shrink_report report = job.shrink(shrink);
        fmt::print("rank {}: recovered: {}\n", report.old_rank, report.describe());
        std::vector<rank_t> first_ranks;
        for (rank_t r : report.survivors) first_ranks.push_back(state.first_ranks[r]);
        state.first_ranks = std::move(first_ranks);
        if (report.survivors.size() + lost_ranks != report.old_size)
          fail(fmt::format("{} survivors of {} with {} lost", report.survivors.size(), report.old_size, lost_ranks));
        for (const auto& [rank, why] : report.lost)
          if (!std::binary_search(dead.begin(), dead.end(), rank)) fail(fmt::format("rank {} was left behind", rank));
      } catch (const qcoll::error& refused) {
        fmt::print("rank {}: shrink refused: {}\n", state.first_rank, refused.what());
        return 3;
      }
    }
  }
} catch (const std::exception& e) {
  fmt::print(stderr, "FAILED: {}\n", e.what());
  return 1;
}
