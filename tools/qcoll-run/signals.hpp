// Signals: the ones qcoll-run forwards to the ranks, and SIGCHLD.
#pragma once

#include "system.hpp"

#include <signal.h>

#include <array>
#include <string>
#include <vector>

namespace qcoll_run {

// Routes SIGCHLD and the forwarded signals into a pipe that the poll loop reads.
// A forwarded signal that was ignored when qcoll-run started (nohup, a non-interactive shell's
// background job) stays ignored, for qcoll-run and for the ranks, as a shell would leave it.
class signal_relay {
 public:
  signal_relay();
  signal_relay(const signal_relay&) = delete;
  signal_relay& operator=(const signal_relay&) = delete;
  ~signal_relay();

  int read_fd() const noexcept { return pipe_.read_end.get(); }

  /// The numbers of the signals received since the last call, oldest first.
  std::vector<int> take_pending();

  /// Async-signal-safe: called in a forked child before exec.
  void restore_original_dispositions() const noexcept;

  /// Forwarded to every running rank.
  static constexpr std::array forwarded{SIGINT, SIGTERM, SIGHUP, SIGQUIT};

 private:
  // forwarded, then SIGCHLD and SIGPIPE.
  std::array<int, forwarded.size() + 2> handled_{};
  std::array<struct sigaction, forwarded.size() + 2> original_{};
  pipe_ends pipe_;
};

/// "SIGKILL (9)", or the number for a signal without a name here.
std::string describe_signal(int signal_number);

}  // namespace qcoll_run
