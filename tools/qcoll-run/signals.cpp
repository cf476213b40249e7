#include "signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace qcoll_run {
namespace {

int signal_pipe_write_fd = -1;

bool is_child_end(const siginfo_t& info) {
  return info.si_code == CLD_EXITED || info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
}

extern "C" void write_signal_to_pipe(int signal_number, siginfo_t* info, void*) {
  const int saved_errno = errno;
  received_signal record{signal_number, 0};
  // The pid only when the kernel reports a child's end: `kill -RTMIN <qcoll-run>` names no rank.
  if ((signal_number == SIGCHLD || signal_number == rank_end_signal()) && info != nullptr && is_child_end(*info)) {
    record.ended = info->si_pid;
  }
  // A record is far smaller than PIPE_BUF, so each write is whole. A full pipe drops it: the
  // loop then has plenty of signals to handle already, and reaps ends it missed when idle.
  if (::write(signal_pipe_write_fd, &record, sizeof record) < 0) {
  }
  errno = saved_errno;
}

}  // namespace

int rank_end_signal() noexcept {
#ifdef __linux__
  return SIGRTMIN;
#else
  return SIGCHLD;
#endif
}

signal_relay::signal_relay() : pipe_(make_pipe("signals")) {
  set_status_flag(pipe_.read_end.get(), O_NONBLOCK);
  set_status_flag(pipe_.write_end.get(), O_NONBLOCK);
  signal_pipe_write_fd = pipe_.write_end.get();

  std::copy(forwarded.begin(), forwarded.end(), handled_.begin());
  handled_count_ = forwarded.size();
  handled_[handled_count_++] = SIGCHLD;  // also the end of a rank started by fork()
  handled_[handled_count_++] = SIGPIPE;
  if (rank_end_signal() != SIGCHLD) handled_[handled_count_++] = rank_end_signal();

  struct sigaction relay {};
  relay.sa_sigaction = write_signal_to_pipe;
  relay.sa_flags = SA_SIGINFO | SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&relay.sa_mask);
  for (std::size_t i = 0; i < handled_count_; ++i) {
    ::sigaction(handled_[i], nullptr, &original_[i]);
    const bool is_forwarded = std::find(forwarded.begin(), forwarded.end(), handled_[i]) != forwarded.end();
    if (is_forwarded && original_[i].sa_handler == SIG_IGN) continue;  // ignored at start
    if (handled_[i] == SIGPIPE) {
      // A closed stdout must not kill qcoll-run while ranks run: write() reports EPIPE instead.
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      ::sigaction(SIGPIPE, &ignore, nullptr);
    } else {
      ::sigaction(handled_[i], &relay, nullptr);
    }
  }
}

signal_relay::~signal_relay() {
  restore_original_dispositions();
  signal_pipe_write_fd = -1;
}

std::vector<received_signal> signal_relay::take_pending() {
  std::vector<received_signal> pending;
  std::array<received_signal, 64> records;
  ssize_t count = 0;
  // Whole records only: each was written in one piece, and the buffer holds whole records.
  while ((count = ::read(read_fd(), records.data(), sizeof records)) > 0 || (count < 0 && errno == EINTR)) {
    pending.insert(pending.end(), records.begin(), records.begin() + std::max<ssize_t>(count, 0) / sizeof records[0]);
  }
  return pending;
}

void signal_relay::restore_original_dispositions() const noexcept {
  for (std::size_t i = 0; i < handled_count_; ++i) ::sigaction(handled_[i], &original_[i], nullptr);
}

std::string describe_signal(int signal_number) {
  static constexpr std::pair<int, const char*> names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
  };
  for (const auto& [number, name] : names) {
    if (number == signal_number) return fmt::format("{} ({})", name, number);
  }
  return std::to_string(signal_number);
}

}  // namespace qcoll_run
