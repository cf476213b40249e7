#include "system.hpp"

#include <fcntl.h>
#include <poll.h>

#include <cstring>
#include <system_error>

namespace qcoll_run {

output_sink sink;

void throw_system_error(std::string_view what, int error) {
  throw std::system_error(error, std::generic_category(), std::string(what));
}

void set_descriptor_flag(int fd, int flag) {
  if (::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | flag) != 0) throw_system_error("fcntl");
}

void set_status_flag(int fd, int flag) {
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | flag) != 0) throw_system_error("fcntl");
}

pipe_ends make_pipe(std::string_view purpose) {
  int fds[2];
  if (::pipe(fds) != 0) throw_system_error(fmt::format("cannot create a pipe for {}", purpose));
  pipe_ends ends{file_descriptor(fds[0]), file_descriptor(fds[1])};
  set_descriptor_flag(fds[0], FD_CLOEXEC);
  set_descriptor_flag(fds[1], FD_CLOEXEC);
  return ends;
}

void open_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF && ::open("/dev/null", O_RDWR) != fd) {
      throw_system_error("cannot open /dev/null");
    }
  }
}

void output_sink::write(int fd, std::string_view data) {
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
        note(fmt::format("cannot write to stdout ({}); dropping the ranks' output from now on", std::strerror(errno)));
      }
    }
  }
}

void output_sink::note(std::string_view message) { write(STDERR_FILENO, fmt::format("qcoll-run: {}\n", message)); }

}  // namespace qcoll_run
