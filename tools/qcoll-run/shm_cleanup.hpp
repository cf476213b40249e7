// Removal of the shared memory a crashed job left behind.
#pragma once

#include <string_view>

namespace qcoll_run {

/// The shm transport unlinks its segment once every rank has attached, so only a job that
/// crashed during setup leaves it behind: this removes the job's segment from /dev/shm, named
/// as the transport names it (qcoll/transports/shm_segment.hpp), once every rank has ended.
void remove_leftover_shared_memory(std::string_view job_id);

}  // namespace qcoll_run
