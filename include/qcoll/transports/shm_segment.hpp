#pragma once
/// @file
/// The name of a job's shared-memory segment, on its own so that a tool can name the
/// segment exactly as the shm transport does without including the transport: qcoll-run
/// removes what a crashed job left in /dev/shm with it.

#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace qcoll::transports::shm {

/// Every segment name starts with "/" + this.
inline constexpr std::string_view segment_prefix = "qcoll-";

/// The POSIX shared-memory name ("/qcoll-…") of the segment of the job `job_id`: the id
/// itself when it is a safe file name (letters, digits, '_' and '-', at most 64 bytes),
/// else "h" and its FNV-1a hash, so that no job id can name a path outside /dev/shm.
/// Names that append ".<suffix>" to it are reserved for the same job.
inline std::string segment_name(std::string_view job_id) {
  const bool safe = !job_id.empty() && job_id.size() <= 64 &&
                    job_id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
                        std::string_view::npos;
  if (safe) return qcoll::detail::format("/{}{}", segment_prefix, job_id);
  std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a
  for (const char c : job_id) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return qcoll::detail::format("/{}h{:016x}", segment_prefix, hash);
}

/// True when `file_name`, an entry of /dev/shm, is the segment of the job `job_id` or one of
/// the names reserved for that job ("<segment>.<suffix>"), or those of one of its nodes'
/// jobs (launch::node_job: "<segment>-node<first rank>", and its suffixes).
inline bool is_segment_of_job(std::string_view file_name, std::string_view job_id) {
  const std::string segment = segment_name(job_id).substr(1);  // without the leading '/'
  if (!file_name.starts_with(segment)) return false;
  std::string_view rest = file_name.substr(segment.size());
  if (rest.starts_with("-node")) {
    rest.remove_prefix(5);
    const std::size_t digits = std::min(rest.find_first_not_of("0123456789"), rest.size());
    if (digits == 0) return false;
    rest.remove_prefix(digits);
  }
  return rest.empty() || (rest.size() > 1 && rest.front() == '.');
}

}  // namespace qcoll::transports::shm
