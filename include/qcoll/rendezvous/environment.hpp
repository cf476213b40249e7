#pragma once
/// @file
/// The description of a job — who this rank is, where the store is, which secret —
/// read from the environment a launcher set up.
///
/// Four launcher families are understood, so a program runs unchanged under each:
///
/// | family   | rank / size                                  | local rank / size                                          |
/// |----------|----------------------------------------------|------------------------------------------------------------|
/// | qcoll    | QCOLL_RANK, QCOLL_WORLD_SIZE                 | QCOLL_LOCAL_RANK, QCOLL_LOCAL_WORLD_SIZE                   |
/// | torchrun | RANK, WORLD_SIZE                             | LOCAL_RANK, LOCAL_WORLD_SIZE                               |
/// | mpirun   | OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE   | OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE     |
/// | slurm    | SLURM_PROCID, SLURM_NTASKS                   | SLURM_LOCALID; the size is SLURM_STEP_TASKS_PER_NODE's (else SLURM_TASKS_PER_NODE's) count for SLURM_NODEID |
///
/// PMIx keeps the world size in its server, not in the environment: under `srun
/// --mpi=pmix` the Slurm variables serve, under Open MPI's mpirun the OMPI ones; a
/// PMIX_RANK alone is an error that says so.
///
/// Rules (each group of variables is read on its own, first source that has it wins):
/// - **Rank and size** come from the first family, in the order qcoll > torchrun > mpirun
///   > slurm (an mpirun or torchrun inside a Slurm allocation inherits the allocation's
///   SLURM_ variables), that sets either of its pair: explicit qcoll settings must be able to override what
///   an outer launcher exported. Half a pair is an error, not a fall-through, because it
///   is always a mistake. The local pair comes from the *same* family (mixing families
///   would pair a rank with another launcher's idea of the host). Without a local pair a
///   rank is assumed to be alone on its host (local 0 of 1): TCP works everywhere, shared
///   memory would not.
/// - **Store address**: QCOLL_STORE=host:port ([v6-address]:port for IPv6), else
///   MASTER_ADDR + MASTER_PORT. When TORCHELASTIC_USE_AGENT_STORE=True, torchrun's own
///   agent already serves a TCPStore on MASTER_PORT, so qcoll's store takes MASTER_PORT + 1.
///   Else, under mpirun with every rank on this host, 127.0.0.1 and
///   port 20000 + FNV-1a(job id) % 12768 (see mpirun_local_port): mpirun passes no address,
///   but every rank knows the job id, so all ranks agree without talking. A multi-host
///   mpirun job has no such common knowledge of rank 0's host: set MASTER_ADDR/MASTER_PORT
///   (mpirun -x) or QCOLL_STORE. Under Slurm, the first host of SLURM_STEP_NODELIST
///   (else SLURM_JOB_NODELIST; 127.0.0.1 when every rank is on this host) and the port
///   derived from the job id the same way; rank 0 must run on that host (Slurm's block
///   and cyclic distributions put it there), which rank 0 checks against SLURMD_NODENAME.
/// - **Job id** (names shared-memory segments, goes into every handshake so two jobs on
///   one host never join each other): QCOLL_JOB_ID, else TORCHELASTIC_RUN_ID (unless it is
///   torchrun's non-unique default "none"), else Open MPI's job id ("ompi-" +
///   OMPI_MCA_ess_base_jobid, or PMIX_NAMESPACE), else Slurm's ("slurm-" + SLURM_JOB_ID
///   + "." + SLURM_STEP_ID), else "host:port" of the store — unique
///   on a host for as long as the store's port is bound.
/// - **Secret**: QCOLL_SECRET, else the contents of the file QCOLL_SECRET_FILE names (one
///   trailing newline stripped; keeps the secret out of `ps e` and /proc/PID/environ of
///   the launcher's children). Empty or unset: no authentication.
/// - QCOLL_TRANSPORT = shm | tcp | auto (default auto: shm when every rank is local).
/// - QCOLL_BIND: the address this rank's TCP listener binds (default 127.0.0.1).
/// - QCOLL_TIMEOUT_MS: deadline for setup and for each collective step (default 60000).
///
/// A variable set to the empty string counts as unset. Every error is a qcoll::error with
/// errc::invalid_argument whose message names the variable and its value.

