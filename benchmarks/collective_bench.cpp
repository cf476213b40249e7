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
// barrier, times one in-place call and checks every element (not timed); --post-barrier
// adds a barrier before the reset (a diagnostic, as the peers' Gloo bench). The slowest
// rank's time of each iteration comes from an allreduce(max) over the communicator
// after the loop (not timed); time = median of those, tmin = their minimum. Warm-up
// times cap the iteration count at about -T seconds per size. Rank r holds
// (r + 1)·((i mod 1021) + 1), so every sum is an exact small integer checked with ==.
// -R 1 takes the data buffer from communicator::allocate (shared buffers over shm).
// -d half|bfloat16 runs the exact table over 16-bit elements: rank r holds
// (r + 1)·((i mod 8) + 1) and the check is the exact sum rounded once to the type.
//
// --compressed LIST adds compressed allreduce variants (qcoll::compressed_allreduce_plan
// over a quantizer) to an allreduce sweep: per size, the exact allreduce runs first and
// then every variant (at every --chunk), by the same loop, into one table whose rows
// compare each variant with that exact row (bench::compressed_table). A variant's plan
// is made once per size, outside the loop, and reused by every iteration, warm-ups
// included, so its error-feedback residuals carry over from call to call as in
// training. Lossy variants cannot be checked with ==: each rank hashes its result, and
// the check is that every rank holds the same bits; relerr says how far they are from
// the exact sum. --grid EXTENTS (e.g. 4x4) runs every variant once more as a
// grid_allreduce_plan on a healthy torus of those extents (rows "grid:…"). --layers N
// cuts each size into N layers (sizes in proportion 1, 2, …, 7, 1, 2, …) and runs
// every variant as one fused plan over them, one call (rows "fused:…"), and as N
// plans, one blocking call each, layer after layer (rows "layers:…"). --two-level K
// runs identity (the exact two-level allreduce) and every variant once more as a
// two_level_allreduce over nodes of K consecutive ranks split from the job, both
// exchanges (rows "2lvl:…", shards, and "2lead:…", leaders; chunk column NxK).
// --reproducible 1 adds a row of qcoll::reproducible_allreduce after the exact one, and
// runs every --compressed variant once more with its owners summing on the shared grid
// (compressed_allreduce_options::reproducible; rows "repro:…").
//
// --device cuda|emulated runs the same tables on device buffers (docs/gpu.md): the
// exact table with the collectives' device_stream forms, and --compressed variants as
// plans on device memory; the buffer is reset by a copy from the host and checked
// after a copy back (neither timed). With --compressed, per size, a row "host+copies"
// times what a user without device collectives would do — copy to pinned host memory,
// the host allreduce, copy back — and after each variant's row a "# split" line says
// where rank 0's calls waited (plan.last_call(): for the device's encodes and copies
// before sends, for the transport, for the last decodes), medians over the timed
// iterations. --device emulated measures the emulation (a CPU), not a GPU.
//
// collective_bench_mpi, the same program built with QCOLL_BENCH_MPI against an MPI,
// runs `mpirun -np N collective_bench_mpi --job [options]` over the MPI transport
// (transports/mpi.hpp) instead of joining from the environment.
//
// Only rank 0 prints. Exit status: 0, 1 if any element was wrong, 2 on errors.

#include "bench_args.hpp"
#include "bench_table.hpp"

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/reproducible.hpp>
#include <qcoll/two_level_allreduce.hpp>
#ifndef QCOLL_BENCH_MPI
#include <qcoll/device/emulated/runtime.hpp>  // --device emulated (not in the MPI builds, which have no --device)
#include <qcoll/transports/cuda_peer.hpp>
#include <qcoll/transports/reference.hpp>
#endif
#include <qcoll/grid_allreduce.hpp>
#include <qcoll/topologies/router.hpp>
#include <qcoll/quantizers/by_name.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/launch/join_nodes.hpp>
#include <qcoll/transports/inproc.hpp>
#ifdef QCOLL_BENCH_MPI
#include <qcoll/transports/mpi.hpp>
#endif
#include <qcoll/version.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
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

/// The value the exact table's rank `rank` holds at i, for element type T. 16-bit
/// types take (rank + 1)·((i mod 8) + 1), whose sums stay small integers.
template <class T>
float pattern_of(std::size_t i, qcoll::rank_t rank) {
  if constexpr (qcoll::half_element<T>) return static_cast<float>((rank + 1) * ((i % 8) + 1));
  else return pattern(i, rank);
}

/// A float as T, rounded once (to nearest even for the 16-bit types).
template <class T>
T as_element(float value) {
  return static_cast<T>(value);
}

/// Page-aligned and faulted in before anything is timed, as the peers' buffers.
template <class T>
struct aligned_buffer {
  explicit aligned_buffer(std::size_t count) : count_(count) {
    const std::size_t bytes = std::max<std::size_t>((count * sizeof(T) + 4095) / 4096 * 4096, 4096);
    data_.reset(static_cast<T*>(std::aligned_alloc(4096, bytes)));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_.get()), 0, bytes);
  }
  std::span<T> span() const noexcept { return {data_.get(), count_}; }

 private:
  struct free_deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T[], free_deleter> data_;
  std::size_t count_;
};
using aligned_floats = aligned_buffer<float>;

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

