#pragma once
/// @file
/// How the ranks that survive a failure agree on a new world without the job's store,
/// whose host may be among the dead (docs/recovery.md has the whole story):
///
/// 1. Every rank keeps a recovery listener open for the life of the job, and the join
///    tells every rank every listener's address (the roster).
/// 2. A survivor probes every other rank's listener at once (probe.hpp). A refused (or
///    reset) connection is a dead process (its host's kernel answers for it); one that
///    is neither accepted nor refused within probe_timeout is a host or link that is
///    down. Both are lost.
/// 3. The lowest rank a survivor found alive coordinates. The others check in with it
///    over an authenticated connection (handshake.hpp, channel recovery, under the
///    current world's job id, so a rank of another job or an older world is refused;
///    through TLS when the job has QCOLL_TLS=1), sending whom they found alive. It waits until every rank it found alive has
///    checked in, or until its gathering ends, then opens the new world's store on its
///    own host and answers each with the new world: the old ranks that go on, in order
///    (the new rank is the position), and the store's port.
/// 4. A coordinator that dies before answering resets its connections; whoever waited
///    for it tries the next lowest rank it found alive.
///
/// A rank that cannot reach the coordinator (its own link is down, or the network is
/// split) ends up alone or in a small group and fails for want of a quorum: by default
/// only a majority of the old world goes on, so at most one side of a split does.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/little_endian.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/handshake_client.hpp>
#include <qcoll/rendezvous/handshake_server.hpp>
#include <qcoll/rendezvous/probe.hpp>
#include <qcoll/rendezvous/secured_socket.hpp>
#include <qcoll/rendezvous/socket_io.hpp>
#include <qcoll/rendezvous/tcp_store.hpp>

#include <qcoll/detail/asio.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qcoll::rendezvous {

struct survivor_options {
  /// How long the whole agreement may take on this rank.
  std::chrono::milliseconds timeout{15000};
  /// How long a probe waits for a rank that neither accepts nor refuses (its host or
  /// link is down) before counting it lost. A dead process on a live host is refused
  /// at once and costs nothing.
  std::chrono::milliseconds probe_timeout{2000};
  /// The fewest ranks that may go on; 0 means a majority of the old world (more than
  /// half), so the two sides of a split network never both go on.
  rank_t min_survivors = 0;
};

/// The listener every rank keeps open for the life of its job, so survivors can find
/// it without the store. Move-only.
class recovery_listener {
 public:
  /// Listens on `bind_address` (an IP address) on a port the kernel picks.
  /// @par Errors qcoll::error (invalid_argument) when it cannot.
  explicit recovery_listener(const std::string& bind_address)
      : io_(std::make_unique<boost::asio::io_context>()), acceptor_(*io_) {
    detail::listen_on_free_port(acceptor_, bind_address, "qcoll recovery:");
    address_ = detail::describe(acceptor_.local_endpoint());
  }

  /// "address:port", as the roster lists it.
  const std::string& address() const noexcept { return address_; }
  boost::asio::io_context& io() noexcept { return *io_; }
  boost::asio::ip::tcp::acceptor& acceptor() noexcept { return acceptor_; }

 private:
  std::unique_ptr<boost::asio::io_context> io_;  // outlives the acceptor
  boost::asio::ip::tcp::acceptor acceptor_;
  std::string address_;
};

/// What the survivors agreed on, as one survivor sees it.
struct survivors {
  std::vector<rank_t> ranks;                  ///< old ranks that go on, ascending: new rank = position
  std::vector<std::pair<rank_t, loss>> lost;  ///< old ranks that do not, and why (as this rank saw it)
  rank_t coordinator = 0;                     ///< the old rank that decided and serves the new store
  job next;                                   ///< this rank's job in the new world
  std::unique_ptr<store_server> store;        ///< the new world's store, on the coordinator only
};

