// qcoll-run's exit statuses, errors and thin wrappers over POSIX descriptors and pipes.
#pragma once

#include <fmt/format.h>

#include <unistd.h>

#include <array>
#include <cerrno>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace qcoll_run {

// Exit statuses of qcoll-run's own (a job's status is its first failed rank's).
inline constexpr int exit_usage = 2;
inline constexpr int exit_timed_out = 124;  // as timeout(1)
inline constexpr int exit_launcher_failed = 125;
inline constexpr int exit_cannot_run = 127;

class usage_error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

class cannot_run_error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A failing system call in qcoll-run itself (exit status 125).
[[noreturn]] void throw_system_error(std::string_view what, int error = errno);

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

void set_descriptor_flag(int fd, int flag);
void set_status_flag(int fd, int flag);

struct pipe_ends {
  file_descriptor read_end, write_end;
};

// Close-on-exec, so that no rank holds another rank's pipe open (its reader would never see EOF).
pipe_ends make_pipe(std::string_view purpose);

// A closed descriptor 0-2 would be reused by the first pipe, which would then become the rank's
// stdin/stdout/stderr by accident (and keep its close-on-exec flag).
void open_standard_descriptors();

// Writes qcoll-run's own stdout and stderr. Each call is one whole-lines chunk, and qcoll-run is
// the only writer, so ranks' lines never interleave. A destination that fails (a closed pipe) is
// dropped, but the ranks' pipes are still drained so that no rank blocks on a full pipe.
class output_sink {
 public:
  void write(int fd, std::string_view data);
  void note(std::string_view message);  // "qcoll-run: message" on stderr

 private:
  std::array<bool, 3> lost_{};
};

extern output_sink sink;

template <class... Args>
void note(fmt::format_string<Args...> format, Args&&... args) {
  sink.note(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qcoll_run