/// A --compressed variant, with its quantizer made (and validated) before any rank runs.
struct variant_spec {
  bench::compressed_variant variant;
  qcoll::quantizers::any_quantizer quantizer;
  std::string description;  // for the header
};

variant_spec make_variant(const bench::compressed_variant& v) {
  return qcoll::quantizers::with_quantizer(v.spec, [&](const auto& quantizer) {
    std::string description = fmt::format("{}, {} bits per value", quantizer.name, quantizer.bits_per_value());
    if (quantizer.group_size() != 0) description += fmt::format(", {} values per group", quantizer.group_size());
    return variant_spec{v, quantizer, std::move(description)};
  });
}

struct run_context {
  std::string transport;  // "inproc", "shm" or "tcp"
  std::string knobs;      // non-default transport settings, for the header
  link_info link;
  std::vector<variant_spec> variants;  // --compressed
  // --cuda-peer: the exact allreduce, in place on device memory, over the CUDA peer transport.
  std::function<void(qcoll::execution::device_stream, std::span<float>)> peer_allreduce;
};

void print_preamble(const collective_options& o, qcoll::rank_t n, const run_context& ctx, bool link_column) {
  std::string what = "exact " + o.op_name;
  if (!ctx.variants.empty()) {
    what += " and compressed";
    for (const variant_spec& v : ctx.variants) what += (&v == &ctx.variants.front() ? " " : ",") + v.variant.name;
  }
  fmt::print("# collective_bench (qcoll {}.{}.{}): {}, {}\n", qcoll::version_major, qcoll::version_minor,
             qcoll::version_patch, what,
             o.job ? fmt::format("{} ranks as processes over the {} transport", n, ctx.transport)
                   : fmt::format("{} ranks as threads of one process over the in-process transport", n));
  fmt::print("# host: {}\n", bench::host_line());
  if (!o.device.empty())
    fmt::print("# buffers on the {} device (--device {}): reset by a copy from the host and checked after one back, "
               "neither timed\n", qcoll::execution::device_runtime("collective_bench").name, o.device);
  const std::string type = o.dtype_name == "float" ? "float32" : o.dtype_name == "half" ? "float16" : "bfloat16";
  fmt::print("# nranks: {}  op: sum  type: {}  in-place  transport: {}{}{}\n", n, type, ctx.transport,
             o.label.empty() ? "" : "  label: ", o.label);
  fmt::print("# time = median over iters of max-over-ranks per-iteration time (barrier before each iteration{})\n",
             o.post_barrier ? "; --post-barrier: and before each reset" : "");
  if (!ctx.knobs.empty()) fmt::print("# transport settings: {}\n", ctx.knobs);
  for (const variant_spec& v : ctx.variants) fmt::print("# variant {}: {}\n", v.variant.name, v.description);
  if (!ctx.variants.empty()) {
    fmt::print("# compressed: one plan per size and variant, made before the loop and reused; its residuals\n"
               "#   carry over from call to call (warm-ups included); every rank starts from the same data each iteration\n");
    fmt::print("# wire(B) = payload bytes rank 0 sent per call (plan.last_call()); exact: 2(n-1)/n*size\n");
    fmt::print("# algbw = uncompressed size / time; bw/ex = algbw / the exact row's algbw (same run, same size)\n");
    fmt::print("# #wrong: exact, identity: wrong elements; lossy: iterations whose result differed between ranks\n"
               "#   (hash of the result) + non-finite elements; relerr = max over iterations of\n"
               "#   max|result - exact sum| / max|exact sum|\n");
  }
  if (ctx.link.bits_per_s > 0)
    fmt::print("# link: {:.0f} bit/s, delay {}{}\n", ctx.link.bits_per_s, ctx.link.delay.empty() ? "?" : ctx.link.delay,
               link_column ? "  (link% = busbw / (rate / 8))" : "");
  std::fflush(stdout);
}

/// Whether this build has --device: the MPI builds leave the device forms out, which
/// halves what they add to the build (g++ builds this file three times in CI).
#ifdef QCOLL_BENCH_MPI
inline constexpr bool device_built = false;
#else
inline constexpr bool device_built = true;
#endif

/// Where a rank's buffer lives: host memory, or (--device) device memory with a stream
/// of its own that the calls are ordered on. The host buffer is then where results are
/// copied back to be checked.
template <class T>
struct device_side {
  device_side(const collective_options& o, std::size_t count)
      : on(device_built && !o.device.empty()), memory(on ? count : 0),
        stream(on ? qcoll::execution::device_stream_owner("collective_bench") : qcoll::execution::device_stream_owner()) {}
  qcoll::execution::device_stream where() const noexcept { return {stream.get()}; }
  std::span<T> span() const noexcept { return memory.span(); }

  bool on;
  qcoll::execution::device_memory<T> memory;
  qcoll::execution::device_stream_owner stream;
};

