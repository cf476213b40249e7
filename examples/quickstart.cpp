// Four ranks sum their gradients with one allreduce. Here the ranks are threads;
// over shared memory or TCP only the transport changes.
#include <qcoll/qcoll.hpp>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
  constexpr qcoll::rank_t ranks = 4;
  qcoll::transports::inproc::world world(ranks);
  std::vector<std::jthread> threads;
  for (qcoll::rank_t r = 0; r < ranks; ++r)
    threads.emplace_back([&world, r] {
      qcoll::communicator comm(world.endpoint(r));     // fully connected topology by default
      std::vector<float> gradient(1000, float(r + 1));  // rank r contributes r + 1
      comm.allreduce(std::span<float>(gradient), qcoll::reduce_op::sum);
      std::printf("rank %zu: gradient[0] = %g (1 + 2 + 3 + 4 = 10)\n", r, gradient[0]);
    });
}
