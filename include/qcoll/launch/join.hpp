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
/// Works unchanged under qcoll-run, torchrun and mpirun (see rendezvous/environment.hpp). Rank 0
/// serves the job's key-value store for the duration of the join; the transport is
/// shm when every rank is on this host and tcp otherwise, unless QCOLL_TRANSPORT says.
/// `fn` is instantiated for both transports, so it is usually a generic lambda, and
/// both instantiations must return the same type.
///
/// This folder sits above rendezvous/ and transports/: it is the one place that picks
/// the concrete store (rendezvous/tcp_store.hpp) and the transports, so rendezvous/
/// never includes transports/ and the transports depend only on the store concept.

#include <qcoll/core/concepts.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/tcp_store.hpp>
#include <qcoll/transports/shm.hpp>
#include <qcoll/transports/tcp.hpp>

#include <optional>
#include <string_view>
#include <utility>

namespace qcoll::launch {

/// Options passed to the transport the join picks.
struct join_options {
  transports::shm::options shm{};
  transports::tcp::options tcp{};
};

/// The transport a job uses: what it asked for, else shm when all ranks are local.
inline rendezvous::transport_kind resolve_transport(const rendezvous::job& j) {
  if (j.transport == rendezvous::transport_kind::shm && !j.all_local())
    qcoll::detail::throw_error(errc::invalid_argument,
                               "rendezvous: the shm transport needs every rank on one host, but only {} of {} are "
                               "local; use QCOLL_TRANSPORT=tcp",
                               j.local_size, j.size);
  if (j.transport != rendezvous::transport_kind::automatic) return j.transport;
  return j.all_local() ? rendezvous::transport_kind::shm : rendezvous::transport_kind::tcp;
}

/// Joins the job `j` describes and calls fn(transport) with the connected transport.
/// Collective: every rank of the job calls it.
/// @par Errors
/// qcoll::error from the store, the transport's join, or ranks that disagree on the
/// transport; every wait is bounded by j.timeout.
template <class Fn>
decltype(auto) join(const rendezvous::job& j, Fn&& fn, const join_options& opts = {}) {
  const deadline until = clock::now() + j.timeout;
  std::optional<rendezvous::store_server> server;
  if (j.rank == 0) server.emplace(j);
  rendezvous::store_client store(j, until);

  // Ranks told different transports would otherwise wait for each other in vain.
  const rendezvous::transport_kind kind = resolve_transport(j);
  if (j.rank == 0) {
    store.set("qcoll/transport", rendezvous::to_string(kind));
  } else if (const std::string chosen = store.get("qcoll/transport", until); chosen != rendezvous::to_string(kind)) {
    qcoll::detail::throw_error(errc::invalid_argument, "rendezvous: rank 0 uses the {} transport but rank {} was told {}",
                               chosen, j.rank, rendezvous::to_string(kind));
  }

  // Rank 0 keeps the store up until every rank is through with it.
  auto finish_rendezvous = [&] {
    store.set(fmt::format("qcoll/joined/{}", j.rank), "1");
    if (j.rank == 0) {
      store.wait_all("qcoll/joined/", j.size, until);
      server.reset();
    }
  };
  if (kind == rendezvous::transport_kind::shm) {
    auto transport = transports::shm::transport::join(j, store, opts.shm);
    finish_rendezvous();
    return std::forward<Fn>(fn)(std::move(transport));
  }
  auto transport = transports::tcp::transport::join(j, store, opts.tcp);
  finish_rendezvous();
  return std::forward<Fn>(fn)(std::move(transport));
}

/// join(job_from_environment(), fn, opts).
template <class Fn>
decltype(auto) join_from_environment(Fn&& fn, const join_options& opts = {}) {
  return join(rendezvous::job_from_environment(), std::forward<Fn>(fn), opts);
}

}  // namespace qcoll::launch
