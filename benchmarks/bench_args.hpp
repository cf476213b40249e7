#pragma once
// Command-line pieces the benchmarks share (nccl-tests style size arguments), and the
// options of collective_bench, which are those of ../shared/peers/src/common.hpp so the
// same arguments (run_all.sh's `-b 4K -e 64M -f 2 [BENCH_ARGS]`) mean the same thing.

#include <qcoll/quantizers/by_name.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace bench {

/// "64K", "256M", "1G" or a plain byte count (binary suffixes, as the peers read them).
inline std::size_t parse_bytes(std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end == copy.c_str()) throw std::invalid_argument("bad size '" + copy + "'");
  const char unit = *end;
  if (unit != '\0' && (end[1] != '\0' || std::string_view("kKmMgG").find(unit) == std::string_view::npos))
    throw std::invalid_argument("bad size suffix in '" + copy + "' (K, M or G)");
  const double scale = unit == 'K' || unit == 'k'   ? 1024.0
                       : unit == 'M' || unit == 'm' ? 1048576.0
                       : unit == 'G' || unit == 'g' ? 1073741824.0
                                                    : 1.0;
  return static_cast<std::size_t>(value * scale);
}

enum class operation { allreduce, reduce_scatter, all_gather, broadcast };

/// A compressed allreduce variant named by --compressed, in qcoll's written form of a
/// quantizer (quantizers/by_name.hpp): identity, one_bit[/G], k_levelB[/G] (B code
/// bits, 2^B levels), bfpM[/BLOCK] (M mantissa bits including the sign), and any
/// quantizer added to qcoll's list. G and BLOCK default to the quantizers' own.
struct compressed_variant {
  qcoll::quantizers::quantizer_spec spec;
  std::string name;  // as written on the command line, for the table

  /// Only identity is lossless: its results are checked element by element.
  bool lossy() const noexcept { return spec.name != qcoll::quantizers::identity<float>::name; }
};

/// @throws std::invalid_argument naming the text and the known quantizers.
inline compressed_variant parse_compressed_variant(std::string_view text) {
  try {
    return {qcoll::quantizers::parse_quantizer_spec(text), std::string(text)};
  } catch (const qcoll::error& e) {
    throw std::invalid_argument(std::string("--compressed: ") + e.what());
  }
}

/// Splits "a,b,c" (empty items are refused).
inline std::vector<std::string> split_list(const std::string& text, const char* flag, char separator = ',') {
  std::vector<std::string> items;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = text.find(separator, begin);
    items.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (items.back().empty()) throw std::invalid_argument(std::string(flag) + ": empty item in '" + text + "'");
    if (comma == std::string::npos) return items;
    begin = comma + 1;
  }
}

/// collective_bench's options. The measurement ones have the peers' names and defaults.
struct collective_options {
  // Where the ranks come from: NRANKS threads over the in-process transport, or (--job)
  // this process is one rank of a job whose launcher set the environment.
  bool job = false;
  std::size_t threads = 0;

  operation op = operation::allreduce;
  std::string op_name = "allreduce";  // -o
  std::string dtype_name = "float";   // -d: float, half or bfloat16 (nccl-tests' names)
  std::size_t min_bytes = 4096;                  // -b
  std::size_t max_bytes = std::size_t{64} << 20;  // -e
  std::size_t factor = 2;                        // -f
  int max_iters = 50;                            // -n
  int min_iters = 5;                             // -m
  std::size_t budget_bytes = std::size_t{128} << 20;  // -B: iterations ≈ budget / size, clamped
  int warmup = -1;                               // -w: -1 = clamp(iters / 5, 2, 10)
  double time_cap_s = 2.0;                       // -T: seconds of timed iterations per size
  bool check = true;                             // -c 0|1
  bool allocated = false;                        // -R 0|1: buffers from communicator::allocate
  std::string label;                             // -l: free text for the header
  bool post_barrier = false;                     // --post-barrier 0|1: a barrier before each reset (diagnostic)
  int link_column = -1;                          // -L 0|1: link% column; -1 = when QCOLL_NETLAB_RATE is set

