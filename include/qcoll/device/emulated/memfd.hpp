#pragma once
/// @file
/// The emulated device's named memfds: what device memory and interprocess events are
/// made of, named after the kind, the owning process and an id, so a process that
/// fetches one through an IPC handle (pidfd_getfd) can check that the descriptor still
/// names what the handle described — not a descriptor number reused since.

#include <qcoll/detail/posix_handles.hpp>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace qcoll::device::emulated_detail {

/// The name of the memfd of `kind` ("device", "event") `id` of process `pid`.
inline std::string memfd_name(const char* kind, std::int64_t pid, std::uint64_t id) {
  return std::string("qcoll-emulated-") + kind + "-" + std::to_string(pid) + "-" + std::to_string(id);
}

/// A new memfd of that name (invalid when the system refuses it).
inline detail::file_descriptor make_memfd(const std::string& name) {
  return detail::file_descriptor(static_cast<int>(::syscall(SYS_memfd_create, name.c_str(), MFD_CLOEXEC)));
}

/// Whether `fd` is the memfd named `name` (/proc/self/fd shows "/memfd:<name> (deleted)").
inline bool names_memfd(const detail::file_descriptor& fd, const std::string& name) {
  char target[256] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd.get());
  const ssize_t length = ::readlink(link.c_str(), target, sizeof target - 1);
  if (length <= 0) return false;
  const std::string expected = "/memfd:" + name;
  const std::string found(target, static_cast<std::size_t>(length));
  return found.rfind(expected, 0) == 0 && (found.size() == expected.size() || found[expected.size()] == ' ');
}

}  // namespace qcoll::device::emulated_detail
