#pragma once
/// @file
/// The MPI transport's options (transports/mpi.hpp), on their own so that the
/// transport's state can keep them without including the public header.

#include <chrono>
#include <optional>

namespace qcoll::transports::mpi {

struct options {
  /// How long a wait polls MPI without pausing (yielding the core between polls);
  /// after it, a wait polls every 50 µs. Unset: QCOLL_SPIN_US, else 2 ms even when
  /// ranks outnumber cores — unlike the shm and tcp transports, which sleep in the
  /// kernel until bytes arrive, MPI moves bytes only inside MPI calls, so a rank that
  /// sleeps stalls its own sends. Measured (collective_bench_mpi --job, 4 ranks on 2
  /// cores, Open MPI 4.1, 2026-11-25): 4 KiB allreduce 1812 µs at 50 µs against 85 µs at
  /// 2 ms over shared memory, 1894 against 183 µs over TCP; 16 MiB 18.7 against 15.2 ms.
  std::optional<std::chrono::microseconds> spin;
  /// How long an abort waits for its messages to leave.
  std::chrono::milliseconds abort_flush{200};
  /// How long an abort, and destruction, wait for transfers MPI could not withdraw
  /// (payloads already moving between two live ranks: milliseconds) to finish, so that
  /// MPI is done with the caller's buffers before the failed call returns.
  std::chrono::milliseconds withdraw_grace{2000};
};

}  // namespace qcoll::transports::mpi
