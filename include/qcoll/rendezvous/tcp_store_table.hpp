#pragma once
/// @file
/// The TCP store's data and parked requests (detail::store_table): what the server does
/// with each request of tcp_store_protocol.hpp, as logic with no socket in sight, so the
/// server (tcp_store_server.hpp) only moves bytes and a fuzz target can drive it alone.

#include <qcoll/rendezvous/tcp_store_protocol.hpp>

#include <qcoll/detail/little_endian.hpp>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace qcoll::rendezvous::detail {

/// The store's data and parked requests, as logic over requests with no socket in sight:
/// the server feeds it each well-formed request (parse_request passed) with its body
/// (key, then value) and sends the replies it returns. Connections are numbers the
/// server chooses; forget() a connection that closed.
class store_table {
 public:
  struct reply {
    std::uint64_t connection;
    std::uint32_t id;
    std::string value;
  };

  std::vector<reply> handle(std::uint64_t connection, const store_request& request, std::span<const std::byte> body) {
    std::vector<reply> replies;
    const auto* text = reinterpret_cast<const char*>(body.data());
    std::string key(text, request.key_size);
    switch (request.op) {
      case store_op::set: {
        replies.push_back({connection, request.id, {}});
        data_.insert_or_assign(key, std::string(text + request.key_size, request.value_size));
        notify(key, replies);
        break;
      }
      case store_op::get:
        if (const auto found = data_.find(key); found != data_.end()) {
          replies.push_back({connection, request.id, found->second});
        } else {
          key_waiters_[key].push_back({connection, request.id});
        }
        break;
      case store_op::wait: {
        barrier_waiter waiter{connection, request.id, std::move(key),
                              qcoll::detail::load_le<std::uint32_t>(body.data() + request.key_size), 0};
        if (advance(waiter)) {
          replies.push_back({connection, request.id, {}});
        } else {
          barrier_waiters_.push_back(std::move(waiter));
        }
        break;
      }
      case store_op::missing:
        replies.push_back(
            {connection, request.id, missing_keys(key, qcoll::detail::load_le<std::uint32_t>(body.data() + request.key_size))});
        break;
      case store_op::cancel: forget(connection, request.id); break;
    }
    return replies;
  }

  /// Drops the parked requests of a connection: all of them, or the one with `id`.
  void forget(std::uint64_t connection, std::optional<std::uint32_t> id = std::nullopt) {
    const auto matches = [&](std::uint64_t owner, std::uint32_t waiter_id) {
      return owner == connection && (!id || *id == waiter_id);
    };
    for (auto it = key_waiters_.begin(); it != key_waiters_.end();) {
      std::erase_if(it->second, [&](const key_waiter& w) { return matches(w.connection, w.id); });
      it = it->second.empty() ? key_waiters_.erase(it) : std::next(it);
    }
    barrier_waiters_.remove_if([&](const barrier_waiter& w) { return matches(w.connection, w.id); });
  }

  void clear() noexcept {
    key_waiters_.clear();
    barrier_waiters_.clear();
  }

 private:
  struct key_waiter {
    std::uint64_t connection;
    std::uint32_t id;
  };
  struct barrier_waiter {
    std::uint64_t connection;
    std::uint32_t id;
    std::string prefix;
    std::uint32_t count;
    std::uint32_t next;  // keys prefix+0 … prefix+(next-1) are known to exist
  };

  /// The keys prefix+0 … prefix+(count−1) that do not exist: their number, then the
  /// first missing_listed of them. The work is bounded by the keys that exist, not by
  /// `count`, which the client chose (a count of 2^32 − 1 must not stall the store).
  std::string missing_keys(const std::string& prefix, std::uint32_t count) const {
    std::uint32_t present = 0;
    for (const auto& entry : data_) {
      const std::string_view key = entry.first;
      if (!key.starts_with(prefix)) continue;
      const std::string_view digits = key.substr(prefix.size());
      std::uint32_t index = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      // Only the spelling std::to_string gives counts: "07" is not key 7.
      if (ec == std::errc{} && end == digits.data() + digits.size() && index < count &&
          (digits.size() == 1 || digits.front() != '0'))
        ++present;
    }
    std::vector<std::uint32_t> absent;
    for (std::uint32_t i = 0; i < count && absent.size() < missing_listed; ++i)
      if (!data_.contains(prefix + std::to_string(i))) absent.push_back(i);
    std::string reply(4 * (1 + absent.size()), '\0');
    qcoll::detail::store_le<std::uint32_t>(reinterpret_cast<std::byte*>(reply.data()), count - present);
    for (std::size_t k = 0; k < absent.size(); ++k)
      qcoll::detail::store_le<std::uint32_t>(reinterpret_cast<std::byte*>(reply.data()) + 4 * (k + 1), absent[k]);
    return reply;
  }

  bool advance(barrier_waiter& waiter) const {
    while (waiter.next < waiter.count && data_.contains(waiter.prefix + std::to_string(waiter.next))) ++waiter.next;
    return waiter.next == waiter.count;
  }

  void notify(const std::string& key, std::vector<reply>& replies) {
    if (auto found = key_waiters_.find(key); found != key_waiters_.end()) {
      const std::string& value = data_.at(key);
      for (const auto& waiter : found->second) replies.push_back({waiter.connection, waiter.id, value});
      key_waiters_.erase(found);
    }
    for (auto it = barrier_waiters_.begin(); it != barrier_waiters_.end();) {
      if (key.starts_with(it->prefix) && advance(*it)) {
        replies.push_back({it->connection, it->id, {}});
        it = barrier_waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::unordered_map<std::string, std::string> data_;
  std::unordered_map<std::string, std::vector<key_waiter>> key_waiters_;
  std::list<barrier_waiter> barrier_waiters_;
};

}  // namespace qcoll::rendezvous::detail
