// One rank of a job: its process, its output pipes, and how it is started.
#pragma once

#include "command_line.hpp"
#include "signals.hpp"
#include "system.hpp"

#include <sched.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <optional>
#include <string>
#include <vector>

namespace qcoll_run {

/// waitpid() flags that find every rank: on Linux a rank is a "clone" child (see start_rank),
/// which waitpid() skips without __WALL.
#ifdef __linux__
inline constexpr int wait_all_children = __WALL;
#else
inline constexpr int wait_all_children = 0;
#endif

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
  bool sent_sigkill = false;            // by qcoll-run
  bool ending_at_first_failure = false;  // had begun to exit, not by qcoll-run's SIGKILL, when
                                         // the first failure was reported
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
/// two pipes, bound to a CPU as `launch.bind` says, and reporting its end with
/// rank_end_signal(). Throws cannot_run_error when the program cannot be run.
void start_rank(rank_process& rank, const rank_launch& launch, std::vector<std::string> environment);

/// Whether the rank's process has begun to exit (or has ended) and is not reaped yet: Linux's
/// PF_EXITING flag in /proc/<pid>/stat. False where that cannot be read.
bool has_begun_to_exit(const rank_process& rank);

/// The whole process group, so that the rank's own child processes get the signal too.
void signal_rank(const rank_process& rank, int signal_number);

}  // namespace qcoll_run
