#pragma once
/// @file
/// Step 2 of the survivors' agreement (survivors.hpp): probing every other rank's
/// recovery listener at once, and what each connect's outcome says about the rank —
/// the one place that maps socket errors to the reasons docs/recovery.md gives.

#include <qcoll/core/concepts.hpp>
#include <qcoll/rendezvous/socket_io.hpp>

#include <qcoll/detail/asio.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace qcoll::rendezvous {

/// Why a rank is not among the survivors.
enum class loss { refused, unreachable, silent };

constexpr std::string_view to_string(loss why) noexcept {
  switch (why) {
    case loss::refused: return "its process is gone (its host refused the connection)";
    case loss::unreachable: return "no answer from its host (host or link down)";
    case loss::silent: return "alive but did not check in";
  }
  return "?";
}

namespace detail {

namespace asio = boost::asio;
using asio::ip::tcp;

/// What a probe's connect says about the rank behind it: alive (accepted), gone (its
/// host's kernel refused or reset the connection: nothing listens there any more — a
/// reset comes from a process killed while the connection was being set up), or
/// nothing yet. "Nothing yet" covers the errors that are no answer from the rank's
/// host (the network's host or net unreachable, a local failure): the probe tries
/// again until probe_timeout, and only then counts the rank unreachable, as
/// docs/recovery.md says.
enum class probe_answer : std::uint8_t { alive, gone, none_yet };

inline probe_answer classify_connect(const boost::system::error_code& ec) noexcept {
  if (!ec) return probe_answer::alive;
  if (ec == asio::error::connection_refused || ec == asio::error::connection_reset ||
      ec == asio::error::connection_aborted)
    return probe_answer::gone;
  return probe_answer::none_yet;
}

/// Probes the ranks `found` still counts alive (all at first), updating it; keeps the
/// connections to higher ranks (a coordinator waits only for higher ones) and closes
/// the others at once, so a lower rank that accepts one sees it end at once.
inline std::vector<std::optional<tcp::socket>> probe(asio::io_context& io,
                                                     std::span<const std::optional<tcp::endpoint>> where,
                                                     rank_t self, std::vector<std::optional<loss>>& found,
                                                     deadline until) {
  constexpr auto retry_pause = std::chrono::milliseconds(20);
  const std::size_t n = where.size();
  std::vector<std::optional<tcp::socket>> connections(n);
  std::vector<std::optional<asio::steady_timer>> retries(n);
  std::size_t pending = 0;
  std::function<void(rank_t)> connect = [&](rank_t r) {
    connections[r].emplace(io);
    connections[r]->async_connect(*where[r], [&, r](boost::system::error_code ec) {
      const probe_answer answer = classify_connect(ec);
      if (answer == probe_answer::none_yet && ec != asio::error::operation_aborted &&
          clock::now() + retry_pause < until) {
        retries[r].emplace(io, retry_pause);
        retries[r]->async_wait([&, r](boost::system::error_code waited) {
          if (waited) --pending;  // cancelled at the deadline: unreachable
          else connect(r);
        });
        return;
      }
      --pending;
      if (answer == probe_answer::alive) found[r].reset();
      else if (answer == probe_answer::gone) found[r] = loss::refused;
      boost::system::error_code ignored;
      if (ec || r < self) connections[r]->close(ignored);
    });
  };
  for (rank_t r = 0; r < n; ++r) {
    if (r == self || found[r].has_value()) continue;
    found[r] = loss::unreachable;  // until its host answers
    if (!where[r]) continue;
    ++pending;
    connect(r);
  }
  run_until(io, [&] { return pending == 0; }, until, [&] {
    boost::system::error_code ignored;
    for (auto& connection : connections)
      if (connection) connection->cancel(ignored);
    for (auto& retry : retries)
      if (retry) retry->cancel();
  });
  for (rank_t r = 0; r < n; ++r)
    if (connections[r] && (found[r].has_value() || !connections[r]->is_open())) connections[r].reset();
  return connections;
}

}  // namespace detail

}  // namespace qcoll::rendezvous