namespace detail {

namespace asio = boost::asio;
using asio::ip::tcp;

inline constexpr std::uint32_t max_roster = 1u << 20;

enum class verdict : std::uint8_t { go_on = 0, too_few = 1 };

inline void put_ranks(std::vector<std::byte>& out, std::span<const rank_t> ranks) {
  const std::size_t at = out.size();
  out.resize(at + 4 + 4 * ranks.size());
  qcoll::detail::store_le<std::uint32_t>(out.data() + at, static_cast<std::uint32_t>(ranks.size()));
  for (std::size_t i = 0; i < ranks.size(); ++i)
    qcoll::detail::store_le<std::uint32_t>(out.data() + at + 4 + 4 * i, static_cast<std::uint32_t>(ranks[i]));
}

/// A recovery read or write that did not finish: timeout at the deadline, else peer_lost.
[[noreturn]] inline void fail_io(const io_outcome& outcome, std::string_view doing, const secured_socket& connection) {
  qcoll::detail::throw_error(outcome.result == io_result::timed_out ? errc::timeout : errc::peer_lost,
                             "qcoll recovery: {} ({}): {}", doing, describe_peer(connection.socket()),
                             outcome.result == io_result::timed_out ? std::string("timed out") : outcome.why());
}

inline void read_bytes(secured_socket& connection, std::span<std::byte> bytes, deadline until, std::string_view doing) {
  if (auto got = connection.read_exact(bytes, until); got.result != io_result::done) fail_io(got, doing, connection);
}

inline void write_bytes(secured_socket& connection, std::span<const std::byte> bytes, deadline until,
                        std::string_view doing) {
  if (auto sent = connection.write_all(bytes, until); sent.result != io_result::done) fail_io(sent, doing, connection);
}

// The agreement's messages, read through `read(bytes)`, which fills `bytes` or throws
// (read_bytes over a socket; the fuzz target reads from memory). Every count is checked
// against the world's size before anything it counts is read.
//
//     check-in (member → coordinator)   rank list: whom the member found alive
//     answer (coordinator → member)     verdict u8, store port u16, rank list of the
//                                       members, rank list of the lost, a loss u8 each
//     rank list                         count u32 (≤ size), then the ranks, u32 each,
//                                       ascending, each below size

/// Reads a rank list. @par Errors errc::protocol_error for a malformed one.
template <class Read>
std::vector<rank_t> read_ranks(Read&& read, rank_t size, std::string_view doing) {
  std::array<std::byte, 4> count_bytes{};
  read(std::span(count_bytes));
  const std::uint32_t count = qcoll::detail::load_le<std::uint32_t>(count_bytes.data());
  if (count > size)
    qcoll::detail::throw_error(errc::protocol_error, "qcoll recovery: {}: a list of {} ranks in a world of {}", doing,
                               count, size);
  std::vector<std::byte> bytes(4 * std::size_t{count});
  read(std::span(bytes));
  std::vector<rank_t> ranks(count);
  for (std::size_t i = 0; i < count; ++i) {
    ranks[i] = qcoll::detail::load_le<std::uint32_t>(bytes.data() + 4 * i);
    if (ranks[i] >= size || (i > 0 && ranks[i] <= ranks[i - 1]))
      qcoll::detail::throw_error(errc::protocol_error, "qcoll recovery: {}: a malformed rank list", doing);
  }
  return ranks;
}

/// The coordinator's answer, as a member reads it.
struct answer {
  verdict outcome = verdict::too_few;
  std::uint16_t store_port = 0;
  std::vector<rank_t> members;                ///< ascending
  std::vector<std::pair<rank_t, loss>> lost;  ///< ascending, none of them a member
};

/// Reads the coordinator's answer. @par Errors errc::protocol_error for a malformed one:
/// an unknown verdict, a malformed rank list, a rank both member and lost. An unknown
/// loss reads as loss::silent (it only words a message).
template <class Read>
answer read_answer(Read&& read, rank_t size, std::string_view doing) {
  std::array<std::byte, 3> head{};
  read(std::span(head));
  const auto outcome = std::to_integer<std::uint8_t>(head[0]);
  if (outcome > static_cast<std::uint8_t>(verdict::too_few))
    qcoll::detail::throw_error(errc::protocol_error, "qcoll recovery: {}: an unknown verdict {}", doing, outcome);
  answer result{static_cast<verdict>(outcome), qcoll::detail::load_le<std::uint16_t>(head.data() + 1), {}, {}};
  result.members = read_ranks(read, size, doing);
  const std::vector<rank_t> lost_ranks = read_ranks(read, size, doing);
  std::vector<std::byte> reasons(lost_ranks.size());
  read(std::span(reasons));
  for (std::size_t i = 0; i < lost_ranks.size(); ++i) {
    if (std::binary_search(result.members.begin(), result.members.end(), lost_ranks[i]))
      qcoll::detail::throw_error(errc::protocol_error, "qcoll recovery: {}: rank {} is both a member and lost", doing,
                                 lost_ranks[i]);
    const auto why = std::to_integer<std::uint8_t>(reasons[i]);
    result.lost.emplace_back(lost_ranks[i], why <= static_cast<std::uint8_t>(loss::silent) ? static_cast<loss>(why)
                                                                                           : loss::silent);
  }
  return result;
}

inline std::vector<std::byte> encode_answer(const answer& a) {
  std::vector<std::byte> out{static_cast<std::byte>(a.outcome), std::byte{}, std::byte{}};
  qcoll::detail::store_le<std::uint16_t>(out.data() + 1, a.store_port);
  put_ranks(out, a.members);
  std::vector<rank_t> lost_ranks;
  for (const auto& [rank, why] : a.lost) lost_ranks.push_back(rank);
  put_ranks(out, lost_ranks);
  for (const auto& [rank, why] : a.lost) out.push_back(static_cast<std::byte>(why));
  return out;
}

/// `read` for the messages above over a connection, bounded by `until`.
inline auto socket_reader(secured_socket& connection, deadline until, std::string_view doing) {
  return [&connection, until, doing](std::span<std::byte> bytes) { read_bytes(connection, bytes, until, doing); };
}

/// The address of "address:port" (IPv6 without its brackets).
inline std::string host_of(const std::string& endpoint) {
  std::string host = endpoint.substr(0, endpoint.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

/// The job of `rank` in the world of the old ranks `members`.
inline job next_job(const job& current, std::span<const std::string> roster, std::span<const rank_t> members,
                    rank_t coordinator, std::uint16_t store_port, const std::string& next_id) {
  job next = current;
  next.job_id = next_id;
  next.size = members.size();
  next.rank = static_cast<rank_t>(std::find(members.begin(), members.end(), current.rank) - members.begin());
  next.store_host = host_of(roster[coordinator]);
  next.store_port = store_port;
  next.local_rank = 0;
  next.local_size = 0;
  const std::string my_host = host_of(roster[current.rank]);
  for (rank_t m : members) {
    if (host_of(roster[m]) != my_host) continue;
    if (m < current.rank) ++next.local_rank;
    ++next.local_size;
  }
  return next;
}

}  // namespace detail

/// Agrees with the other survivors of `current` on the world that goes on, and returns
/// this rank's part in it. Collective over the survivors: every rank that is still
/// alive calls it after the failure, within `opts.timeout` of the others.
///
/// `roster[r]` is rank r's recovery listener ("address:port"), `listener` this rank's,
/// `next_id` the new world's job id (the same on every survivor).
/// @par Errors qcoll::error: errc::peer_lost when fewer than the required survivors
/// agreed (the message says how many and who), errc::timeout when no coordinator
/// answered in time, errc::invalid_argument for a roster that does not fit `current`.
inline survivors agree_on_survivors(const job& current, std::span<const std::string> roster,
                                    recovery_listener& listener, const std::string& next_id,
                                    const survivor_options& opts = {}) {
  namespace asio = boost::asio;
  using asio::ip::tcp;
  const rank_t n = current.size, self = current.rank;
  if (roster.size() != n || self >= n || n > detail::max_roster)
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll recovery: a roster of {} addresses for rank {} of {}",
                               roster.size(), self, n);
  const rank_t quorum = opts.min_survivors != 0 ? opts.min_survivors : n / 2 + 1;
  const auto started = clock::now();
  const deadline until = started + opts.timeout;
  std::vector<std::optional<tcp::endpoint>> where(n);
  for (rank_t r = 0; r < n; ++r) where[r] = rendezvous::detail::parse_endpoint(roster[r]);

  asio::io_context& io = listener.io();
  std::vector<std::optional<loss>> found(n);  // nothing: alive as far as this rank knows (itself too)

  for (;;) {
    // Probe (again, after a coordinator died): the connections to the higher ranks stay
    // open while this rank gathers, because a rank whose process dies resets them.
    std::vector<std::optional<tcp::socket>> probes =
        detail::probe(io, where, self, found, std::min(until, clock::now() + opts.probe_timeout));
    const auto round_start = clock::now();
    const auto alive_end = std::find_if(found.begin(), found.end(), [](const auto& f) { return !f.has_value(); });
    const rank_t coordinator = static_cast<rank_t>(alive_end - found.begin());  // self at the latest
    std::vector<rank_t> members;

    if (coordinator == self) {
      // Gather until every rank found alive has checked in or died (its probe connection
      // resets), or the gathering ends: within 2/5 of the timeout from the round's start,
      // before the members stop waiting for us (1/2), and leaving a quarter for answers.
      const deadline gather_until = std::min(until - opts.timeout / 4, round_start + opts.timeout * 2 / 5);
      std::vector<std::optional<secured_socket>> checked_in(n);
      rank_t waiting = 0;
      std::array<std::byte, 1> ignored_byte{};
      for (rank_t r = 0; r < n; ++r) {
        if (r == self || found[r].has_value()) continue;
        ++waiting;
        if (!probes[r]) continue;
        probes[r]->async_read_some(asio::buffer(ignored_byte), [&, r](boost::system::error_code ec, std::size_t) {
          if (ec == asio::error::operation_aborted || checked_in[r] || found[r].has_value()) return;
          found[r] = loss::refused;  // its process died while we waited for it
          --waiting;
        });
      }
      std::optional<tcp::socket> arriving;
      std::function<void()> accept_next = [&] {
        arriving.emplace(io);
        listener.acceptor().async_accept(*arriving, [&](boost::system::error_code ec) {
          if (ec) return;
          try {
            tcp::socket socket = std::move(*arriving);
            const deadline admit_until = std::min(gather_until, clock::now() + opts.probe_timeout);
            const hello peer = admit(socket, current, channel::recovery, admit_until);
            const std::string from = detail::describe_peer(socket);
            secured_socket connection(std::move(socket), current, tls_role::server,
                                      qcoll::detail::format("rank {} at {}", peer.rank, from), admit_until);
            // A rank checks in only with the lowest rank it found alive, us: its view is
            // read (and checked for form) but changes nothing.
            const std::string doing = qcoll::detail::format("reading a check-in ({})", from);
            detail::read_ranks(detail::socket_reader(connection, gather_until, doing), n, doing);
            if (peer.rank != self && !checked_in[peer.rank]) {
              if (!found[peer.rank].has_value()) --waiting;
              found[peer.rank].reset();  // it reached us, so it is alive whatever the probe said
              checked_in[peer.rank].emplace(std::move(connection));
            }
          } catch (const qcoll::error&) {
            // A probe (it closes without a word) or a stranger: neither is a survivor.
          }
          if (waiting > 0) accept_next();
        });
      };
      if (waiting > 0) accept_next();
      const auto stop_gathering = [&] {  // the accept and the watches are pending either way
        boost::system::error_code ignored;
        listener.acceptor().cancel(ignored);
        for (auto& connection : probes)
          if (connection) connection->close(ignored);
      };
      if (detail::run_until(io, [&] { return waiting == 0; }, gather_until, stop_gathering)) {
        stop_gathering();
        io.restart();
        io.run();
      }
      for (rank_t r = 0; r < n; ++r) {
        if (r == self || checked_in[r]) members.push_back(r);
        else if (!found[r].has_value()) found[r] = loss::silent;
      }

      survivors result;
      result.coordinator = self;
      detail::answer answer;
      answer.members = members;
      if (members.size() >= quorum) {
        result.next = detail::next_job(current, roster, members, self, 0, next_id);
        result.store = std::make_unique<store_server>(result.next);
        result.next.store_port = result.store->port();
        answer.outcome = detail::verdict::go_on;
        answer.store_port = result.next.store_port;
      }
      // Who is lost and why, as the coordinator saw it: the members' probes may have
      // found alive a rank that died a moment later.
      for (rank_t r = 0; r < n; ++r)
        if (found[r].has_value()) answer.lost.emplace_back(r, *found[r]);
      const std::vector<std::byte> answer_bytes = detail::encode_answer(answer);
      for (rank_t r = 0; r < n; ++r) {
        if (!checked_in[r]) continue;
        try {
          detail::write_bytes(*checked_in[r], answer_bytes, until, "sending the new world");
        } catch (const qcoll::error& e) {  // it died since: the new world's join will tell
          qcoll::detail::log_warning("qcoll: rank {}: recovery: {}", self, e.what());
        }
      }
      if (members.size() < quorum)
        qcoll::detail::throw_error(errc::peer_lost,
                                   "qcoll recovery on rank {} of {}: only {} rank(s) agreed to go on (old ranks {}), "
                                   "fewer than the {} required (survivor_options::min_survivors)",
                                   self, n, members.size(), qcoll::detail::join(members, ", "), quorum);
      result.ranks = std::move(members);
      result.lost = std::move(answer.lost);
      return result;
    }

    // Check in with the coordinator and wait for its answer.
    probes.clear();
    std::vector<rank_t> view;
    for (rank_t r = 0; r < n; ++r)
      if (!found[r].has_value()) view.push_back(r);
    // A coordinator that is alive but never answers (hung) is given up after half the
    // timeout, which leaves a round for the next lowest.
    const deadline answer_until = std::min(until, round_start + opts.timeout / 2);
    detail::answer answer;
    try {
      boost::system::error_code reached;
      tcp::socket socket = detail::connect_before(io, *where[coordinator], answer_until, reached);
      if (reached)
        qcoll::detail::throw_error(reached == asio::error::timed_out ? errc::timeout : errc::peer_lost,
                                   "qcoll recovery on rank {}: cannot reach the coordinator, rank {}: {}", self,
                                   coordinator, reached.message());
      introduce(socket, current, channel::recovery, answer_until);
      const std::string at = detail::describe_peer(socket);
      secured_socket connection(std::move(socket), current, tls_role::client,
                                qcoll::detail::format("the coordinator, rank {} at {}", coordinator, at), answer_until);
      std::vector<std::byte> check_in;
      detail::put_ranks(check_in, view);
      detail::write_bytes(connection, check_in, answer_until, "checking in with the coordinator");
      const std::string waiting = qcoll::detail::format("rank {} waiting for the coordinator, rank {}", self, coordinator);
      answer = detail::read_answer(detail::socket_reader(connection, answer_until, waiting), n, waiting);
      for (const auto& [rank, why] : answer.lost) found[rank] = why;
    } catch (const qcoll::error& e) {
      // The coordinator died or never answered: try the next lowest, while a round fits.
      if (e.code() == errc::protocol_error || clock::now() >= until - opts.timeout / 4) throw;
      found[coordinator] = e.code() == errc::peer_lost ? loss::refused : loss::silent;  // reset: it died
      continue;
    }
    members = std::move(answer.members);
    if (answer.outcome != detail::verdict::go_on)
      qcoll::detail::throw_error(errc::peer_lost,
                                 "qcoll recovery on rank {} of {}: only {} rank(s) agreed to go on (old ranks {}), "
                                 "fewer than the {} required (survivor_options::min_survivors)",
                                 self, n, members.size(), qcoll::detail::join(members, ", "), quorum);
    if (!std::binary_search(members.begin(), members.end(), self) ||
        !std::binary_search(members.begin(), members.end(), coordinator))
      qcoll::detail::throw_error(errc::protocol_error,
                                 "qcoll recovery on rank {}: the coordinator, rank {}, answered with a world "
                                 "without one of us",
                                 self, coordinator);
    survivors result;
    result.coordinator = coordinator;
    result.next = detail::next_job(current, roster, members, coordinator, answer.store_port, next_id);
    for (rank_t r = 0; r < n; ++r) {
      if (std::binary_search(members.begin(), members.end(), r)) continue;
      result.lost.emplace_back(r, found[r].value_or(loss::silent));
    }
    result.ranks = std::move(members);
    return result;
  }
}

}  // namespace qcoll::rendezvous
