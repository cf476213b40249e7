// qcoll's exact collectives in the nccl-tests table format of ../shared/peers (same
// options, columns, data pattern and timing method), so a run can be put side by side
// with Open MPI and Gloo:
//
//   collective_bench NRANKS [options]   NRANKS threads of this process, in-process transport
//   collective_bench --job [options]    one rank of a real job: joins from the environment
//                                       (qcoll-run, torchrun, mpirun, benchmarks/netlab) over
//                                       the shm or tcp transport the environment selects
//
// Both modes run the same per-rank code (run_rank, over any communicator). Per size, as
// the peers: allocate and fault in the buffers, barrier, warm-up iterations, then timed
// ones. An iteration resets the buffer from a pristine copy (not timed), enters a
// barrier, times one in-place call and checks every element (not timed). The slowest
// rank's time of each iteration comes from an allreduce(max) over the communicator
// after the loop (not timed); time = median of those, tmin = their minimum. Warm-up
// times cap the iteration count at about -T seconds per size. Rank r holds
// (r + 1)·((i mod 1021) + 1), so every sum is an exact small integer checked with ==.
//
// Only rank 0 prints. Exit status: 0, 1 if any element was wrong, 2 on errors.

#include "bench_args.hpp"
#include "bench_table.hpp"

#include <qcoll/communicator.hpp>
#include <qcoll/rendezvous/join.hpp>
#include <qcoll/transports/inproc.hpp>
#include <qcoll/version.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

using bench::collective_options;
using bench::operation;

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

float pattern(std::size_t i, qcoll::rank_t rank) {
  return static_cast<float>((rank + 1) * static_cast<std::size_t>((i % 1021) + 1));
}

/// Page-aligned and faulted in before anything is timed, as the peers' buffers.
struct aligned_floats {
  explicit aligned_floats(std::size_t count) : count_(count) {
    const std::size_t bytes = std::max<std::size_t>((count * sizeof(float) + 4095) / 4096 * 4096, 4096);
    data_.reset(static_cast<float*>(std::aligned_alloc(4096, bytes)));
    if (!data_) throw std::bad_alloc();
    std::memset(data_.get(), 0, bytes);
  }
  std::span<float> span() const noexcept { return {data_.get(), count_}; }

 private:
  struct free_deleter {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<float[], free_deleter> data_;
  std::size_t count_;
};

/// What a job's environment says about a shaped link (benchmarks/netlab sets these).
struct link_info {
  double bits_per_s = 0;  // 0: not a shaped link
  std::string delay;
};

link_info link_from_environment() {
  link_info link;
  if (const char* rate = std::getenv("QCOLL_NETLAB_RATE"); rate && *rate) link.bits_per_s = std::strtod(rate, nullptr);
  if (const char* delay = std::getenv("QCOLL_NETLAB_DELAY"); delay) link.delay = delay;
  return link;
}

struct run_context {
  std::string transport;  // "inproc", "shm" or "tcp"
  std::string knobs;      // non-default transport settings, for the header
  link_info link;
};

void print_preamble(const collective_options& o, qcoll::rank_t n, const run_context& ctx, bool link_column) {
  fmt::print("# collective_bench (qcoll {}.{}.{}): exact {}, {}\n", qcoll::version_major, qcoll::version_minor,
             qcoll::version_patch, o.op_name,
             o.job ? fmt::format("{} ranks as processes over the {} transport", n, ctx.transport)
                   : fmt::format("{} ranks as threads of one process over the in-process transport", n));
  fmt::print("# host: {}\n", bench::host_line());
  fmt::print("# nranks: {}  op: sum  type: float32  in-place  transport: {}{}{}\n", n, ctx.transport,
             o.label.empty() ? "" : "  label: ", o.label);
  fmt::print("# time = median over iters of max-over-ranks per-iteration time (barrier before each iteration)\n");
  if (!ctx.knobs.empty()) fmt::print("# transport settings: {}\n", ctx.knobs);
  if (ctx.link.bits_per_s > 0)
    fmt::print("# link: {:.0f} bit/s, delay {}{}\n", ctx.link.bits_per_s, ctx.link.delay.empty() ? "?" : ctx.link.delay,
               link_column ? "  (link% = busbw / (rate / 8))" : "");
  std::fflush(stdout);
}

/// The whole sweep on one rank: the single timing loop both modes share.
/// Returns true when every element of every iteration was right (on every rank).
template <class Communicator>
bool run_rank(Communicator& comm, const collective_options& o, const run_context& ctx) {
  const qcoll::rank_t n = comm.size(), me = comm.rank();
  const bool link_column = o.link_column != 0 && ctx.link.bits_per_s > 0;
  std::unique_ptr<bench::table> table;
  if (me == 0) {
    print_preamble(o, n, ctx, link_column);
    table = std::make_unique<bench::table>(fmt::format("qcoll {} {}", o.op_name, ctx.transport), n, o.op,
                                           link_column ? ctx.link.bits_per_s / 8.0 : 0.0);
  }
  bool all_right = true;
  for (const std::size_t bytes : bench::sweep_sizes(o)) {
    const std::size_t count = bytes / sizeof(float);
    const qcoll::block_range mine = qcoll::block_of(count, n, me);
    aligned_floats buffer(count), pristine_buffer(count);
    const std::span<float> data = buffer.span(), pristine = pristine_buffer.span();
    // all_gather starts with only this rank's block filled, so the check sees what arrived.
    for (std::size_t i = 0; i < count; ++i)
      pristine[i] = o.op != operation::all_gather || (i >= mine.offset && i < mine.offset + mine.size) ? pattern(i, me)
                                                                                                      : -1.0f;
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);

    double wrong = 0;
    const auto one_iteration = [&]() -> double {
      std::memcpy(data.data(), pristine.data(), bytes);
      comm.barrier();
      const double start = now_us();
      switch (o.op) {
        case operation::allreduce: comm.allreduce(data, qcoll::reduce_op::sum); break;
        case operation::reduce_scatter:
          comm.reduce_scatter(std::span<const float>(data), mine.of(data), qcoll::reduce_op::sum);
          break;
        case operation::all_gather: comm.all_gather(std::span<const float>(mine.of(data)), data); break;
      }
      const double took = now_us() - start;
      if (!o.check) return took;
      std::size_t bad = 0;
      switch (o.op) {
        case operation::allreduce:
          for (std::size_t i = 0; i < count; ++i) bad += data[i] != ranks_sum * pattern(i, 0);
          break;
        case operation::reduce_scatter:
          for (std::size_t i = mine.offset; i < mine.offset + mine.size; ++i) bad += data[i] != ranks_sum * pattern(i, 0);
          break;
        case operation::all_gather:
          for (qcoll::rank_t owner = 0; owner < n; ++owner) {
            const qcoll::block_range b = qcoll::block_of(count, n, owner);
            for (std::size_t i = b.offset; i < b.offset + b.size; ++i) bad += data[i] != pattern(i, owner);
          }
          break;
      }
      wrong += static_cast<double>(bad);
      return took;
    };

    const int most = bench::iterations_for(bytes, o);
    std::vector<double> warmup(static_cast<std::size_t>(bench::warmup_for(most, o)));
    comm.barrier();
    for (double& t : warmup) t = one_iteration();
    if (!warmup.empty()) comm.allreduce(std::span<double>(warmup), qcoll::reduce_op::max);
    const int iterations = bench::capped_iterations(most, warmup, o);
    // Times of the timed iterations, then the wrong count: one allreduce(max) gives
    // every iteration's slowest rank and the worst rank's count.
    std::vector<double> stats(static_cast<std::size_t>(iterations) + 1, 0.0);
    for (int it = 0; it < iterations; ++it) stats[static_cast<std::size_t>(it)] = one_iteration();
    stats.back() = wrong;
    comm.allreduce(std::span<double>(stats), qcoll::reduce_op::max);
    all_right = all_right && stats.back() == 0;
    if (table) table->row(bytes, std::vector<double>(stats.begin(), stats.end() - 1), stats.back());
  }
  if (table) table->finish();
  return all_right;
}

