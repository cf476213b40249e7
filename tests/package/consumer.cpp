#include <qcoll/qcoll.hpp>

#include <cstdio>
#include <thread>
#include <vector>

int main() {
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
  std::printf("qcoll %d.%d.%d consumer: sum = %g\n", qcoll::version_major, qcoll::version_minor,
              qcoll::version_patch, result[0]);
  return result[0] == 3.0 && result[1] == 3.0 ? 0 : 1;
}
