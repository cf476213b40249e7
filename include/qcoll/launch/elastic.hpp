#pragma once
/// @file
/// A job that goes on when ranks die. It joins as launch::join does, and when a call
/// fails because ranks died (or their links went down), shrink() agrees among the
/// survivors on a new world with consecutive ranks, and the next join() connects it:
///
///     auto job = qcoll::launch::elastic_job::from_environment();
///     for (;;) {
///       try {
///         return job.join([&](auto transport) {
///           qcoll::communicator comm(std::move(transport));
///           return train(comm, state);  // state lives out here, so it outlives a failure
///         });
///       } catch (const qcoll::error& e) {
///         if (!qcoll::launch::recoverable(e)) throw;
///         const qcoll::launch::shrink_report report = job.shrink();  // throws without a quorum
///         state.restart_from(report);   // roll back to the last step every survivor finished
///       }
///     }
///
/// No store survives a failure here: the store of a join lives only for that join (on
/// rank 0, who may be the one that died). Instead every rank keeps a recovery listener
/// open and the join hands every rank the list of them (the roster); the survivors find
/// each other through it (rendezvous/survivors.hpp), and the lowest survivor serves the
/// new world's store for its join. docs/recovery.md says what is detected, how fast,
/// what survives and what the application must do.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/survivors.hpp>
#include <qcoll/rendezvous/tcp_store.hpp>

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll::launch {

using shrink_options = rendezvous::survivor_options;

/// What a shrink told this rank.
struct shrink_report {
  unsigned epoch = 0;  ///< how many shrinks this job has been through, this one included
  rank_t old_rank = 0, old_size = 0;
  rank_t new_rank = 0, new_size = 0;
  std::vector<rank_t> survivors;                          ///< the old rank of each new rank
  std::vector<std::pair<rank_t, rendezvous::loss>> lost;  ///< old ranks left behind, and why
  rank_t coordinator = 0;                                 ///< old rank of the new world's rank 0
  std::chrono::nanoseconds took{};                        ///< the agreement, on this rank

  /// One line: "old rank 3 of 6 is rank 1 of 4 (shrink 1, agreed in 1.2 ms), lost: rank 0 (…), …".
  std::string describe() const {
    std::string losses;
    for (const auto& [rank, why] : lost)
      losses += qcoll::detail::format("{}rank {} ({})", losses.empty() ? "" : ", ", rank, rendezvous::to_string(why));
    return qcoll::detail::format("old rank {} of {} is rank {} of {} (shrink {}, agreed in {:.1f} ms), lost: {}", old_rank,
                       old_size, new_rank, new_size, epoch,
                       std::chrono::duration<double, std::milli>(took).count(), losses.empty() ? "none" : losses);
  }
};

/// Whether `e` is a failure a shrink can recover from: a peer lost, a timeout, an
/// abort, a broken message (condition::transport_failure). A contract violation (a
/// bad argument, mismatched counts) would only happen again.
inline bool recoverable(const std::system_error& e) noexcept {
  return e.code() == qcoll::condition::transport_failure;
}

/// A job whose survivors can go on after ranks die. Move-only; one per process.
class elastic_job {
 public:
  /// Opens this rank's recovery listener on j.bind_address. Nothing is sent yet.
  QCOLL_LAUNCH_DECL explicit elastic_job(rendezvous::job j, join_options opts = {});
  QCOLL_LAUNCH_DECL elastic_job(elastic_job&&) noexcept;
  QCOLL_LAUNCH_DECL elastic_job& operator=(elastic_job&&);  // as Asio's acceptor: not noexcept
  QCOLL_LAUNCH_DECL ~elastic_job();

  static elastic_job from_environment(join_options opts = {}) {
    return elastic_job(rendezvous::job_from_environment(), opts);
  }

  /// This rank's job in the current world (after a shrink: the new one).
  const rendezvous::job& job() const noexcept { return job_; }
  /// How many shrinks this job has been through.
  unsigned epoch() const noexcept { return epoch_; }
  /// Every rank's recovery listener, "address:port", once a join has got that far.
  std::span<const std::string> roster() const noexcept { return roster_; }

  /// launch::join on the current world, which also hands every rank the roster.
  /// Collective over the current world.
  template <class Fn>
  decltype(auto) join(Fn&& fn) {
    return detail::join_with(
        job_, std::move(next_store_), [this](rendezvous::store_client& store, deadline until) { publish_roster(store, until); },
        std::forward<Fn>(fn), opts_);
  }

  /// Agrees with the other survivors of the current world on the world that goes on
  /// (rendezvous::agree_on_survivors) and makes it the current one; the next join()
  /// connects it. Collective over the survivors, each calling it after its failure.
  /// @par Errors
  /// qcoll::error: errc::peer_lost when fewer than opts.min_survivors (by default a
  /// majority) agreed, errc::timeout when no coordinator answered in time,
  /// errc::invalid_argument before a join got as far as the roster. After an error this
  /// rank is not part of any world: it should exit.
  QCOLL_LAUNCH_DECL shrink_report shrink(const shrink_options& opts = {});

 private:
  /// join's step between the agreement on the transport and the transport's join: every
  /// rank publishes its recovery listener and reads the roster back.
  QCOLL_LAUNCH_DECL void publish_roster(rendezvous::store_client& store, deadline until);

  static constexpr std::size_t roster_chunk = 512;  // ≤ 512 · 64 bytes: well within a store value

  rendezvous::job job_;
  std::string base_id_;
  join_options opts_;
  rendezvous::recovery_listener listener_;
  std::vector<std::string> roster_;
  std::unique_ptr<rendezvous::store_server> next_store_;  // on the new world's rank 0, until its join
  unsigned epoch_ = 0;
};

#if !defined(QCOLL_LAUNCH_COMPILED) || defined(QCOLL_LAUNCH_SOURCE)
// Compiled once where QCOLL_LAUNCH_COMPILED is defined (src/launch.cpp), as join_host is.
QCOLL_LAUNCH_DECL elastic_job::elastic_job(rendezvous::job j, join_options opts)
    : job_(std::move(j)), base_id_(job_.job_id), opts_(opts), listener_(job_.bind_address) {}
QCOLL_LAUNCH_DECL elastic_job::elastic_job(elastic_job&&) noexcept = default;
QCOLL_LAUNCH_DECL elastic_job& elastic_job::operator=(elastic_job&&) = default;
QCOLL_LAUNCH_DECL elastic_job::~elastic_job() = default;

QCOLL_LAUNCH_DECL void elastic_job::publish_roster(rendezvous::store_client& store, deadline until) {
  store.set(qcoll::detail::format("qcoll/recovery/address/{}", job_.rank), listener_.address());
  // Rank 0 gathers the addresses and publishes them in a few values, so the others
  // each read a few keys rather than one per rank.
  std::vector<std::string> roster;
  if (job_.rank == 0) {
    store.wait_all("qcoll/recovery/address/", job_.size, until);
    for (rank_t r = 0; r < job_.size; ++r)
      roster.push_back(r == 0 ? listener_.address() : store.get(qcoll::detail::format("qcoll/recovery/address/{}", r), until));
    for (std::size_t first = 0; first < roster.size(); first += roster_chunk) {
      std::string value;
      for (std::size_t r = first; r < std::min(roster.size(), first + roster_chunk); ++r) value += roster[r] + '\n';
      store.set(qcoll::detail::format("qcoll/recovery/roster/{}", first / roster_chunk), value);
    }
  } else {
    for (std::size_t chunk = 0; chunk * roster_chunk < job_.size; ++chunk) {
      const std::string value = store.get(qcoll::detail::format("qcoll/recovery/roster/{}", chunk), until);
      for (std::size_t at = 0; at < value.size();) {
        const std::size_t end = value.find('\n', at);
        if (end == std::string::npos) break;
        roster.push_back(value.substr(at, end - at));
        at = end + 1;
      }
    }
    if (roster.size() != job_.size || roster[job_.rank] != listener_.address())
      qcoll::detail::throw_error(errc::protocol_error, "qcoll rank {}: the recovery roster has {} entries for {} ranks",
                                 job_.rank, roster.size(), job_.size);
  }
  roster_ = std::move(roster);
}

QCOLL_LAUNCH_DECL shrink_report elastic_job::shrink(const shrink_options& opts) {
  if (roster_.size() != job_.size)
    qcoll::detail::throw_error(errc::invalid_argument,
                               "qcoll rank {}: elastic_job::shrink before a join exchanged the recovery roster",
                               job_.rank);
  const auto started = clock::now();
  rendezvous::survivors agreed = rendezvous::agree_on_survivors(
      job_, roster_, listener_, qcoll::detail::format("{}.e{}", base_id_, epoch_ + 1), opts);

  shrink_report report;
  report.epoch = ++epoch_;
  report.old_rank = job_.rank;
  report.old_size = job_.size;
  report.new_rank = agreed.next.rank;
  report.new_size = agreed.next.size;
  report.survivors = agreed.ranks;
  report.lost = std::move(agreed.lost);
  report.coordinator = agreed.coordinator;
  std::vector<std::string> roster;
  for (rank_t r : agreed.ranks) roster.push_back(roster_[r]);
  roster_ = std::move(roster);
  job_ = std::move(agreed.next);
  next_store_ = std::move(agreed.store);
  report.took = clock::now() - started;
  return report;
}
#endif

}  // namespace qcoll::launch
