#pragma once
/// @file
/// The main() of the multi-process examples: parse the options, join the job that
/// qcoll-run (or mpirun, torchrun) started, run on a communicator over its transport,
/// and report any error as "program: message" with exit status 2.

#include <qcoll/communicator.hpp>
#include <qcoll/launch/join.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string_view>
#include <utility>

namespace qcoll_examples {

/// How a program joins: the host transports (launch::join).
struct join_host_transports {
  template <class Fn>
  decltype(auto) operator()(Fn&& fn) const {
    return qcoll::launch::join_from_environment(std::forward<Fn>(fn));
  }
};

/// run(comm, options, transport name) gives the exit status. `Join`: how it joins (a
/// program on GPUs passes one that calls launch::join_devices_from_environment, and its
/// run is compiled once more, for the CUDA peer transport).
template <class Join = join_host_transports, class Parse, class Run>
int launched_main(std::string_view program, int argc, char** argv, Parse&& parse, Run&& run) {
  try {
    const auto options = parse(argc, argv);
    return Join{}([&](auto transport) {
      const std::string_view name = qcoll::rendezvous::to_string(transport.kind());
      qcoll::communicator comm(std::move(transport));
      return run(comm, options, name);
    });
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", program, e.what());
    return 2;
  }
}

}  // namespace qcoll_examples
