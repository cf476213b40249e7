#pragma once
/// @file
/// reference<T>: a transport by reference, as a transport. What lets two communicators
/// share one joined transport that only one of them owns — the CUDA peer transport's
/// control channel beside a host communicator over the same connections, or several
/// plans' communicators compiled once over one type. Each communicator numbers its own
/// calls; the ranks must make each call through the same one and never use two at once
/// (as with split communicators). The referenced transport must outlive it.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <cstddef>
#include <span>
#include <string_view>
#include <system_error>

namespace qcoll::transports {

template <qcoll::transport T>
class reference {
 public:
  using request = typename T::request;

  explicit reference(T& referenced) noexcept : referenced_(&referenced) {}

  rank_t rank() const noexcept { return referenced_->rank(); }
  rank_t size() const noexcept { return referenced_->size(); }
  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    referenced_->post_send(r, peer, tag, header, data);
  }
  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    referenced_->post_recv(r, peer, tag, buffer);
  }
  bool test(request& r) { return referenced_->test(r); }
  std::error_code wait(request& r, deadline until) { return referenced_->wait(r, until); }
  void abort(std::error_code code, std::string_view reason) { referenced_->abort(code, reason); }
  transports::failure failure() const { return referenced_->failure(); }
  T& referenced() const noexcept { return *referenced_; }

 private:
  T* referenced_;
};

}  // namespace qcoll::transports
