#pragma once
/// @file
/// From the environment to a connected transport in one call:
///
///     int main() {
///       return qcoll::launch::join_from_environment([](auto transport) {
///         qcoll::communicator comm(std::move(transport));
///         …
///         return 0;
///       });
///     }
///
/// Works unchanged under qcoll-run, torchrun and mpirun (see rendezvous/environment.hpp).
/// Rank 0 serves the job's key-value store for the duration of the join; the transport
/// is shm when every rank is on this host and tcp otherwise, unless QCOLL_TRANSPORT says,
/// and every rank must end up with the same one (agree_on_transport).
/// `fn` gets a transports::process_transport either way — shm and tcp join one type
/// (transports/process.hpp), so `fn` and the collectives it calls are compiled once;
/// transport.kind() says which joined.
///
/// A program on GPUs joins with join_devices (launch/join_devices.hpp) instead: `fn` then
/// also takes the CUDA peer transport (QCOLL_TRANSPORT=cuda_peer). Only those programs
/// compile `fn` for it, and only they include its headers; join refuses cuda_peer, saying so.
///
/// This folder sits above rendezvous/ and transports/: it is the one place that picks
/// the concrete store (rendezvous/tcp_store.hpp) and the transports, so rendezvous/
/// never includes transports/ and the transports depend only on the store concept.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/tcp_store.hpp>
#include <qcoll/transports/cuda_peer/protocol.hpp>
#include <qcoll/transports/shm.hpp>
#include <qcoll/transports/tcp.hpp>

#include <algorithm>
#include <concepts>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// The launch layer's non-template code — join_host below, elastic_job's members — is
// inline, unless the program links src/launch.cpp, which defines it once
// (QCOLL_LAUNCH_COMPILED; qcoll's build links it into its own programs: CMake target
// qcoll_launch).
#if defined(QCOLL_LAUNCH_COMPILED)
#define QCOLL_LAUNCH_DECL
#else
#define QCOLL_LAUNCH_DECL inline
#endif

namespace qcoll::launch {

/// Options passed to the transport the join picks.
struct join_options {
  transports::shm::options shm{};
  transports::tcp::options tcp{};
  /// join_devices' cuda_peer (over shm, with `shm`); device −1: LOCAL_RANK mod the devices;
  /// its window from QCOLL_CUDA_PEER_SLOT_BYTES and QCOLL_CUDA_PEER_SLOTS where set.
  transports::cuda_peer::options cuda_peer = transports::cuda_peer::options::from_environment();
};

/// The transport a job uses: what it asked for, else shm when all ranks are local.
inline rendezvous::transport_kind resolve_transport(const rendezvous::job& j) {
  if ((j.transport == rendezvous::transport_kind::shm || j.transport == rendezvous::transport_kind::cuda_peer) &&
      !j.all_local())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "rendezvous: the {} transport needs every rank on one host, but only {} of {} are "
                               "local; use QCOLL_TRANSPORT=tcp",
                               rendezvous::to_string(j.transport), j.local_size, j.size);
  if (j.transport != rendezvous::transport_kind::automatic) return j.transport;
  return j.all_local() ? rendezvous::transport_kind::shm : rendezvous::transport_kind::tcp;
}

namespace detail {

/// Ranks as ascending runs, "0, 2, 5-9", at most 16 runs and then "…": readable for any job size.
inline std::string rank_list(const std::vector<rank_t>& ranks) {
  std::string text;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t last = i;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    if (runs++ == 16) return text + ", …";
    if (!text.empty()) text += ", ";
    text += last == i ? qcoll::detail::format("{}", ranks[i]) : qcoll::detail::format("{}-{}", ranks[i], ranks[last]);
    i = last + 1;
  }
  return text;
}

inline constexpr std::string_view transports_agree = "agreed";
/// The start of a verdict that says some ranks never arrived (the rest says which).
inline constexpr std::string_view ranks_missing = "missing: ";

}  // namespace detail

