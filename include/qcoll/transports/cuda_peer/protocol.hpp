#pragma once
/// @file
/// The CUDA peer transport's vocabulary (transports/cuda_peer.hpp says how it works):
/// its options, the reserved tags, the record every control message is, and the
/// request a caller posts.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/byte_count.hpp>
#include <qcoll/device/runtime.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace qcoll::transports::cuda_peer {

struct options {
  /// Bytes per slot: one copy, one record each way. Large enough that a record costs
  /// nothing beside the copy, small enough that `slots` of them per peer stay cheap.
  std::size_t slot_bytes = std::size_t{1} << 20;
  /// Slots per sender in each receiver's window: chunks in flight per peer.
  std::size_t slots = 8;
  /// The rank's device; −1: the calling thread's current device at connect.
  int device = -1;
  /// How long connect waits for the peers' windows, and the destructor for the peers to
  /// close this rank's windows.
  std::chrono::milliseconds timeout{30000};

  /// The defaults with the environment's overrides, which every rank must share (connect
  /// refuses windows that differ, naming both): QCOLL_CUDA_PEER_SLOT_BYTES (a byte
  /// count, K or M suffix; 4 KiB to 1 GiB) and QCOLL_CUDA_PEER_SLOTS (1 to 64). Each
  /// rank holds slots × slot_bytes of device memory per peer.
  /// @throws qcoll::error invalid_argument naming a variable that is malformed or out of range.
  static options from_environment() {
    options o;
    o.slot_bytes = qcoll::detail::byte_count_variable("QCOLL_CUDA_PEER_SLOT_BYTES", o.slot_bytes);
    if (o.slot_bytes < (std::size_t{4} << 10) || o.slot_bytes > (std::size_t{1} << 30))
      qcoll::detail::throw_error(errc::invalid_argument, "qcoll: QCOLL_CUDA_PEER_SLOT_BYTES={} is not between 4 KiB and 1 GiB",
                                 std::getenv("QCOLL_CUDA_PEER_SLOT_BYTES"));
    o.slots = qcoll::detail::byte_count_variable("QCOLL_CUDA_PEER_SLOTS", o.slots);
    if (o.slots < 1 || o.slots > 64)
      qcoll::detail::throw_error(errc::invalid_argument, "qcoll: QCOLL_CUDA_PEER_SLOTS={} is not between 1 and 64",
                                 std::getenv("QCOLL_CUDA_PEER_SLOTS"));
    return o;
  }
};

/// The control transport's tag the protocol's records travel on. A caller's tags must
/// be below first_reserved_tag (every subgroup context's are: subgroup.hpp).
inline constexpr tag_t first_reserved_tag = 0xffffff00u;
inline constexpr tag_t protocol_tag = 0xfffffff0u;

template <qcoll::transport Control>
class engine;

namespace detail {

/// A protocol record: fixed size, so every receive of one is posted with its exact size.
struct record {
  enum kind_t : std::uint64_t { announce = 1, clear_to_send, refused, chunk, credit, leaving, left, window, opened };
  std::uint64_t kind = 0;
  std::uint64_t id = 0;      ///< the message (per sender and receiver), or the window's pid
  std::uint64_t offset = 0;  ///< chunk: where in the message; window: its address
  std::uint64_t bytes = 0;   ///< announce, chunk: how many; window: slot_bytes; opened: nonzero on failure
  std::uint64_t slot = 0;    ///< chunk, credit: which slot; window: slots; announce: the caller's tag
  message_header header{};   ///< announce: the caller's
  device::ipc_handle handle{};  ///< window: the exported allocation
};

}  // namespace detail

/// A posted send or receive on device memory. Destroying a posted one cancels it (one
/// already moving data aborts the transport).
template <qcoll::transport Control>
class request : public request_base {
 public:
  request() = default;
  ~request() {
    if (engine_) engine_->withdraw(*this, make_error_code(errc::aborted), "a posted request was destroyed");
  }

 private:
  friend class engine<Control>;
  enum class state : unsigned char { idle, announced, streaming, done };

  engine<Control>* engine_ = nullptr;
  state state_ = state::idle;
  std::uint64_t id_ = 0;
  std::size_t queued_ = 0;  ///< sender: bytes whose copies were queued; receiver: whose chunks arrived
  std::size_t moved_ = 0;   ///< bytes whose copies completed
};

}  // namespace qcoll::transports::cuda_peer
