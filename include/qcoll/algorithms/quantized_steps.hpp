#pragma once
/// @file
/// The two things every quantized algorithm does to a value range: encode it with
/// error feedback into a frame, and decode (or decode-and-add) a frame from a peer.
/// Shared by the compressed allreduce and the grid allreduce.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/partition.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <system_error>
#include <vector>

namespace qcoll::algorithms {

/// Encodes `values` into `frame` with error feedback from part `at` of the committed
/// residual (residual[committed]) into the same part of the staging one, which
/// becomes the committed one only once the whole call succeeded (failure
/// atomicity). The encode reads one and writes the other: no copy (a quantizer with
/// only the concept's in-place encode gets one).
template <quantizer Q>
void staged_encode(Q& quantizer, std::span<const typename Q::value_type> values,
                   std::vector<typename Q::value_type> (&residual)[2], unsigned committed, block_range at,
                   std::span<std::byte> frame, quantizers::encode_position position) {
  using T = typename Q::value_type;
  if constexpr (!Q::keeps_residual) {
    quantizer.encode(values, std::span<T>(), frame, position);
  } else {
    const std::span<const T> previous = at.of(std::span<const T>(residual[committed]));
    const std::span<T> staging = at.of(std::span(residual[1 - committed]));
    if constexpr (requires { quantizer.encode(values, previous, staging, frame, position); }) {
      quantizer.encode(values, previous, staging, frame, position);
    } else {
      std::copy(previous.begin(), previous.end(), staging.begin());
      quantizer.encode(values, staging, frame, position);
    }
  }
}

/// Decodes a frame from rank `from` into `into` (adding to it when `accumulate`);
/// a frame that does not decode fails the call, naming the peer and the sizes.
template <quantizer Q, transport Transport>
void decode_or_fail(primitives<Transport>& step, const Q& quantizer, std::span<const std::byte> frame,
                    std::span<typename Q::value_type> into, bool accumulate, rank_t from) {
  const std::error_code failure = accumulate ? quantizer.decode_accumulate(frame, into) : quantizer.decode(frame, into);
  if (failure)
    step.fail(errc::protocol_error, "the {}-byte frame from rank {} does not decode as {} values of {}: {}",
              frame.size(), from, into.size(), Q::name, failure.message());
}

}  // namespace qcoll::algorithms
