// Ranks as MPI processes, over the MPI transport: the fabric is MPI's (shared memory,
// TCP, InfiniBand — whatever the MPI was built with), and so is the placement of the
// ranks, so there is no store and no MASTER_ADDR. A gradient is summed exactly, then
// averaged through the 1-bit compressed allreduce; a sub-communicator sums over half
// of the ranks.
//
//   mpirun -np 4 mpi_allreduce          # Open MPI or MPICH; Slurm: srun -n 4 mpi_allreduce
//
// Build it against your MPI (CMake: find_package(MPI), link MPI::MPI_C and qcoll::qcoll).

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/quantizers/one_bit.hpp>
#include <qcoll/transports/mpi.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) try {
  qcoll::transports::mpi::environment mpi(argc, argv);  // MPI_Init_thread(SERIALIZED) unless MPI is up
  qcoll::communicator comm(qcoll::transports::mpi::transport(MPI_COMM_WORLD));
  const qcoll::rank_t n = comm.size(), r = comm.rank();

  std::vector<float> gradient(1 << 20, float(r + 1));  // rank r contributes r + 1
  comm.allreduce(std::span<float>(gradient), qcoll::reduce_op::sum);
  const float expected = float(n * (n + 1) / 2);
  bool correct = gradient.front() == expected && gradient.back() == expected;

  // 1 bit per value on the wire: every rank gets the same bits, close to the mean.
  qcoll::compressed_allreduce_plan<qcoll::quantizers::one_bit> plan(comm, gradient.size());
  std::vector<float> mean(gradient.size());
  std::vector<float> mine(gradient.size(), float(r + 1));
  comm.allreduce(plan, std::span<const float>(mine), std::span<float>(mean), qcoll::reduce_op::avg);
  // Each rank's values are equal, so 1 bit represents them exactly and the mean is exact.
  const double exact_mean = double(n + 1) / 2;
  correct = correct && mean[0] == exact_mean && mean.back() == exact_mean;

  // Halves by parity, over the same MPI communicator.
  auto half = comm.split(std::int64_t(r % 2), std::int64_t(r));
  std::vector<double> ranks_in_half{double(r)};
  half->allreduce(std::span<double>(ranks_in_half), qcoll::reduce_op::sum);
  double expected_half = 0;
  for (qcoll::rank_t other = r % 2; other < n; other += 2) expected_half += double(other);
  correct = correct && ranks_in_half[0] == expected_half;

  fmt::print("rank {} of {}: gradient[0] = {} (1 + … + {} = {}), 1-bit mean[0] = {:.3f} (exact {:.3f}), "
             "sum of the ranks in my half = {}: {}\n",
             r, n, gradient[0], n, expected, mean[0], exact_mean, ranks_in_half[0], correct ? "correct" : "WRONG");
  return correct ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mpi_allreduce: %s\n", e.what());
  return 1;
}
