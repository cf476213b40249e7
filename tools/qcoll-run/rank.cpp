#include "rank.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/sched.h>
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <system_error>

extern char** environ;

namespace qcoll_run {
namespace {

/// The CPU rank `index` is pinned to, if any: ranks that each have a core of their own
/// and stay on it poll their peers without migrating (measured: 1 MiB shm allreduce with
/// 2 ranks, 2.9–3.4 GB/s unbound against 5.4–6.0 bound).
std::optional<cpu_set_t> cpu_for(binding bind, int ranks, int index) {
  if (bind == binding::none) return std::nullopt;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return std::nullopt;
  const int usable = CPU_COUNT(&allowed);
  if (bind == binding::automatic && usable < ranks) return std::nullopt;
  int wanted = index % usable;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    if (wanted-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      return one;
    }
  }
  return std::nullopt;
}

// Everything a forked child needs, prepared before fork(): the child only makes system calls.
struct child_setup {
  char* const* argv;
  char* const* envp;
  int stdin_fd, stdout_fd, stderr_fd, exec_error_fd;
  pid_t launcher_pid;
  const signal_relay* signals;
  const sigset_t* original_mask;
  const rlimit* original_file_limit;  // null: unchanged
  const cpu_set_t* cpu;               // null: not bound
};

[[noreturn]] void exec_rank(const child_setup& setup) noexcept {
  ::setpgid(0, 0);
#ifdef __linux__
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != setup.launcher_pid) ::_exit(exit_launcher_failed);  // it died before prctl
#endif
  // Descriptors 0-2 of qcoll-run are open (see main), so the pipes are never 0-2 themselves and
  // dup2 always clears their close-on-exec flag.
  if (setup.stdin_fd != STDIN_FILENO) ::dup2(setup.stdin_fd, STDIN_FILENO);
  ::dup2(setup.stdout_fd, STDOUT_FILENO);
  ::dup2(setup.stderr_fd, STDERR_FILENO);
  if (setup.original_file_limit != nullptr) ::setrlimit(RLIMIT_NOFILE, setup.original_file_limit);
  if (setup.cpu != nullptr) ::sched_setaffinity(0, sizeof(cpu_set_t), setup.cpu);
  setup.signals->restore_original_dispositions();
  ::sigprocmask(SIG_SETMASK, setup.original_mask, nullptr);
  environ = const_cast<char**>(setup.envp);
  ::execvp(setup.argv[0], setup.argv);
  const int error = errno;
  if (::write(setup.exec_error_fd, &error, sizeof error) < 0) {
  }
  ::_exit(exit_cannot_run);
}

// fork(), except that on Linux the child's end is reported with rank_end_signal() instead of
// SIGCHLD (clone3's exit_signal), so that ends are queued in the order they happen. The child
// only makes system calls until it execs (exec_rank), so skipping fork()'s library
// bookkeeping in it is safe, as in a vfork child. Before Linux 5.3 (no clone3) it is fork(),
// and ends are reported with SIGCHLD.
pid_t start_process() {
#if defined(__linux__) && defined(SYS_clone3)
  clone_args args{};
  args.exit_signal = static_cast<std::uint64_t>(rank_end_signal());
  const long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid >= 0 || errno != ENOSYS) return static_cast<pid_t>(pid);
#endif
  return ::fork();
}

}  // namespace

void start_rank(rank_process& rank, const rank_launch& launch, std::vector<std::string> environment) {
  std::vector<char*> envp;
  for (auto& variable : environment) envp.push_back(variable.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const auto& arg : *launch.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);

  const auto purpose = fmt::format("rank {}", rank.index);
  pipe_ends out = make_pipe(purpose), err = make_pipe(purpose);
  // Closed by a successful exec; otherwise the child writes errno into it.
  pipe_ends exec_error = make_pipe(purpose);

  // Signals stay blocked across fork() so that the child never runs qcoll-run's handler
  // (which would write into qcoll-run's signal pipe); the child unblocks after resetting them.
  sigset_t all, original_mask;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &original_mask);
  const std::optional<cpu_set_t> cpu = cpu_for(launch.bind, launch.ranks, rank.index);
  const child_setup setup{argv.data(),
                          envp.data(),
                          rank.index == 0 ? launch.stdin_fd : launch.stdin_others,
                          out.write_end.get(),
                          err.write_end.get(),
                          exec_error.write_end.get(),
                          ::getpid(),
                          launch.signals,
                          &original_mask,
                          launch.original_file_limit,
                          cpu ? &*cpu : nullptr};
  const pid_t pid = start_process();
  if (pid == 0) exec_rank(setup);
  const int start_error = errno;
  ::sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  if (pid < 0) throw_system_error(fmt::format("cannot start rank {}", rank.index), start_error);

  ::setpgid(pid, pid);  // in both processes: the group exists whichever of them runs first
  rank.pid = pid;
  rank.running = true;
  exec_error.write_end.reset();
  out.write_end.reset();
  err.write_end.reset();

  int error = 0;
  ssize_t count = 0;
  do {
    count = ::read(exec_error.read_end.get(), &error, sizeof error);
  } while (count < 0 && errno == EINTR);
  if (count == sizeof error) {
    ::waitpid(pid, nullptr, wait_all_children);
    rank.running = false;
    throw cannot_run_error(fmt::format("cannot run '{}': {}", launch.command->front(), std::strerror(error)));
  }

  set_status_flag(out.read_end.get(), O_NONBLOCK);
  set_status_flag(err.read_end.get(), O_NONBLOCK);
  rank.out = {std::move(out.read_end), STDOUT_FILENO, {}};
  rank.err = {std::move(err.read_end), STDERR_FILENO, {}};
}

bool has_begun_to_exit(const rank_process& rank) {
  const file_descriptor stat(::open(fmt::format("/proc/{}/stat", rank.pid).c_str(), O_RDONLY | O_CLOEXEC));
  if (!stat) return false;
  char buffer[512];
  const ssize_t count = ::read(stat.get(), buffer, sizeof buffer - 1);
  if (count <= 0) return false;
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold anything, so
  // the fields are counted from its last ')'.
  const std::string_view fields(buffer, static_cast<std::size_t>(count));
  const auto comm_end = fields.rfind(')');
  if (comm_end == std::string_view::npos) return false;
  long long values[6] = {};  // ppid pgrp session tty_nr tpgid flags (tpgid may be -1)
  const char* position = buffer + comm_end + 1;
  const char* const end = buffer + count;
  while (position < end && *position == ' ') ++position;
  if (position == end) return false;
  const char state = *position++;
  for (auto& value : values) {
    while (position < end && *position == ' ') ++position;
    const auto [next, error] = std::from_chars(position, end, value);
    if (error != std::errc{}) return false;
    position = next;
  }
  constexpr long long pf_exiting = 0x4;  // include/linux/sched.h
  return state == 'Z' || state == 'X' || (values[5] & pf_exiting) != 0;
}

void signal_rank(const rank_process& rank, int signal_number) {
  if (::kill(-rank.pid, signal_number) != 0 && errno == ESRCH) ::kill(rank.pid, signal_number);
}

}  // namespace qcoll_run
