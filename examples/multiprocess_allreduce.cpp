// Ranks as processes: the same program runs under qcoll-run, torchrun or mpirun and
// finds its job in the environment (rank, world size, the store rank 0 serves, the
// secret), then sums a gradient across the job over shared memory or TCP.
//
//   qcoll-run -n 4 multiprocess_allreduce                  # shared memory
//   qcoll-run -n 4 --transport tcp multiprocess_allreduce  # TCP over loopback
//   mpirun -np 4 multiprocess_allreduce                    # Open MPI starts the ranks
//   torchrun --nproc-per-node 4 --no-python multiprocess_allreduce

#include <qcoll/communicator.hpp>
#include <qcoll/launch/join.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

int main() try {
  return qcoll::launch::join_from_environment([](auto transport) {
    qcoll::communicator comm(std::move(transport));  // fully connected over this job's ranks (the default)
    const qcoll::rank_t n = comm.size(), r = comm.rank();

    // The communicator's own memory: over shared memory the peers map it and reduce
    // straight out of it (docs/transports.md, "Shared buffers"); elsewhere it is
    // ordinary memory. Allocate a bucket once and reuse it; any std::span works too.
    qcoll::buffer<float> gradient = qcoll::allocate<float>(comm, 1 << 20);
    std::fill(gradient.begin(), gradient.end(), float(r + 1));  // rank r contributes r + 1
    comm.allreduce(std::span<float>(gradient), qcoll::reduce_op::sum);

    const float expected = float(n * (n + 1) / 2);
    const bool correct = gradient[0] == expected && gradient[gradient.size() - 1] == expected;
    fmt::print("rank {} of {}: gradient[0] = {} (1 + … + {} = {}): {}\n", r, n, gradient[0], n, expected,
               correct ? "correct" : "WRONG");
    return correct ? 0 : 1;
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "multiprocess_allreduce: %s\n", e.what());
  return 1;
}