/// The untimed start of an iteration: reset the buffer from its pristine copy (on the
/// device too, --device) and enter the barrier that starts the timed call.
/// --post-barrier first waits for every rank to have left the previous call, so no
/// rank's reset (nor the check before it) overlaps another rank's call.
template <class Communicator, class T>
void reset_and_enter(Communicator& comm, const collective_options& o, std::span<T> data, std::span<const T> pristine,
                     const device_side<T>* device = nullptr) {
  if (o.post_barrier) comm.barrier();
  if (device && device->on) device->memory.upload(pristine);
  else std::memcpy(static_cast<void*>(data.data()), pristine.data(), data.size_bytes());
  comm.barrier();
}

/// After a timed call on device memory: its result copied back into `data`, to be checked.
template <class T>
void result_to_host(const device_side<T>& device, std::span<T> data) {
  if (device.on) device.memory.download(data);
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2), values.end());
  return values[values.size() / 2];
}

struct measured {
  std::vector<double> times_us;  // every timed iteration's slowest-rank time
  std::vector<double> summary;   // the caller's summary, max over ranks
};

/// The single timing loop: warm-ups, then timed iterations, of `one_iteration` (which
/// resets, enters a barrier, times one call and checks). After it, one allreduce(max)
/// gives every iteration's slowest rank and the maximum over ranks of `summary()`
/// (the checks' findings, as doubles).
template <class Communicator, class Iteration, class Summary>
measured timed_iterations(Communicator& comm, const collective_options& o, std::size_t bytes,
                          Iteration& one_iteration, Summary&& summary) {
  const int most = bench::iterations_for(bytes, o);
  std::vector<double> warmup(static_cast<std::size_t>(bench::warmup_for(most, o)));
  comm.barrier();
  for (double& t : warmup) t = one_iteration();
  if (!warmup.empty()) comm.allreduce(std::span<double>(warmup), qcoll::reduce_op::max);
  const auto iterations = static_cast<std::size_t>(bench::capped_iterations(most, warmup, o));
  std::vector<double> stats(iterations, 0.0);
  for (double& t : stats) t = one_iteration();
  const std::vector<double> tail = summary();
  stats.insert(stats.end(), tail.begin(), tail.end());
  comm.allreduce(std::span<double>(stats), qcoll::reduce_op::max);
  return {std::vector<double>(stats.begin(), stats.begin() + static_cast<std::ptrdiff_t>(iterations)),
          std::vector<double>(stats.begin() + static_cast<std::ptrdiff_t>(iterations), stats.end())};
}

/// What one check of an allreduce result against the exact sum found.
struct result_check {
  std::size_t wrong = 0;       // elements != the exact sum
  std::size_t non_finite = 0;  // NaN or infinite elements
  double relerr = 0;           // max |result − exact| / max |exact|
  std::uint64_t hash = 0;      // of the result's bits, to compare across ranks
};

result_check check_allreduce(std::span<const float> data, qcoll::rank_t n) {
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  result_check c;
  double max_error = 0, max_exact = 0;
  std::uint64_t hash = 0xcbf29ce484222325u;  // FNV-1a over 32-bit words
  for (std::size_t i = 0; i < data.size(); ++i) {
    const float exact = ranks_sum * pattern(i, 0);
    c.wrong += data[i] != exact;
    c.non_finite += !std::isfinite(data[i]);
    max_error = std::max(max_error, std::abs(static_cast<double>(data[i]) - exact));
    max_exact = std::max(max_exact, std::abs(static_cast<double>(exact)));
    hash = (hash ^ std::bit_cast<std::uint32_t>(data[i])) * 0x100000001b3u;
  }
  c.relerr = max_exact > 0 ? max_error / max_exact : 0.0;
  c.hash = hash;
  return c;
}

/// The findings of every check of one table row, reduced over ranks by one allreduce(max):
/// counts, the worst relerr, and each iteration's hash as 32-bit halves (exact in a
/// double) and their negations, so the maximum gives both the largest and the smallest
/// hash of each iteration.
struct check_tally {
  double wrong = 0, non_finite = 0, relerr = 0;
  std::vector<std::uint64_t> hashes;

  void add(const result_check& c) {
    wrong += static_cast<double>(c.wrong);
    non_finite += static_cast<double>(c.non_finite);
    relerr = std::max(relerr, c.relerr);
    hashes.push_back(c.hash);
  }
  std::vector<double> summary() const {
    std::vector<double> s{wrong, non_finite, relerr};
    for (const std::uint64_t h : hashes)
      for (const std::uint64_t half : {h >> 32, h & 0xffffffffu}) {
        s.push_back(static_cast<double>(half));
        s.push_back(-static_cast<double>(half));
      }
    return s;
  }
  /// Iterations whose hash was not the same on every rank, from a reduced summary().
  static double differing_iterations(const std::vector<double>& reduced) {
    double differing = 0;
    for (std::size_t i = 3; i + 3 < reduced.size(); i += 4)
      differing += reduced[i] != -reduced[i + 1] || reduced[i + 2] != -reduced[i + 3];
    return differing;
  }
};

/// "256K", "1M" or the plain number of values.
std::string values_text(std::size_t values) {
  if (values >= (std::size_t{1} << 20) && values % (std::size_t{1} << 20) == 0)
    return fmt::format("{}M", values >> 20);
  if (values >= 1024 && values % 1024 == 0) return fmt::format("{}K", values >> 10);
  return std::to_string(values);
}

