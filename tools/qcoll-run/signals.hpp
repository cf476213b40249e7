// Signals: the ones qcoll-run forwards to the ranks, and the ones that report a rank's end.
#pragma once

#include "system.hpp"

#include <signal.h>
#include <sys/types.h>

#include <array>
#include <string>
#include <vector>

namespace qcoll_run {

/// The signal a rank's end is reported with. A rank started by start_rank (rank.hpp) on
/// Linux reports it with a real-time signal: those are queued one per rank, in the order the
/// ranks ended, where SIGCHLD coalesces the ends of ranks that end close together into one
/// signal, after which waitpid(-1) finds them in the order they were started, not ended.
int rank_end_signal() noexcept;

/// One signal qcoll-run received, in the order received.
struct received_signal {
  int number = 0;
  pid_t ended = 0;  // for a child's end (rank_end_signal or SIGCHLD): the child; else 0
};

// Routes the rank-end signals and the forwarded signals into a pipe that the poll loop reads.
// A forwarded signal that was ignored when qcoll-run started (nohup, a non-interactive shell's
// background job) stays ignored, for qcoll-run and for the ranks, as a shell would leave it.
class signal_relay {
 public:
  signal_relay();
  signal_relay(const signal_relay&) = delete;
  signal_relay& operator=(const signal_relay&) = delete;
  ~signal_relay();

  int read_fd() const noexcept { return pipe_.read_end.get(); }

  /// The signals received since the last call, oldest first.
  std::vector<received_signal> take_pending();

  /// Async-signal-safe: called in a forked child before exec.
  void restore_original_dispositions() const noexcept;

  /// Forwarded to every running rank.
  static constexpr std::array forwarded{SIGINT, SIGTERM, SIGHUP, SIGQUIT};

 private:
  // forwarded, then SIGCHLD, SIGPIPE and rank_end_signal() where that is not SIGCHLD.
  std::array<int, forwarded.size() + 3> handled_{};
  std::size_t handled_count_ = 0;
  std::array<struct sigaction, forwarded.size() + 3> original_{};
  pipe_ends pipe_;
};

/// "SIGKILL (9)", or the number for a signal without a name here.
std::string describe_signal(int signal_number);

}  // namespace qcoll_run
