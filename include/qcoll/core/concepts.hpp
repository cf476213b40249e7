#pragma once
/// @file
/// The three policy contracts. Each is a `requires` expression that lists the
/// operations a model must provide, so a policy that lacks one is rejected with a
/// diagnostic naming it. docs/concepts.md states what each operation must do.

#include <qcoll/core/encode_position.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

namespace qcoll {

using clock = std::chrono::steady_clock;
/// Every blocking wait takes one; a wait that passes it returns errc::timeout.
using deadline = clock::time_point;

/// What turns n values into an encoded frame and back, with error feedback.
/// `encode` adds `residual` to the input (none when it is empty), quantizes, and
/// stores the new error in `residual`; `position` keys stochastic rounding.
/// `decode_accumulate` is the fused step reductions use (out += decoded). Decoding
/// checks the whole frame first and returns an error, touching nothing, if it is
/// not exactly what this quantizer would have written for out.size() values.
/// `bits_per_value()` is the nominal code width; `group_size()` the granularity a
/// caller must cut buffers at to keep groups intact (0: any cut). `Q::name` names
/// it in error messages. A quantizer may also offer the split-residual encode
/// `encode(in, residual_in, residual_out, encoded, position)` (residual_in read,
/// residual_out written); algorithms use it when present to save a copy, and the
/// concept's in-place encode otherwise.
template <class Q>
concept quantizer = requires(const Q& q, std::size_t n, std::span<const typename Q::value_type> in,
                             std::span<typename Q::value_type> residual,
                             std::span<typename Q::value_type> out, std::span<std::byte> encoded,
                             std::span<const std::byte> received, quantizers::encode_position position) {
  requires arithmetic_element<typename Q::value_type>;
  { Q::keeps_residual } -> std::convertible_to<bool>;
  { q.bits_per_value() } -> std::convertible_to<double>;
  { q.group_size() } -> std::same_as<std::size_t>;
  { q.encoded_size(n) } -> std::same_as<std::size_t>;
  { q.encode(in, residual, encoded, position) } -> std::same_as<void>;
  { q.decode(received, out) } -> std::same_as<std::error_code>;
  { q.decode_accumulate(received, out) } -> std::same_as<std::error_code>;
  { Q::name } -> std::convertible_to<std::string_view>;  // names it in error messages
};

/// How bytes move between ranks: post a send or a receive into a caller-owned
/// request, then test or wait for it with a deadline. Requests must not move while
/// posted; destroying a posted one cancels it. Once wait() has returned for a
/// request, it no longer refers to its transport and may outlive it (plans keep
/// their requests from call to call, across communicators). Messages between a pair of ranks with
/// the same tag arrive in the order they were sent.
template <class T>
concept transport = requires(T& t, const T& ct, typename T::request& request, rank_t peer,
                             transports::tag_t tag, const transports::message_header& header,
                             std::span<const std::byte> data, std::span<std::byte> buffer,
                             deadline until, std::error_code code, std::string_view reason) {
  { ct.rank() } -> std::same_as<rank_t>;
  { ct.size() } -> std::same_as<rank_t>;
  { t.post_send(request, peer, tag, header, data) } -> std::same_as<void>;
  { t.post_recv(request, peer, tag, buffer) } -> std::same_as<void>;
  { t.test(request) } -> std::same_as<bool>;
  { t.wait(request, until) } -> std::same_as<std::error_code>;
  { std::as_const(request).header() } -> std::same_as<const transports::message_header&>;
  { std::as_const(request).transferred() } -> std::same_as<std::size_t>;
  { std::as_const(request).header_arrived() } -> std::same_as<bool>;
  { t.abort(code, reason) } -> std::same_as<void>;
  { ct.failure() } -> std::same_as<transports::failure>;
};

/// A transport that tells a silent peer from a live one that waits on something else.
/// Its wait(request, until) fails only when the peer was silent for the whole span
/// from the call to `until`: while the peer is heard from (its data, or the small
/// "alive, waiting for rank w" notes a rank sends every quarter of a span, at most
/// every second, to every peer while it waits), the deadline moves on, until twice the
/// span passes without a byte of the request itself moving. stall(peer) then says which of the two ended the last timed-out wait on
/// that peer, so an error names the rank that stopped, not a live one waiting for it.
template <class T>
concept liveness_transport = transport<T> && requires(const T& ct, rank_t peer) {
  { ct.stall(peer) } -> std::same_as<transports::stall>;
};

/// A transport that can also read a peer's memory directly, for single-copy ring
/// steps (algorithm::ring_single_copy): single_copy() says whether every pair of ranks
/// may (shm: the kernel permits cross-memory attach between them; in-process: always),
/// and read_peer copies into.size() bytes from `address` in peer's address space.
/// Only an address the peer sent in a message of the current call may be read.
template <class T>
concept single_copy_transport =
    transport<T> && requires(T& t, const T& ct, rank_t peer, std::uint64_t address, std::span<std::byte> into) {
      { ct.single_copy() } -> std::convertible_to<bool>;
      { t.read_peer(peer, address, into) } -> std::same_as<std::error_code>;
    };

/// A single-copy transport whose ranks can also map memory their peers allocated
/// through it (shm: communicator::allocate), so a step reads a peer's block in place
/// instead of copying it through the kernel. allocate_shared(bytes) makes such memory
/// (its bytes() a std::span<std::byte>); region_of(data) says which of this rank's
/// regions holds all of `data` (serial 0: none); map_peer gives a read-only view of
/// `bytes` at `address` of the region a peer described, empty when it cannot (the step
/// then calls read_peer).
template <class T>
concept shared_memory_transport =
    single_copy_transport<T> && requires(T& t, const T& ct, rank_t peer, std::span<const std::byte> data,
                                         const transports::shared_region& region, std::uint64_t address,
                                         std::size_t bytes) {
      { t.allocate_shared(bytes).bytes() } -> std::same_as<std::span<std::byte>>;
      { ct.region_of(data) } -> std::same_as<transports::shared_region>;
      { t.map_peer(peer, region, address, bytes) } -> std::same_as<std::span<const std::byte>>;
    };

/// Whether a transport moves device memory itself — it says so with a static member
/// `moves_device_memory = true`, as a transport between GPUs would. Every transport
/// today moves host memory and leaves it out: a call on device buffers over one is
/// staged through pinned host memory (algorithms/device_staging.hpp, needs_staging).
template <class T>
inline constexpr bool moves_device_memory = requires { requires T::moves_device_memory; };

/// Who talks to whom. Compile-time facts (the fan-out bound) are static members;
/// runtime neighbour tables are plain data built once.
template <class T>
concept topology = requires(const T& t, rank_t a, rank_t b) {
  { T::max_fan_out } -> std::convertible_to<std::size_t>;
  { t.size() } -> std::same_as<rank_t>;
  { t.linked(a, b) } -> std::same_as<bool>;
};

/// A topology that embeds a ring: ring_order()[p] is the rank at position p, and
/// consecutive positions (and the last and the first) are linked.
template <class T>
concept ring_topology = topology<T> && requires(const T& t) {
  { t.ring_order() } -> std::same_as<std::span<const rank_t>>;
};

}  // namespace qcoll