/// The first step of join: resolves this rank's transport and checks that every rank
/// resolved the same one. Collective: every rank of the job calls it (calling it again
/// is harmless). join calls it before either transport starts; a program that drives
/// the steps itself calls it first.
///
/// Each rank publishes its choice; rank 0 reads them all (n − 1 store round trips, a
/// fraction of a second for a thousand ranks) and publishes the verdict, which every
/// other rank waits for. Comparing with rank 0's choice alone is not enough: the ranks
/// that chose as rank 0 did would go on into their transport's join and wait there for
/// the others until the setup deadline.
/// @par Errors
/// errc::invalid_argument on every rank, at once, when the ranks resolved different
/// transports, naming which ranks chose which; otherwise what resolve_transport and the
/// store throw. A rank that never comes: errc::timeout, on rank 0 at `until` naming the
/// ranks that did not arrive, and on the others with rank 0's message.
template <rendezvous::store Store>
rendezvous::transport_kind agree_on_transport(const rendezvous::job& j, Store& store, deadline until) {
  const rendezvous::transport_kind kind = resolve_transport(j);
  // "shm", or "shm (auto)" when the rank was not told and picked it: the message then
  // shows whether a rank was told otherwise or found other ranks on its host.
  const std::string choice = qcoll::detail::format("{}{}", rendezvous::to_string(kind),
                                         j.transport == rendezvous::transport_kind::automatic ? " (auto)" : "");
  store.set(qcoll::detail::format("qcoll/transport/{}", j.rank), choice);
  std::string verdict;
  if (j.rank == 0) {
    // Rank 0 gives up a little before the others, so that they fail with its reason
    // (which ranks never came, from the store) instead of timing out on their own.
    const deadline arrivals_until = until - std::min<clock::duration>(j.timeout / 10, std::chrono::seconds(1));
    try {
      store.wait_all("qcoll/transport/", j.size, arrivals_until);
    } catch (const qcoll::error& e) {
      if (e.code() != errc::timeout) throw;
      store.set("qcoll/transport", qcoll::detail::format("{}{}", detail::ranks_missing, e.what()));
      // Serving the store until the setup deadline, for the ranks that came to read it.
      try {
        store.wait_all("qcoll/transport/seen/", j.size, until);
      } catch (const qcoll::error&) {  // some never come: that is the error thrown here
      }
      throw;
    }
    std::vector<std::pair<std::string, std::vector<rank_t>>> groups{{choice, {0}}};
    bool differ = false;
    for (rank_t r = 1; r < j.size; ++r) {
      std::string theirs = store.get(qcoll::detail::format("qcoll/transport/{}", r), until);
      differ = differ || theirs.substr(0, theirs.find(' ')) != rendezvous::to_string(kind);
      auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == theirs; });
      if (group == groups.end()) group = groups.insert(groups.end(), {std::move(theirs), {}});
      group->second.push_back(r);
    }
    if (!differ) {
      verdict = detail::transports_agree;
    } else {
      std::string who;
      for (const auto& [name, ranks] : groups)
        who += qcoll::detail::format("{}{} on rank{} {}", who.empty() ? "" : "; ", name, ranks.size() == 1 ? "" : "s",
                           detail::rank_list(ranks));
      verdict = qcoll::detail::format("the ranks were told different transports: {}: set the same QCOLL_TRANSPORT "
                            "(qcoll-run --transport) on every rank",
                            who);
    }
    store.set("qcoll/transport", verdict);
  } else {
    verdict = store.get("qcoll/transport", until);
    if (verdict.starts_with(detail::ranks_missing)) {
      store.set(qcoll::detail::format("qcoll/transport/seen/{}", j.rank), "1");
      qcoll::detail::throw_error(errc::timeout, "qcoll rank {}: the job's setup failed on rank 0: {}", j.rank,
                                 std::string_view(verdict).substr(detail::ranks_missing.size()));
    }
  }
  if (verdict == detail::transports_agree) return kind;

  // Rank 0 serves the store: it stays until every rank has read the verdict (or a few
  // seconds, should one have died meanwhile), so none gets "store closed" instead.
  store.set(qcoll::detail::format("qcoll/transport/seen/{}", j.rank), "1");
  if (j.rank == 0) {
    try {
      store.wait_all("qcoll/transport/seen/", j.size, std::min(until, clock::now() + std::chrono::seconds(5)));
    } catch (const qcoll::error&) {  // the verdict below is the error that matters
    }
  }
  qcoll::detail::throw_error(errc::invalid_argument, "qcoll rank {}: {}", j.rank, verdict);
}

namespace detail {

/// What join (and join_through) hand `fn`: the host transports only.
struct host_transports {};

/// The transport of `kind` joined through `store`: the one place that maps a transport's
/// kind to its join (rendezvous::named_transports lists the kinds). shm and tcp join one
/// type, so every program's collectives are compiled once, for it. For cuda_peer this is
/// the control transport over shm when `devices` (join_devices puts the CUDA peer
/// transport over it: only the programs that join with it compile their collectives for
/// that one too), and an error otherwise.
template <rendezvous::store Store>
transports::process_transport join_process_transport(rendezvous::transport_kind kind, const rendezvous::job& j,
                                                     Store& store, bool devices, const join_options& opts) {
  switch (kind) {  // no default: a kind added to the list without its case here fails -Wswitch
    case rendezvous::transport_kind::shm: return transports::shm::join(j, store, opts.shm);
    case rendezvous::transport_kind::tcp: return transports::tcp::join(j, store, opts.tcp);
    case rendezvous::transport_kind::cuda_peer:
      if (devices) return transports::shm::join(j, store, opts.shm);
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "qcoll rank {}: QCOLL_TRANSPORT=cuda_peer moves device memory, and this program "
                                 "joins host transports only (launch::join); a program on GPUs joins with "
                                 "launch::join_devices",
                                 j.rank);
    case rendezvous::transport_kind::automatic: break;  // agree_on_transport resolved it
  }
  qcoll::detail::throw_error(errc::invalid_argument, "qcoll rank {}: no transport of kind '{}' to join", j.rank,
                             rendezvous::to_string(kind));
}

