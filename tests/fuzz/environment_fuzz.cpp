// Fuzz target for the launch environment's parser (rendezvous/environment.hpp), which
// reads whatever a launcher, a batch script or a user exported.
//
// Input: lines "NAME=value" (the first '=' splits; a later line of the same name wins).
// job_from_environment must either throw qcoll::error with errc::invalid_argument and
// the parser's prefix, or return a job that keeps its promises: rank < size, local_rank
// < local_size ≤ size, a non-empty job id and store host, a store port, a timeout of at
// least 1 ms. Any other exception, or a crash, is a failure. QCOLL_SECRET_FILE reads
// unset here: the fuzzer must not open the files a mutant names.

#include <qcoll/rendezvous/environment.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace qcoll;

[[noreturn]] void failure(const std::string& what) {
  std::fprintf(stderr, "environment_fuzz: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string, std::less<>> variables;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (std::size_t start = 0; start < text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    if (const auto equals = line.find('='); equals != std::string_view::npos)
      variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
    start = end + 1;
  }
  const auto lookup = [&](const char* name) -> const char* {
    if (std::string_view(name) == rendezvous::variables::secret_file) return nullptr;
    const auto found = variables.find(name);
    return found == variables.end() ? nullptr : found->second.c_str();
  };
  try {
    const rendezvous::job job = rendezvous::job_from_environment(lookup);
    if (job.rank >= job.size) failure("a rank not below the size");
    if (job.local_rank >= job.local_size || job.local_size > job.size) failure("a local rank or size out of range");
    if (job.job_id.empty() || job.store_host.empty() || job.store_port == 0) failure("no job id or store address");
    if (job.timeout.count() < 1) failure("a timeout under 1 ms");
  } catch (const qcoll::error& e) {
    if (e.code() != errc::invalid_argument) failure(std::string("an error other than invalid_argument: ") + e.what());
    if (!std::string_view(e.what()).starts_with(rendezvous::detail::environment_error_prefix))
      failure(std::string("an error without the parser's prefix: ") + e.what());
  } catch (const std::exception& e) {
    failure(std::string("an exception other than qcoll::error: ") + e.what());
  }
  return 0;
}

#ifndef QCOLL_LIBFUZZER
#include "driver.hpp"

namespace {

/// A launcher's environment as each family sets it, with plausible (mostly valid) values.
qcoll::test::fuzz::bytes valid_input(std::mt19937_64& random) {
  std::string text;
  const auto set = [&](std::string_view name, const std::string& value) {
    text.append(name).append("=").append(value).append("\n");
  };
  const auto number = [&](std::uint64_t below) { return std::to_string(random() % below); };
  const std::uint64_t size = 1 + random() % 16, rank = random() % size, local_size = 1 + random() % size;
  switch (random() % 4) {
    case 0:  // qcoll-run
      set("QCOLL_RANK", std::to_string(rank));
      set("QCOLL_WORLD_SIZE", std::to_string(size));
      set("QCOLL_LOCAL_RANK", std::to_string(rank % local_size));
      set("QCOLL_LOCAL_WORLD_SIZE", std::to_string(local_size));
      set("QCOLL_STORE", random() % 2 ? "127.0.0.1:" + number(65536) : "[::1]:" + number(65536));
      set("QCOLL_JOB_ID", "job-" + number(1000));
      break;
    case 1:  // torchrun
      set("RANK", std::to_string(rank));
      set("WORLD_SIZE", std::to_string(size));
      set("LOCAL_RANK", std::to_string(rank % local_size));
      set("LOCAL_WORLD_SIZE", std::to_string(local_size));
      set("MASTER_ADDR", "node" + number(10));
      set("MASTER_PORT", number(65536));
      set("TORCHELASTIC_RUN_ID", random() % 2 ? "none" : "run" + number(100));
      if (random() % 2) set("TORCHELASTIC_USE_AGENT_STORE", "True");
      break;
    case 2:  // mpirun
      set("OMPI_COMM_WORLD_RANK", std::to_string(rank));
      set("OMPI_COMM_WORLD_SIZE", std::to_string(size));
      set("OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank % local_size));
      set("OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(random() % 2 ? size : local_size));
      set(random() % 2 ? "OMPI_MCA_ess_base_jobid" : "PMIX_NAMESPACE", number(100000));
      break;
    default:  // srun
      set("SLURM_PROCID", std::to_string(rank));
      set("SLURM_NTASKS", std::to_string(size));
      set("SLURM_LOCALID", std::to_string(rank % local_size));
      set("SLURM_NODEID", number(3));
      set("SLURM_STEP_TASKS_PER_NODE", std::to_string(local_size) + "(x2)," + number(4));
      set("SLURM_STEP_NODELIST", "node[00" + number(9) + "-004,007],gpu1");
      set("SLURMD_NODENAME", "node00" + number(3));
      set("SLURM_JOB_ID", number(100000));
      set("SLURM_STEP_ID", number(4));
      break;
  }
  if (random() % 3 == 0) set("QCOLL_SECRET", "s3cret");
  if (random() % 3 == 0) set("QCOLL_TRANSPORT", random() % 2 ? "shm" : "tcp");
  if (random() % 3 == 0) set("QCOLL_BIND", "0.0.0.0");
  if (random() % 3 == 0) set("QCOLL_TIMEOUT_MS", number(100000));
  return {text.begin(), text.end()};
}

}  // namespace

int main(int argc, char** argv) { return qcoll::test::fuzz::drive(argc, argv, "environment_fuzz", valid_input); }
#endif