#include <qcoll/detail/check.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>

#include <qcoll/detail/format.hpp>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace qcoll::rendezvous {

/// Names of qcoll's own variables (the file comment says what each means), for launchers
/// that set them: qcoll-run takes them from here.
namespace variables {
inline constexpr const char* rank = "QCOLL_RANK";
inline constexpr const char* world_size = "QCOLL_WORLD_SIZE";
inline constexpr const char* local_rank = "QCOLL_LOCAL_RANK";
inline constexpr const char* local_world_size = "QCOLL_LOCAL_WORLD_SIZE";
inline constexpr const char* store = "QCOLL_STORE";
inline constexpr const char* job_id = "QCOLL_JOB_ID";
inline constexpr const char* secret = "QCOLL_SECRET";
inline constexpr const char* secret_file = "QCOLL_SECRET_FILE";
inline constexpr const char* transport = "QCOLL_TRANSPORT";
inline constexpr const char* bind = "QCOLL_BIND";
inline constexpr const char* timeout_ms = "QCOLL_TIMEOUT_MS";
}  // namespace variables

/// Which transport carries the data between ranks.
enum class transport_kind { automatic, shm, tcp };

constexpr std::string_view to_string(transport_kind kind) noexcept {
  switch (kind) {
    case transport_kind::automatic: return "auto";
    case transport_kind::shm: return "shm";
    case transport_kind::tcp: return "tcp";
  }
  return "transport?";
}

/// The transports by name, in one list: QCOLL_TRANSPORT, qcoll-run's --transport and
/// the PyTorch bridge read names through parse_transport, and launch/join.hpp joins
/// each kind. A new transport adds its kind here and its join there.
inline constexpr transport_kind named_transports[] = {transport_kind::automatic, transport_kind::shm,
                                                      transport_kind::tcp};

/// The kind `name` names ("auto", "shm", "tcp"), or nothing.
constexpr std::optional<transport_kind> parse_transport(std::string_view name) noexcept {
  for (const transport_kind kind : named_transports)
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

/// "shm, tcp, auto": for messages.
inline std::string transport_names() {
  std::string names;
  for (const transport_kind kind : named_transports)
    if (kind != transport_kind::automatic) names += std::string(to_string(kind)) + ", ";
  return names + std::string(to_string(transport_kind::automatic));
}

/// Everything a rank needs to join its job.
struct job {
  rank_t rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string store_host = "127.0.0.1";
  std::uint16_t store_port = 0;
  std::string job_id;  ///< never empty when it comes from job_from_environment
  std::string secret;  ///< empty: no authentication
  transport_kind transport = transport_kind::automatic;
  std::string bind_address = "127.0.0.1";
  std::chrono::milliseconds timeout{60000};
  std::string launcher;  ///< "qcoll", "torchrun", "mpirun" or "slurm": which family gave rank/size

  /// True when every rank runs on this host (local_size counts the ranks here).
  bool all_local() const noexcept { return local_size == size; }
};

/// The store port of an mpirun job whose ranks are all on one host:
/// 20000 + FNV-1a-32(job_id) % 12768: every rank computes the same port from the job id
/// alone. 20000–32767 avoids the well-known and most registered service ports, and
/// stays below Linux's ephemeral range (32768–60999 by default): a port there is
/// taken at random by any outgoing connection on the host (a test running beside the
/// job did so, 1 run in 30), which no choice of job id can avoid. A port that is still
/// in use is reported by store_server; QCOLL_STORE or MASTER_ADDR/MASTER_PORT override it.
constexpr std::uint16_t mpirun_local_port(std::string_view job_id) noexcept {
  std::uint32_t hash = 2166136261u;
  for (char c : job_id) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 16777619u;
  }
  return static_cast<std::uint16_t>(20000 + hash % 12768);
}

