#pragma once
/// @file
/// Argument checks shared by the public constructors and collectives.

#include <qcoll/core/error.hpp>

#include <fmt/format.h>

#include <functional>
#include <span>
#include <utility>

namespace qcoll::detail {

template <class... Args>
[[noreturn]] void throw_error(errc code, fmt::format_string<Args...> format, Args&&... args) {
  throw error(make_error_code(code), fmt::format(format, std::forward<Args>(args)...));
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

}  // namespace qcoll::detail
