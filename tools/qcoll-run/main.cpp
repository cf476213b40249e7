// qcoll-run: starts the N ranks of a qcoll job on this machine and supervises them.
//
//   qcoll-run -n N [--transport shm|tcp|cuda_peer] [--bind core|none] [--keep-going] [--timeout S] [--grace S] [--] program args...
//
// Design choices:
// - Each rank runs in a process group of its own, and qcoll-run signals the whole group, so a
//   rank's helper processes stop with it. A terminal's Ctrl-C then reaches qcoll-run alone, which
//   forwards it exactly once; ranks left in qcoll-run's group would get it twice, and
//   `kill -TERM <qcoll-run>` would not reach them at all.
// - One thread, one poll(2) loop (supervisor.hpp); signal handlers only write to a pipe.
// - A rank's end is reported by a signal queued per rank (signals.hpp), so that "the first rank
//   that failed" is the first to end, not the first waitpid() happens to return.
// - On Linux a rank gets SIGKILL when qcoll-run dies (PR_SET_PDEATHSIG): ranks must not outlive
//   the process that would stop and reap them.
//
// The parts: command_line (options, --help), job_environment (what each rank's environment
// holds), rank (starting one rank), signals, supervisor (the job's loop), shm_cleanup, and
// system (descriptors, pipes, qcoll-run's own output).

#include "command_line.hpp"
#include "supervisor.hpp"
#include "system.hpp"

#include <qcoll/version.hpp>

#include <fmt/format.h>

#include <exception>
#include <variant>

int main(int argc, char** argv) {
  using namespace qcoll_run;
  try {
    open_standard_descriptors();
    const command_line parsed = parse_command_line(argc, argv);
    if (std::holds_alternative<show_help>(parsed)) {
      sink.write(STDOUT_FILENO, usage_text());
      return 0;
    }
    if (std::holds_alternative<show_version>(parsed)) {
      sink.write(STDOUT_FILENO, fmt::format("qcoll-run (qcoll) {}.{}.{}\n", QCOLL_VERSION_MAJOR, QCOLL_VERSION_MINOR,
                                            QCOLL_VERSION_PATCH));
      return 0;
    }
    job_supervisor job(std::get<options>(parsed));
    return job.run();
  } catch (const usage_error& error) {
    note("{}\nTry 'qcoll-run --help' for more information.", error.what());
    return exit_usage;
  } catch (const cannot_run_error& error) {
    note("{}", error.what());
    return exit_cannot_run;
  } catch (const std::exception& error) {
    note("{}", error.what());
    return exit_launcher_failed;
  }
}
