#pragma once
// Runs N ranks as threads over the in-process transport: the harness every
// collective test uses to sweep world sizes.

#include <qcoll/communicator.hpp>
#include <qcoll/topologies/ring.hpp>
#include <qcoll/transports/inproc.hpp>

#include <exception>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

namespace qcoll::test {

using inproc_communicator = communicator<transports::inproc::transport>;

/// What each rank's function threw (null where it returned).
struct rank_outcomes {
  std::vector<std::exception_ptr> errors;

  bool all_succeeded() const {
    for (const auto& e : errors)
      if (e) return false;
    return true;
  }

  /// The code and message rank r failed with, or {} and "" if it succeeded.
  std::pair<std::error_code, std::string> failure(std::size_t r) const {
    if (!errors.at(r)) return {};
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::system_error& e) {
      return {e.code(), e.what()};
    } catch (const std::exception& e) {
      return {std::make_error_code(std::errc::state_not_recoverable), e.what()};
    }
  }
};

/// Tuning that forces one algorithm (or the ring everywhere, by default).
inline tuning forcing(algorithm allreduce = algorithm::ring, algorithm broadcast = algorithm::ring,
                      algorithm barrier = algorithm::ring) {
  tuning t;
  t.allreduce = allreduce;
  t.broadcast = broadcast;
  t.barrier = barrier;
  return t;
}

/// Rank r runs fn(communicator&) on its own thread; make_topology(n) gives the topology.
/// fn must not use Boost.Test assertions (they are not thread-safe): record results
/// per rank, or throw, and assert on the main thread afterwards.
template <class Topology = topologies::ring, class Fn>
rank_outcomes run_ranks(std::size_t n, Fn fn, communicator_options options = {},
                        std::function<Topology(std::size_t)> make_topology = [](std::size_t size) {
                          return Topology(size);
                        }) {
  return {transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    inproc_communicator comm(std::move(endpoint), make_topology(n), options);
    fn(comm);
  })};
}

}  // namespace qcoll::test
