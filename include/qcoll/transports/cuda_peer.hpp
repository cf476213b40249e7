#pragma once
/// @file
/// cuda_peer: ranks on one node, each bound to a GPU (several ranks per GPU allowed),
/// moving device memory GPU to GPU through windows in the receivers' device memory —
/// never staged through host memory. A model of qcoll::transport whose buffers are
/// device memory (moves_device_memory).
///
/// **Protocol.** Every rank owns a receive window per sender: `slots` slots of
/// `slot_bytes` in one device allocation, exported with the device runtime's handles
/// (cudaIpcGetMemHandle) and opened by every peer at connect. Beside the data, a host
/// *control* transport (shm for processes, inproc for threads) carries small records:
///   1. the sender announces a message — its tag, header and size; the receiver matches
///      announcements with its receives by tag, in order per tag, keeping those that no
///      receive waits for yet (a few dozen bytes each);
///   2. the receiver, once a receive matched the announcement, answers "clear to send"
///      (or "refused" when the sizes differ: the receive fails with protocol_error and the
///      sender's size, as on every transport);
///   3. the sender copies the message into free slots of its window at the receiver, one
///      slot-sized chunk per copy on its own stream, and once the runtime reports a copy
///      complete it sends a "chunk" record (message, offset, bytes, slot);
///   4. the receiver copies the slot into the receive's buffer and, once that copy is
///      complete, returns the slot with a "credit" record.
/// Memory is bounded by the windows whatever the message size (flow control by
/// credits); both ends pipeline up to `slots` chunks per peer.
///
/// Every record travels on one reserved tag of the control transport, whose receive is
/// always posted: a transport that delivers a peer's messages in send order across tags
/// (the stream engine) would otherwise hold the protocol's records behind a message no
/// receive matches yet, and another user of the same control transport (a host
/// communicator beside this one) never meets this one's messages.
///
/// **Ordering by completion the host observes, not by inter-process events.** A record
/// leaves only after the copy it announces has completed (an event queried from the
/// host). The alternative — the receiver's stream waiting on the sender's exported
/// event, as CGX does — would leave a survivor's stream waiting forever on an event of a
/// peer that died before recording it, and a stream that never drains cannot be freed or
/// synchronised: the failure would become a hang. This way no stream ever waits on
/// another process, so a dead peer is only a control transport that breaks (peer_lost
/// within the deadline). The cost is a host round trip per chunk, hidden by pipelining
/// `slots` chunks — only partly: ~37 µs per 1 MiB slot on an H200 (docs/gpu.md).
///
/// **Several ranks per GPU** are allowed (NCCL refuses them): nothing in the protocol
/// depends on which device a peer uses. Ranks that are threads of one process open
/// each other's windows the same way (the CUDA runtime's open_memory answers a handle its
/// own process exported with the allocation itself, which CUDA's IPC would refuse).
///
/// **Failures.** A peer that dies breaks the control transport: every request that
/// involves it fails with peer_lost (the control transport's deadline). abort() aborts the
/// control transport, so every rank hears it. A host pointer given as a send's data or a
/// receive's buffer throws invalid_argument naming it. A request withdrawn half-moved (a
/// wait that timed out, a posted request destroyed) aborts the transport: the rest of its
/// chunks could no longer be placed. At destruction a rank waits for its copies, closes
/// its peers' windows, says so, and frees its own windows once every peer has closed
/// them (or is gone, or `close_timeout` passed).


#include <qcoll/core/concepts.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/transports/cuda_peer/engine.hpp>
#include <qcoll/transports/cuda_peer/protocol.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

namespace qcoll::transports::cuda_peer {

/// One rank's endpoint. Models qcoll::transport; its buffers are device memory of its
/// device (moves_device_memory). Move-only; posted requests point at its engine, which
/// stays put.
template <qcoll::transport Control>
class transport {
 public:
  using request = cuda_peer::request<Control>;
  static constexpr bool moves_device_memory = true;

  /// Connects over `control` (every rank calls it, collectively): makes this rank's
  /// windows on its device, exchanges handles with every peer and opens theirs. Every
  /// rank fails alike (qcoll::error naming the rank and window) if any cannot.
  explicit transport(Control control, const options& settings = {})
      : engine_(std::make_unique<engine<Control>>(std::move(control), settings)) {}

  rank_t rank() const noexcept { return engine_->rank(); }
  rank_t size() const noexcept { return engine_->size(); }
  /// QCOLL_TRANSPORT's name for it.
  rendezvous::transport_kind kind() const noexcept { return rendezvous::transport_kind::cuda_peer; }
  /// The device whose memory it moves.
  int device() const noexcept { return engine_->device(); }
  const options& settings() const noexcept { return engine_->settings(); }
  Control& control() noexcept { return engine_->control(); }
  /// The stream every copy of this transport runs on; a collective over it queues its
  /// reductions there too.
  device::stream_handle stream() const noexcept { return engine_->stream(); }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    engine_->post_send(r, peer, tag, header, data);
  }
  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    engine_->post_recv(r, peer, tag, buffer);
  }
  bool test(request& r) { return engine_->test(r); }
  std::error_code wait(request& r, deadline until) { return engine_->wait(r, until); }
  void abort(std::error_code code, std::string_view reason) { engine_->abort(code, reason); }
  transports::failure failure() const { return engine_->failure(); }
  /// Bytes this rank copied into its peers' windows.
  std::uint64_t bytes_copied() const noexcept { return engine_->bytes_copied(); }

 private:
  std::unique_ptr<engine<Control>> engine_;
};

}  // namespace qcoll::transports::cuda_peer
