#pragma once
/// @file
/// How a buffer is split into per-rank blocks, for reduce_scatter, all_gather and
/// the ring algorithms. Blocks are contiguous and in rank order; the first
/// `count % parts` blocks hold one element more, so sizes differ by at most one.

#include <algorithm>
#include <cstddef>
#include <span>

namespace qcoll {

struct block_range {
  std::size_t offset = 0;
  std::size_t size = 0;

  template <class T>
  std::span<T> of(std::span<T> whole) const {
    return whole.subspan(offset, size);
  }
};

/// Block `index` of `count` elements split into `parts` blocks.
constexpr block_range block_of(std::size_t count, std::size_t parts, std::size_t index) noexcept {
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

}  // namespace qcoll