std::string grid_text(const std::vector<std::size_t>& extents) {
  std::string text;
  for (std::size_t e : extents) text += (text.empty() ? "" : "x") + std::to_string(e);
  return text;
}

/// `count` values cut into `layers` layers of sizes in proportion 1, 2, …, 7, 1, 2, …
/// (the last takes what rounding leaves).
std::vector<std::size_t> layer_sizes(std::size_t count, std::size_t layers) {
  std::size_t weights = 0;
  for (std::size_t k = 0; k < layers; ++k) weights += 1 + k % 7;
  std::vector<std::size_t> sizes;
  std::size_t given = 0;
  for (std::size_t k = 0; k + 1 < layers; ++k) {
    sizes.push_back(count * (1 + k % 7) / weights);
    given += sizes.back();
  }
  sizes.push_back(count - given);
  return sizes;
}

/// The --compressed sweep on one rank: per size, the exact allreduce, then every
/// variant at every chunk size, each by timed_iterations.
template <class Communicator>
bool run_rank_compressed(Communicator& comm, const collective_options& o, const run_context& ctx,
                         Communicator* joined_node) {
  const qcoll::rank_t n = comm.size(), me = comm.rank();
  const bool link_column = o.link_column != 0 && ctx.link.bits_per_s > 0;
  std::unique_ptr<bench::compressed_table> table;
  if (me == 0) {
    print_preamble(o, n, ctx, link_column);
    table = std::make_unique<bench::compressed_table>(fmt::format("qcoll {} compressed {}", o.op_name, ctx.transport),
                                                      n, link_column ? ctx.link.bits_per_s / 8.0 : 0.0);
  }
  const std::vector<std::size_t> chunks =
      o.chunk_values.empty() ? std::vector<std::size_t>{qcoll::compressed_allreduce_options{}.chunk_values}
                             : o.chunk_values;
  // --two-level: nodes of K consecutive ranks: joined as such (a job with K ranks per
  // host: shm inside the node), or split from the job once for the whole sweep.
  std::optional<Communicator> split_node;
  Communicator* node = joined_node;
  if (o.two_level != 0 && !node) {
    if (n % o.two_level != 0)
      throw std::invalid_argument(fmt::format("--two-level {}: {} ranks are not nodes of {}", o.two_level, n, o.two_level));
    split_node = comm.split(static_cast<std::int64_t>(me / o.two_level), static_cast<std::int64_t>(me));
    node = &*split_node;
  }
  bool all_right = true;
  for (const std::size_t bytes : bench::sweep_sizes(o)) {
    const std::size_t count = bytes / sizeof(float);
    aligned_floats buffer(count), pristine_buffer(count);
    const std::span<float> data = buffer.span(), pristine = pristine_buffer.span();
    for (std::size_t i = 0; i < count; ++i) pristine[i] = pattern(i, me);
    const device_side<float> device(o, count);

    // One row: `call` is the allreduce (in place on `data`, or on the device's copy);
    // exact results (exact, identity) are checked element by element, lossy ones
    // across ranks. `after` runs after each timed call (not timed).
    const auto measure = [&](auto&& call, bool lossy, auto&& after) {
      check_tally tally;
      const auto one_iteration = [&]() -> double {
        reset_and_enter(comm, o, data, std::span<const float>(pristine), &device);
        const double start = now_us();
        call();
        const double took = now_us() - start;
        after();
        result_to_host(device, data);
        if (o.check) tally.add(check_allreduce(data, n));
        return took;
      };
      const measured m = timed_iterations(comm, o, bytes, one_iteration, [&] { return tally.summary(); });
      bench::compressed_table::row_data row;
      row.times_us = m.times_us;
      row.wrong = lossy ? check_tally::differing_iterations(m.summary) + m.summary[1] : m.summary[0];
      row.relerr = o.check ? m.summary[2] : -1.0;
      all_right = all_right && row.wrong == 0;
      return row;
    };

    const auto nothing = [] {};
    bench::compressed_table::row_data exact = measure(
        [&] {
          if constexpr (device_built)
            if (device.on) return comm.allreduce(device.where(), device.span(), qcoll::reduce_op::sum);
          comm.allreduce(data, qcoll::reduce_op::sum);
        },
        false, nothing);
    exact.variant = "exact";
    exact.chunk = "-";
    if (table) table->exact_row(bytes, std::move(exact));
    if (o.reproducible) {
      // The reproducible sum: a max round over the blocks' exponents, then the integers
      // on the grid as doubles (reduce-scattered, and the values gathered, from 256 KiB of
      // them); exact here, so checked as exact.
      bench::compressed_table::row_data row = measure(
          [&] {
            if constexpr (device_built)
              if (device.on)
                return qcoll::reproducible_allreduce(comm, device.where(), device.span(), qcoll::reduce_op::sum);
            qcoll::reproducible_allreduce(comm, data, qcoll::reduce_op::sum);
          },
          false, nothing);
      row.variant = "reproducible";
      row.chunk = "-";
      row.wire_bytes = qcoll::detail::reproducible::wire_bytes<float>(count, n);
      if (table) table->compressed_row(bytes, row);
    }
    if (device_built && device.on) {
      // What a user without device collectives would do: copy to pinned host memory,
      // reduce there, copy back; the baseline of the device allreduce.
      const qcoll::execution::pinned_memory<float> staged(count);
      const auto& runtime = qcoll::execution::device_runtime("collective_bench");
      bench::compressed_table::row_data host = measure(
          [&] {
            const std::size_t size = count * sizeof(float);
            qcoll::execution::check_device(runtime, runtime.copy(staged.data(), device.span().data(), size, device.stream.get()), "copy");
            qcoll::execution::check_device(runtime, runtime.synchronize(device.stream.get()), "copy");
            comm.allreduce(staged.span(), qcoll::reduce_op::sum);
            qcoll::execution::check_device(runtime, runtime.copy(device.span().data(), staged.data(), size, device.stream.get()), "copy");
            qcoll::execution::check_device(runtime, runtime.synchronize(device.stream.get()), "copy");
          },
          false, nothing);
      host.variant = "host+copies";
      host.chunk = "-";
      host.wire_bytes = 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * static_cast<double>(bytes);
      if (table) table->compressed_row(bytes, host);
      if (ctx.peer_allreduce) {
        // The same allreduce GPU to GPU over cuda_peer, then the ceiling it is held to: a
        // device-to-device copy of the size (rank 0's, as many times as the rows iterate).
        bench::compressed_table::row_data peer =
            measure([&] { ctx.peer_allreduce(device.where(), device.span()); }, false, nothing);
        peer.variant = "cuda_peer";
        peer.chunk = "-";
        peer.wire_bytes = host.wire_bytes;
        if (table) table->compressed_row(bytes, peer);
        const qcoll::execution::device_memory<float> target(count);
        bench::compressed_table::row_data copy;
        for (std::size_t k = 0; k < std::max<std::size_t>(peer.times_us.size(), 1); ++k) {
          const double start = now_us();
          qcoll::execution::check_device(runtime, runtime.copy(target.data(), device.span().data(), count * sizeof(float),
                                                               device.stream.get()), "copy");
          qcoll::execution::check_device(runtime, runtime.synchronize(device.stream.get()), "copy");
          copy.times_us.push_back(now_us() - start);
        }
        copy.variant = "d2d copy";
        copy.chunk = "-";
        if (table) table->compressed_row(bytes, copy);
      }
    }

    for (const bool on_grid : {false, true}) {
      if (on_grid && !o.reproducible) break;  // the repro: rows only with --reproducible 1
      for (const variant_spec& v : ctx.variants)
        for (const std::size_t chunk : chunks)
          std::visit(
              [&](const auto& quantizer) {
                using Q = std::decay_t<decltype(quantizer)>;
                qcoll::compressed_allreduce_options options;
                options.chunk_values = chunk == collective_options::whole_stripe ? count : chunk;
                options.reproducible = on_grid;
                const std::string name = (on_grid ? "repro:" : "") + v.variant.name;
                if constexpr (device_built) {
                  if (device.on) {
                    qcoll::compressed_allreduce_plan<Q, float, qcoll::execution::device_space> plan(
                        device.where(), comm, count, quantizer, options);
                    std::vector<double> device_wait, transport_wait, device_tail;
                    const auto record = [&] {
                      const qcoll::call_statistics& s = plan.last_call();
                      device_wait.push_back(std::chrono::duration<double, std::micro>(s.device_wait).count());
                      transport_wait.push_back(std::chrono::duration<double, std::micro>(s.transport_wait).count());
                      device_tail.push_back(std::chrono::duration<double, std::micro>(s.device_tail).count());
                    };
                    bench::compressed_table::row_data row = measure(
                        [&] { comm.allreduce(device.where(), plan, device.span(), qcoll::reduce_op::sum); },
                        v.variant.lossy(), record);
                    row.variant = name;
                    row.chunk = chunk == collective_options::whole_stripe ? "whole" : values_text(plan.chunk_values());
                    row.wire_bytes = static_cast<double>(plan.last_call().bytes_sent);
                    if (table) {
                      table->compressed_row(bytes, row);
                      fmt::print("# split {} {}: waited for the device's encodes and copies {:.1f} us, for the transport "
                                 "{:.1f} us, for the last decodes {:.1f} us (rank 0, medians)\n",
                                 bytes, name, median_of(device_wait), median_of(transport_wait),
                                 median_of(device_tail));
                    }
                    return;
                  }
                }
                qcoll::compressed_allreduce_plan<Q> plan(comm, count, quantizer, options);
                bench::compressed_table::row_data row =
                    measure([&] { comm.allreduce(plan, data, qcoll::reduce_op::sum); }, v.variant.lossy(), nothing);
                if (plan.last_call().bytes_sent != plan.bytes_sent_per_call())
                  std::fprintf(stderr, "collective_bench: rank %zu, %s: sent %zu bytes, bytes_sent_per_call() says %zu\n",
                               me, name.c_str(), plan.last_call().bytes_sent, plan.bytes_sent_per_call());
                row.variant = name;
                row.chunk = chunk == collective_options::whole_stripe ? "whole" : values_text(plan.chunk_values());
                row.wire_bytes = static_cast<double>(plan.last_call().bytes_sent);
                if (table) table->compressed_row(bytes, row);
              },
              v.quantizer);
    }

    // --layers: the same variants over N layers, fused into one call and one by one.
    if (o.layers != 0) {
      const std::vector<std::size_t> sizes = layer_sizes(count, o.layers);
      std::vector<std::span<float>> layers;
      for (std::size_t k = 0, at = 0; k < sizes.size(); at += sizes[k++]) layers.push_back(data.subspan(at, sizes[k]));
      for (const variant_spec& v : ctx.variants)
        std::visit(
            [&](const auto& quantizer) {
              using Q = std::decay_t<decltype(quantizer)>;
              qcoll::compressed_allreduce_plan<Q> fused(comm, std::span<const std::size_t>(sizes), quantizer);
              bench::compressed_table::row_data row = measure(
                  [&] { comm.allreduce(fused, std::span<const std::span<float>>(layers), qcoll::reduce_op::sum); },
                  v.variant.lossy(), nothing);
              row.variant = "fused:" + v.variant.name;
              row.chunk = fmt::format("{}L", layers.size());
              row.wire_bytes = static_cast<double>(fused.last_call().bytes_sent);
              if (table) table->compressed_row(bytes, row);

              std::vector<qcoll::compressed_allreduce_plan<Q>> plans;
              for (const std::size_t size : sizes) plans.emplace_back(comm, size, quantizer);
              row = measure(
                  [&] {
                    for (std::size_t k = 0; k < plans.size(); ++k) comm.allreduce(plans[k], layers[k], qcoll::reduce_op::sum);
                  },
                  v.variant.lossy(), nothing);
              row.variant = "layers:" + v.variant.name;
              row.chunk = fmt::format("{}L", layers.size());
              row.wire_bytes = 0;
              for (const auto& p : plans) row.wire_bytes += static_cast<double>(p.last_call().bytes_sent);
              if (table) table->compressed_row(bytes, row);
            },
            v.quantizer);
    }

    // --grid: the same variants through the grid allreduce on a healthy torus.
    if (!o.grid_extents.empty()) {
      const qcoll::topologies::grid_routing routing =
          qcoll::topologies::route_grid(qcoll::topologies::torus(o.grid_extents));
      for (const variant_spec& v : ctx.variants)
        std::visit(
            [&](const auto& quantizer) {
              using Q = std::decay_t<decltype(quantizer)>;
              qcoll::grid_allreduce_plan<Q> plan(comm, routing, count, quantizer);
              bench::compressed_table::row_data row =
                  measure([&] { comm.allreduce(plan, data, qcoll::reduce_op::sum); }, v.variant.lossy(), nothing);
              row.variant = "grid:" + v.variant.name;
              row.chunk = grid_text(o.grid_extents);
              row.wire_bytes = static_cast<double>(plan.last_call().bytes_sent);
              if (table) table->compressed_row(bytes, row);
            },
            v.quantizer);
    }

    // --two-level: the exact two-level allreduce, then every variant, both exchanges.
    if (node) {
      std::vector<variant_spec> two_level_variants{make_variant(bench::parse_compressed_variant("identity"))};
      for (const variant_spec& v : ctx.variants)
        if (!std::holds_alternative<qcoll::quantizers::identity<float>>(v.quantizer)) two_level_variants.push_back(v);
      for (const qcoll::two_level_exchange exchange : {qcoll::two_level_exchange::shards, qcoll::two_level_exchange::leaders})
        for (const variant_spec& v : two_level_variants)
          std::visit(
              [&](const auto& quantizer) {
                qcoll::two_level_options options{.exchange = exchange};
                options.compressed.chunk_values = chunks.front() == collective_options::whole_stripe ? count : chunks.front();
                qcoll::two_level_allreduce bucket(*node, comm, count, quantizer, options);
                bench::compressed_table::row_data row =
                    measure([&] { bucket.allreduce(data, qcoll::reduce_op::sum); }, v.variant.lossy(), nothing);
                row.variant = (exchange == qcoll::two_level_exchange::shards ? "2lvl:" : "2lead:") + v.variant.name;
                row.chunk = fmt::format("{}x{}", bucket.layout().nodes, bucket.layout().ranks_per_node);
                row.wire_bytes = static_cast<double>(bucket.last_call().bytes_sent);
                if (table) table->compressed_row(bytes, row);
              },
              v.quantizer);
    }
  }
  if (table) table->finish();
  return all_right;
}

