#include <qcoll/qcoll.hpp>
#ifdef QCOLL_CONSUMER_MPI
#include <qcoll/transports/mpi.hpp>
#endif

#include <cstdio>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  qcoll::transports::inproc::world world(2);
  std::vector<double> result(2);
  {
    std::vector<std::jthread> ranks;
    for (qcoll::rank_t r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        qcoll::communicator comm(world.endpoint(r));
        std::vector<double> v(5, double(r + 1));
        comm.allreduce(std::span<double>(v), qcoll::reduce_op::sum);
        result[r] = v[4];
      });
  }
  // The quantizer kernels come with the package, compiled in this build.
  const qcoll::quantizers::one_bit quantizer;
  std::vector<float> gradient(4096, 0.5f), decoded(4096);
  std::vector<std::byte> frame(quantizer.encoded_size(gradient.size()));
  quantizer.encode(gradient, {}, frame);
  const bool decoded_ok = !quantizer.decode(frame, decoded) && decoded[4095] == 0.5f;
  bool mpi_ok = true;
#ifdef QCOLL_CONSUMER_MPI
  {  // target qcoll::mpi: one rank (MPI's singleton start, no mpirun)
    qcoll::transports::mpi::environment mpi(argc, argv);
    qcoll::communicator comm(qcoll::transports::mpi::transport(MPI_COMM_WORLD));
    std::vector<float> v(3, 2.0f);
    comm.allreduce(std::span<float>(v), qcoll::reduce_op::sum);
    mpi_ok = comm.size() == 1 && v[2] == 2.0f;
    std::printf("mpi transport: %d rank, %s; ", int(comm.size()), mpi_ok ? "ok" : "wrong");
  }
#else
  (void)argc;
  (void)argv;
#endif
  std::printf("qcoll %d.%d.%d consumer: sum = %g, one_bit on %s: %s\n", qcoll::version_major, qcoll::version_minor,
              qcoll::version_patch, result[0], qcoll::kernels::cpu::active_kernels().name, decoded_ok ? "ok" : "wrong");
  return result[0] == 3.0 && result[1] == 3.0 && decoded_ok && mpi_ok ? 0 : 1;
}
