#pragma once
/// @file
/// Step primitives: the verbs every collective is written in (send, recv,
/// send_recv, send_recv_reduce). They are the one place that posts to a transport,
/// checks what arrived, and turns any failure into an abort of the communicator
/// plus an exception that names the call, this rank, the peer and the sizes. Two
/// parts live apart: how a step ends, those checks and failures included
/// (step_completion.hpp, the base of primitives), and the schedule of a ring phase
/// pipelined in slices (ring_pipeline.hpp, run by ring_phase). Here: the verbs, the
/// single-copy steps that read from the peer's memory, and the arrival gate.

#include <qcoll/algorithms/ring_pipeline.hpp>
#include <qcoll/algorithms/step_completion.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/execution/kernels.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <deque>
#include <span>
#include <system_error>
#include <utility>

namespace qcoll::algorithms {

/// Data a step reads that may still be arriving from another memory space: a device
/// call's input, copied to host memory chunk by chunk while the script already runs
/// (algorithms/device_staging.hpp). await(context, data, bytes) returns once those
/// bytes are there (null), or the words of the failure that stopped them.
struct arrival_gate {
  void* context = nullptr;
  const char* (*await)(void* context, const void* data, std::size_t bytes) = nullptr;
};

/// A call's step verbs over `Transport`. How a step ends (the bounded wait, the checks
/// of what arrived, fail, fail_with, abandon; the call's header, rank and trace) comes
/// from step_completion (step_completion.hpp).
template <transport Transport>
class primitives : public step_completion<Transport> {
  using base = step_completion<Transport>;
  // The base's names the verbs use unqualified (a dependent base's are not found otherwise).
  using base::transport_, base::header_, base::trace_;
  using base::finish_send, base::finish_recv, base::fail_transport;

 public:
  using request = typename Transport::request;
  using base::fail;
  using base::abandon;

  /// `header` describes the call on this rank; every message carries it and every
  /// received header must equal it. `timeout` bounds each wait, i.e. how long a step
  /// may go without progress. `tag` tags every message the verbs post themselves.
  primitives(Transport& transport, const transports::message_header& header, std::chrono::milliseconds timeout,
             transports::tag_t tag = 0)
      : base(transport, header, timeout), tag_(tag) {}

  template <class T>
  void send(rank_t to, std::span<const T> data) {
    request outgoing;
    post_send(outgoing, to, tag_, data);
    finish_send(outgoing, to, data.size_bytes());
  }

  template <class T>
  void recv(rank_t from, std::span<T> data) {
    request incoming;
    transport_.post_recv(incoming, from, tag_, std::as_writable_bytes(data));
    finish_recv(incoming, from, data.size_bytes());
  }

  /// Sends `outgoing` to `to` while receiving `incoming` from `from`.
  template <class T>
  void send_recv(rank_t to, std::span<const T> outgoing, rank_t from, std::span<T> incoming) {
    if constexpr (single_copy_transport<Transport>) {
      if (read_directly_)
        return exchange_directly(to, std::as_bytes(outgoing), from, std::as_bytes(incoming), false,
                                 [&](std::uint64_t address, const transports::shared_region& region, std::size_t offset,
                                     std::size_t bytes, std::span<std::byte>) {
                                   const std::span<std::byte> into = std::as_writable_bytes(incoming).subspan(offset, bytes);
                                   const std::span<const std::byte> mapped = map_peer(from, region, address + offset, bytes);
                                   if (mapped.empty()) return read_peer(from, address + offset, into);
                                   execution::copy(into, mapped);
                                   trace_.paths.mapped += bytes;
                                   return std::error_code();
                                 });
    }
    request recv_request;
    request send_request;
    post_recv(recv_request, from, tag_, incoming);
    post_send(send_request, to, tag_, outgoing);
    finish_recv(recv_request, from, incoming.size_bytes());
    finish_send(send_request, to, outgoing.size_bytes());
  }

