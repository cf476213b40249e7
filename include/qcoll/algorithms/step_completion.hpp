#pragma once
/// @file
/// How a step ends: the call's side of the transport (the transport, the header every
/// message of the call carries, the step timeout, the call's trace), each wait bounded
/// by that timeout, the checks of what arrived (this call's header, the expected
/// size), and the one place that turns any failure into an abort of the communicator
/// plus an exception that names the call, this rank, the peer and the sizes. The base
/// of primitives (primitives.hpp), apart from its verbs so that what a failure says is
/// read in one place.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/call_trace.hpp>
#include <qcoll/detail/describe.hpp>
#include <qcoll/detail/format.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <system_error>

namespace qcoll::algorithms {

template <transport Transport>
class step_completion {
 public:
  using request = typename Transport::request;

  /// `header` describes the call on this rank; every message carries it and every
  /// received header must equal it. `timeout` bounds each wait, i.e. how long a step
  /// may go without progress.
  step_completion(Transport& transport, const transports::message_header& header, std::chrono::milliseconds timeout)
      : transport_(transport), header_(header), timeout_(timeout) {}

  /// After a failure: makes sure every rank hears of it, then takes back whatever
  /// is still posted, so the requests and their buffers are free again.
  void abandon(std::span<request> requests, const std::system_error& failure) {
    if (!transport_.failure().code) transport_.abort(failure.code(), failure.what());
    for (request& r : requests) transport_.wait(r, clock::now());
  }

  rank_t rank() const noexcept { return transport_.rank(); }
  const transports::message_header& header() const noexcept { return header_; }
  /// What QCOLL_DEBUG=INFO reports when the call ends (the communicator arms it).
  detail::call_trace& trace() noexcept { return trace_; }

  /// Aborts the communicator (so every rank learns of it) and throws.
  template <class... Args>
  [[noreturn]] void fail(errc code, qcoll::detail::format_string<Args...> format, const Args&... args) {
    fail_with(make_error_code(code), qcoll::detail::format_erased(format, fmt::make_format_args(args...)));
  }

  /// The same for a failure found outside the primitives (say, an exception from a
  /// kernel): the transport is aborted unless something already aborted it.
  [[noreturn]] void fail_with(std::error_code code, const std::string& detail) {
    const std::string message = qcoll::detail::format("qcoll {} on rank {} of {}: {}", qcoll::detail::describe(header_),
                                            transport_.rank(), transport_.size(), detail);
    transport_.abort(code, message);
    throw error(code, message);
  }

 protected:
  /// The transport's wait, bounded by the step timeout; timed for the trace when armed.
  std::error_code wait(request& r) {
    const clock::time_point entered = clock::now();
    const std::error_code code = transport_.wait(r, entered + timeout_);
    if (trace_.armed()) trace_.add_wait(clock::now() - entered);
    return code;
  }

  void finish_send(request& r, rank_t to, std::size_t bytes) {
    if (const std::error_code code = wait(r))
      fail_transport(code, to, qcoll::detail::format("sending {} bytes to it", bytes));
  }

  void finish_recv(request& r, rank_t from, std::size_t bytes) {
    const std::error_code code = wait(r);
    // A protocol error with a header: a message of this call's or another's, wrongly
    // sized. Without one, no message was matched: the peer's stream broke, or a rank
    // aborted with that code (fail_transport passes its words on).
    if (code == errc::protocol_error && !r.header_arrived()) {
      if (!transport_.failure().code)
        fail_with(code, qcoll::detail::format("peer {} sent something that is not a qcoll message while receiving {} "
                                              "bytes from it", from, bytes));
      fail_transport(code, from, qcoll::detail::format("receiving {} bytes from it", bytes));
    }
    if (!code || code == errc::protocol_error) {
      const transports::message_header& got = r.header();
      if (got != header_) {
        fail_with(make_error_code(mismatch_of(got)),
                  qcoll::detail::format("peer {} called {} but this rank called {}", from, qcoll::detail::describe(got),
                              qcoll::detail::describe(header_)));
      }
      if (code) {
        // The right size and still an error, or a rank aborted meanwhile: the stream broke
        // under the message (a payload checksum's mismatch; an abort record mid-message),
        // and the transport knows why.
        if (r.transferred() == bytes || transport_.failure().code)
          fail_transport(code, from, qcoll::detail::format("receiving {} bytes from it", bytes));
        fail_with(code, qcoll::detail::format("peer {} sent {} bytes where {} were expected", from, r.transferred(), bytes));
      }
      return;
    }
    fail_transport(code, from, qcoll::detail::format("receiving {} bytes from it", bytes));
  }

  [[noreturn]] void fail_transport(std::error_code code, rank_t peer, const std::string& what) {
    if (const transports::failure failed = transport_.failure(); failed.code) {
      // Another rank (or this one, earlier) aborted: pass its code and words on, it knows why.
      throw error(failed.code, qcoll::detail::format("qcoll {} on rank {} of {}: waiting for peer {}: {}",
                                           qcoll::detail::describe(header_), transport_.rank(), transport_.size(), peer,
                                           failed.reason));
    }
    if (code == errc::timeout) {
      if constexpr (liveness_transport<Transport>) {
        if (const transports::stall stall = transport_.stall(peer); stall.peer_alive)
          fail_with(code, qcoll::detail::format("peer {} is alive but {} did not finish within {}ms: {}", peer, what,
                                                stall.waited.count(), what_it_waits_for(stall)));
      }
      fail_with(code, qcoll::detail::format("no progress from peer {} within {}ms while {}", peer, timeout_.count(), what));
    }
    if (code == errc::peer_lost) {
      // The pipe's words say why where the transport kept them (a TLS record that failed
      // its authentication, a reset connection).
      if constexpr (requires { transport_.lost_reason(peer); }) {
        if (const std::string why = transport_.lost_reason(peer); !why.empty())
          fail_with(code, qcoll::detail::format("peer {} was lost while {}: {}", peer, what, why));
      }
      fail_with(code, qcoll::detail::format("peer {} was lost while {}", peer, what));
    }
    fail_with(code, qcoll::detail::format("peer {}: {} while {}", peer, code.message(), what));
  }

  std::string what_it_waits_for(const transports::stall& stall) const {
    if (!stall.waits_for) return "it sent something, but not what this rank waits for";
    if (*stall.waits_for == transport_.rank())
      return "it waits for this rank, which waits for it (did every rank make the same calls?)";
    return qcoll::detail::format("it waits for peer {}", *stall.waits_for);
  }

  errc mismatch_of(const transports::message_header& got) const noexcept {
    if (got.kind != header_.kind || got.op != header_.op || got.root != header_.root ||
        got.sequence != header_.sequence)
      return errc::operation_mismatch;
    if (got.type != header_.type) return errc::type_mismatch;
    if (got.count != header_.count) return errc::count_mismatch;
    return errc::operation_mismatch;  // the same call, run by another algorithm
  }

  Transport& transport_;
  transports::message_header header_;
  std::chrono::milliseconds timeout_;
  detail::call_trace trace_;
};

}  // namespace qcoll::algorithms
