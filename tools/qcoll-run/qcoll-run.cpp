// qcoll-run: starts the N ranks of a qcoll job on this machine and supervises them.
//
//   qcoll-run -n N [--transport shm|tcp] [--bind core|none] [--keep-going] [--timeout S] [--grace S] [--] program args...
//
// Design choices:
// - Each rank runs in a process group of its own, and qcoll-run signals the whole group, so a
//   rank's helper processes stop with it. A terminal's Ctrl-C then reaches qcoll-run alone, which
//   forwards it exactly once; ranks left in qcoll-run's group would get it twice, and
//   `kill -TERM <qcoll-run>` would not reach them at all.
// - One thread, one poll(2) loop over the ranks' output pipes and a self-pipe into which the
//   signal handler writes the signal number (SIGCHLD included): forwarding, reaping and output
//   relaying all happen in that loop, none of it inside a signal handler.
// - QCOLL_STORE names a loopback port that was free when qcoll-run looked (bind to port 0, then
//   close). Another process may take it before rank 0 binds it; rank 0 then fails to serve the
//   store and the job fails at rendezvous. The window is short, and a rerun picks a new port.
// - On Linux a rank gets SIGKILL when qcoll-run dies (PR_SET_PDEATHSIG): ranks must not outlive
//   the process that would stop and reap them.

#include <qcoll/version.hpp>

#include <fmt/format.h>

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

extern char** environ;

