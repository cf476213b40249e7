#pragma once
/// @file
/// What every transport's request shares, and how error messages name a call.

#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>

namespace qcoll::transports {

/// What every transport's request reports: the header that arrived with a received
/// message and the bytes moved (for a receive of the wrong size: the size the sender
/// announced) — and what a transport records about any posted request. A request is
/// caller-owned and must not move while posted, so it is not copyable; each transport
/// derives its request from this and adds its own bookkeeping.
class request_base {
 public:
  request_base() = default;
  request_base(const request_base&) = delete;
  request_base& operator=(const request_base&) = delete;

  const message_header& header() const noexcept { return header_; }
  std::size_t transferred() const noexcept { return transferred_; }

 protected:
  ~request_base() = default;

  message_header header_{};
  std::size_t transferred_ = 0;
  rank_t peer_ = 0;
  tag_t tag_ = 0;
  bool is_send_ = false;
  const std::byte* send_data_ = nullptr;
  std::byte* recv_data_ = nullptr;
  std::size_t size_ = 0;  // bytes to send, or capacity of the receive buffer
  std::error_code result_{};
};

/// "allreduce(count=1000, f32, sum) #3", as error messages name a call.
inline std::string describe(const message_header& h) {
  switch (h.kind) {
    case collective::barrier: return fmt::format("barrier #{}", h.sequence);
    case collective::all_gather:
      return fmt::format("all_gather(count={}, {}) #{}", h.count, to_string(h.type), h.sequence);
    case collective::broadcast:
      return fmt::format("broadcast(count={}, {}, root={}) #{}", h.count, to_string(h.type), h.root,
                         h.sequence);
    case collective::allreduce:
    case collective::reduce_scatter:
    case collective::compressed_allreduce: break;
    case collective::grid_allreduce:
      return fmt::format("grid_allreduce(count={}, {}, {}, plan {:08x}) #{}", h.count, to_string(h.type),
                         to_string(h.op), h.root, h.sequence);
  }
  return fmt::format("{}(count={}, {}, {}) #{}", to_string(h.kind), h.count, to_string(h.type),
                     to_string(h.op), h.sequence);
}

}  // namespace qcoll::transports
