#pragma once
/// @file
/// Byte counts read from the environment (QCOLL_*_BYTES): a number with an optional K or
/// M (KiB, MiB) suffix, or "off" — one reader for every variable that takes one.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>

#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <string_view>

namespace qcoll::detail {

/// What "off" reads as: a threshold no size reaches.
inline constexpr std::size_t bytes_never = std::numeric_limits<std::size_t>::max();

/// The byte count in environment variable `name`, `fallback` where it is unset or empty.
/// @throws qcoll::error invalid_argument naming the variable when it is set but malformed.
inline std::size_t byte_count_variable(const char* name, std::size_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string_view text(value);
  if (text == "off") return bytes_never;
  std::size_t number = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  std::size_t scale = 1;
  const std::string_view suffix(end, text.data() + text.size() - end);
  if (suffix == "K" || suffix == "KiB") scale = std::size_t{1} << 10;
  else if (suffix == "M" || suffix == "MiB") scale = std::size_t{1} << 20;
  else if (!suffix.empty()) number = bytes_never;  // refused below
  if (ec != std::errc() || number == bytes_never || number > bytes_never / scale)
    throw_error(errc::invalid_argument, "qcoll: {}={} is not a byte count (a number, optionally K or M, or off)", name,
                value);
  return number * scale;
}

}  // namespace qcoll::detail