namespace {

constexpr int exit_usage = 2;
constexpr int exit_timed_out = 124;  // as timeout(1)
constexpr int exit_launcher_failed = 125;
constexpr int exit_cannot_run = 127;
constexpr int max_ranks = 1024;
constexpr std::size_t max_line_bytes = 64 * 1024;  // longer lines are relayed in pieces
constexpr double max_seconds = 1e9;                // keeps deadlines within steady_clock's range

using clock_type = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Errors

class usage_error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class cannot_run_error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failing system call in qcoll-run itself (exit status 125).
[[noreturn]] void throw_system_error(std::string_view what, int error = errno) {
  throw std::system_error(error, std::generic_category(), std::string(what));
}

// ---------------------------------------------------------------------------------------------
// Command line

enum class binding { automatic, core, none };

struct options {
  int ranks = 0;
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

constexpr std::string_view usage_text = R"(Usage: qcoll-run -n N [options] [--] program [arguments...]

Starts N ranks of a qcoll job on this machine, each running `program arguments...` with
QCOLL_RANK, QCOLL_WORLD_SIZE, QCOLL_LOCAL_RANK, QCOLL_LOCAL_WORLD_SIZE, QCOLL_STORE,
QCOLL_JOB_ID, QCOLL_SECRET and QCOLL_TRANSPORT set. Every line a rank prints is
prefixed with "[rank] ", on stdout or stderr as the rank printed it.

Options:
  -n N                 number of ranks, 1 to 1024 (required)
  --transport shm|tcp  the ranks' QCOLL_TRANSPORT (default: shm)
  --bind core|none     pin rank r to the r-th CPU qcoll-run may use (default: core when
                       there are at least N such CPUs, else none; as Open MPI binds)
  --keep-going         when a rank fails, let the other ranks finish
  --timeout SECONDS    stop the job when it runs longer than this (exit status 124)
  --grace SECONDS      time from SIGTERM to SIGKILL when stopping ranks (default: 5)
  -h, --help           print this help and exit
  --version            print the qcoll version and exit

QCOLL_JOB_ID and QCOLL_SECRET are kept when set (a non-empty job id), else generated.
SIGINT, SIGTERM, SIGHUP and SIGQUIT are forwarded to every running rank. When a rank
fails, the others are stopped: SIGTERM, then SIGKILL after the grace period. At the end,
shared memory left in /dev/shm by the job (qcoll-<job id>) is removed.

Exit status: 0 when every rank exits 0, else the status of the first rank that failed
(128 + the signal number for a rank killed by a signal); 124 when the job timed out;
127 when the program cannot be run; 2 on bad usage; 125 when qcoll-run itself fails.
)";

int parse_rank_count(std::string_view text) {
  int count = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (error != std::errc{} || end != text.data() + text.size() || count < 1 || count > max_ranks) {
    throw usage_error(fmt::format("-n needs a number of ranks from 1 to {}, not '{}'", max_ranks, text));
  }
  return count;
}

double parse_seconds(std::string_view option, std::string_view text, bool zero_allowed) {
  double seconds = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (error != std::errc{} || end != text.data() + text.size() || !std::isfinite(seconds) ||
      seconds < 0 || (seconds == 0 && !zero_allowed) || seconds > max_seconds) {
    throw usage_error(fmt::format("{} needs a {} number of seconds, not '{}'", option,
                                  zero_allowed ? "non-negative" : "positive", text));
  }
  return seconds;
}

command_line parse_command_line(int argc, char** argv) {
  options parsed;
  bool ranks_given = false;
  int index = 1;
  // The value of an option: "--name=value", "-nvalue" or the next argument.
  const auto value_of = [&](std::string_view arg, std::string_view name) -> std::string_view {
    if (arg.size() > name.size()) return arg.substr(name.size() + (arg[name.size()] == '=' ? 1 : 0));
    if (index + 1 >= argc) throw usage_error(fmt::format("option '{}' needs a value", name));
    return argv[++index];
  };
  const auto is_option = [](std::string_view arg, std::string_view name) {
    return arg == name || (arg.starts_with(name) && (name == "-n" || arg[name.size()] == '='));
  };

  for (; index < argc; ++index) {
    const std::string_view arg = argv[index];
    if (arg == "--") {
      ++index;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    if (arg == "-h" || arg == "--help") return show_help{};
    if (arg == "--version") return show_version{};
    if (arg == "--keep-going") {
      parsed.keep_going = true;
    } else if (is_option(arg, "-n")) {
      parsed.ranks = parse_rank_count(value_of(arg, "-n"));
      ranks_given = true;
    } else if (is_option(arg, "--transport")) {
      parsed.transport = value_of(arg, "--transport");
      if (parsed.transport != "shm" && parsed.transport != "tcp") {
        throw usage_error(fmt::format("--transport is shm or tcp, not '{}'", parsed.transport));
      }
    } else if (is_option(arg, "--bind")) {
      const std::string_view how = value_of(arg, "--bind");
      if (how != "core" && how != "none") throw usage_error(fmt::format("--bind is core or none, not '{}'", how));
      parsed.bind = how == "core" ? binding::core : binding::none;
    } else if (is_option(arg, "--timeout")) {
      parsed.timeout_seconds = parse_seconds("--timeout", value_of(arg, "--timeout"), false);
    } else if (is_option(arg, "--grace")) {
      parsed.grace_seconds = parse_seconds("--grace", value_of(arg, "--grace"), true);
    } else {
      throw usage_error(fmt::format("unknown option '{}'", arg));
    }
  }
  if (!ranks_given) throw usage_error("the number of ranks is missing (-n N)");
  if (index >= argc) throw usage_error("the program to run is missing");
  parsed.command.assign(argv + index, argv + argc);
  return parsed;
}

// ---------------------------------------------------------------------------------------------
// File descriptors and output

class file_descriptor {
 public:
  file_descriptor() = default;
  explicit file_descriptor(int fd) noexcept : fd_(fd) {}
  file_descriptor(file_descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  file_descriptor& operator=(file_descriptor&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~file_descriptor() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void set_descriptor_flag(int fd, int flag) {
  if (::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | flag) != 0) throw_system_error("fcntl");
}

void set_status_flag(int fd, int flag) {
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | flag) != 0) throw_system_error("fcntl");
}

struct pipe_ends {
  file_descriptor read_end, write_end;
};

// Close-on-exec, so that no rank holds another rank's pipe open (its reader would never see EOF).
pipe_ends make_pipe(std::string_view purpose) {
  int fds[2];
  if (::pipe(fds) != 0) throw_system_error(fmt::format("cannot create a pipe for {}", purpose));
  pipe_ends ends{file_descriptor(fds[0]), file_descriptor(fds[1])};
  set_descriptor_flag(fds[0], FD_CLOEXEC);
  set_descriptor_flag(fds[1], FD_CLOEXEC);
  return ends;
}

// Writes qcoll-run's own stdout and stderr. Each call is one whole-lines chunk, and qcoll-run is
// the only writer, so ranks' lines never interleave. A destination that fails (a closed pipe) is
// dropped, but the ranks' pipes are still drained so that no rank blocks on a full pipe.
class output_sink {
 public:
  void write(int fd, std::string_view data) {
    auto& lost = lost_[static_cast<std::size_t>(fd)];
    while (!data.empty() && !lost) {
      const ssize_t written = ::write(fd, data.data(), data.size());
      if (written >= 0) {
        data.remove_prefix(static_cast<std::size_t>(written));
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd writable{fd, POLLOUT, 0};  // a non-blocking terminal or pipe we inherited
        ::poll(&writable, 1, -1);
      } else if (errno != EINTR) {
        lost = true;
        if (fd != STDERR_FILENO) {
          note(fmt::format("cannot write to stdout ({}); dropping the ranks' output from now on",
                           std::strerror(errno)));
        }
      }
    }
  }

  void note(std::string_view message) { write(STDERR_FILENO, fmt::format("qcoll-run: {}\n", message)); }

 private:
  std::array<bool, 3> lost_{};
};

output_sink sink;

template <class... Args>
void note(fmt::format_string<Args...> format, Args&&... args) {
  sink.note(fmt::format(format, std::forward<Args>(args)...));
}

// ---------------------------------------------------------------------------------------------
// Signals

int signal_pipe_write_fd = -1;

extern "C" void write_signal_to_pipe(int signal_number) {
  const int saved_errno = errno;
  const auto byte = static_cast<unsigned char>(signal_number);
  // A full pipe drops the byte: the loop then has plenty of signals to handle already.
  if (::write(signal_pipe_write_fd, &byte, 1) < 0) {
  }
  errno = saved_errno;
}

// Routes SIGCHLD and the forwarded signals into a pipe that the poll loop reads. A forwarded
// signal that was ignored when qcoll-run started (nohup, a non-interactive shell's background
// job) stays ignored, for qcoll-run and for the ranks, as a shell would leave it.
class signal_relay {
 public:
  signal_relay() : pipe_(make_pipe("signals")) {
    set_status_flag(pipe_.read_end.get(), O_NONBLOCK);
    set_status_flag(pipe_.write_end.get(), O_NONBLOCK);
    signal_pipe_write_fd = pipe_.write_end.get();

    struct sigaction relay {};
    relay.sa_handler = write_signal_to_pipe;
    relay.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&relay.sa_mask);
    for (std::size_t i = 0; i < handled_.size(); ++i) {
      ::sigaction(handled_[i], nullptr, &original_[i]);
      const bool ignored_at_start = handled_[i] != SIGCHLD && handled_[i] != SIGPIPE &&
                                    original_[i].sa_handler == SIG_IGN;
      if (ignored_at_start) continue;
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

  signal_relay(const signal_relay&) = delete;
  signal_relay& operator=(const signal_relay&) = delete;
  ~signal_relay() {
    restore_original_dispositions();
    signal_pipe_write_fd = -1;
  }

  int read_fd() const noexcept { return pipe_.read_end.get(); }

  std::vector<int> take_pending() {
    std::vector<int> pending;
    unsigned char bytes[256];
    ssize_t count = 0;
    while ((count = ::read(read_fd(), bytes, sizeof bytes)) > 0 || (count < 0 && errno == EINTR)) {
      pending.insert(pending.end(), bytes, bytes + std::max<ssize_t>(count, 0));
    }
    return pending;
  }

  // Async-signal-safe: called in a forked child before exec.
  void restore_original_dispositions() const noexcept {
    for (std::size_t i = 0; i < handled_.size(); ++i) ::sigaction(handled_[i], &original_[i], nullptr);
  }

 private:
  // The first four are forwarded to the ranks.
  static constexpr std::array handled_{SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE};
  std::array<struct sigaction, handled_.size()> original_{};
  pipe_ends pipe_;
};

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

// ---------------------------------------------------------------------------------------------
// The job's environment

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> random(bytes);
  const file_descriptor urandom(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (!urandom) throw_system_error("cannot open /dev/urandom");
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t count = ::read(urandom.get(), random.data() + done, bytes - done);
    if (count > 0) {
      done += static_cast<std::size_t>(count);
    } else if (count == 0 || errno != EINTR) {
      throw_system_error("cannot read /dev/urandom", count == 0 ? EIO : errno);
    }
  }
  std::string hex;
  for (const unsigned char byte : random) hex += fmt::format("{:02x}", byte);
  return hex;
}

// A loopback port free right now; see the note at the top about the race this leaves.
unsigned find_free_loopback_port() {
  const file_descriptor probe(::socket(AF_INET, SOCK_STREAM, 0));
  if (!probe) throw_system_error("cannot create a socket to find a free port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(probe.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw_system_error("cannot find a free port on 127.0.0.1");
  }
  return ntohs(address.sin_port);
}

// Job ids that may name files: the launcher's own are hex; a user's is used for cleanup only if
// it is this tame (no '/', no '.', bounded), else leftover shared memory is left alone.
bool job_id_is_safe_for_cleanup(std::string_view id) {
  return !id.empty() && id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// The shm transport names its segment /qcoll-<job id> (possibly with ".suffix" parts); a job
// that crashed leaves it behind, so it is removed once every rank has ended.
void remove_leftover_shared_memory(const std::string& job_id) {
  if (!job_id_is_safe_for_cleanup(job_id)) return;
  DIR* directory = ::opendir("/dev/shm");
  if (directory == nullptr) return;  // no POSIX shared memory filesystem here
  const std::string exact = "qcoll-" + job_id;
  const std::string prefix = exact + ".";
  std::vector<std::string> leftovers;
  while (const dirent* entry = ::readdir(directory)) {
    const std::string_view name = entry->d_name;
    if (name == exact || name.starts_with(prefix)) leftovers.emplace_back(name);
  }
  ::closedir(directory);
  for (const auto& name : leftovers) {
    const std::string path = "/dev/shm/" + name;
    if (::unlink(path.c_str()) == 0) {
      note("removed shared memory the job left behind: {}", path);
    } else if (errno != ENOENT) {
      note("cannot remove shared memory the job left behind, {}: {}", path, std::strerror(errno));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Ranks

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

class launcher {
 public:
  explicit launcher(options job) : options_(std::move(job)), ranks_(static_cast<std::size_t>(options_.ranks)) {}

  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;

  // Only when qcoll-run itself fails midway: ranks must not be left running unsupervised.
  ~launcher() {
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      signal_rank(rank, SIGKILL);
      ::waitpid(rank.pid, nullptr, 0);
    }
  }

  int run() {
    start_ranks();
    supervise();
    remove_leftover_shared_memory(job_id_);
    return timed_out_ ? exit_timed_out : first_failure_.value_or(0);
  }

 private:
  enum class read_outcome { data, nothing_yet, end_of_file };

  std::vector<std::string> shared_environment() {
    static constexpr std::string_view set_per_job[] = {
        "QCOLL_RANK",  "QCOLL_WORLD_SIZE", "QCOLL_LOCAL_RANK", "QCOLL_LOCAL_WORLD_SIZE",
        "QCOLL_STORE", "QCOLL_JOB_ID",     "QCOLL_SECRET",     "QCOLL_TRANSPORT"};
    const char* given_job_id = std::getenv("QCOLL_JOB_ID");
    const char* given_secret = std::getenv("QCOLL_SECRET");
    // An empty job id would name no segment at all; an empty secret means "no authentication".
    job_id_ = given_job_id != nullptr && *given_job_id != '\0' ? given_job_id : random_hex(8);
    const std::string secret = given_secret != nullptr ? given_secret : random_hex(16);

    std::vector<std::string> environment;
    for (char** entry = environ; *entry != nullptr; ++entry) {
      const std::string_view variable = *entry;
      const auto name = variable.substr(0, variable.find('='));
      if (std::find(std::begin(set_per_job), std::end(set_per_job), name) == std::end(set_per_job)) {
        environment.emplace_back(variable);
      }
    }
    environment.push_back(fmt::format("QCOLL_WORLD_SIZE={}", options_.ranks));
    environment.push_back(fmt::format("QCOLL_LOCAL_WORLD_SIZE={}", options_.ranks));
    environment.push_back(fmt::format("QCOLL_STORE=127.0.0.1:{}", find_free_loopback_port()));
    environment.push_back("QCOLL_JOB_ID=" + job_id_);
    environment.push_back("QCOLL_SECRET=" + secret);
    environment.push_back("QCOLL_TRANSPORT=" + options_.transport);
    return environment;
  }

  void start_ranks() {
    // qcoll-run keeps two pipes per rank open: the usual soft limit of 1024 descriptors is too
    // few for 1024 ranks, so it is raised as far as needed (ranks get the original limit back).
    if (::getrlimit(RLIMIT_NOFILE, &original_file_limit_) == 0) {
      rlimit raised = original_file_limit_;
      raised.rlim_cur = std::min<rlim_t>(raised.rlim_max, 2 * ranks_.size() + 64);
      file_limit_raised_ = raised.rlim_cur > original_file_limit_.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
    }
    const std::vector<std::string> environment = shared_environment();
    // A terminal stays with qcoll-run: a rank outside the terminal's foreground process group
    // that read it would be stopped (SIGTTIN). A file or pipe goes to rank 0, as mpirun does.
    const file_descriptor dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!dev_null) throw_system_error("cannot open /dev/null");
    const int rank0_stdin = ::isatty(STDIN_FILENO) ? dev_null.get() : STDIN_FILENO;

    for (std::size_t index = 0; index < ranks_.size(); ++index) {
      auto& rank = ranks_[index];
      rank.index = static_cast<int>(index);
      rank.prefix = fmt::format("[{}] ", index);
      start_rank(rank, environment, index == 0 ? rank0_stdin : dev_null.get());
    }
    if (options_.timeout_seconds) timeout_deadline_ = clock_type::now() + to_duration(*options_.timeout_seconds);
  }

  /// The CPU rank `index` is pinned to, if any: ranks that each have a core of their own
  /// and stay on it poll their peers without migrating (measured: 1 MiB shm allreduce with
  /// 2 ranks, 2.9–3.4 GB/s unbound against 5.4–6.0 bound).
  std::optional<cpu_set_t> cpu_for(int index) const {
    if (options_.bind == binding::none) return std::nullopt;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return std::nullopt;
    const int usable = CPU_COUNT(&allowed);
    if (options_.bind == binding::automatic && usable < options_.ranks) return std::nullopt;
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

  void start_rank(rank_process& rank, std::vector<std::string> environment, int stdin_fd) {
    environment.push_back(fmt::format("QCOLL_RANK={}", rank.index));
    environment.push_back(fmt::format("QCOLL_LOCAL_RANK={}", rank.index));
    std::vector<char*> envp;
    for (auto& variable : environment) envp.push_back(variable.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (auto& arg : options_.command) argv.push_back(arg.data());
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
    const std::optional<cpu_set_t> cpu = cpu_for(rank.index);
    const child_setup setup{argv.data(), envp.data(), stdin_fd, out.write_end.get(), err.write_end.get(),
                            exec_error.write_end.get(), ::getpid(), &signals_, &original_mask,
                            file_limit_raised_ ? &original_file_limit_ : nullptr, cpu ? &*cpu : nullptr};
    const pid_t pid = ::fork();
    if (pid == 0) exec_rank(setup);
    const int fork_error = errno;
    ::sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    if (pid < 0) throw_system_error(fmt::format("cannot start rank {}", rank.index), fork_error);

    ::setpgid(pid, pid);  // in both processes: the group exists whichever of them runs first
    rank.pid = pid;
    rank.running = true;
    ++running_ranks_;
    exec_error.write_end.reset();
    out.write_end.reset();
    err.write_end.reset();

    int error = 0;
    ssize_t count = 0;
    do {
      count = ::read(exec_error.read_end.get(), &error, sizeof error);
    } while (count < 0 && errno == EINTR);
    if (count == sizeof error) {
      ::waitpid(pid, nullptr, 0);
      rank.running = false;
      --running_ranks_;
      throw cannot_run_error(fmt::format("cannot run '{}': {}", options_.command.front(), std::strerror(error)));
    }

    set_status_flag(out.read_end.get(), O_NONBLOCK);
    set_status_flag(err.read_end.get(), O_NONBLOCK);
    rank.out = {std::move(out.read_end), STDOUT_FILENO, {}};
    rank.err = {std::move(err.read_end), STDERR_FILENO, {}};
  }

  // The event loop: relays output, handles signals and deadlines until every rank has ended.
  void supervise() {
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
      if (::poll(polled.data(), polled.size(), poll_timeout_ms()) < 0) {
        if (errno == EINTR) continue;
        throw_system_error("poll");
      }
      for (std::size_t i = 1; i < polled.size(); ++i) {
        if (polled[i].revents != 0) relay_output(*polled_streams[i - 1].first, *polled_streams[i - 1].second);
      }
      if (polled[0].revents != 0) handle_signals();
      enforce_deadlines();
    }
    drain_outputs();
  }

  // Reads what one pipe holds and relays every complete line (and, at end of file, the last
  // partial one) with the rank's prefix, in one write.
  read_outcome relay_output(const rank_process& rank, output_stream& stream) {
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
  void drain_outputs() {
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

  void handle_signals() {
    for (const int signal_number : signals_.take_pending()) {
      if (signal_number == SIGCHLD) {
        reap_ended_ranks();
        continue;
      }
      if (running_ranks_ == 0) continue;
      note("forwarding {} to {} running rank(s)", describe_signal(signal_number), running_ranks_);
      for (auto& rank : ranks_) {
        if (rank.running) signal_rank(rank, signal_number);
      }
    }
  }

  void reap_ended_ranks() {
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      const auto rank = std::find_if(ranks_.begin(), ranks_.end(), [&](const auto& r) { return r.pid == pid; });
      if (rank != ranks_.end() && rank->running) on_rank_ended(*rank, status);
    }
  }

  void on_rank_ended(rank_process& rank, int status) {
    rank.running = false;
    --running_ranks_;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;

    const int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    if (!first_failure_) first_failure_ = code;
    if (rank.stopped_by_launcher) return;
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
  void stop_remaining_ranks() {
    stopping_ = true;
    timeout_deadline_.reset();
    kill_deadline_ = clock_type::now() + to_duration(options_.grace_seconds);
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      rank.stopped_by_launcher = true;
      signal_rank(rank, SIGTERM);
    }
  }

  void enforce_deadlines() {
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
        signal_rank(rank, SIGKILL);
      }
    }
  }

  int poll_timeout_ms() const {
    std::optional<clock_type::time_point> next;
    for (const auto& deadline : {timeout_deadline_, kill_deadline_}) {
      if (deadline && (!next || *deadline < *next)) next = deadline;
    }
    if (!next) return -1;
    const auto remaining = std::chrono::ceil<std::chrono::milliseconds>(*next - clock_type::now());
    return static_cast<int>(std::clamp<std::chrono::milliseconds::rep>(remaining.count(), 0, 1000 * 1000));
  }

  // The whole process group, so that the rank's own child processes get the signal too.
  static void signal_rank(const rank_process& rank, int signal_number) {
    if (::kill(-rank.pid, signal_number) != 0 && errno == ESRCH) ::kill(rank.pid, signal_number);
  }

  static clock_type::duration to_duration(double seconds) {
    return std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(seconds));
  }

  options options_;
  signal_relay signals_;
  std::vector<rank_process> ranks_;
  std::string job_id_;
  rlimit original_file_limit_{};
  bool file_limit_raised_ = false;
  int running_ranks_ = 0;
  std::optional<int> first_failure_;
  bool stopping_ = false;
  bool timed_out_ = false;
  std::optional<clock_type::time_point> timeout_deadline_, kill_deadline_;
  std::array<char, 64 * 1024> read_buffer_{};
};

// A closed descriptor 0-2 would be reused by the first pipe, which would then become the rank's
// stdin/stdout/stderr by accident (and keep its close-on-exec flag).
void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF && ::open("/dev/null", O_RDWR) != fd) {
      throw_system_error("cannot open /dev/null");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    open_standard_descriptors();
    const command_line parsed = parse_command_line(argc, argv);
    if (std::holds_alternative<show_help>(parsed)) {
      sink.write(STDOUT_FILENO, usage_text);
      return 0;
    }
    if (std::holds_alternative<show_version>(parsed)) {
      sink.write(STDOUT_FILENO, fmt::format("qcoll-run (qcoll) {}.{}.{}\n", QCOLL_VERSION_MAJOR,
                                            QCOLL_VERSION_MINOR, QCOLL_VERSION_PATCH));
      return 0;
    }
    launcher job(std::get<options>(parsed));
    return job.run();
  } catch (const usage_error& error) {
    note("{}\nTry 'qcoll-run --help' for more information.", error.what());
    return exit_usage;
  } catch (const cannot_run_error& error) {
    note("{}", error.what());
    return exit_cannot_run;
  } catch (const std::exception& error) {
    note("{}", error.what());
    return exit_launcher_failed;
  }
}
