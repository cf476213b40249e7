#include "signals.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace qcoll_run {
namespace {

int signal_pipe_write_fd = -1;

extern "C" void write_signal_to_pipe(int signal_number) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(signal_number);
  // A full pipe drops the byte: the loop then has plenty of signals to handle already.
  if (::write(signal_pipe_write_fd, &byte, 1) < 0) {
  }
  errno = saved_errno;
}

}  // namespace

signal_relay::signal_relay() : pipe_(make_pipe("signals")) {
  set_status_flag(pipe_.read_end.get(), O_NONBLOCK);
  set_status_flag(pipe_.write_end.get(), O_NONBLOCK);
  signal_pipe_write_fd = pipe_.write_end.get();

  std::copy(forwarded.begin(), forwarded.end(), handled_.begin());
  handled_[forwarded.size()] = SIGCHLD;
  handled_[forwarded.size() + 1] = SIGPIPE;

  struct sigaction relay {};
  relay.sa_handler = write_signal_to_pipe;
  relay.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&relay.sa_mask);
  for (std::size_t i = 0; i < handled_.size(); ++i) {
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

std::vector<int> signal_relay::take_pending() {
  std::vector<int> pending;
  unsigned char bytes[256];
  ssize_t count = 0;
  while ((count = ::read(read_fd(), bytes, sizeof bytes)) > 0 || (count < 0 && errno == EINTR)) {
    pending.insert(pending.end(), bytes, bytes + std::max<ssize_t>(count, 0));
  }
  return pending;
}

void signal_relay::restore_original_dispositions() const noexcept {
  for (std::size_t i = 0; i < handled_.size(); ++i) ::sigaction(handled_[i], &original_[i], nullptr);
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