/// What a join runs once the ranks agree on the transport and before it starts (the
/// elastic job publishes its recovery roster there); may be empty.
using publish_step = std::function<void(rendezvous::store_client&, deadline)>;

/// What join_host gives: the transport the ranks agreed on, joined.
struct joined_host {
  rendezvous::transport_kind kind;
  transports::process_transport transport;
};

/// The job's own rendezvous, up to a connected transport: rank 0 serves the job's store
/// (`server`, or one made here) until every rank is through with it; the ranks agree on
/// the transport, run `publish`, and join it (join_process_transport). Not a template,
/// so that it can be compiled once: where QCOLL_LAUNCH_COMPILED is defined its
/// definition is src/launch.cpp's (qcoll's own build links it into its programs, a
/// dozen of which join), elsewhere every program that joins compiles it.
QCOLL_LAUNCH_DECL joined_host join_host(const rendezvous::job& j, std::unique_ptr<rendezvous::store_server> server,
                                        const publish_step& publish, bool devices, const join_options& opts);

/// join, with the store server given (or made here on rank 0) and `publish` run by every
/// rank once the transports agree and before either starts; then fn(transport), with
/// the CUDA peer transport over the joined one where Devices (join_devices.hpp's) makes it.
template <class Devices = host_transports, class Fn>
decltype(auto) join_with(const rendezvous::job& j, std::unique_ptr<rendezvous::store_server> server,
                         const publish_step& publish, Fn&& fn, const join_options& opts) {
  constexpr bool devices = !std::same_as<Devices, host_transports>;
  joined_host joined = join_host(j, std::move(server), publish, devices, opts);
  if constexpr (devices) {
    if (joined.kind == rendezvous::transport_kind::cuda_peer)
      return std::forward<Fn>(fn)(Devices::join(j, std::move(joined.transport), opts.cuda_peer));
  }
  return std::forward<Fn>(fn)(std::move(joined.transport));
}

}  // namespace detail

/// join, through a rendezvous store the caller already has — any type that models
/// rendezvous::store, such as PyTorch's c10d store in the PyTorch bridge — instead of
/// the job's own TCP store: the ranks agree on the transport, join it, and wait until
/// every rank is through with the store before fn(transport) runs, so the store's
/// owner may go on or go away. Collective. Errors as join's.
template <rendezvous::store Store, class Fn>
decltype(auto) join_through(const rendezvous::job& j, Store& store, Fn&& fn, const join_options& opts = {}) {
  const deadline until = clock::now() + j.timeout;
  const rendezvous::transport_kind kind = agree_on_transport(j, store, until);
  auto transport = detail::join_process_transport(kind, j, store, false, opts);
  store.set(qcoll::detail::format("qcoll/joined/{}", j.rank), "1");
  store.wait_all("qcoll/joined/", j.size, until);
  return std::forward<Fn>(fn)(std::move(transport));
}

/// Joins the job `j` describes and calls fn(transport) with the connected transport.
/// Collective: every rank of the job calls it.
/// @par Errors
/// qcoll::error from the store or the transport's join; every wait is bounded by
/// j.timeout. Ranks that resolve different transports all fail at once with
/// errc::invalid_argument, naming which ranks chose which.
template <class Fn>
decltype(auto) join(const rendezvous::job& j, Fn&& fn, const join_options& opts = {}) {
  return detail::join_with(j, nullptr, {}, std::forward<Fn>(fn), opts);
}

/// join(job_from_environment(), fn, opts).
template <class Fn>
decltype(auto) join_from_environment(Fn&& fn, const join_options& opts = {}) {
  return join(rendezvous::job_from_environment(), std::forward<Fn>(fn), opts);
}

#if !defined(QCOLL_LAUNCH_COMPILED) || defined(QCOLL_LAUNCH_SOURCE)
QCOLL_LAUNCH_DECL detail::joined_host detail::join_host(const rendezvous::job& j,
                                                     std::unique_ptr<rendezvous::store_server> server,
                                                     const detail::publish_step& publish, bool devices,
                                                     const join_options& opts) {
  const deadline until = clock::now() + j.timeout;
  if (j.rank == 0 && !server) server = std::make_unique<rendezvous::store_server>(j);
  rendezvous::store_client store(j, until);

  // Ranks told different transports would otherwise wait for each other in vain.
  const rendezvous::transport_kind kind = agree_on_transport(j, store, until);
  if (publish) publish(store, until);
  transports::process_transport transport = join_process_transport(kind, j, store, devices, opts);

  // Rank 0 keeps the store up until every rank is through with it.
  store.set(qcoll::detail::format("qcoll/joined/{}", j.rank), "1");
  if (j.rank == 0) {
    store.wait_all("qcoll/joined/", j.size, until);
    server.reset();
  }
  return {kind, std::move(transport)};
}
#endif

}  // namespace qcoll::launch