namespace detail {

using lookup_function = std::function<const char*(const char*)>;

constexpr std::string_view environment_error_prefix = "qcoll job environment";

/// The variable's value, or nothing when it is unset or empty.
inline std::optional<std::string_view> read_variable(const lookup_function& lookup, const char* name) {
  const char* value = lookup(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string_view(value);
}

/// A decimal number 0 … max, digits only.
inline std::uint64_t parse_number(const char* name, std::string_view value, std::uint64_t max) {
  std::uint64_t number = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  const bool digits_only = !value.empty() && value.front() >= '0' && value.front() <= '9';
  if (!digits_only || end != value.data() + value.size() || ec == std::errc::invalid_argument)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is not a non-negative integer",
                               environment_error_prefix, name, value);
  if (ec == std::errc::result_out_of_range || number > max)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is out of range (at most {})",
                               environment_error_prefix, name, value, max);
  return number;
}

inline std::uint16_t parse_port(const char* name, std::string_view value) {
  std::uint64_t port = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), port);
  const bool digits_only = !value.empty() && value.front() >= '0' && value.front() <= '9';
  if (!digits_only || end != value.data() + value.size() || ec != std::errc{} || port == 0 || port > 65535)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is not a port number (1-65535)",
                               environment_error_prefix, name, value);
  return static_cast<std::uint16_t>(port);
}

struct host_port {
  std::string host;
  std::uint16_t port = 0;
};

/// "host:port" or "[v6-address]:port".
inline host_port parse_host_port(const char* name, std::string_view value) {
  std::string_view host;
  std::string_view port;
  if (value.starts_with('[')) {
    const auto close = value.find(']');
    if (close != std::string_view::npos && close + 1 < value.size() && value[close + 1] == ':') {
      host = value.substr(1, close - 1);
      port = value.substr(close + 2);
    }
  } else if (const auto colon = value.rfind(':'); colon != std::string_view::npos) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) host = {};  // a bare IPv6 address needs brackets
  }
  if (host.empty() || port.empty())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: {}={} is not host:port (e.g. 127.0.0.1:29500, or [::1]:29500 for IPv6)",
                               environment_error_prefix, name, value);
  return {std::string(host), parse_port(name, port)};
}

/// The secret in a file: at most 64 KiB, one trailing newline ("\n" or "\r\n") stripped.
inline std::string read_secret_file(std::string_view path) {
  const std::string file_name(path);
  std::FILE* file = std::fopen(file_name.c_str(), "rb");
  if (file == nullptr)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: QCOLL_SECRET_FILE={} cannot be read: {}",
                               environment_error_prefix, path, std::strerror(errno));
  constexpr std::size_t limit = 64 * 1024;
  std::string secret(limit + 1, '\0');
  const std::size_t got = std::fread(secret.data(), 1, secret.size(), file);
  const bool failed = std::ferror(file) != 0;
  std::fclose(file);
  if (failed)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: QCOLL_SECRET_FILE={} cannot be read",
                               environment_error_prefix, path);
  if (got > limit)
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: QCOLL_SECRET_FILE={} is larger than {} bytes; a secret is a short string",
                               environment_error_prefix, path, limit);
  secret.resize(got);
  if (secret.ends_with('\n')) secret.pop_back();
  if (secret.ends_with('\r')) secret.pop_back();
  if (secret.empty())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: QCOLL_SECRET_FILE={} is empty (unset the variable to run without a secret)",
                               environment_error_prefix, path);
  return secret;
}

struct launcher_family {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  ///< nullptr: computed (Slurm)
};

inline constexpr launcher_family launcher_families[] = {
    {"qcoll", variables::rank, variables::world_size, variables::local_rank, variables::local_world_size},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

/// Ranks travel as u32 in the handshake.
inline constexpr std::uint64_t max_world_size = std::numeric_limits<std::uint32_t>::max();

/// Reads one (rank, size)-style pair: both or neither; rank < size; size ≥ 1.
inline bool read_pair(const lookup_function& lookup, const char* rank_name, const char* size_name, rank_t& rank,
                      rank_t& size) {
  const auto rank_value = read_variable(lookup, rank_name);
  const auto size_value = read_variable(lookup, size_name);
  if (!rank_value && !size_value) return false;
  if (!size_value)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is set but {} is not: set both",
                               environment_error_prefix, rank_name, *rank_value, size_name);
  if (!rank_value)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is set but {} is not: set both",
                               environment_error_prefix, size_name, *size_value, rank_name);
  rank = parse_number(rank_name, *rank_value, max_world_size);
  size = parse_number(size_name, *size_value, max_world_size);
  if (size == 0)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}=0: a job has at least one rank",
                               environment_error_prefix, size_name);
  if (rank >= size)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is not below {}={}", environment_error_prefix,
                               rank_name, rank, size_name, size);
  return true;
}

