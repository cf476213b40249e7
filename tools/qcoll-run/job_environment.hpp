// The environment each rank gets: qcoll-run's own, with the job's description added.
#pragma once

#include <qcoll/rendezvous/environment.hpp>

#include <array>
#include <string>
#include <vector>

namespace qcoll_run {

/// The variables qcoll-run sets for every rank; whatever qcoll-run's own environment has for
/// them is replaced. The names are the library's (rendezvous/environment.hpp reads them).
inline constexpr std::array<const char*, 8> variables_set_per_job = {
    qcoll::rendezvous::variables::rank,      qcoll::rendezvous::variables::world_size,
    qcoll::rendezvous::variables::local_rank, qcoll::rendezvous::variables::local_world_size,
    qcoll::rendezvous::variables::store,     qcoll::rendezvous::variables::job_id,
    qcoll::rendezvous::variables::secret,    qcoll::rendezvous::variables::transport};

/// What every rank of a job shares.
struct job_environment {
  std::string job_id;
  int ranks_per_node = 0;  // the local world's size; rank r's local rank is r mod it
  std::vector<std::string> shared;  // "NAME=value" entries
};

/// QCOLL_JOB_ID and QCOLL_SECRET are kept when set (a non-empty job id), else generated; the
/// store is a loopback port that was free when qcoll-run looked, chosen below the kernel's
/// ephemeral port range so that no connect() or bind(0) of another process can take it
/// before rank 0 binds it. A process that binds that very port explicitly still can; rank 0
/// then fails to serve the store and the job fails at rendezvous, saying so.
/// `ranks_per_node` 0: every rank on one node (local rank = rank).
job_environment make_job_environment(int ranks, int ranks_per_node, const std::string& transport);

/// The complete environment of rank `rank`.
std::vector<std::string> rank_environment(const job_environment& job, int rank);

}  // namespace qcoll_run
