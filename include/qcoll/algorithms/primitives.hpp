#pragma once
/// @file
/// Step primitives: the verbs every collective is written in (send, recv,
/// send_recv, send_recv_reduce). They are the one place that posts to a transport,
/// checks what arrived, and turns any failure into an abort of the communicator
/// plus an exception that names the call, this rank, the peer and the sizes.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/kernels/cpu/convert.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/describe.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <system_error>

namespace qcoll::algorithms {

template <transport Transport>
class primitives {
 public:
  using request = typename Transport::request;

  /// `header` describes the call on this rank; every message carries it and every
  /// received header must equal it. `timeout` bounds each wait, i.e. how long a step
  /// may go without progress.
  primitives(Transport& transport, const transports::message_header& header, std::chrono::milliseconds timeout,
             transports::tag_t tag = 0)
      : transport_(transport), header_(header), timeout_(timeout), tag_(tag) {}

  template <class T>
  void send(rank_t to, std::span<const T> data) {
    request outgoing;
    transport_.post_send(outgoing, to, tag_, header_, std::as_bytes(data));
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
    request recv_request;
    request send_request;
    transport_.post_recv(recv_request, from, tag_, std::as_writable_bytes(incoming));
    transport_.post_send(send_request, to, tag_, header_, std::as_bytes(outgoing));
    finish_recv(recv_request, from, incoming.size_bytes());
    finish_send(send_request, to, outgoing.size_bytes());
  }

  /// send_recv, then result = incoming ⊕ own (own widened to float first when it
  /// holds 16-bit values and T is float).
  template <arithmetic_element T, element Own>
  void send_recv_reduce(rank_t to, std::span<const T> outgoing, rank_t from, std::span<T> incoming,
                        std::span<const Own> own, std::span<T> result, reduce_op op) {
    send_recv(to, outgoing, from, incoming);
    if constexpr (std::same_as<T, Own>) kernels::cpu::reduce<T>(op, incoming, own, result);
    else kernels::cpu::reduce_widened(op, std::span<const T>(incoming), own, result);
  }

  // The split forms, for algorithms that keep many messages in flight (pipelined
  // chunks): post now, complete later. A request's buffer must stay put until then.

  template <class T>
  void post_send(request& r, rank_t to, transports::tag_t tag, std::span<const T> data) {
    transport_.post_send(r, to, tag, header_, std::as_bytes(data));
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

  /// After a failure: makes sure every rank hears of it, then takes back whatever
  /// is still posted, so the requests and their buffers are free again.
  void abandon(std::span<request> requests, const std::system_error& failure) {
    if (!transport_.failure().code) transport_.abort(failure.code(), failure.what());
    for (request& r : requests) transport_.wait(r, clock::now());
  }

  rank_t rank() const noexcept { return transport_.rank(); }
  const transports::message_header& header() const noexcept { return header_; }

  /// Aborts the communicator (so every rank learns of it) and throws.
  template <class... Args>
  [[noreturn]] void fail(errc code, fmt::format_string<Args...> format, Args&&... args) {
    fail_with(make_error_code(code), fmt::format(format, std::forward<Args>(args)...));
  }

  /// The same for a failure found outside the primitives (say, an exception from a
  /// kernel): the transport is aborted unless something already aborted it.
  [[noreturn]] void fail_with(std::error_code code, const std::string& detail) {
    const std::string message = fmt::format("qcoll {} on rank {} of {}: {}", qcoll::detail::describe(header_),
                                            transport_.rank(), transport_.size(), detail);
    transport_.abort(code, message);
    throw error(code, message);
  }

 private:

  void finish_send(request& r, rank_t to, std::size_t bytes) {
    if (const std::error_code code = transport_.wait(r, clock::now() + timeout_))
      fail_transport(code, to, fmt::format("sending {} bytes to it", bytes));
  }

  void finish_recv(request& r, rank_t from, std::size_t bytes) {
    const std::error_code code = transport_.wait(r, clock::now() + timeout_);
    if (!code || code == errc::protocol_error) {
      const transports::message_header& got = r.header();
      if (got != header_) {
        fail_with(make_error_code(mismatch_of(got)),
                  fmt::format("peer {} called {} but this rank called {}", from, qcoll::detail::describe(got),
                              qcoll::detail::describe(header_)));
      }
      if (code) {
        fail_with(code, fmt::format("peer {} sent {} bytes where {} were expected", from, r.transferred(), bytes));
      }
      return;
    }
    fail_transport(code, from, fmt::format("receiving {} bytes from it", bytes));
  }

  [[noreturn]] void fail_transport(std::error_code code, rank_t peer, const std::string& what) {
    if (const transports::failure failed = transport_.failure(); failed.code) {
      // Another rank (or this one, earlier) aborted: pass its code and words on, it knows why.
      throw error(failed.code, fmt::format("qcoll {} on rank {} of {}: waiting for peer {}: {}",
                                           qcoll::detail::describe(header_), transport_.rank(), transport_.size(), peer,
                                           failed.reason));
    }
    if (code == errc::timeout)
      fail_with(code, fmt::format("no progress from peer {} within {} while {}", peer, timeout_, what));
    if (code == errc::peer_lost) fail_with(code, fmt::format("peer {} was lost while {}", peer, what));
    fail_with(code, fmt::format("peer {}: {} while {}", peer, code.message(), what));
  }

  errc mismatch_of(const transports::message_header& got) const noexcept {
    if (got.kind != header_.kind || got.op != header_.op || got.root != header_.root ||
        got.sequence != header_.sequence)
      return errc::operation_mismatch;
    if (got.type != header_.type) return errc::type_mismatch;
    return errc::count_mismatch;
  }

  Transport& transport_;
  transports::message_header header_;
  std::chrono::milliseconds timeout_;
  transports::tag_t tag_;
};

}  // namespace qcoll::algorithms
