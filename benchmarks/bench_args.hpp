#pragma once
// Command-line pieces the benchmarks share (nccl-tests style size arguments).

#include <cstddef>
#include <cstdlib>
#include <string>
#include <string_view>

namespace bench {

/// "64K", "256M", "1G" or a plain byte count.
inline std::size_t parse_bytes(std::string_view text) {
  char* end = nullptr;
  const double value = std::strtod(std::string(text).c_str(), &end);
  const char unit = end && *end ? *end : ' ';
  const double scale = unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
  return static_cast<std::size_t>(value * scale);
}

}  // namespace bench