  // Transport knobs for experiments (job mode; 0 or negative = the library default).
  long spin_us = -1;                 // --spin-us: engine_options::spin
  std::size_t shm_pipe_bytes = 0;    // --shm-pipe: shm options::pipe_bytes
  std::size_t tcp_buffer_bytes = 0;  // --tcp-buffer: tcp options::socket_buffer_bytes

  // Compressed allreduce (-o allreduce only): every size runs the exact allreduce and
  // then each variant at each chunk size, in one table.
  std::vector<compressed_variant> compressed;  // --compressed: empty = the exact table only
  std::vector<std::size_t> chunk_values;       // --chunk: values per chunk, whole_stripe, or empty = library default
  static constexpr std::size_t whole_stripe = 0;
  std::vector<std::size_t> grid_extents;       // --grid: also run each variant as a grid allreduce on this torus
  std::size_t layers = 0;                      // --layers: also run each variant over this many layers, fused and not
  bool reproducible = false;                   // --reproducible 1: a row of reproducible_allreduce per size
  std::size_t two_level = 0;                   // --two-level: also run each variant as a two_level_allreduce, nodes of this many ranks

  // --device cuda|emulated: the collectives and plans on device buffers (empty: host buffers).
  std::string device;
  // --cuda-peer 1 (job mode, with --device and --compressed): rows of the exact allreduce
  // over the CUDA peer transport between the job's ranks, and of a device-to-device copy.
  bool cuda_peer = false;
};

inline constexpr std::string_view collective_usage =
    "usage: collective_bench NRANKS [options]   NRANKS threads over the in-process transport\n"
    "       collective_bench --job [options]    one rank of a job (qcoll-run, torchrun, mpirun, netlab)\n"
    "options (as ../shared/peers):\n"
    "  -o allreduce|reduce_scatter|all_gather|broadcast   the collective (default allreduce; broadcast from rank 0)\n"
    "  -d float|half|bfloat16   the element type (default float; 16-bit types reduce in float, exact table only)\n"
    "  -b BYTES -e BYTES -f N   sizes from -b to -e, times N each (default 4K, 64M, 2; K/M/G suffixes)\n"
    "  -n N -m N                at most / at least N timed iterations per size (default 50, 5)\n"
    "  -B BYTES                 iterations = clamp(BYTES / size, -m, -n) (default 128M)\n"
    "  -T SECONDS               cap the timed iterations of a size at about this long (default 2)\n"
    "  -w N                     warm-up iterations (default clamp(iterations / 5, 2, 10))\n"
    "  -c 0|1                   check every result (default 1)\n"
    "  -R 0|1                   1: the data buffers come from communicator::allocate (over shm: shared\n"
    "                           buffers the peers map; nccl-tests' buffer registration); the table's title\n"
    "                           says \"allocated\" (default 0: ordinary memory, as the peers)\n"
    "  -l LABEL                 free text for the header\n"
    "  -L 0|1                   link% column (default: when QCOLL_NETLAB_RATE is set)\n"
    "  BENCH_DUMP_TIMES=1 in the environment prints every timed iteration's time (us) to stderr\n"
    "compressed allreduce (with -o allreduce; one table: per size the exact allreduce, then each variant):\n"
    "  --compressed LIST        variants: identity, one_bit[/G], k_levelB[/G], bfpM[/BLOCK], comma-separated\n"
    "                           (e.g. identity,one_bit,k_level4,bfp8; G = values per group, default 2048)\n"
    "  --chunk LIST             compressed_allreduce_options::chunk_values, in values (K/M suffixes, 1K = 1024),\n"
    "                           or 'whole' (one chunk per stripe); a list runs every variant at each (default:\n"
    "                           the library's default)\n"
    "  --grid EXTENTS           also run each variant as a grid_allreduce_plan on a healthy torus of these\n"
    "                           extents, e.g. 4x4 (their product must be the number of ranks)\n"
    "  --layers N               also run each variant over the size cut into N layers of unequal sizes: one fused\n"
    "                           plan over all of them in one call (rows fused:V) against one plan and one\n"
    "                           blocking call per layer (rows layers:V)\n"
    "  --reproducible 1         also run qcoll::reproducible_allreduce (sums independent of the algorithm and\n"
    "                           of the number of ranks) beside the exact allreduce (rows reproducible; the\n"
    "                           compressed table, with or without --compressed; host or --device memory)\n"
    "  --two-level K            also run each variant (and identity: the exact two-level allreduce) as a\n"
    "                           two_level_allreduce, nodes of K consecutive ranks split from the job (rows\n"
    "                           2lvl:V, shards, and 2lead:V, leaders; netlab --ranks-per-node K puts each\n"
    "                           node behind one shaped link)\n"
    "  --post-barrier 0|1       diagnostic, as the peers' GLOO_BENCH_POST_BARRIER: a barrier after each timed call,\n"
    "                           so no rank resets or checks its buffer while a slower one is still in the call\n"
    "                           (with more ranks than cores that work takes the slower rank's core; default 0)\n"
    "device buffers (docs/gpu.md):\n"
    "  --device cuda|emulated   the collectives' device_stream forms and plans on device memory (exact table, and\n"
    "                           --compressed variants); with --compressed, rows 'host+copies' (the host call and\n"
    "                           its two copies) and, per variant, where a call waited (# split lines)\n"
    "  --cuda-peer 0|1          job mode, with --device and --compressed: rows 'cuda_peer' (the exact allreduce\n"
    "                           GPU to GPU over the CUDA peer transport, the job's transport its control) and\n"
    "                           'd2d copy' (a device-to-device copy of the size on rank 0: the ceiling)\n"
    "job-mode transport knobs, for experiments:\n"
    "  --spin-us US             how long a wait polls before it sleeps (library default 50)\n"
    "  --shm-pipe BYTES         shm ring bytes per pair (power of two >= 64K; default 2M)\n"
    "  --tcp-buffer BYTES       SO_SNDBUF/SO_RCVBUF (default 0: kernel autotuning)\n";