/// The whole sweep on one rank: the single timing loop both modes share. T is the
/// element type (-d); a 16-bit result is checked against the exact sum rounded once.
/// Returns true when every element of every iteration was right (on every rank).
template <class T, class Communicator>
bool run_rank(Communicator& comm, const collective_options& o, const run_context& ctx) {
  const qcoll::rank_t n = comm.size(), me = comm.rank();
  const bool link_column = o.link_column != 0 && ctx.link.bits_per_s > 0;
  std::unique_ptr<bench::table> table;
  if (me == 0) {
    print_preamble(o, n, ctx, link_column);
    const std::string type = o.dtype_name == "float" ? "" : " " + o.dtype_name;
    table = std::make_unique<bench::table>(fmt::format("qcoll {}{} {}{}", o.op_name, type, ctx.transport,
                                                       o.allocated ? " allocated" : ""),
                                           n, o.op,
                                           link_column ? ctx.link.bits_per_s / 8.0 : 0.0, o.dtype_name, sizeof(T));
  }
  bool all_right = true;
  for (const std::size_t bytes : bench::sweep_sizes(o)) {
    const std::size_t count = bytes / sizeof(T);
    const qcoll::block_range mine = qcoll::block_of(count, n, me);
    aligned_buffer<T> buffer(o.allocated ? 0 : count), pristine_buffer(count);
    const qcoll::buffer<T> allocated = o.allocated ? comm.template allocate<T>(count) : qcoll::buffer<T>();
    const std::span<T> data = o.allocated ? allocated.span() : buffer.span(), pristine = pristine_buffer.span();
    // all_gather starts with only this rank's block filled, so the check sees what arrived.
    for (std::size_t i = 0; i < count; ++i)
      pristine[i] = as_element<T>(
          (o.op != operation::all_gather || (i >= mine.offset && i < mine.offset + mine.size)) &&
                  (o.op != operation::broadcast || me == 0)
              ? pattern_of<T>(i, me)
              : -1.0f);
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    // The reduced value at i, rounded to T once; the gathered value of `owner` at i.
    const auto sum_at = [&](std::size_t i) { return float(as_element<T>(ranks_sum * pattern_of<T>(i, 0))); };
    const auto value_at = [&](std::size_t i, qcoll::rank_t owner) { return float(as_element<T>(pattern_of<T>(i, owner))); };

    double wrong = 0;
    const device_side<T> device(o, count);
    const auto one_iteration = [&]() -> double {
      reset_and_enter(comm, o, data, std::span<const T>(pristine), &device);
      const double start = now_us();
      bool called = false;
      if constexpr (device_built) {
        if (device.on) {
          const std::span<T> on = device.span();
          switch (o.op) {
            case operation::allreduce: comm.allreduce(device.where(), on, qcoll::reduce_op::sum); break;
            case operation::reduce_scatter:
              comm.reduce_scatter(device.where(), std::span<const T>(on), mine.of(on), qcoll::reduce_op::sum);
              break;
            case operation::all_gather: comm.all_gather(device.where(), std::span<const T>(mine.of(on)), on); break;
            case operation::broadcast: comm.broadcast(device.where(), on, 0); break;
          }
          called = true;
        }
      }
      if (!called) {
        switch (o.op) {
          case operation::allreduce: comm.allreduce(data, qcoll::reduce_op::sum); break;
          case operation::reduce_scatter:
            comm.reduce_scatter(std::span<const T>(data), mine.of(data), qcoll::reduce_op::sum);
            break;
          case operation::all_gather: comm.all_gather(std::span<const T>(mine.of(data)), data); break;
          case operation::broadcast: comm.broadcast(data, 0); break;
        }
      }
      const double took = now_us() - start;
      result_to_host(device, data);
      if (!o.check) return took;
      std::size_t bad = 0;
      switch (o.op) {
        case operation::allreduce:
          for (std::size_t i = 0; i < count; ++i) bad += float(data[i]) != sum_at(i);
          break;
        case operation::reduce_scatter:
          for (std::size_t i = mine.offset; i < mine.offset + mine.size; ++i) bad += float(data[i]) != sum_at(i);
          break;
        case operation::all_gather:
          for (qcoll::rank_t owner = 0; owner < n; ++owner) {
            const qcoll::block_range b = qcoll::block_of(count, n, owner);
            for (std::size_t i = b.offset; i < b.offset + b.size; ++i) bad += float(data[i]) != value_at(i, owner);
          }
          break;
        case operation::broadcast:
          for (std::size_t i = 0; i < count; ++i) bad += float(data[i]) != value_at(i, 0);
          break;
      }
      wrong += static_cast<double>(bad);
      return took;
    };

    const measured m = timed_iterations(comm, o, bytes, one_iteration, [&] { return std::vector<double>{wrong}; });
    all_right = all_right && m.summary[0] == 0;
    if (table) table->row(bytes, m.times_us, m.summary[0]);
  }
  if (table) table->finish();
  return all_right;
}

