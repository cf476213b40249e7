#pragma once
/// @file
/// subgroup<Base>: some ranks of a transport, renumbered 0 … k − 1, with tags of their
/// own — what a sub-communicator (communicator::split) sends through. It owns no
/// connection: posts go to the base transport, with the peer translated to its base
/// rank and the tag moved into the subgroup's context, so messages of different
/// subgroups (and of the whole) between one pair of ranks never match each other.
///
/// Contexts: context c owns the tags [c · tags_per_context, (c + 1) · tags_per_context).
/// Context 0 is the whole transport with its tags unchanged, so the identity subgroup
/// sends exactly what the base transport would. Which contexts are free is the
/// creator's business (communicator::split agrees on one among the members).
///
/// Failure is the base transport's: an abort through any subgroup aborts the base
/// (every rank of it hears), since the connections are shared.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll::transports {

/// Tags one context owns: a collective uses a few (qcoll's use 0 and 1).
inline constexpr tag_t tags_per_context = 256;
/// Contexts a base transport offers (context 0 included).
inline constexpr std::uint32_t max_contexts = 0xffffffffu / tags_per_context;

template <transport Base>
class subgroup {
 public:
  using request = typename Base::request;
  /// Device memory where the base moves it (core/concepts.hpp).
  static constexpr bool moves_device_memory = qcoll::moves_device_memory<Base>;

  /// The whole of `base`: rank r is base rank r, tags unchanged (context 0).
  explicit subgroup(Base& base) : base_(&base), rank_(base.rank()), size_(base.size()) {}

  /// Base ranks `members` (distinct, in the subgroup's rank order; this rank among
  /// them) in context `context` ≥ 1.
  subgroup(Base& base, std::vector<rank_t> members, std::uint32_t context)
      : base_(&base), members_(std::move(members)), size_(members_.size()), tag_base_(0) {
    if (context == 0 || context >= max_contexts)
      detail::throw_error(errc::invalid_argument, "subgroup: context {} is outside 1 … {}", context, max_contexts - 1);
    tag_base_ = context * tags_per_context;
    bool found = false;
    for (rank_t r = 0; r < members_.size(); ++r) {
      if (members_[r] >= base.size())
        detail::throw_error(errc::invalid_argument, "subgroup: member {} is not a rank of a {}-rank transport",
                            members_[r], base.size());
      if (members_[r] == base.rank()) {
        rank_ = r;
        found = true;
      }
    }
    if (!found)
      detail::throw_error(errc::invalid_argument, "subgroup: base rank {} is not among its members", base.rank());
  }

  rank_t rank() const noexcept { return rank_; }
  rank_t size() const noexcept { return size_; }
  /// The rank of subgroup rank r on the base transport.
  rank_t base_rank(rank_t r) const noexcept { return members_.empty() ? r : members_[r]; }
  std::uint32_t context() const noexcept { return tag_base_ / tags_per_context; }
  Base& base() const noexcept { return *base_; }

  void post_send(request& r, rank_t peer, tag_t tag, const message_header& header, std::span<const std::byte> data) {
    base_->post_send(r, base_peer(peer), base_tag(tag), header, data);
  }
  void post_recv(request& r, rank_t peer, tag_t tag, std::span<std::byte> buffer) {
    base_->post_recv(r, base_peer(peer), base_tag(tag), buffer);
  }
  bool test(request& r) { return base_->test(r); }
  std::error_code wait(request& r, deadline until) { return base_->wait(r, until); }
  void abort(std::error_code code, std::string_view reason) { base_->abort(code, reason); }
  transports::failure failure() const { return base_->failure(); }
  /// The base's, with the rank it names renumbered (dropped when it is not a member).
  transports::stall stall(rank_t peer) const
    requires liveness_transport<Base>
  {
    transports::stall s = base_->stall(base_peer(peer));
    if (s.waits_for && !members_.empty()) {
      const auto found = std::find(members_.begin(), members_.end(), *s.waits_for);
      s.waits_for = found == members_.end() ? std::nullopt : std::optional<rank_t>(rank_t(found - members_.begin()));
    }
    return s;
  }

  /// Why the base's stream to or from `peer` broke (its words, its numbering), where the
  /// base keeps it.
  std::string lost_reason(rank_t peer) const
    requires requires(const Base& b) { b.lost_reason(rank_t{}); }
  {
    return base_->lost_reason(base_peer(peer));
  }

  // Single-copy reads, where the base transport offers them.
  bool single_copy() const
    requires single_copy_transport<Base>
  {
    return base_->single_copy();
  }
  std::error_code read_peer(rank_t peer, std::uint64_t address, std::span<std::byte> into)
    requires single_copy_transport<Base>
  {
    return base_->read_peer(base_peer(peer), address, into);
  }
  // Shared memory, where the base transport maps peers' regions.
  auto allocate_shared(std::size_t bytes)
    requires shared_memory_transport<Base>
  {
    return base_->allocate_shared(bytes);
  }
  shared_region region_of(std::span<const std::byte> data) const
    requires shared_memory_transport<Base>
  {
    return base_->region_of(data);
  }
  std::span<const std::byte> map_peer(rank_t peer, const shared_region& region, std::uint64_t address,
                                      std::size_t bytes)
    requires shared_memory_transport<Base>
  {
    return base_->map_peer(base_peer(peer), region, address, bytes);
  }

 private:
  rank_t base_peer(rank_t peer) const {
    if (peer >= size_)
      detail::throw_error(errc::invalid_argument, "subgroup: rank {} of {}: peer {} is out of range", rank_, size_,
                          peer);
    return base_rank(peer);
  }
  tag_t base_tag(tag_t tag) const {
    if (tag >= tags_per_context)
      detail::throw_error(errc::invalid_argument, "subgroup: tag {} is not below {}", tag, tags_per_context);
    return tag_base_ + tag;
  }

  Base* base_;
  std::vector<rank_t> members_;  // empty: every base rank, in order
  rank_t rank_ = 0;
  rank_t size_ = 0;
  tag_t tag_base_ = 0;
};

}  // namespace qcoll::transports