/// The task count of node `node` in Slurm's compressed per-node counts: "2(x3),1" is
/// 2 on nodes 0–2 and 1 on node 3.
inline std::uint64_t slurm_tasks_on_node(const char* name, std::string_view value, std::uint64_t node) {
  const auto malformed = [&] {
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is not Slurm's per-node task counts (e.g. 2(x3),1)",
                               environment_error_prefix, name, value);
  };
  std::uint64_t first_node = 0;
  for (std::string_view rest = value; !rest.empty();) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    std::uint64_t repeat = 1;
    if (const auto open = item.find("(x"); open != std::string_view::npos) {
      if (!item.ends_with(')')) malformed();
      const std::string_view times = item.substr(open + 2, item.size() - open - 3);
      const auto [end, ec] = std::from_chars(times.data(), times.data() + times.size(), repeat);
      if (ec != std::errc{} || end != times.data() + times.size() || repeat == 0) malformed();
      item = item.substr(0, open);
    }
    std::uint64_t tasks = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), tasks);
    if (item.empty() || ec != std::errc{} || end != item.data() + item.size()) malformed();
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
  }
  qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} has no count for node {} (SLURM_NODEID)",
                             environment_error_prefix, name, value, node);
}

/// The first host of a Slurm hostlist: "node[001-004,007],gpu1" → "node001" (each
/// bracket gives its first value, zero padding kept).
inline std::string slurm_first_host(const char* name, std::string_view list) {
  std::string host;
  bool well_formed = true;
  for (std::size_t i = 0; i < list.size() && list[i] != ',' && well_formed; ++i) {
    if (list[i] == ']') well_formed = false;
    if (list[i] != '[') {
      host += list[i];
      continue;
    }
    const auto close = list.find(']', i);
    const std::string_view range = list.substr(i + 1, close == std::string_view::npos ? 0 : close - i - 1);
    const std::string_view first = range.substr(0, range.find_first_of(",-"));
    well_formed = close != std::string_view::npos && !first.empty();
    host += first;
    i = close;
  }
  if (!well_formed || host.empty())
    qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is not a Slurm host list (e.g. node[001-004],gpu1)",
                               environment_error_prefix, name, list);
  return host;
}

/// Slurm's local rank and the count of this step's tasks on this node.
inline bool read_slurm_local(const lookup_function& lookup, rank_t& local_rank, rank_t& local_size) {
  const auto local_id = read_variable(lookup, "SLURM_LOCALID");
  if (!local_id) return false;
  const char* counts_name = "SLURM_STEP_TASKS_PER_NODE";
  auto counts = read_variable(lookup, counts_name);
  if (!counts) counts = read_variable(lookup, counts_name = "SLURM_TASKS_PER_NODE");
  const auto node_id = read_variable(lookup, "SLURM_NODEID");
  if (!counts || !node_id)
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: SLURM_LOCALID={} is set but {} is not: Slurm sets SLURM_NODEID and "
                               "SLURM_STEP_TASKS_PER_NODE with it",
                               environment_error_prefix, *local_id, node_id ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_NODEID");
  local_rank = parse_number("SLURM_LOCALID", *local_id, max_world_size);
  local_size = slurm_tasks_on_node(counts_name, *counts, parse_number("SLURM_NODEID", *node_id, max_world_size));
  if (local_rank >= local_size)
    qcoll::detail::throw_error(errc::invalid_argument, "{}: SLURM_LOCALID={} is not below this node's {} tasks ({}={})",
                               environment_error_prefix, local_rank, local_size, counts_name, *counts);
  return true;
}

}  // namespace detail

