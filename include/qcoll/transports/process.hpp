#pragma once
/// @file
/// The transport of a rank in a multi-process job on the stream engine, whichever way it
/// joined: over shm's shared pipes (shm.hpp) or tcp's sockets (tcp.hpp). Both joins
/// return this one type — `shm::transport` and `tcp::transport` name it — and how it
/// moves bytes is the engine's channels, chosen at join. So a program that may join
/// either way (launch::join) compiles its collectives once, not once per transport: a
/// second transport type instantiated every collective again, about a fifth of an
/// example's compile time (docs/testing.md, "CI time").
///
/// What differs at run time: kind() says how it joined, and single_copy() is true only
/// where shm's join found that every rank may read every other's memory (a tcp job never
/// reads its peers' memory). allocate_shared makes the same mappable memory either way;
/// without single copy it is ordinary memory to the collectives.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/rendezvous/environment.hpp>
#include <qcoll/transports/shm_shared_memory.hpp>
#include <qcoll/transports/stream/engine.hpp>

#include <sys/types.h>
#include <sys/uio.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::transports {

/// What a rank knows of its peers' processes when they all run on this host (shm's
/// join): their pids, for process_vm_readv and pidfd_getfd; whether every pair may read
/// each other's memory; and the word the peers probed at join, which lives as long as
/// the transport. A tcp job has none.
struct local_peers {
  std::vector<pid_t> pids;
  bool single_copy = false;
  std::unique_ptr<std::uint64_t> probe;
};

/// One rank's endpoint. Models qcoll::shared_memory_transport and liveness_transport; move-only.
class process_transport : public stream::endpoint {
 public:
  /// A transport over `core`, joined as `kind`, with the peers' processes where they are
  /// on this host. shm::join and tcp::join make it.
  process_transport(std::unique_ptr<stream::engine> core, std::chrono::milliseconds job_timeout,
                    rendezvous::transport_kind kind, local_peers peers = {})
      : stream::endpoint(std::move(core), job_timeout),
        kind_(kind),
        pids_(std::move(peers.pids)),
        single_copy_(peers.single_copy && !pids_.empty()),
        probe_(std::move(peers.probe)),
        peer_regions_(std::make_unique<shm::detail::peer_regions>(pids_)) {}

  /// How it joined: shm or tcp (QCOLL_TRANSPORT's names).
  rendezvous::transport_kind kind() const noexcept { return kind_; }

  /// Whether every pair of ranks may read each other's memory (agreed at join).
  bool single_copy() const noexcept { return single_copy_; }

  /// Memory the other ranks can map, for a collective's data (communicator::allocate):
  /// single-copy steps read it in place instead of through the kernel. Without single
  /// copy it is ordinary memory to the collectives. Any thread; it may outlive the
  /// transport.
  shm::shared_memory allocate_shared(std::size_t bytes) { return shm::shared_memory::make(regions_, bytes); }

  /// Which of this rank's shared regions holds all of `data` (serial 0: none).
  shared_region region_of(std::span<const std::byte> data) const { return regions_->find(data); }

  /// `bytes` at `address` in the region `peer` described, mapped read-only into this
  /// process (once; kept until the owner frees it); empty when it cannot be mapped.
  std::span<const std::byte> map_peer(rank_t peer, const shared_region& region, std::uint64_t address,
                                      std::size_t bytes) {
    if (!single_copy_ || peer == rank()) return {};
    return peer_regions_->view(peer, region, address, bytes);
  }

  /// How many of the peers' shared regions this rank has mapped now.
  std::size_t mapped_peer_regions() const { return peer_regions_->mapped_count(); }

  /// Copies into.size() bytes from `address` in `peer`'s memory (process_vm_readv).
  /// peer_lost when its process is gone or the memory no longer mapped (it left the call).
  std::error_code read_peer(rank_t peer, std::uint64_t address, std::span<std::byte> into) {
    if (!single_copy_ || peer >= pids_.size() || peer == rank()) return make_error_code(errc::invalid_argument);
    std::size_t done = 0;
    while (done < into.size()) {
      const iovec local{into.data() + done, into.size() - done};
      const iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + done)), into.size() - done};
      const ssize_t n = ::process_vm_readv(pids_[peer], &local, 1, &remote, 1, 0);
      if (n > 0) {
        done += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return make_error_code(errno == ESRCH || errno == EFAULT || n == 0 ? errc::peer_lost : errc::invalid_argument);
    }
    return {};
  }

 private:
  rendezvous::transport_kind kind_;
  std::vector<pid_t> pids_;
  bool single_copy_ = false;
  std::unique_ptr<std::uint64_t> probe_;  // read by the peers' probes at join
  std::shared_ptr<shm::detail::region_registry> regions_ = std::make_shared<shm::detail::region_registry>();
  std::unique_ptr<shm::detail::peer_regions> peer_regions_;  // behind a pointer: it holds a mutex, the transport moves
};

static_assert(shared_memory_transport<process_transport>);
static_assert(liveness_transport<process_transport>);

}  // namespace qcoll::transports
