#pragma once
// An in-process transport that counts what a rank hands it, and can be told to fail
// after a number of sends: the tests' view of the bytes an algorithm really sends,
// and a way to break a collective at a chosen point.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/transports/inproc.hpp>

#include <cstddef>
#include <limits>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>

namespace qcoll::test {

class counting_transport {
 public:
  using request = transports::inproc::request;

  /// The send numbered `fail_at_send` (0-based, counted over the transport's life)
  /// aborts the world with peer_lost instead of being sent.
  explicit counting_transport(transports::inproc::transport inner,
                              std::size_t fail_at_send = std::numeric_limits<std::size_t>::max())
      : inner_(std::move(inner)), fail_at_send_(fail_at_send) {}

  rank_t rank() const noexcept { return inner_.rank(); }
  rank_t size() const noexcept { return inner_.size(); }

  void post_send(request& r, rank_t peer, transports::tag_t tag, const transports::message_header& header,
                 std::span<const std::byte> data) {
    if (sends_++ == fail_at_send_)
      inner_.abort(make_error_code(errc::peer_lost), "injected failure: this rank's link went down");
    bytes_sent_ += data.size();
    inner_.post_send(r, peer, tag, header, data);
  }
  void post_recv(request& r, rank_t peer, transports::tag_t tag, std::span<std::byte> buffer) {
    inner_.post_recv(r, peer, tag, buffer);
  }
  bool test(request& r) { return inner_.test(r); }
  std::error_code wait(request& r, deadline until) { return inner_.wait(r, until); }
  void abort(std::error_code code, std::string_view reason) { inner_.abort(code, reason); }
  transports::failure failure() const { return inner_.failure(); }

  /// Fails the `k`-th send from now (0: the next one).
  void fail_after_sends(std::size_t k) noexcept { fail_at_send_ = sends_ + k; }

  std::size_t bytes_sent() const noexcept { return bytes_sent_; }
  std::size_t sends() const noexcept { return sends_; }

 private:
  transports::inproc::transport inner_;
  std::size_t fail_at_send_;
  std::size_t sends_ = 0;
  std::size_t bytes_sent_ = 0;
};

static_assert(transport<counting_transport>);

}  // namespace qcoll::test
