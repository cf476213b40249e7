#include "job_environment.hpp"

#include "system.hpp"

#include <qcoll/rendezvous/hmac.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string_view>

extern char** environ;

namespace qcoll_run {
namespace {

namespace variables = qcoll::rendezvous::variables;

// OpenSSL's generator, as the handshake's nonces (rendezvous/hmac.hpp).
std::string random_hex(std::size_t bytes) {
  std::vector<std::byte> random(bytes);
  qcoll::rendezvous::random_bytes(random);
  std::string hex;
  for (const std::byte byte : random) hex += fmt::format("{:02x}", std::to_integer<unsigned>(byte));
  return hex;
}

/// Whether 127.0.0.1:`port` can be bound right now (port 0: any port the kernel picks);
/// the port bound, or 0 when it cannot.
unsigned bind_loopback_briefly(unsigned port) {
  const file_descriptor probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe) throw_system_error("cannot create a socket to find a free port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t length = sizeof address;
  if (::bind(probe.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return 0;
  }
  return ntohs(address.sin_port);
}

/// The first port of the kernel's ephemeral range (ip_local_port_range), 0 when unknown.
unsigned first_ephemeral_port() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  unsigned low = 0, high = 0;
  return range >> low >> high ? low : 0;
}

/// A loopback port free right now, below the kernel's ephemeral range where it can:
/// ports there are never handed out by connect() or bind(0), which the busy neighbours
/// of a job (other jobs' TCP meshes, a test suite in parallel) do thousands of times, so
/// only an explicit bind of the same port can still take it before rank 0 binds it (a
/// port from bind(0) was taken that way once in a CI run). Falls back to bind(0).
unsigned find_free_loopback_port() {
  constexpr unsigned lowest = 10000;  // well above the registered services' usual ports
  const unsigned ephemeral = first_ephemeral_port();
  if (ephemeral > lowest + 1000) {
    std::random_device random;
    std::uniform_int_distribution<unsigned> pick(lowest, ephemeral - 1);
    for (int attempt = 0; attempt < 64; ++attempt)
      if (const unsigned port = bind_loopback_briefly(pick(random))) return port;
  }
  const unsigned any = bind_loopback_briefly(0);
  if (any == 0) throw_system_error("cannot find a free port on 127.0.0.1");
  return any;
}

}  // namespace

job_environment make_job_environment(int ranks, int ranks_per_node, const std::string& transport) {
  const char* given_job_id = std::getenv(variables::job_id);
  const char* given_secret = std::getenv(variables::secret);
  const char* given_secret_file = std::getenv(variables::secret_file);
  job_environment job;
  job.ranks_per_node = ranks_per_node != 0 ? ranks_per_node : ranks;
  // An empty job id would name no segment at all; an empty secret means "no authentication".
  job.job_id = given_job_id != nullptr && *given_job_id != '\0' ? given_job_id : random_hex(8);
  // A secret given in a file stays there: the ranks read QCOLL_SECRET_FILE themselves, so
  // the secret is in no process's environment (a QCOLL_SECRET would also win over it).
  const bool secret_in_file = given_secret == nullptr && given_secret_file != nullptr && *given_secret_file != '\0';
  // A build without OpenSSL cannot authenticate, and its ranks would refuse a secret.
  const std::string secret = given_secret != nullptr                                        ? given_secret
                             : secret_in_file || !qcoll::rendezvous::authentication_available ? ""
                                                                                               : random_hex(16);

  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable = *entry;
    const auto name = variable.substr(0, variable.find('='));
    if (std::find(variables_set_per_job.begin(), variables_set_per_job.end(), name) == variables_set_per_job.end()) {
      job.shared.emplace_back(variable);
    }
  }
  job.shared.push_back(fmt::format("{}={}", variables::world_size, ranks));
  job.shared.push_back(fmt::format("{}={}", variables::local_world_size, job.ranks_per_node));
  job.shared.push_back(fmt::format("{}=127.0.0.1:{}", variables::store, find_free_loopback_port()));
  job.shared.push_back(fmt::format("{}={}", variables::job_id, job.job_id));
  if (!secret_in_file) job.shared.push_back(fmt::format("{}={}", variables::secret, secret));
  job.shared.push_back(fmt::format("{}={}", variables::transport, transport));
  return job;
}

std::vector<std::string> rank_environment(const job_environment& job, int rank) {
  std::vector<std::string> environment = job.shared;
  environment.push_back(fmt::format("{}={}", variables::rank, rank));
  environment.push_back(fmt::format("{}={}", variables::local_rank, rank % job.ranks_per_node));
  return environment;
}

}  // namespace qcoll_run
