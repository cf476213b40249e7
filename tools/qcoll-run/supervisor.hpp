// The job: starts the ranks, relays their output, forwards signals, reaps them, and stops
// the others when one fails.
//
// One thread, one poll(2) loop over the ranks' output pipes and a self-pipe into which the
// signal handler writes the signals received (the ranks' ends included): forwarding, reaping
// and output relaying all happen in that loop, none of it inside a signal handler.
#pragma once

#include "command_line.hpp"
#include "rank.hpp"
#include "signals.hpp"

#include <sys/resource.h>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace qcoll_run {

class job_supervisor {
 public:
  explicit job_supervisor(options job);
  job_supervisor(const job_supervisor&) = delete;
  job_supervisor& operator=(const job_supervisor&) = delete;
  // Only when qcoll-run itself fails midway: ranks must not be left running unsupervised.
  ~job_supervisor();

  /// Runs the job to its end; returns qcoll-run's exit status.
  int run();

 private:
  using clock_type = std::chrono::steady_clock;
  enum class read_outcome { data, nothing_yet, end_of_file };

  void start_ranks();
  void supervise();
  read_outcome relay_output(const rank_process& rank, output_stream& stream);
  void drain_outputs();
  void handle_signals();
  void reap(pid_t pid);
  void reap_any_ended();
  void on_rank_ended(rank_process& rank, int status);
  void stop_remaining_ranks();
  void enforce_deadlines();
  int poll_timeout_ms() const;

  options options_;
  signal_relay signals_;
  std::vector<rank_process> ranks_;
  std::string job_id_;
  rlimit original_file_limit_{};
  bool file_limit_raised_ = false;
  int running_ranks_ = 0;
  struct failure {
    int status;   // qcoll-run's exit status for it
    bool killed;  // by SIGKILL
  };
  std::optional<failure> first_failure_;
  bool stopping_ = false;
  bool timed_out_ = false;
  std::optional<clock_type::time_point> timeout_deadline_, kill_deadline_;
  std::array<char, 64 * 1024> read_buffer_{};
};

}  // namespace qcoll_run