/// Reads the job from `lookup(name)` (nullptr: unset). See the file comment for the rules.
/// @par Errors qcoll::error (errc::invalid_argument) naming the variable and its value.
inline job job_from_environment(const std::function<const char*(const char*)>& lookup) {
  using detail::environment_error_prefix;
  using detail::read_variable;
  job result;

  // Rank and size: the first family that has them.
  const detail::launcher_family* family = nullptr;
  for (const auto& candidate : detail::launcher_families) {
    if (detail::read_pair(lookup, candidate.rank, candidate.size, result.rank, result.size)) {
      family = &candidate;
      break;
    }
  }
  if (family == nullptr) {
    if (auto pmix_rank = read_variable(lookup, "PMIX_RANK"))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}: PMIX_RANK={} is set, but PMIx keeps the world size in its server, not in the "
                                 "environment: launch with srun (SLURM_PROCID/SLURM_NTASKS) or mpirun, or set "
                                 "QCOLL_RANK and QCOLL_WORLD_SIZE",
                                 environment_error_prefix, *pmix_rank);
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: no rank: set QCOLL_RANK/QCOLL_WORLD_SIZE, or run under qcoll-run, torchrun "
                               "(RANK/WORLD_SIZE), mpirun or srun",
                               environment_error_prefix);
  }
  result.launcher = family->name;
  const bool local_pair =
      family->local_size ? detail::read_pair(lookup, family->local_rank, family->local_size, result.local_rank,
                                             result.local_size)
                         : detail::read_slurm_local(lookup, result.local_rank, result.local_size);
  if (local_pair) {
    if (result.local_size > result.size)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is larger than {}={}", environment_error_prefix,
                                 family->local_size ? family->local_size : "this node's Slurm task count",
                               result.local_size, family->size, result.size);
  } else {
    result.local_rank = 0;
    result.local_size = 1;
  }

  // Job id, part 1: what a launcher named.
  if (auto id = read_variable(lookup, variables::job_id)) {
    result.job_id = *id;
  } else if (auto run_id = read_variable(lookup, "TORCHELASTIC_RUN_ID"); run_id && *run_id != "none") {
    result.job_id = *run_id;
  } else if (auto ompi = read_variable(lookup, "OMPI_MCA_ess_base_jobid")) {
    result.job_id = qcoll::detail::format("ompi-{}", *ompi);
  } else if (auto pmix = read_variable(lookup, "PMIX_NAMESPACE")) {
    result.job_id = qcoll::detail::format("ompi-{}", *pmix);
  } else if (auto slurm_job = read_variable(lookup, "SLURM_JOB_ID")) {
    const auto step = read_variable(lookup, "SLURM_STEP_ID");
    result.job_id = step ? qcoll::detail::format("slurm-{}.{}", *slurm_job, *step) : qcoll::detail::format("slurm-{}", *slurm_job);
  }

  // Store address.
  const auto master_addr = read_variable(lookup, "MASTER_ADDR");
  const auto master_port = read_variable(lookup, "MASTER_PORT");
  if (auto store = read_variable(lookup, variables::store)) {
    auto [host, port] = detail::parse_host_port(variables::store, *store);
    result.store_host = std::move(host);
    result.store_port = port;
  } else if (master_addr || master_port) {
    if (!master_addr || !master_port)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: {}={} is set but {} is not: set both",
                                 environment_error_prefix, master_addr ? "MASTER_ADDR" : "MASTER_PORT",
                                 master_addr ? *master_addr : *master_port,
                                 master_addr ? "MASTER_PORT" : "MASTER_ADDR");
    result.store_host = *master_addr;
    result.store_port = detail::parse_port("MASTER_PORT", *master_port);
    if (read_variable(lookup, "TORCHELASTIC_USE_AGENT_STORE") == std::string_view("True")) {
      if (result.store_port == 65535)
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "{}: MASTER_PORT=65535 leaves no port for qcoll's store next to torchrun's "
                                   "agent store (qcoll uses MASTER_PORT + 1); set QCOLL_STORE=host:port",
                                   environment_error_prefix);
      ++result.store_port;
    }
  } else if (result.launcher == "mpirun") {
    if (!result.all_local())
      qcoll::detail::throw_error(
          errc::invalid_argument,
          "{}: no store address for an mpirun job on several hosts (OMPI_COMM_WORLD_LOCAL_SIZE={} of "
          "OMPI_COMM_WORLD_SIZE={}): set MASTER_ADDR and MASTER_PORT to an address rank 0 can listen on, e.g. "
          "mpirun -x MASTER_ADDR=node0 -x MASTER_PORT=29500 …, or set QCOLL_STORE=host:port",
          environment_error_prefix, result.local_size, result.size);
    if (result.job_id.empty())
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}: no store address and no job id to derive a port from (neither "
                                 "OMPI_MCA_ess_base_jobid nor PMIX_NAMESPACE is set): set QCOLL_STORE=host:port",
                                 environment_error_prefix);
    result.store_host = "127.0.0.1";
    result.store_port = mpirun_local_port(result.job_id);
  } else if (result.launcher == "slurm") {
    if (result.job_id.empty())
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}: no store address and no job id to derive a port from (SLURM_JOB_ID is not "
                                 "set): set QCOLL_STORE=host:port",
                                 environment_error_prefix);
    result.store_port = mpirun_local_port(result.job_id);
    if (!result.all_local()) {
      const char* list_name = "SLURM_STEP_NODELIST";
      auto list = read_variable(lookup, list_name);
      if (!list) list = read_variable(lookup, list_name = "SLURM_JOB_NODELIST");
      if (!list)
        qcoll::detail::throw_error(errc::invalid_argument,
                                   "{}: no store address for a Slurm job on several nodes (neither "
                                   "SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set): set MASTER_ADDR and "
                                   "MASTER_PORT, or QCOLL_STORE=host:port",
                                   environment_error_prefix);
      result.store_host = detail::slurm_first_host(list_name, *list);
      const auto node_name = read_variable(lookup, "SLURMD_NODENAME");
      if (result.rank == 0 && node_name && *node_name != result.store_host)
        qcoll::detail::throw_error(
            errc::invalid_argument,
            "{}: rank 0 serves the store, but it runs on {} (SLURMD_NODENAME), not on {}, the first node of "
            "{}={} where the other ranks look for it: use srun's block or cyclic distribution, or set "
            "MASTER_ADDR and MASTER_PORT (or QCOLL_STORE) to rank 0's host",
            environment_error_prefix, *node_name, result.store_host, list_name, *list);
    }
  } else {
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: no store address: set QCOLL_STORE=host:port (qcoll-run sets it), or "
                               "MASTER_ADDR and MASTER_PORT (torchrun sets them)",
                               environment_error_prefix);
  }

  // Job id, part 2: the store's address is unique on its host while rank 0 serves it.
  if (result.job_id.empty()) {
    result.job_id = result.store_host.find(':') != std::string::npos
                        ? qcoll::detail::format("[{}]:{}", result.store_host, result.store_port)
                        : qcoll::detail::format("{}:{}", result.store_host, result.store_port);
  }

  // Secret.
  if (auto secret = read_variable(lookup, variables::secret)) {
    result.secret = *secret;
  } else if (auto path = read_variable(lookup, variables::secret_file)) {
    result.secret = detail::read_secret_file(*path);
  }

  if (auto transport = read_variable(lookup, variables::transport)) {
    const std::optional<transport_kind> kind = parse_transport(*transport);
    if (!kind)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: QCOLL_TRANSPORT={} is not one of {}",
                                 environment_error_prefix, *transport, transport_names());
    result.transport = *kind;
  }

  if (auto bind = read_variable(lookup, variables::bind)) result.bind_address = *bind;

  if (auto timeout = read_variable(lookup, variables::timeout_ms)) {
    const auto ms = detail::parse_number(variables::timeout_ms, *timeout, std::numeric_limits<std::uint32_t>::max());
    if (ms == 0)
      qcoll::detail::throw_error(errc::invalid_argument, "{}: QCOLL_TIMEOUT_MS=0: the timeout must be at least 1 ms",
                                 environment_error_prefix);
    result.timeout = std::chrono::milliseconds(ms);
  }
  return result;
}

/// The job this process belongs to, from its environment (::getenv).
inline job job_from_environment() {
  return job_from_environment([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace qcoll::rendezvous
