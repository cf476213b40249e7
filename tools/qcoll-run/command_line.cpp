#include "command_line.hpp"

#include "job_environment.hpp"
#include "system.hpp"

#include <qcoll/rendezvous/environment.hpp>

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string_view>
#include <system_error>
#include <vector>

namespace qcoll_run {
namespace {

using qcoll::rendezvous::transport_kind;

int parse_rank_count(std::string_view text, std::string_view option = "-n") {
  int count = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (error != std::errc{} || end != text.data() + text.size() || count < 1 || count > max_ranks) {
    throw usage_error(fmt::format("{} needs a number of ranks from 1 to {}, not '{}'", option, max_ranks, text));
  }
  return count;
}

/// "shm, tcp or cuda_peer": the launcher starts one transport, so every named one but auto.
std::string launched_transport_names() {
  std::vector<std::string> names;
  for (const transport_kind named : qcoll::rendezvous::named_transports)
    if (named != transport_kind::automatic) names.emplace_back(to_string(named));
  std::string text;
  for (std::size_t k = 0; k < names.size(); ++k)
    text += (k == 0 ? "" : k + 1 == names.size() ? " or " : ", ") + names[k];
  return text;
}

double parse_seconds(std::string_view option, std::string_view text, bool zero_allowed) {
  double seconds = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (error != std::errc{} || end != text.data() + text.size() || !std::isfinite(seconds) || seconds < 0 ||
      (seconds == 0 && !zero_allowed) || seconds > max_seconds) {
    throw usage_error(fmt::format("{} needs a {} number of seconds, not '{}'", option,
                                  zero_allowed ? "non-negative" : "positive", text));
  }
  return seconds;
}

}  // namespace

std::string usage_text() {
  // The variables come from the list qcoll-run sets, so that the help names exactly those,
  // wrapped at 88 columns.
  std::string variables;
  std::size_t line_length = 0;
  for (std::size_t i = 0; i < variables_set_per_job.size(); ++i) {
    const bool last = i + 1 == variables_set_per_job.size();
    const std::string item = fmt::format("{}{}", variables_set_per_job[i], last ? "" : i + 2 == variables_set_per_job.size() ? " and" : ",");
    if (i > 0 && line_length + 1 + item.size() > 88) {
      variables += '\n';
      line_length = 0;
    } else if (i > 0) {
      variables += ' ';
      ++line_length;
    }
    variables += item;
    line_length += item.size();
  }
  return fmt::format(R"(Usage: qcoll-run -n N [options] [--] program [arguments...]

Starts N ranks of a qcoll job on this machine, each running `program arguments...` with
{} set. Every line a rank prints is
prefixed with "[rank] ", on stdout or stderr as the rank printed it.

Options:
  -n N                 number of ranks, 1 to {} (required)
  --transport NAME     the ranks' {}: {} (default: shm)
  --ranks-per-node K   run the ranks as nodes of K (K divides N): rank r gets local rank
                       r mod K and a local world of K, as on N/K hosts (for programs that
                       join a node transport beside the job's, launch::join_nodes)
  --bind core|none     pin rank r to the r-th CPU qcoll-run may use (default: core when
                       there are at least N such CPUs, else none; as Open MPI binds)
  --keep-going         when a rank fails, let the other ranks finish
  --timeout SECONDS    stop the job when it runs longer than this (exit status 124)
  --grace SECONDS      time from SIGTERM to SIGKILL when stopping ranks (default: 5)
  -h, --help           print this help and exit
  --version            print the qcoll version and exit

{} and {} are kept when set (a non-empty job id), else generated; no secret
is generated when {} names a file that holds it (the ranks read it there), or
when qcoll was built without OpenSSL (it cannot authenticate); an empty secret
(QCOLL_SECRET=) runs the job without authentication.
SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every running rank. When a rank
fails, the others are stopped: SIGTERM, then SIGKILL after the grace period. At the end,
shared memory left in /dev/shm by the job (qcoll-<job id>) is removed.

Exit status: 0 when every rank exits 0, else the status of the first rank that failed
(128 + the signal number for a rank killed by a signal); 124 when the job timed out;
127 when the program cannot be run; 2 on bad usage; 125 when qcoll-run itself fails.
)",
                     variables, max_ranks, qcoll::rendezvous::variables::transport, launched_transport_names(),
                     qcoll::rendezvous::variables::job_id, qcoll::rendezvous::variables::secret,
                     qcoll::rendezvous::variables::secret_file);
}

command_line parse_command_line(int argc, char** argv) {
  options parsed;
  bool ranks_given = false;
  int index = 1;
  // The value of an option: "--name=value", "-nvalue" or the next argument.
  const auto value_of = [&](std::string_view arg, std::string_view name) -> std::string_view {
    if (arg.size() > name.size()) return arg.substr(name.size() + (arg[name.size()] == '=' ? 1 : 0));
    if (index + 1 >= argc) throw usage_error(fmt::format("option '{}' needs a value", name));
    return argv[++index];
  };
  const auto is_option = [](std::string_view arg, std::string_view name) {
    return arg == name || (arg.starts_with(name) && (name == "-n" || arg[name.size()] == '='));
  };

  for (; index < argc; ++index) {
    const std::string_view arg = argv[index];
    if (arg == "--") {
      ++index;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    if (arg == "-h" || arg == "--help") return show_help{};
    if (arg == "--version") return show_version{};
    if (arg == "--keep-going") {
      parsed.keep_going = true;
    } else if (is_option(arg, "-n")) {
      parsed.ranks = parse_rank_count(value_of(arg, "-n"));
      ranks_given = true;
    } else if (is_option(arg, "--transport")) {
      parsed.transport = value_of(arg, "--transport");
      const auto kind = qcoll::rendezvous::parse_transport(parsed.transport);
      if (!kind || *kind == transport_kind::automatic) {
        throw usage_error(fmt::format("--transport is {}, not '{}'", launched_transport_names(), parsed.transport));
      }
    } else if (is_option(arg, "--ranks-per-node")) {
      parsed.ranks_per_node = parse_rank_count(value_of(arg, "--ranks-per-node"), "--ranks-per-node");
    } else if (is_option(arg, "--bind")) {
      const std::string_view how = value_of(arg, "--bind");
      if (how != "core" && how != "none") throw usage_error(fmt::format("--bind is core or none, not '{}'", how));
      parsed.bind = how == "core" ? binding::core : binding::none;
    } else if (is_option(arg, "--timeout")) {
      parsed.timeout_seconds = parse_seconds("--timeout", value_of(arg, "--timeout"), false);
    } else if (is_option(arg, "--grace")) {
      parsed.grace_seconds = parse_seconds("--grace", value_of(arg, "--grace"), true);
    } else {
      throw usage_error(fmt::format("unknown option '{}'", arg));
    }
  }
  if (!ranks_given) throw usage_error("the number of ranks is missing (-n N)");
  if (parsed.ranks_per_node != 0 && parsed.ranks % parsed.ranks_per_node != 0)
    throw usage_error(fmt::format("--ranks-per-node {} does not divide -n {}", parsed.ranks_per_node, parsed.ranks));
  if (index >= argc) throw usage_error("the program to run is missing");
  parsed.command.assign(argv + index, argv + argc);
  return parsed;
}

}  // namespace qcoll_run
