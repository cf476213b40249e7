#pragma once
/// @file
/// The header every message of a collective carries, and what a transport says
/// once it can no longer deliver. A receiver compares the header it got with the
/// one it expects, so ranks that disagree about the call (count, type, operation,
/// root, or how many collectives they have run) are told precisely, instead of
/// reducing mismatched bytes. Vocabulary of the transport concept: no fmt here.

#include <qcoll/core/types.hpp>

#include <cstdint>
#include <string>
#include <system_error>

namespace qcoll::transports {

/// Tags separate concurrent streams of messages between one pair of ranks.
using tag_t = std::uint32_t;

struct message_header {
  std::uint64_t sequence = 0;  ///< how many collectives this communicator ran before
  std::uint64_t count = 0;     ///< element count as the caller passed it
  std::uint32_t root = 0;      ///< broadcast root; 0 for the others
  collective kind = collective::barrier;
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  std::uint8_t reserved = 0;

  friend bool operator==(const message_header&, const message_header&) = default;
};

/// Why a transport can no longer deliver: the first abort's code and words.
/// An empty code means the transport is intact.
struct failure {
  std::error_code code;
  std::string reason;
};

}  // namespace qcoll::transports
