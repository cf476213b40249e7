#pragma once
/// @file
/// The MPI transport's request and the sizes of the protocol it carries (a 32-byte
/// frame, payloads of up to inline_payload_bytes inside the frame's message: the top
/// comment of transports/mpi.hpp). Its destructor is defined with detail::state
/// (state.hpp), whose withdraw it calls.

#include <qcoll/core/message.hpp>
#include <qcoll/transports/mpi/c_api.hpp>
#include <qcoll/transports/stream/records.hpp>

#include <mpi.h>

#include <array>
#include <cstddef>

namespace qcoll::transports::mpi {

/// Payloads up to this size travel in one MPI message with their frame. Part of the
/// protocol: every rank of a job must use the same value, so it is not an option.
/// Below every eager limit of Open MPI's and MPICH's shared-memory and TCP paths, so an
/// inline send completes at once and never leaves the caller's buffer to MPI.
inline constexpr std::size_t inline_payload_bytes = 2048;
/// u64 payload length, then the message header.
inline constexpr std::size_t frame_bytes = 8 + stream::message_header_bytes;

namespace detail {
struct state;
}

/// A posted send or receive. Destroying a posted request withdraws it.
class request : public request_base {
 public:
  request() = default;
  ~request();

 private:
  friend struct detail::state;
  friend class transport;
  enum class state : unsigned char { idle, sending, probing, receiving_frame, receiving_payload, done };

  detail::state* owner_ = nullptr;
  state state_ = state::idle;
  bool inline_payload_ = false;
  bool payload_posted_ = false;
  // The frame, and after it an inline payload: one contiguous message, so no MPI
  // datatype is made per small message (MPICH 4.0's UCX device leaks the UCX datatype
  // of some freed MPI datatypes: pmodels/mpich#7966, ~100 bytes a message).
  std::array<std::byte, frame_bytes + inline_payload_bytes> frame_{};
  MPI_Request frame_request_ = MPI_REQUEST_NULL;
  MPI_Request payload_request_ = MPI_REQUEST_NULL;
  MPI_Request clear_request_ = MPI_REQUEST_NULL;  // the clear-to-send: awaited (send) or sent (receive)
  request* prev_ = nullptr;  // the transport's list of pending requests, in post order
  request* next_ = nullptr;
};

}  // namespace qcoll::transports::mpi
