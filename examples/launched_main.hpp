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

/// run(comm, options, transport name) gives the exit status. `Devices`: a program on
/// GPUs, which also takes the CUDA peer transport (qcoll-run --transport cuda_peer:
/// launch::join_devices); its run is compiled once more, for that transport.
template <bool Devices = false, class Parse, class Run>
int launched_main(std::string_view program, int argc, char** argv, Parse&& parse, Run&& run) {
  try {
    const auto options = parse(argc, argv);
    const auto body = [&](auto transport) {
      const std::string_view name = qcoll::rendezvous::to_string(transport.kind());
      qcoll::communicator comm(std::move(transport));
      return run(comm, options, name);
    };
    if constexpr (Devices) return qcoll::launch::join_devices_from_environment(body);
    else return qcoll::launch::join_from_environment(body);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}: {}\n", program, e.what());
    return 2;
  }
}

}  // namespace qcoll_examples
