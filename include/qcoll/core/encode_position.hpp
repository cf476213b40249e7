#pragma once
/// @file
/// Where an encode sits in its caller's sequence of calls: part of the quantizer
/// concept's vocabulary, so it lives below the quantizers and their kernels.

#include <cstdint>

namespace qcoll::quantizers {

/// Where an encode sits in the caller's sequence of calls and in its tensor.
/// Deterministic quantizers ignore it. Stochastic rounding draws the random number
/// for element i of `in` from (seed, sequence, offset + i), so a result depends on
/// the seed, the call and the element's place in the tensor — never on how the
/// tensor was chunked, on the thread count or on the SIMD width. Pass a new
/// `sequence` for every call (a collective's sequence number does).
struct encode_position {
  std::uint64_t sequence = 0;
  std::uint64_t offset = 0;
};

}  // namespace qcoll::quantizers
