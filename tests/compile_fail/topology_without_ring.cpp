// Must not compile: the ring collectives need a topology that embeds a ring, and
// only a ring topology converts to the graph a communicator keeps.
#include <qcoll/communicator.hpp>
#include <qcoll/transports/inproc.hpp>

struct star {
  static constexpr std::size_t max_fan_out = 8;
  qcoll::rank_t size() const { return 8; }
  bool linked(qcoll::rank_t a, qcoll::rank_t b) const { return a == 0 || b == 0; }
};

void over_a_star(qcoll::transports::inproc::transport t) {
  qcoll::communicator<qcoll::transports::inproc::transport> comm(std::move(t), qcoll::topologies::graph(star{}));
}