  /// send_recv, then result = incoming ⊕ own (own widened to float first when it
  /// holds 16-bit values and T is float). Straight from the sender's memory after
  /// read_directly(); see ring_phase() for the pipelined form of a whole phase.
  template <arithmetic_element T, element Own>
  void send_recv_reduce(rank_t to, std::span<const T> outgoing, rank_t from, std::span<T> incoming,
                        std::span<const Own> own, std::span<T> result, reduce_op op) {
    if constexpr (single_copy_transport<Transport>) {
      if (read_directly_) {
        // Slices of the peer's partial land in the bounce buffer (in cache) and are reduced from there.
        const std::size_t slice = bounce_.size() / sizeof(T);
        const std::span<T> landing(reinterpret_cast<T*>(bounce_.data()), slice);
        return exchange_directly(to, std::as_bytes(outgoing), from, std::as_bytes(std::span<const T>(result)), true,
                                 [&](std::uint64_t address, const transports::shared_region& region, std::size_t offset,
                                     std::size_t bytes, std::span<std::byte> instead) {
          // Pieces hold whole elements: they are cut from the sender's block of T.
          const std::size_t first = offset / sizeof(T), count = bytes / sizeof(T);
          // Where this piece of the result goes: its place, or the staging buffer (redirect_next_result()).
          const std::span<T> into = instead.empty() ? result.subspan(first, count)
                                                    : std::span<T>(reinterpret_cast<T*>(instead.data()), count);
          // In memory both map: reduced straight from the peer's block, no copy at all.
          if (const std::span<const std::byte> mapped = map_peer(from, region, address + offset, bytes);
              !mapped.empty()) {
            reduce_into(op, std::span<const T>(reinterpret_cast<const T*>(mapped.data()), count),
                        own.subspan(first, count), into);
            trace_.paths.mapped += bytes;
            return std::error_code();
          }
          for (std::size_t at = 0; at < count; at += slice) {
            const std::size_t n = std::min(slice, count - at);
            if (const std::error_code code = read_peer(from, address + (first + at) * sizeof(T),
                                                       std::as_writable_bytes(landing.first(n))))
              return code;
            reduce_into(op, std::span<const T>(landing.first(n)), own.subspan(first + at, n), into.subspan(at, n));
          }
          return std::error_code();
        });
      }
    }
    send_recv(to, outgoing, from, incoming);
    reduce_into(op, std::span<const T>(incoming), own, result);
  }

  /// result = incoming ⊕ own, own widened to float first when it holds 16-bit values
  /// (host memory only: on the device, scripts widen their input first).
  template <arithmetic_element T, element Own>
  void reduce_into(reduce_op op, std::span<const T> incoming, std::span<const Own> own, std::span<T> result) {
    arrive(std::as_bytes(own));
    if constexpr (std::same_as<T, Own>) {
      reduce<T>(op, incoming, own, result);
    } else {
      if (on_device_) fail(errc::invalid_argument, "internal error: a widening reduction on device memory");
      execution::reduce_widened(op, incoming, own, result);
    }
  }

  // ---- the data verbs between steps, in the call's memory space

  /// The call's buffers are device memory, and everything the verbs below do to them is
  /// queued on `stream` — a transport that moves device memory runs its copies there
  /// too, so each step's reduction is ordered before the send of its result. Set before
  /// the first step; host memory otherwise.
  void data_on_device(void* stream) noexcept {
    on_device_ = true;
    device_ = execution::device_stream{stream};
  }
  bool on_device() const noexcept { return on_device_; }

