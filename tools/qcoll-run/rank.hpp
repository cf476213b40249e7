// One rank of a job: its process, its output pipes, and how it is started.
#pragma once

#include "command_line.hpp"
#include "signals.hpp"
#include "system.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace qcoll_run {

struct output_stream {
  file_descriptor pipe;      // read end; reset at end of file
  int destination = -1;      // qcoll-run's STDOUT_FILENO or STDERR_FILENO
  std::string partial_line;  // bytes after the last newline relayed
};

struct rank_process {
  int index = 0;
  std::string prefix;  // "[index] "
  pid_t pid = -1;
  bool running = false;
  bool stopped_by_launcher = false;  // its end is no news: qcoll-run asked for it
  output_stream out, err;
};

/// How every rank of a job is started.
struct rank_launch {
  const std::vector<std::string>* command;
  int stdin_fd;                       // rank 0's; the others get stdin_others
  int stdin_others;
  const signal_relay* signals;
  const rlimit* original_file_limit;  // null: unchanged
  binding bind;
  int ranks;
};

/// Starts `rank.index` with `environment`: in a process group of its own, with its output on
/// two pipes, bound to a CPU as `launch.bind` says. Throws cannot_run_error when the program
/// cannot be run.
void start_rank(rank_process& rank, const rank_launch& launch, std::vector<std::string> environment);

/// The whole process group, so that the rank's own child processes get the signal too.
void signal_rank(const rank_process& rank, int signal_number);

}  // namespace qcoll_run