/// run_rank with the failure of one rank made every rank's: the communicator is aborted,
/// so the others fail at once instead of waiting out their timeout.
template <class Communicator>
bool run_rank_or_abort(Communicator& comm, const collective_options& o, const run_context& ctx) {
  try {
    return run_rank(comm, o, ctx);
  } catch (const std::exception& e) {
    if (!comm.aborted()) comm.abort(e.what());
    throw;
  }
}

int run_threads(const collective_options& o) {
  const auto n = static_cast<qcoll::rank_t>(o.threads);
  const run_context ctx{"inproc", {}, {}};
  std::vector<char> right(n, 0);
  const auto errors = qcoll::transports::inproc::run_ranks(n, [&](auto transport) {
    qcoll::communicator comm(std::move(transport));
    right[comm.rank()] = run_rank_or_abort(comm, o, ctx);
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return std::all_of(right.begin(), right.end(), [](char r) { return r != 0; }) ? 0 : 1;
}

int run_job(const collective_options& o) {
  const qcoll::rendezvous::job job = qcoll::rendezvous::job_from_environment();
  qcoll::rendezvous::join_options join;
  std::string knobs;
  if (o.spin_us >= 0) {
    join.shm.engine.spin = join.tcp.engine.spin = std::chrono::microseconds(o.spin_us);
    knobs += fmt::format(" spin {} us", o.spin_us);
  }
  if (o.shm_pipe_bytes > 0) {
    join.shm.pipe_bytes = o.shm_pipe_bytes;
    knobs += fmt::format(" shm pipe {} B", o.shm_pipe_bytes);
  }
  if (o.tcp_buffer_bytes > 0) {
    join.tcp.socket_buffer_bytes = o.tcp_buffer_bytes;
    knobs += fmt::format(" tcp socket buffers {} B", o.tcp_buffer_bytes);
  }
  const run_context ctx{std::string(qcoll::rendezvous::to_string(qcoll::rendezvous::resolve_transport(job))),
                        knobs.empty() ? knobs : knobs.substr(1), link_from_environment()};
  if (o.link_column == 1 && ctx.link.bits_per_s <= 0)
    throw std::invalid_argument("-L 1 needs QCOLL_NETLAB_RATE (the link rate in bit/s)");
  const bool right = qcoll::rendezvous::join(
      job,
      [&](auto transport) {
        qcoll::communicator comm(std::move(transport), qcoll::communicator_options{job.timeout});
        return run_rank_or_abort(comm, o, ctx);
      },
      join);
  return right ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    std::fwrite(bench::collective_usage.data(), 1, bench::collective_usage.size(), stdout);
    return 0;
  }
  collective_options o;
  try {
    o = bench::parse_collective_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench: %s\n%.*s", e.what(), static_cast<int>(bench::collective_usage.size()),
                 bench::collective_usage.data());
    return 2;
  }
  try {
    return o.job ? run_job(o) : run_threads(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench: %s\n", e.what());
    return 2;
  }
}
