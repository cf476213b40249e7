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

#include <cstdio>
#include <vector>

int main() try {
  return qcoll::launch::join_from_environment([](auto transport) {
    qcoll::communicator comm(std::move(transport));  // fully connected over this job's ranks (the default)
    const qcoll::rank_t n = comm.size(), r = comm.rank();

    std::vector<float> gradient(1 << 20, float(r + 1));  // rank r contributes r + 1
    comm.allreduce(std::span<float>(gradient), qcoll::reduce_op::sum);

    const float expected = float(n * (n + 1) / 2);
    const bool correct = gradient.front() == expected && gradient.back() == expected;
    fmt::print("rank {} of {}: gradient[0] = {} (1 + … + {} = {}): {}\n", r, n, gradient[0], n, expected,
               correct ? "correct" : "WRONG");
    return correct ? 0 : 1;
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "multiprocess_allreduce: %s\n", e.what());
  return 1;
}
