#pragma once
/// @file
/// The data side of communicator::split: what each rank contributes (split_record,
/// gathered by every rank) and who ends up together, decided from those records alone,
/// so every rank decides alike.

#include <qcoll/core/error.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace qcoll::detail {

/// What each rank contributes to a split.
struct split_record {
  static constexpr std::size_t fields = 3;
  std::int64_t color = 0;
  std::int64_t key = 0;
  std::uint64_t next_context = 0;

  void store(std::span<double> into) const {
    into[0] = std::bit_cast<double>(color);
    into[1] = std::bit_cast<double>(key);
    into[2] = std::bit_cast<double>(next_context);
  }
  static split_record load(std::span<const double> records, rank_t r) {
    const std::span<const double> from = records.subspan(r * fields, fields);
    return {std::bit_cast<std::int64_t>(from[0]), std::bit_cast<std::int64_t>(from[1]),
            std::bit_cast<std::uint64_t>(from[2])};
  }
};

/// The ranks a split puts together, and the context they take.
struct split_group {
  std::vector<rank_t> members;  ///< in (key, rank) order
  std::uint64_t context = 0;    ///< one no member uses yet with any rank
};

/// The group of `rank`, which passed `color`, from every rank's record in rank order
/// (`records`, split_record::fields values each); empty when `color` is `none`.
/// @throws qcoll::error invalid_argument, on every rank alike, when any rank passed a
/// color below 0 other than `none`.
inline split_group split_group_of(std::span<const double> records, std::int64_t color, std::int64_t none, rank_t rank) {
  const rank_t size = records.size() / split_record::fields;
  std::vector<split_record> all(size);
  for (rank_t r = 0; r < size; ++r) all[r] = split_record::load(records, r);
  for (rank_t r = 0; r < size; ++r)
    if (all[r].color < 0 && all[r].color != none)
      throw_error(errc::invalid_argument,
                  "qcoll split on rank {} of {}: rank {} passed color {}; a color is ≥ 0, or no_color", rank, size, r,
                  all[r].color);
  split_group group;
  if (color == none) return group;
  for (rank_t r = 0; r < size; ++r)
    if (all[r].color == color) {
      group.members.push_back(r);
      group.context = std::max(group.context, all[r].next_context);
    }
  std::stable_sort(group.members.begin(), group.members.end(),
                   [&](rank_t a, rank_t b) { return all[a].key < all[b].key; });
  return group;
}

}  // namespace qcoll::detail
