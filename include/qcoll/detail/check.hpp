#pragma once
/// @file
/// Argument checks shared by the public constructors and collectives.

#include <qcoll/core/error.hpp>

#include <qcoll/detail/format.hpp>

#include <functional>
#include <span>
#include <utility>

namespace qcoll::detail {

/// Throws qcoll::error with `code` and the formatted message (the one non-template
/// thrower every call site shares).
[[noreturn]] inline void throw_formatted(errc code, fmt::string_view format, fmt::format_args args) {
  throw error(make_error_code(code), format_erased(format, args));
}

template <class... Args>
[[noreturn]] void throw_error(errc code, format_string<Args...> format, const Args&... args) {
  throw_formatted(code, format, fmt::make_format_args(args...));
}

/// True when the two byte ranges share at least one byte.
template <class A, class B>
bool overlaps(std::span<A> a, std::span<B> b) noexcept {
  if (a.empty() || b.empty()) return false;
  const auto* a_begin = reinterpret_cast<const std::byte*>(a.data());
  const auto* b_begin = reinterpret_cast<const std::byte*>(b.data());
  // std::less gives a total order even for pointers into unrelated objects.
  const std::less<const std::byte*> before;
  return before(a_begin, b_begin + b.size_bytes()) && before(b_begin, a_begin + a.size_bytes());
}

template <class A, class B>
bool same_range(std::span<A> a, std::span<B> b) noexcept {
  return a.size_bytes() == b.size_bytes() &&
         static_cast<const void*>(a.data()) == static_cast<const void*>(b.data());
}

/// Fails `step` (a call's primitives) with invalid_argument unless `in` and `out` have
/// the same size and are the same range or disjoint, as an allreduce takes them.
template <class Step, class In, class Out>
void check_same_or_disjoint(Step& step, std::span<In> in, std::span<Out> out) {
  if (in.size() != out.size())
    step.fail(errc::invalid_argument, "input has {} elements but output has {}", in.size(), out.size());
  if (!same_range(in, out) && overlaps(in, out))
    step.fail(errc::invalid_argument, "input and output overlap without being the same range");
}

}  // namespace qcoll::detail
