#pragma once
/// @file
/// Warnings that must reach a person but must not stop the program: one line on
/// stderr per call, written with one write(2) so lines from ranks that share a
/// terminal do not interleave mid-line. QCOLL_LOG=quiet silences them.
/// The caller writes the whole line, by convention "qcoll: rank R: what happened".

#include <qcoll/detail/format.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include <unistd.h>

namespace qcoll::detail {

/// True unless the environment says QCOLL_LOG=quiet (read on every call: warnings are rare).
inline bool log_enabled() noexcept {
  const char* setting = std::getenv("QCOLL_LOG");
  return setting == nullptr || std::strcmp(setting, "quiet") != 0;
}

/// True when QCOLL_DEBUG=INFO asks for the informational lines (which algorithm a
/// call used, …); read once by whoever caches it, as they may come once per call.
inline bool debug_info_enabled() noexcept {
  const char* setting = std::getenv("QCOLL_DEBUG");
  return setting != nullptr && (std::strcmp(setting, "INFO") == 0 || std::strcmp(setting, "info") == 0);
}

/// Writes one whole line with one write(2).
inline void write_formatted_line(fmt::string_view format, fmt::format_args args) noexcept {
  try {
    std::string line = format_erased(format, args);
    line.push_back('\n');
    const char* data = line.data();
    std::size_t left = line.size();
    while (left > 0) {  // one call unless interrupted or cut short by the kernel
      const ssize_t written = ::write(STDERR_FILENO, data, left);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) return;
      data += written;
      left -= static_cast<std::size_t>(written);
    }
  } catch (...) {  // a warning that cannot be formatted is not worth an exception
  }
}

template <class... Args>
void log_warning(format_string<Args...> format, const Args&... args) noexcept {
  if (!log_enabled()) return;
  write_formatted_line(format, fmt::make_format_args(args...));
}

/// An informational line; the caller checks debug_info_enabled() first.
template <class... Args>
void log_info(format_string<Args...> format, const Args&... args) noexcept {
  write_formatted_line(format, fmt::make_format_args(args...));
}

}  // namespace qcoll::detail
