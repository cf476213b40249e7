#include "shm_cleanup.hpp"

#include "system.hpp"

#include <qcoll/transports/shm_segment.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace qcoll_run {

void remove_leftover_shared_memory(std::string_view job_id) {
  DIR* directory = ::opendir("/dev/shm");
  if (directory == nullptr) return;  // no POSIX shared memory filesystem here
  std::vector<std::string> leftovers;
  while (const dirent* entry = ::readdir(directory)) {
    if (qcoll::transports::shm::is_segment_of_job(entry->d_name, job_id)) leftovers.emplace_back(entry->d_name);
  }
  ::closedir(directory);
  for (const auto& name : leftovers) {
    const std::string path = "/dev/shm/" + name;
    if (::unlink(path.c_str()) == 0) {
      note("removed shared memory the job left behind: {}", path);
    } else if (errno != ENOENT) {
      note("cannot remove shared memory the job left behind, {}: {}", path, std::strerror(errno));
    }
  }
}

}  // namespace qcoll_run
