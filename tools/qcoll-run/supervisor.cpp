#include "supervisor.hpp"

#include "job_environment.hpp"
#include "shm_cleanup.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace qcoll_run {
namespace {

constexpr std::size_t max_line_bytes = 64 * 1024;  // longer lines are relayed in pieces

// A rank's end is normally reported by a signal; this bounds how long one whose signal was
// lost (the real-time signal queue full) stays unreaped while nothing else happens.
constexpr int idle_reap_ms = 1000;

std::chrono::steady_clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace

job_supervisor::job_supervisor(options job)
    : options_(std::move(job)), ranks_(static_cast<std::size_t>(options_.ranks)) {}

job_supervisor::~job_supervisor() {
  for (auto& rank : ranks_) {
    if (!rank.running) continue;
    signal_rank(rank, SIGKILL);
    ::waitpid(rank.pid, nullptr, wait_all_children);
  }
}

int job_supervisor::run() {
  start_ranks();
  supervise();
  remove_leftover_shared_memory(job_id_);
  return timed_out_ ? exit_timed_out : first_failure_ ? first_failure_->status : 0;
}

void job_supervisor::start_ranks() {
  // qcoll-run keeps two pipes per rank open: the usual soft limit of 1024 descriptors is too
  // few for 1024 ranks, so it is raised as far as needed (ranks get the original limit back).
  if (::getrlimit(RLIMIT_NOFILE, &original_file_limit_) == 0) {
    rlimit raised = original_file_limit_;
    raised.rlim_cur = std::min<rlim_t>(raised.rlim_max, 2 * ranks_.size() + 64);
    file_limit_raised_ = raised.rlim_cur > original_file_limit_.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  const job_environment environment = make_job_environment(options_.ranks, options_.ranks_per_node, options_.transport);
  job_id_ = environment.job_id;
  // A terminal stays with qcoll-run: a rank outside the terminal's foreground process group
  // that read it would be stopped (SIGTTIN). A file or pipe goes to rank 0, as mpirun does.
  const file_descriptor dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null) throw_system_error("cannot open /dev/null");
  const rank_launch launch{&options_.command,
                           ::isatty(STDIN_FILENO) ? dev_null.get() : STDIN_FILENO,
                           dev_null.get(),
                           &signals_,
                           file_limit_raised_ ? &original_file_limit_ : nullptr,
                           options_.bind,
                           options_.ranks};

  for (std::size_t index = 0; index < ranks_.size(); ++index) {
    auto& rank = ranks_[index];
    rank.index = static_cast<int>(index);
    rank.prefix = fmt::format("[{}] ", index);
    start_rank(rank, launch, rank_environment(environment, rank.index));
    ++running_ranks_;
  }
  if (options_.timeout_seconds) timeout_deadline_ = clock_type::now() + to_duration(*options_.timeout_seconds);
}

// The event loop: relays output, handles signals and deadlines until every rank has ended.
void job_supervisor::supervise() {
  std::vector<pollfd> polled;
  std::vector<std::pair<rank_process*, output_stream*>> polled_streams;
  while (running_ranks_ > 0) {
    polled.assign(1, pollfd{signals_.read_fd(), POLLIN, 0});
    polled_streams.clear();
    for (auto& rank : ranks_) {
      for (auto* stream : {&rank.out, &rank.err}) {
        if (!stream->pipe) continue;
        polled.push_back({stream->pipe.get(), POLLIN, 0});
        polled_streams.emplace_back(&rank, stream);
      }
    }
    const int ready = ::poll(polled.data(), polled.size(), poll_timeout_ms());
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw_system_error("poll");
    }
    for (std::size_t i = 1; i < polled.size(); ++i) {
      if (polled[i].revents != 0) relay_output(*polled_streams[i - 1].first, *polled_streams[i - 1].second);
    }
    if (polled[0].revents != 0) handle_signals();
    if (ready == 0) {
      handle_signals();  // the ends reported so far first, in order
      reap_any_ended();
    }
    enforce_deadlines();
  }
  drain_outputs();
}

