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
/// - QCOLL_TLS = 1 | 0 (default 0): TLS 1.3 on the TCP transport's connections, keyed by
///   the secret (rendezvous/tls.hpp); 1 needs a secret.
/// - QCOLL_TRANSPORT = shm | tcp | auto (default auto: shm when every rank is local).
/// - QCOLL_BIND: the address this rank's TCP listener binds (default 127.0.0.1).
/// - QCOLL_TIMEOUT_MS: deadline for setup and for each collective step (default 60000).
///
/// A variable set to the empty string counts as unset. Every error is a qcoll::error with
/// errc::invalid_argument whose message names the variable and its value.

#include <qcoll/detail/check.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/rendezvous/hmac.hpp>
#include <qcoll/rendezvous/launcher_variables.hpp>

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


/// Which transport carries the data between ranks.
/// cuda_peer: device memory between the GPUs of one node (transports/cuda_peer.hpp), over
/// shm; only programs that join with launch::join_devices take it.
enum class transport_kind { automatic, shm, tcp, cuda_peer };

constexpr std::string_view to_string(transport_kind kind) noexcept {
  switch (kind) {
    case transport_kind::automatic: return "auto";
    case transport_kind::shm: return "shm";
    case transport_kind::tcp: return "tcp";
    case transport_kind::cuda_peer: return "cuda_peer";
  }
  return "transport?";
}

/// The transports by name, in one list: QCOLL_TRANSPORT, qcoll-run's --transport and
/// the PyTorch bridge read names through parse_transport, and launch/join.hpp joins
/// each kind. A new transport adds its kind here and its join there.
inline constexpr transport_kind named_transports[] = {transport_kind::automatic, transport_kind::shm,
                                                      transport_kind::tcp, transport_kind::cuda_peer};

/// The kind `name` names ("auto", "shm", "tcp"), or nothing.
constexpr std::optional<transport_kind> parse_transport(std::string_view name) noexcept {
  for (const transport_kind kind : named_transports)
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

/// "shm, tcp, cuda_peer, auto": for messages.
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
  bool tls = false;    ///< TLS 1.3 on every TCP connection (transport, store, recovery), keyed by the secret (rendezvous/tls.hpp)
  transport_kind transport = transport_kind::automatic;
  std::string bind_address = "127.0.0.1";
  std::chrono::milliseconds timeout{60000};
  std::string launcher;  ///< "qcoll", "torchrun", "mpirun" or "slurm": which family gave rank/size

  /// True when every rank runs on this host (local_size counts the ranks here).
  bool all_local() const noexcept { return local_size == size; }
};

namespace detail {

/// Refuses a job with a secret in a build that cannot prove it (no OpenSSL: hmac.hpp):
/// on every rank as it reads its job, before a byte is sent, instead of joining as a job
/// without one or failing obscurely. `where` starts the message.
inline void require_authentication(const job& j, std::string_view where) {
  if (!authentication_available && !j.secret.empty())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: this job has a secret (QCOLL_SECRET or QCOLL_SECRET_FILE), but this program's "
                               "qcoll was built without OpenSSL (QCOLL_WITH_OPENSSL=OFF, or QCOLL_NO_OPENSSL defined) "
                               "and cannot authenticate ranks: build it with OpenSSL, or run the job without a secret "
                               "on a network you trust (QCOLL_SECRET set empty)",
                               where);
}

/// QCOLL_TLS into `j`, whose secret is already read: 1 or 0 (unset: 0); 1 needs a secret.
/// For launchers' programs that build their job themselves too (the PyTorch backend).
inline void read_tls(const lookup_function& lookup, job& j) {
  const auto tls = read_variable(lookup, variables::tls);
  if (!tls) return;
  if (*tls != "0" && *tls != "1")
    qcoll::detail::throw_error(errc::invalid_argument, "{}: QCOLL_TLS={} is not 1 or 0", environment_error_prefix, *tls);
  j.tls = *tls == "1";
  if (j.tls && j.secret.empty())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: QCOLL_TLS=1 without a secret: TLS's key derives from the job's secret; set "
                               "QCOLL_SECRET or QCOLL_SECRET_FILE (qcoll-run makes one)",
                               environment_error_prefix);
}

}  // namespace detail

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
  detail::require_authentication(result, environment_error_prefix);
  detail::read_tls(lookup, result);

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