  /// out = a ⊕ b (avg as sum); `out` may be `a` or `b`.
  template <arithmetic_element T>
  void reduce(reduce_op op, std::span<const T> a, std::span<const T> b, std::span<T> out) {
    if (on_device_) execution::queue_reduce<T>(device_, op, a, b, out);
    else execution::reduce<T>(op, a, b, out);
  }
  /// values /= contributions (an average's last step).
  template <arithmetic_element T>
  void finish_avg(std::span<T> values, std::size_t contributions) {
    if (on_device_) execution::queue_finish_avg<T>(device_, values, contributions);
    else execution::finish_avg<T>(values, contributions);
  }
  /// into = from (the same size).
  template <element T>
  void copy(std::span<const T> from, std::span<T> into) {
    if (on_device_) execution::queue_copy(device_, std::as_writable_bytes(into), std::as_bytes(from));
    else execution::copy(std::as_writable_bytes(into), std::as_bytes(from));
  }
  /// 16-bit values to float (exact) and back (nearest even).
  template <half_element Half>
  void widen(std::span<const Half> in, std::span<float> out) {
    if (on_device_) execution::queue_widen<Half>(device_, in, out);
    else execution::widen<Half>(in, out);
  }
  template <half_element Half>
  void narrow(std::span<const float> in, std::span<Half> out) {
    if (on_device_) execution::queue_narrow<Half>(device_, in, out);
    else execution::narrow<Half>(in, out);
  }

  /// True when ring phases go as pipelines of slices (slice_reductions() asked for it
  /// and the steps are not read from the peer's memory).
  bool pipelined() const noexcept { return slice_bytes_ > 0 && !read_directly_; }

  /// A ring phase of `steps` steps as one pipeline of slices: step s sends block
  /// outgoing(s) to `to` and receives block incoming(s) from `from`, both cut into
  /// slices (slice_reductions()), each its own message; arrived(s, offset, count) runs
  /// as each slice of step s lands, in order. The link stays busy across steps, and a
  /// phase may reuse its buffers from step to step (run_ring_pipeline, ring_pipeline.hpp,
  /// says when each slice goes). outgoing(s) and incoming(s) are asked once per step,
  /// in step order.
  template <class T, class Outgoing, class Incoming, class Arrived>
  void ring_phase(rank_t to, rank_t from, std::size_t steps, Outgoing&& outgoing, Incoming&& incoming,
                  Arrived&& arrived) {
    run_ring_pipeline<T>(*this, tag_, to, from, steps, slice_bytes_, slices_in_flight_, std::forward<Outgoing>(outgoing),
                         std::forward<Incoming>(incoming), std::forward<Arrived>(arrived));
  }

  /// Asks send_recv and send_recv_reduce to read what arrives straight from the
  /// sender's memory (algorithm::ring_single_copy), reductions through `bounce` (at
  /// least 64 bytes, aligned for the element type). Every rank of the call asks alike.
  void read_directly(std::span<std::byte> bounce) noexcept {
    read_directly_ = true;
    bounce_ = bounce;
  }

  /// With read_directly(): a step whose outgoing block lies in ordinary memory (no
  /// shared region holds it) and fits `staging` (memory the peers map, from the
  /// transport's allocate_shared) is copied there slice by slice and offered from there
  /// (exchange_directly), so the peer reads it through its mapping instead of the
  /// kernel's cross-memory-attach copy (one user-space copy here against the kernel's
  /// page pinning there: tuning_table::single_copy_kernel_bytes). `staging` stays
  /// untouched by the caller while the call runs; every step waits until its reader is
  /// done with it.
  /// `spare`, of the same size (or none), holds results for redirect_next_result().
  void stage_outgoing(std::span<std::byte> staging, std::span<std::byte> spare = {}) noexcept {
    staging_ = {staging, spare.size() >= staging.size() ? spare : std::span<std::byte>()};
  }