// Reads what one pipe holds and relays every complete line (and, at end of file, the last
// partial one) with the rank's prefix, in one write.
job_supervisor::read_outcome job_supervisor::relay_output(const rank_process& rank, output_stream& stream) {
  const ssize_t count = ::read(stream.pipe.get(), read_buffer_.data(), read_buffer_.size());
  if (count < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return read_outcome::nothing_yet;
  const bool end_of_file = count <= 0;  // a read error ends the stream just the same
  if (!end_of_file) stream.partial_line.append(read_buffer_.data(), static_cast<std::size_t>(count));

  std::string relayed;
  std::string_view pending = stream.partial_line;
  while (!pending.empty()) {
    const auto newline = pending.find('\n');
    const bool line_complete = newline != std::string_view::npos && newline < max_line_bytes;
    if (!line_complete && !end_of_file && pending.size() < max_line_bytes) break;
    const auto length = line_complete ? newline + 1 : std::min(pending.size(), max_line_bytes);
    relayed += rank.prefix;
    relayed += pending.substr(0, length);
    if (!line_complete) relayed += '\n';
    pending.remove_prefix(length);
  }
  stream.partial_line.erase(0, stream.partial_line.size() - pending.size());
  sink.write(stream.destination, relayed);
  if (!end_of_file) return read_outcome::data;
  stream.pipe.reset();
  return read_outcome::end_of_file;
}

// Every rank has ended, but a process it started in the background may still hold its pipes:
// relay what they hold now instead of waiting for end of file.
void job_supervisor::drain_outputs() {
  for (auto& rank : ranks_) {
    for (auto* stream : {&rank.out, &rank.err}) {
      // Bounded, in case such a process keeps writing.
      for (int reads = 0; stream->pipe && reads < 64; ++reads) {
        if (relay_output(rank, *stream) != read_outcome::data) break;
      }
      if (stream->pipe && !stream->partial_line.empty()) {
        sink.write(stream->destination, rank.prefix + stream->partial_line + '\n');
      }
      stream->pipe.reset();
    }
  }
}

void job_supervisor::handle_signals() {
  bool coalesced = false;
  for (const auto& received : signals_.take_pending()) {
    if (received.number == rank_end_signal() || received.number == SIGCHLD) {
      // Ends are reaped in the order they were reported, which is the order the ranks ended:
      // that order decides which failure is the first.
      if (received.ended > 0) reap(received.ended);
      // One SIGCHLD may stand for several ends (a rank started by fork(): see start_process).
      coalesced = coalesced || received.number == SIGCHLD;
      continue;
    }
    if (running_ranks_ == 0) continue;
    note("forwarding {} to {} running rank(s)", describe_signal(received.number), running_ranks_);
    for (auto& rank : ranks_) {
      if (rank.running) signal_rank(rank, received.number);
    }
  }
  if (coalesced) reap_any_ended();
}

void job_supervisor::reap(pid_t pid) {
  const auto rank = std::find_if(ranks_.begin(), ranks_.end(), [&](const auto& r) { return r.pid == pid; });
  if (rank == ranks_.end() || !rank->running) return;  // not a rank, or reaped already
  int status = 0;
  if (::waitpid(pid, &status, WNOHANG | wait_all_children) == pid) on_rank_ended(*rank, status);
}

// Every rank that has ended, in an order waitpid() chooses (the order they were started):
// only for ends no signal named.
void job_supervisor::reap_any_ended() {
  int status = 0;
  pid_t pid = 0;
  while ((pid = ::waitpid(-1, &status, WNOHANG | wait_all_children)) > 0) {
    const auto rank = std::find_if(ranks_.begin(), ranks_.end(), [&](const auto& r) { return r.pid == pid; });
    if (rank != ranks_.end() && rank->running) on_rank_ended(*rank, status);
  }
}

void job_supervisor::on_rank_ended(rank_process& rank, int status) {
  rank.running = false;
  --running_ranks_;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;

  const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  // A rank killed by SIGKILL that had begun to exit when the first failure was reported failed
  // before it: a killed rank's peers notice its loss as soon as its sockets close, and may be
  // reported before it. SIGKILL cannot be caught, so it is never a rank's reaction to another's
  // failure: it comes from outside (the OOM killer, a user, a watchdog); ranks qcoll-run sent
  // SIGKILL are not marked.
  const bool killed_before_first_failure = killed && rank.ending_at_first_failure;
  if (!first_failure_ || (killed_before_first_failure && !first_failure_->killed)) {
    first_failure_ = failure{code, killed};
    for (auto& other : ranks_) {
      other.ending_at_first_failure = other.running && !other.sent_sigkill && has_begun_to_exit(other);
    }
  }
  if (rank.stopped_by_launcher && !killed_before_first_failure) return;
  if (WIFSIGNALED(status)) {
    note("rank {} was killed by signal {}", rank.index, describe_signal(WTERMSIG(status)));
  } else {
    note("rank {} exited with status {}", rank.index, code);
  }
  if (!options_.keep_going && !stopping_ && running_ranks_ > 0) {
    note("stopping the {} other running rank(s) (--keep-going lets them finish)", running_ranks_);
    stop_remaining_ranks();
  }
}

// SIGTERM now, SIGKILL after the grace period to ranks that are still running then.
void job_supervisor::stop_remaining_ranks() {
  stopping_ = true;
  timeout_deadline_.reset();
  kill_deadline_ = clock_type::now() + to_duration(options_.grace_seconds);
  for (auto& rank : ranks_) {
    if (!rank.running) continue;
    rank.stopped_by_launcher = true;
    signal_rank(rank, SIGTERM);
  }
}

void job_supervisor::enforce_deadlines() {
  const auto now = clock_type::now();
  if (timeout_deadline_ && now >= *timeout_deadline_) {
    note("job timed out after {} s", *options_.timeout_seconds);
    timed_out_ = true;
    stop_remaining_ranks();
  }
  if (kill_deadline_ && now >= *kill_deadline_) {
    kill_deadline_.reset();
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      note("rank {} is still running {} s after SIGTERM; sending SIGKILL", rank.index, options_.grace_seconds);
      rank.sent_sigkill = true;
      signal_rank(rank, SIGKILL);
    }
  }
}

int job_supervisor::poll_timeout_ms() const {
  std::optional<clock_type::time_point> next;
  for (const auto& deadline : {timeout_deadline_, kill_deadline_}) {
    if (deadline && (!next || *deadline < *next)) next = deadline;
  }
  if (!next) return idle_reap_ms;
  const auto remaining = std::chrono::ceil<std::chrono::milliseconds>(*next - clock_type::now());
  return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(remaining.count(), 0, idle_reap_ms));
}

}  // namespace qcoll_run
