#pragma once
/// @file
/// Message formatting, the one way qcoll's headers turn values into text (error
/// messages, warnings, descriptions of calls). Every call site is a thin template
/// that erases its arguments' types (fmt::make_format_args) and hands them to one
/// non-template function, fmt's own vformat pattern (DESIGN principle 6): the
/// formatting code is compiled once, in fmt, not once per call site.
///
/// It is also what lets a `.cu` file include qcoll's headers. nvcc's front end
/// cannot evaluate fmt's consteval format-string checks, so in a CUDA translation
/// unit a format string is a plain string_view, checked when the message is made;
/// every other compiler checks it at compile time, as fmt::format does, and every
/// header is compiled that way in CI (guards.headers_compile_alone), so a bad
/// format string never reaches a user. fmt 9 (Debian 12's) also turns its constexpr
/// off when it sees nvcc, which the host compiler then rejects (a constexpr function
/// calling a non-constexpr one); a host compiler behind nvcc accepts fmt's constexpr
/// as it does in any .cpp file, so it is turned back on. fmt 10 and later need
/// neither (tested with fmt 12.2 and nvcc 13.0).

#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif
#include <fmt/core.h>

#include <string>
#include <string_view>

namespace qcoll::detail {

#if defined(__CUDACC__)
template <class... Args>
using format_string = fmt::string_view;
#else
/// A format string for these argument types, checked at compile time.
template <class... Args>
using format_string = fmt::format_string<const Args&...>;
#endif

/// The one function that formats: `format` with its arguments, type-erased.
inline std::string format_erased(fmt::string_view format, fmt::format_args args) { return fmt::vformat(format, args); }

/// fmt::format's result, through format_erased.
template <class... Args>
std::string format(format_string<Args...> text, const Args&... args) {
  return format_erased(text, fmt::make_format_args(args...));
}

/// The values of `range`, each as "{}" formats it, with `separator` between them.
template <class Range>
std::string join(const Range& range, std::string_view separator) {
  std::string joined;
  bool first = true;
  for (const auto& value : range) {
    if (!first) joined.append(separator);
    first = false;
    joined += format_erased("{}", fmt::make_format_args(value));
  }
  return joined;
}

}  // namespace qcoll::detail
