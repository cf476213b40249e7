#pragma once
/// @file
/// A quantizer named at run time — by a command line, a configuration, the PyTorch
/// hook — as a name and the two settings that named quantizers read. Each quantizer
/// makes itself from one (`Q::from_spec`); quantizers/by_name.hpp lists them and
/// parses the written form "name[bits][/group]".

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace qcoll::quantizers {

struct quantizer_spec {
  std::string name{};                  ///< the quantizer's `name`: one_bit, k_level, bfp, identity
  std::optional<unsigned> bits{};      ///< k_level: code bits (2^bits levels); bfp: mantissa bits
  std::optional<std::size_t> group{};  ///< values per group (one_bit, k_level) or block (bfp)
  std::uint64_t seed = 0;              ///< k_level's stochastic rounding key: one per rank
};

/// Which of a spec's settings a quantizer reads (`Q::reads`); the others must be unset.
struct spec_reads {
  bool bits = false;
  bool group = false;
};

namespace detail {

/// Refuses a setting `spec` gives that the quantizer `name` does not read: a spec
/// written "one_bit4" would otherwise mean one_bit as if the 4 were not there.
inline void refuse_unread(const char* name, spec_reads reads, const quantizer_spec& spec) {
  if (spec.bits && !reads.bits)
    qcoll::detail::throw_error(errc::invalid_argument, "{} takes no bit count, not bits={}", name, *spec.bits);
  if (spec.group && !reads.group)
    qcoll::detail::throw_error(errc::invalid_argument, "{} takes no group size, not group={}", name, *spec.group);
}

}  // namespace detail
}  // namespace qcoll::quantizers
