#pragma once
/// @file
/// How error messages name a call.

#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <qcoll/detail/format.hpp>

#include <string>

namespace qcoll::detail {

/// "allreduce(count=1000, f32, sum) #3", the call without its algorithm.
inline std::string describe_call(const transports::message_header& h) {
  switch (h.kind) {
    case collective::barrier: return qcoll::detail::format("barrier #{}", h.sequence);
    case collective::split: return qcoll::detail::format("split #{}", h.sequence);
    case collective::point_to_point:
      return qcoll::detail::format("point_to_point(count={}, {}) message #{} of the pair", h.count, to_string(h.type), h.sequence);
    case collective::all_gather:
      return qcoll::detail::format("all_gather(count={}, {}) #{}", h.count, to_string(h.type), h.sequence);
    case collective::broadcast:
      return qcoll::detail::format("broadcast(count={}, {}, root={}) #{}", h.count, to_string(h.type), h.root,
                         h.sequence);
    case collective::allreduce:
    case collective::reduce_scatter: break;
    case collective::compressed_allreduce:
      if (h.root == 0) break;  // a plan summing on the shared grid says so
      return qcoll::detail::format("compressed_allreduce(count={}, {}, {}, reproducible) #{}", h.count,
                                   to_string(h.type), to_string(h.op), h.sequence);
    case collective::grid_allreduce:
      return qcoll::detail::format("grid_allreduce(count={}, {}, {}, plan {:08x}) #{}", h.count, to_string(h.type),
                         to_string(h.op), h.root, h.sequence);
  }
  return qcoll::detail::format("{}(count={}, {}, {}) #{}", to_string(h.kind), h.count, to_string(h.type),
                     to_string(h.op), h.sequence);
}

/// "allreduce(count=1000, f32, sum) #3 via ring", as error messages name a call.
inline std::string describe(const transports::message_header& h) {
  if (h.way == algorithm::unspecified) return describe_call(h);
  return qcoll::detail::format("{} via {}", describe_call(h), to_string(h.way));
}

}  // namespace qcoll::detail