  /// With stage_outgoing(): the result of the next send_recv_reduce is needed only as
  /// the outgoing block of the step right after it (an intermediate partial of a ring
  /// reduce-scatter). Where that step would stage it (it lies in ordinary memory), it
  /// is reduced straight into whichever of the staging buffer and its spare the step
  /// does not offer, and its place is left untouched: one write of the block instead of
  /// two (a reduction, then the staging copy), and writes, not reads, are what a step's
  /// memory time goes by (benchmarks/write_cost). The next step offers it from there;
  /// one that sends anything else fails as an internal error.
  void redirect_next_result() noexcept { redirect_requested_ = !staging_[1].empty(); }

  /// Asks ring phases to go as pipelines of slices of `bytes` (0: whole steps; a step
  /// of fewer than two slices goes whole). Both ends of a step must slice alike, so
  /// every rank passes the same values.
  void slice_reductions(std::size_t bytes, std::size_t in_flight) noexcept {
    slice_bytes_ = bytes;
    slices_in_flight_ = std::clamp<std::size_t>(in_flight, 1, max_ring_slices_in_flight);
  }

  /// Every read of data a step sends or reduces waits for `gate` first; the call fails
  /// (aborting, on every rank) if the data cannot arrive.
  void await_arrivals(arrival_gate gate) noexcept { arrivals_ = gate; }

  // The split forms, for algorithms that keep many messages in flight (pipelined
  // chunks): post now, complete later. A request's buffer must stay put until then.

  template <class T>
  void post_send(request& r, rank_t to, transports::tag_t tag, std::span<const T> data) {
    arrive(std::as_bytes(data));
    transport_.post_send(r, to, tag, header_, std::as_bytes(data));
    trace_.paths.transport += data.size_bytes();
  }
  template <class T>
  void post_recv(request& r, rank_t from, transports::tag_t tag, std::span<T> data) {
    transport_.post_recv(r, from, tag, std::as_writable_bytes(data));
  }
  /// Moves pending messages along without blocking; true once `r` completed.
  bool poll(request& r) { return transport_.test(r); }
  /// Waits for a posted send (the wait bounded by the timeout); fails the call on error.
  void complete_send(request& r, rank_t to, std::size_t bytes) { finish_send(r, to, bytes); }
  /// Waits for a posted receive and checks that it carries this call's header.
  void complete_recv(request& r, rank_t from, std::size_t bytes) { finish_recv(r, from, bytes); }

 private:

  /// Waits for `data` to have arrived (await_arrivals); fails the call if it cannot.
  void arrive(std::span<const std::byte> data) {
    if (!arrivals_.await || data.empty()) return;
    if (const char* failure = arrivals_.await(arrivals_.context, data.data(), data.size()))
      fail(errc::device_error, "copying {} bytes of the input from device memory: {}", data.size(), failure);
  }

  /// The transport's copy out of `peer`'s memory (single_copy_transport).
  std::error_code read_peer(rank_t peer, std::uint64_t address, std::span<std::byte> into) {
    trace_.paths.peer_read += into.size();
    return transport_.read_peer(peer, address, into);
  }

  /// `bytes` at `address` of the shared region `peer` described, mapped here; empty
  /// where the transport maps no peer memory or cannot map this region.
  std::span<const std::byte> map_peer(rank_t peer, const transports::shared_region& region, std::uint64_t address,
                                      std::size_t bytes) {
    if constexpr (shared_memory_transport<Transport>) {
      if (region.serial != 0) return transport_.map_peer(peer, region, address, bytes);
    }
    (void)peer, (void)region, (void)address, (void)bytes;
    return {};
  }

