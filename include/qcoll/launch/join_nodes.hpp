#pragma once
/// @file
/// join for a job of several nodes, with a second transport inside each node: `fn` takes
/// the node's transport (shm among this host's ranks) and the world's (what join picks:
/// tcp between hosts), the two a two_level_allreduce needs:
///
///     qcoll::launch::join_nodes_from_environment([](auto node_transport, auto world_transport) {
///       qcoll::communicator node(std::move(node_transport)), world(std::move(world_transport));
///       qcoll::two_level_allreduce bucket(node, world, gradients.size(), qcoll::quantizers::one_bit{});
///       …
///     });
///
/// A node is the ranks rank − LOCAL_RANK … rank − LOCAL_RANK + LOCAL_WORLD_SIZE − 1: a
/// launcher that numbers each host's ranks consecutively (torchrun, qcoll-run, Slurm's
/// block distribution, mpirun --map-by slot) gives exactly its hosts. The node's shm
/// transport joins through the world's store under keys of its own, before the world's
/// transport, so one rendezvous makes both.

#include <qcoll/core/error.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/rendezvous/store.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace qcoll::launch {

namespace detail {

/// A store whose keys all start with `prefix`: a group of ranks rendezvous inside the
/// job's store without meeting another group's keys.
template <rendezvous::store Store>
class prefixed_store {
 public:
  prefixed_store(Store& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}
  void set(std::string_view key, std::string_view value) { inner_.set(prefix_ + std::string(key), value); }
  std::string get(std::string_view key, deadline until) { return inner_.get(prefix_ + std::string(key), until); }
  void wait_all(std::string_view key, rank_t n, deadline until) { inner_.wait_all(prefix_ + std::string(key), n, until); }

 private:
  Store& inner_;
  std::string prefix_;
};

}  // namespace detail

/// The job of this rank's node: its local ranks, named after the node's first rank.
/// @throws qcoll::error (invalid_argument) when the local rank is not below the local size.
inline rendezvous::job node_job(const rendezvous::job& j) {
  if (j.local_rank >= j.local_size || j.local_rank > j.rank)
    qcoll::detail::throw_error(errc::invalid_argument, "qcoll rank {}: local rank {} of {} does not make a node", j.rank,
                               j.local_rank, j.local_size);
  rendezvous::job node = j;
  node.rank = j.local_rank;
  node.size = j.local_size;
  node.job_id = qcoll::detail::format("{}-node{}", j.job_id, j.rank - j.local_rank);
  node.transport = rendezvous::transport_kind::shm;
  return node;
}

namespace detail {

/// The node's shm transport (node_job(j)), joined through the job's store under the
/// node's keys. Compiled once where QCOLL_LAUNCH_COMPILED is defined, as join_host is.
QCOLL_LAUNCH_DECL transports::process_transport join_node(const rendezvous::job& j, rendezvous::store_client& store,
                                                          const join_options& opts);

}  // namespace detail

/// Joins the job `j` describes twice: the node's ranks over shm, and every rank over the
/// transport join picks; then fn(node_transport, world_transport). Collective: every
/// rank of the job calls it. Errors as join's; a node whose ranks are not on one host
/// fails its shm join (the segment is not there) within j.timeout.
template <class Fn>
decltype(auto) join_nodes(const rendezvous::job& j, Fn&& fn, const join_options& opts = {}) {
  std::optional<transports::process_transport> node;
  const auto join_node = [&](rendezvous::store_client& store, deadline) { node.emplace(detail::join_node(j, store, opts)); };
  return detail::join_with(
      j, nullptr, join_node,
      [&](auto world) { return std::forward<Fn>(fn)(std::move(*node), std::move(world)); }, opts);
}

/// join_nodes(job_from_environment(), fn, opts).
template <class Fn>
decltype(auto) join_nodes_from_environment(Fn&& fn, const join_options& opts = {}) {
  return join_nodes(rendezvous::job_from_environment(), std::forward<Fn>(fn), opts);
}

#if !defined(QCOLL_LAUNCH_COMPILED) || defined(QCOLL_LAUNCH_SOURCE)
QCOLL_LAUNCH_DECL transports::process_transport detail::join_node(const rendezvous::job& j,
                                                                  rendezvous::store_client& store,
                                                                  const join_options& opts) {
  prefixed_store<rendezvous::store_client> node_store(store,
                                                      qcoll::detail::format("qcoll/node/{}/", j.rank - j.local_rank));
  return transports::shm::join(node_job(j), node_store, opts.shm);
}
#endif

}  // namespace qcoll::launch