/// run_rank with the failure of one rank made every rank's: the communicator is aborted,
/// so the others fail at once instead of waiting out their timeout.
template <class Communicator>
bool run_rank_or_abort(Communicator& comm, const collective_options& o, const run_context& ctx,
                       Communicator* node = nullptr) {
  try {
    if (!ctx.variants.empty() || o.reproducible) return run_rank_compressed(comm, o, ctx, node);
    if (o.dtype_name == "bfloat16") return run_rank<qcoll::bfloat16>(comm, o, ctx);
    if (o.dtype_name == "half") return run_rank<qcoll::float16>(comm, o, ctx);
    return run_rank<float>(comm, o, ctx);
  } catch (const std::exception& e) {
    if (!comm.aborted()) comm.abort(e.what());
    throw;
  }
}

std::vector<variant_spec> make_variants(const collective_options& o) {
  std::vector<variant_spec> variants;
  for (const bench::compressed_variant& v : o.compressed) variants.push_back(make_variant(v));
  return variants;
}

int run_threads(const collective_options& o) {
  const auto n = static_cast<qcoll::rank_t>(o.threads);
  run_context ctx;
  ctx.transport = "inproc";
  ctx.variants = make_variants(o);
  std::vector<char> right(n, 0);
  const auto errors = qcoll::transports::inproc::run_ranks(n, [&](auto transport) {
    qcoll::communicator comm(std::move(transport));
    right[comm.rank()] = run_rank_or_abort(comm, o, ctx);
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return std::all_of(right.begin(), right.end(), [](char r) { return r != 0; }) ? 0 : 1;
}

#ifdef QCOLL_BENCH_MPI
int run_job(const collective_options& o) {
  qcoll::transports::mpi::options mpi_options;
  std::string knobs;
  if (o.spin_us >= 0) {
    mpi_options.spin = std::chrono::microseconds(o.spin_us);
    knobs = fmt::format("spin {} us", o.spin_us);
  }
  const char* timeout_text = std::getenv("QCOLL_TIMEOUT_MS");
  const std::chrono::milliseconds timeout(timeout_text ? std::stoll(timeout_text) : 60000);
  const run_context ctx{"mpi", knobs, link_from_environment(), make_variants(o), {}};
  qcoll::communicator comm(qcoll::transports::mpi::transport(MPI_COMM_WORLD, mpi_options),
                           qcoll::communicator_options{timeout});
  return run_rank_or_abort(comm, o, ctx) ? 0 : 1;
}
#else
int run_job(const collective_options& o) {
  const qcoll::rendezvous::job job = qcoll::rendezvous::job_from_environment();
  qcoll::launch::join_options join;
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
  const run_context ctx{std::string(qcoll::rendezvous::to_string(qcoll::launch::resolve_transport(job))),
                        knobs.empty() ? knobs : knobs.substr(1), link_from_environment(), make_variants(o), {}};
  if (o.link_column == 1 && ctx.link.bits_per_s <= 0)
    throw std::invalid_argument("-L 1 needs QCOLL_NETLAB_RATE (the link rate in bit/s)");
  if (o.two_level != 0 && job.local_size == o.two_level && job.size > job.local_size) {
    // Hosts of K ranks each (netlab --ranks-per-node K, qcoll-run on several hosts):
    // the nodes over shm, the job over its own transport.
    run_context two_level = ctx;
    two_level.knobs += fmt::format("{}nodes over shm", two_level.knobs.empty() ? "" : ", ");
    const bool right = qcoll::launch::join_nodes(
        job,
        [&](auto node_transport, auto world_transport) {
          qcoll::communicator node(std::move(node_transport), qcoll::communicator_options{job.timeout});
          qcoll::communicator comm(std::move(world_transport), qcoll::communicator_options{job.timeout});
          return run_rank_or_abort(comm, o, two_level, &node);
        },
        join);
    return right ? 0 : 1;
  }
  const bool right = qcoll::launch::join(
      job,
      [&](auto transport) {
        qcoll::communicator comm(std::move(transport), qcoll::communicator_options{job.timeout});
        if (!o.cuda_peer) return run_rank_or_abort(comm, o, ctx);
        // --cuda-peer: a second communicator, over the CUDA peer transport with this one's
        // transport as its control; each rank on local rank % the devices.
        using control = qcoll::transports::reference<std::remove_reference_t<decltype(comm.transport())>>;
        const auto& runtime = qcoll::execution::device_runtime("collective_bench");
        int devices = 1;
        qcoll::execution::check_device(runtime, runtime.device_count(&devices), "counting devices");
        auto settings = qcoll::transports::cuda_peer::options::from_environment();
        settings.device = static_cast<int>(job.local_rank % static_cast<qcoll::rank_t>(std::max(devices, 1)));
        qcoll::execution::check_device(runtime, runtime.set_device(settings.device), "choosing a device");
        qcoll::communicator peers(qcoll::transports::cuda_peer::transport<control>(control(comm.transport()), settings),
                                  qcoll::communicator_options{job.timeout});
        run_context with_peers = ctx;
        with_peers.peer_allreduce = [&](qcoll::execution::device_stream where, std::span<float> data) {
          peers.allreduce(where, data, qcoll::reduce_op::sum);
        };
        return run_rank_or_abort(comm, o, with_peers);
      },
      join);
  return right ? 0 : 1;
}
#endif

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
  if (!device_built && !o.device.empty()) {
    std::fprintf(stderr, "collective_bench: --device is not in the MPI builds; run collective_bench --job under qcoll-run\n");
    return 2;
  }
#ifndef QCOLL_BENCH_MPI
  if (o.device == "emulated") qcoll::execution::use_device(qcoll::device::emulated());
#endif
  if (o.device == "cuda" &&
      (qcoll::execution::active_device() != qcoll::execution::linked_cuda() || qcoll::execution::gpu_count() == 0)) {
    std::printf("collective_bench --device cuda: no CUDA device here (or no CUDA build), skipped\n");
    return 77;
  }
  try {
#ifdef QCOLL_BENCH_MPI
    qcoll::transports::mpi::environment mpi(argc, argv);
#endif
    return o.job ? run_job(o) : run_threads(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_bench: %s\n", e.what());
    return 2;
  }
}