  /// A single-copy step: tell `to` where `outgoing` is (address, bytes, the shared
  /// region holding it, if any, and whether it is being staged), learn from `from` where
  /// its data is, `consume(address, region, offset, bytes, instead)` it from there piece
  /// by piece (the first failed read's code, or none) into `produced`, or into `instead`
  /// when that is not empty (a `redirectable` product the caller asked to redirect: it
  /// goes to the staging buffer), tell `from` this rank is done with it, and wait until
  /// `to` is done with `outgoing` (which stays untouched until then).
  ///
  /// A block of ordinary memory that fits the staging buffer is staged in slices of the
  /// bounce buffer's size: each slice is copied, then announced with an empty "ready"
  /// message, and the reader consumes slice k once its "ready" is in, so it reads each
  /// one while it is still in cache and starts before the whole block is copied. A rank
  /// waits for a ready only once all its own slices are out, so no rank waits on one
  /// that waits on it. A redirected result is offered whole, from where it was reduced.
  /// Per peer, a rank sends "where" first, then its readies, then
  /// "done", and receives in the same order (to and from may be the same peer).
  template <class Consume>
  void exchange_directly(rank_t to, std::span<const std::byte> outgoing, rank_t from,
                         std::span<const std::byte> produced, bool redirectable, Consume&& consume) {
    arrive(outgoing);  // offered to the peer, or staged from, below
    const std::size_t expected_bytes = produced.size();
    transports::shared_region region;
    std::span<const std::byte> source;  // where staged slices are copied from; empty when not staged
    std::size_t stage_slice = 0;
    std::span<std::byte> redirect;  // where `produced` goes instead, when redirected
    if constexpr (shared_memory_transport<Transport>) {
      // Which of staging_ (the buffer, its spare) `to` reads in this step; none: 1, so 0 is idle.
      std::size_t busy_half = 1;
      if (!redirected_.empty()) {  // the previous step reduced `outgoing` into staging
        if (redirected_.data() != outgoing.data() || redirected_.size() != outgoing.size())
          fail(errc::invalid_argument, "internal error: a step sends {} bytes, not the previous step's redirected "
               "result of {} bytes", outgoing.size(), redirected_.size());
        busy_half = redirected_half_;
        outgoing = staging_[busy_half].first(outgoing.size());
        redirected_ = {};
      } else if (transport_.region_of(outgoing).serial == 0 && !outgoing.empty() &&
                 outgoing.size() <= staging_[0].size()) {
        busy_half = 0;
        source = outgoing;
        outgoing = staging_[busy_half].first(outgoing.size());
        stage_slice = std::max<std::size_t>(bounce_.size() / 64 * 64, 64);
      }
      region = transport_.region_of(outgoing);
      // A result in a shared region is read where it lies: nothing to save there.
      if (std::exchange(redirect_requested_, false) && redirectable && !produced.empty() &&
          expected_bytes <= staging_[0].size() && transport_.region_of(produced).serial == 0) {
        redirected_half_ = 1 - busy_half;
        redirect = staging_[redirected_half_].first(expected_bytes);
      }
    }
    const std::array<std::uint64_t, 7> mine{reinterpret_cast<std::uintptr_t>(outgoing.data()), outgoing.size(),
                                            region.serial, region.handle, region.base, region.bytes, stage_slice};
    std::array<std::uint64_t, 7> theirs{};
    const auto pieces = [](std::size_t bytes, std::size_t slice) { return slice == 0 ? 0 : (bytes + slice - 1) / slice; };
    std::array<request, 4> requests;  // where from `from`, where to `to`, done to `from`, done from `to`
    std::deque<request> readies_sent, readies_received;  // a deque never moves them
    // The receive of `to`'s "done". In-process, a read of this rank's block waits until
    // it is posted (inproc's read_peer), so it goes first where nothing is staged; where
    // blocks may be staged it follows the readies, which `to` sends before its "done".
    bool done_posted = false;
    const auto post_done_receive = [&] {
      if (!std::exchange(done_posted, true)) post_recv(requests[3], to, tag_, std::span<std::byte>());
    };
    try {
      post_recv(requests[0], from, tag_, std::span<std::uint64_t>(theirs));
      if constexpr (!shared_memory_transport<Transport>) post_done_receive();
      post_send(requests[1], to, tag_, std::span<const std::uint64_t>(mine));
      finish_recv(requests[0], from, sizeof theirs);
      if (theirs[1] != expected_bytes)
        fail(errc::protocol_error, "peer {} offers {} bytes where this rank reads {}", from, theirs[1], expected_bytes);
      if (theirs[6] % 64 != 0)
        fail(errc::protocol_error, "peer {} stages its block in slices of {} bytes", from, theirs[6]);
      const transports::shared_region where{theirs[2], theirs[3], theirs[4], theirs[5]};
      const std::size_t their_slice = theirs[6] != 0 ? theirs[6] : expected_bytes;  // unstaged: one piece, there now
      const std::size_t staged = pieces(source.size(), stage_slice), to_read = pieces(expected_bytes, their_slice);
      if (theirs[6] != 0)
        for (std::size_t k = 0; k < to_read; ++k) post_recv(readies_received.emplace_back(), from, tag_, std::span<std::byte>());
      // Whether piece k of the peer's block may be read now (`wait`: block until it may).
      const auto ready = [&](std::size_t k, bool wait) {
        if (theirs[6] == 0) return true;
        if (!wait && !poll(readies_received[k])) return false;
        finish_recv(readies_received[k], from, 0);
        return true;
      };
      const auto read_piece = [&](std::size_t k) {
        const std::size_t offset = k * their_slice, bytes = std::min(their_slice, expected_bytes - offset);
        if (const std::error_code code =
                consume(theirs[0], where, offset, bytes, redirect.empty() ? redirect : redirect.subspan(offset, bytes))) {
          // The peer left the call: most likely it aborted, and its reason waits in the
          // transport (it is sent before the peer can exit or free the buffer). Take it
          // in, so the failure passes that reason on instead of blaming the peer.
          post_done_receive();
          poll(requests[3]);
          fail_transport(code, from, qcoll::detail::format("reading {} bytes from its memory", expected_bytes));
        }
      };
      // Stage a slice, then read whatever the peer has announced; wait only once every
      // slice of this rank's is out, so waiting never holds back a peer (and with ranks
      // that outnumber cores, a rank whose predecessor is not running stages on).
      for (std::size_t k_staged = 0, k_read = 0; k_staged < staged || k_read < to_read;) {
        if (k_staged < staged) {
          const std::size_t offset = k_staged * stage_slice, bytes = std::min(stage_slice, source.size() - offset);
          execution::copy(staging_[0].subspan(offset, bytes), source.subspan(offset, bytes));  // fresh blocks go to half 0
          trace_.paths.staged += bytes;
          post_send(readies_sent.emplace_back(), to, tag_, std::span<const std::byte>());
          ++k_staged;
        }
        while (k_read < to_read && ready(k_read, k_staged == staged)) read_piece(k_read++);
      }
      post_done_receive();
      post_send(requests[2], from, tag_, std::span<const std::byte>());
      for (request& announced : readies_sent) finish_send(announced, to, 0);
      finish_send(requests[2], from, 0);
      finish_recv(requests[3], to, 0);
      finish_send(requests[1], to, sizeof mine);
      if (!redirect.empty()) redirected_ = produced;
    } catch (const std::system_error& failure) {
      abandon(requests, failure);
      for (std::deque<request>* readies : {&readies_sent, &readies_received})
        for (request& r : *readies) abandon(std::span<request>(&r, 1), failure);
      throw;
    }
  }


  transports::tag_t tag_;
  std::size_t slice_bytes_ = 0;
  bool read_directly_ = false;
  std::span<std::byte> bounce_;
  std::array<std::span<std::byte>, 2> staging_;  // the buffer and its spare: a step offers one while its result fills the other
  bool redirect_requested_ = false;
  std::span<const std::byte> redirected_;  // the result (left untouched) whose values wait in staging
  std::size_t redirected_half_ = 0;
  std::size_t slices_in_flight_ = 1;
  arrival_gate arrivals_;
  bool on_device_ = false;
  execution::device_stream device_;
};

}  // namespace qcoll::algorithms
