#pragma once
/// @file
/// What launchers put in a rank's environment, and how it is read: qcoll's own variable
/// names, the four launcher families' rank and size variables, Slurm's node lists and
/// task counts, numbers, ports, host:port pairs and secret files — each read with an
/// error that names the variable and its value. environment.hpp's job_from_environment
/// applies the rules (its file comment) with these.

#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>

#include <qcoll/detail/format.hpp>

#include <cerrno>
#include <charconv>
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
inline constexpr const char* tls = "QCOLL_TLS";
inline constexpr const char* transport = "QCOLL_TRANSPORT";
inline constexpr const char* bind = "QCOLL_BIND";
inline constexpr const char* timeout_ms = "QCOLL_TIMEOUT_MS";
}  // namespace variables

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

}  // namespace qcoll::rendezvous
