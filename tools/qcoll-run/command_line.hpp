// qcoll-run's command line: what a job is asked to be.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace qcoll_run {

inline constexpr int max_ranks = 1024;
inline constexpr double max_seconds = 1e9;  // keeps deadlines within steady_clock's range

enum class binding { automatic, core, none };

struct options {
  int ranks = 0;
  int ranks_per_node = 0;  // --ranks-per-node: nodes of this many ranks on this machine; 0: one node
  std::string transport = "shm";
  binding bind = binding::automatic;
  bool keep_going = false;
  std::optional<double> timeout_seconds;
  double grace_seconds = 5;
  std::vector<std::string> command;
};

struct show_help {};
struct show_version {};
using command_line = std::variant<options, show_help, show_version>;

/// Throws usage_error for a command line that asks for no valid job.
command_line parse_command_line(int argc, char** argv);

/// The text of --help.
std::string usage_text();

}  // namespace qcoll_run