inline collective_options parse_collective_options(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.empty()) throw std::invalid_argument("missing NRANKS or --job");
  collective_options o;
  std::size_t i = 0;
  if (args[0] == "--job") {
    o.job = true;
  } else {
    char* end = nullptr;
    const std::string first(args[0]);
    o.threads = std::strtoull(first.c_str(), &end, 10);
    if (end == first.c_str() || *end != '\0' || o.threads == 0)
      throw std::invalid_argument("the first argument is NRANKS (≥ 1) or --job, not '" + first + "'");
  }
  for (i = 1; i < args.size(); ++i) {
    const std::string_view flag = args[i];
    if (i + 1 >= args.size()) throw std::invalid_argument("option " + std::string(flag) + " needs a value");
    const std::string value(args[++i]);
    const auto integer = [&] {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0')
        throw std::invalid_argument(std::string(flag) + " needs an integer, not '" + value + "'");
      return v;
    };
    if (flag == "-o") o.op_name = value;
    else if (flag == "-d") o.dtype_name = value;
    else if (flag == "-b") o.min_bytes = parse_bytes(value);
    else if (flag == "-e") o.max_bytes = parse_bytes(value);
    else if (flag == "-f") o.factor = parse_bytes(value);
    else if (flag == "-n") o.max_iters = static_cast<int>(integer());
    else if (flag == "-m") o.min_iters = static_cast<int>(integer());
    else if (flag == "-B") o.budget_bytes = parse_bytes(value);
    else if (flag == "-w") o.warmup = static_cast<int>(integer());
    else if (flag == "-T") o.time_cap_s = std::strtod(value.c_str(), nullptr);
    else if (flag == "-c") o.check = integer() != 0;
    else if (flag == "-R") o.allocated = integer() != 0;
    else if (flag == "-l") o.label = value;
    else if (flag == "-L") o.link_column = integer() != 0 ? 1 : 0;
    else if (flag == "--post-barrier") o.post_barrier = integer() != 0;
    else if (flag == "--spin-us") o.spin_us = integer();
    else if (flag == "--shm-pipe") o.shm_pipe_bytes = parse_bytes(value);
    else if (flag == "--tcp-buffer") o.tcp_buffer_bytes = parse_bytes(value);
    else if (flag == "--compressed")
      for (const std::string& item : split_list(value, "--compressed"))
        o.compressed.push_back(parse_compressed_variant(item));
    else if (flag == "--chunk")
      for (const std::string& item : split_list(value, "--chunk")) {
        const std::size_t values = item == "whole" ? collective_options::whole_stripe : parse_bytes(item);
        if (item != "whole" && values == 0) throw std::invalid_argument("--chunk: '" + item + "' values per chunk");
        o.chunk_values.push_back(values);
      }
    else if (flag == "--cuda-peer") o.cuda_peer = integer() != 0;
    else if (flag == "--device") {
      if (value != "cuda" && value != "emulated") throw std::invalid_argument("--device is cuda or emulated, not '" + value + "'");
      o.device = value;
    } else if (flag == "--layers") {
      o.layers = parse_bytes(value);
      if (o.layers == 0) throw std::invalid_argument("--layers: a positive number of layers");
    } else if (flag == "--reproducible") {
      o.reproducible = integer() != 0;
    } else if (flag == "--two-level") {
      o.two_level = parse_bytes(value);
      if (o.two_level == 0) throw std::invalid_argument("--two-level: a positive number of ranks per node");
    } else if (flag == "--grid")
      for (const std::string& item : split_list(value, "--grid", 'x')) {
        const std::size_t extent = parse_bytes(item);
        if (extent == 0) throw std::invalid_argument("--grid: extents are positive, not '" + item + "'");
        o.grid_extents.push_back(extent);
      }
    else throw std::invalid_argument("unknown option '" + std::string(flag) + "'");
  }
  if (o.op_name == "allreduce") o.op = operation::allreduce;
  else if (o.op_name == "reduce_scatter") o.op = operation::reduce_scatter;
  else if (o.op_name == "all_gather") o.op = operation::all_gather;
  else if (o.op_name == "broadcast") o.op = operation::broadcast;
  else throw std::invalid_argument("-o is allreduce, reduce_scatter, all_gather or broadcast, not '" + o.op_name + "'");
  if (o.dtype_name != "float" && o.dtype_name != "half" && o.dtype_name != "bfloat16")
    throw std::invalid_argument("-d is float, half or bfloat16, not '" + o.dtype_name + "'");
  if (o.dtype_name != "float" && !o.compressed.empty())
    throw std::invalid_argument("-d " + o.dtype_name + " runs the exact table only (no --compressed)");
  if (!o.compressed.empty() && o.op != operation::allreduce)
    throw std::invalid_argument("--compressed needs -o allreduce");
  if (o.reproducible && (o.op != operation::allreduce || o.dtype_name != "float" || o.allocated))
    throw std::invalid_argument("--reproducible 1 runs float allreduces (no -d or -R 1)");
  if (o.allocated && !o.compressed.empty()) throw std::invalid_argument("-R 1 runs the exact table only (no --compressed)");
  if (!o.chunk_values.empty() && o.compressed.empty()) throw std::invalid_argument("--chunk needs --compressed");
  if (!o.grid_extents.empty() && o.compressed.empty()) throw std::invalid_argument("--grid needs --compressed");
  if (o.layers != 0 && o.compressed.empty()) throw std::invalid_argument("--layers needs --compressed");
  if (o.two_level != 0 && o.compressed.empty()) throw std::invalid_argument("--two-level needs --compressed");
  if (o.cuda_peer && (!o.job || o.device.empty() || o.compressed.empty()))
    throw std::invalid_argument("--cuda-peer 1 needs --job, --device and --compressed");
  if (!o.device.empty() && (o.allocated || !o.grid_extents.empty() || o.layers != 0 || o.two_level != 0))
    throw std::invalid_argument("--device runs the exact table and --compressed variants (no -R 1, --grid, --layers or --two-level)");
  if (!o.grid_extents.empty() && !o.job &&
      std::accumulate(o.grid_extents.begin(), o.grid_extents.end(), std::size_t{1}, std::multiplies<>()) != o.threads)
    throw std::invalid_argument("--grid: the extents' product must be NRANKS");
  // The peers' corrections, so the same arguments give the same sweep.
  if (o.factor < 2) throw std::invalid_argument("-f must be ≥ 2");
  o.min_bytes = std::max<std::size_t>(o.min_bytes, 4);
  o.min_iters = std::max(o.min_iters, 1);
  o.max_iters = std::max(o.max_iters, o.min_iters);
  return o;
}

}  // namespace bench
