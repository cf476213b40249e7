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

/// A quantizer whose encode keeps a memory between calls besides the residual (one_bit
/// taking its reconstruction values from the previous encode): memory_size(n) values
/// for an encode of n values, NaN when fresh.
template <class Q>
concept remembers_between_encodes =
    quantizer<Q> && requires(const Q& q, std::size_t n, std::span<const typename Q::value_type> in,
                             std::span<typename Q::value_type> out, std::span<std::byte> frame,
                             quantizers::encode_position position) {
      { q.memory_size(n) } -> std::convertible_to<std::size_t>;
      q.encode(in, in, out, in, out, frame, position);
    };

/// Values of memory an encode of n values keeps (0 for most quantizers).
template <quantizer Q>
std::size_t encode_memory_size(const Q& quantizer, std::size_t n) noexcept {
  if constexpr (remembers_between_encodes<Q>) return quantizer.memory_size(n);
  else return 0;
}

/// Encodes `values` into `frame` with error feedback from part `at` of the committed
/// residual (residual[committed]) into the same part of the staging one, which
/// becomes the committed one only once the whole call succeeded (failure
/// atomicity). The encode reads one and writes the other: no copy (a quantizer with
/// only the concept's in-place encode gets one). A quantizer that remembers between
/// encodes reads its memory from part `memory_at` of memory[committed] and writes
/// the staging one the same way.
template <quantizer Q>
void staged_encode(Q& quantizer, std::span<const typename Q::value_type> values,
                   std::vector<typename Q::value_type> (&residual)[2], std::vector<typename Q::value_type> (&memory)[2],
                   unsigned committed, block_range at, std::size_t memory_at, std::span<std::byte> frame,
                   quantizers::encode_position position) {
  using T = typename Q::value_type;
  if constexpr (remembers_between_encodes<Q> && Q::keeps_residual) {
    const block_range kept{memory_at, quantizer.memory_size(values.size())};
    if (kept.size != 0)
      return quantizer.encode(values, at.of(std::span<const T>(residual[committed])),
                              at.of(std::span(residual[1 - committed])), kept.of(std::span<const T>(memory[committed])),
                              kept.of(std::span(memory[1 - committed])), frame, position);
  }
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
