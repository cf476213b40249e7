#pragma once
/// @file
/// The name of a job's shared-memory segment, on its own so that a tool can name the
/// segment exactly as the shm transport does without including the transport: qcoll-run
/// removes what a crashed job left in /dev/shm with it.

#include <qcoll/detail/format.hpp>

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
/// the names reserved for that job ("<segment>.<suffix>").
inline bool is_segment_of_job(std::string_view file_name, std::string_view job_id) {
  const std::string segment = segment_name(job_id).substr(1);  // without the leading '/'
  return file_name == segment || (file_name.size() > segment.size() + 1 && file_name.starts_with(segment) &&
                                  file_name[segment.size()] == '.');
}

}  // namespace qcoll::transports::shm
