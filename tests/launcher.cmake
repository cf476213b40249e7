# qcoll-run end to end: each test launches small shell ranks (launcher/rank.sh <behaviour>) and
# checks the exit status, output, timing and leftovers (check_job.cmake says how).
if(NOT TARGET qcoll-run OR NOT UNIX)
  return()
endif()

set(launcher_rank sh ${CMAKE_CURRENT_SOURCE_DIR}/launcher/rank.sh)

# qcoll_launcher_test(<name> CHECK <var>=<value>... COMMAND <qcoll-run arguments>... [ENVIRONMENT <var>=<value>...])
function(qcoll_launcher_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "CHECK;COMMAND;ENVIRONMENT")
  list(TRANSFORM arg_CHECK PREPEND "-D")
  add_test(NAME launcher.${name}
    COMMAND ${CMAKE_COMMAND} ${arg_CHECK} -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- $<TARGET_FILE:qcoll-run> ${arg_COMMAND})
  set_tests_properties(launcher.${name} PROPERTIES TIMEOUT 30)
  if(arg_ENVIRONMENT)
    set_tests_properties(launcher.${name} PROPERTIES ENVIRONMENT "${arg_ENVIRONMENT}")
  endif()
endfunction()

# The job's environment.
qcoll_launcher_test(env CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=env RANKS=3 TRANSPORT=shm
  COMMAND -n 3 ${launcher_rank} env)
qcoll_launcher_test(env_tcp CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=env RANKS=2 TRANSPORT=tcp
  COMMAND -n 2 --transport tcp ${launcher_rank} env)
qcoll_launcher_test(env_given_job_id_and_secret
  CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=env RANKS=2 TRANSPORT=shm JOB_ID=given-job "SECRET=given secret" PASSTHROUGH=kept
  COMMAND -n 2 ${launcher_rank} env
  ENVIRONMENT QCOLL_JOB_ID=given-job "QCOLL_SECRET=given secret" QCOLL_TEST_PASSTHROUGH=kept QCOLL_RANK=99 QCOLL_TRANSPORT=tcp)
# A secret in a file stays in the file: qcoll-run sets no QCOLL_SECRET, which would win over it.
qcoll_launcher_test(env_given_secret_file
  CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=env RANKS=2 TRANSPORT=shm SECRET=unset PASSTHROUGH=kept
  COMMAND -n 2 ${launcher_rank} env
  ENVIRONMENT QCOLL_SECRET_FILE=${CMAKE_CURRENT_SOURCE_DIR}/launcher/rank.sh QCOLL_TEST_PASSTHROUGH=kept)
# --ranks-per-node: nodes of 2 on this machine, rank r's local rank r mod 2.
qcoll_launcher_test(env_ranks_per_node CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=env RANKS=4 PER_NODE=2 TRANSPORT=tcp
  COMMAND -n 4 --ranks-per-node 2 --transport tcp ${launcher_rank} env)
qcoll_launcher_test(many_ranks CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=env RANKS=64 TRANSPORT=shm
  COMMAND -n 64 ${launcher_rank} env)

# Binding: --bind core pins each rank to one CPU; --bind none leaves the launcher's set.
qcoll_launcher_test(bind_core CHECK EXIT=0 "COUNT_LINES=1:^\\[0\\] cpus=[0-9]+$"
  COMMAND -n 1 --bind core ${launcher_rank} cpus)
qcoll_launcher_test(bind_none CHECK EXIT=0 "COUNT_LINES=0:^\\[0\\] cpus=[0-9]+$|1:^\\[0\\] cpus=.*[-,]"
  COMMAND -n 1 --bind none ${launcher_rank} cpus)

# Failures: the first one's status, the other ranks stopped (or not, with --keep-going).
qcoll_launcher_test(failing_rank_stops_others
  CHECK EXIT=3 MAX_SECONDS=10 STDOUT_EMPTY=ON "STDERR_HAS=qcoll-run: rank 1 exited with status 3"
  COMMAND -n 3 ${launcher_rank} rank1_fails)
qcoll_launcher_test(stopping_a_rank_stops_its_children  # each rank has a process group of its own
  CHECK EXIT=3 MAX_SECONDS=10 VERIFY=children_stopped RANKS=3
  COMMAND -n 3 ${launcher_rank} rank1_fails_children_stopped)
qcoll_launcher_test(keep_going
  CHECK EXIT=3 MIN_SECONDS=1 MAX_SECONDS=10 "STDOUT_HAS=[0] rank 0 finished|[2] rank 2 finished"
        "STDERR_HAS=qcoll-run: rank 1 exited with status 3" STDERR_LACKS=stopping
  COMMAND -n 3 --keep-going ${launcher_rank} rank1_fails_others_finish)
qcoll_launcher_test(killed_by_signal
  CHECK EXIT=137 MAX_SECONDS=10 "STDERR_HAS=qcoll-run: rank 0 was killed by signal SIGKILL (9)"
  COMMAND -n 2 ${launcher_rank} rank0_killed)
# The first failure decides the status, even when the other ranks fail right after it: the
# last rank kills itself, the others lose it and exit 4 at once. 30 jobs each, all must exit 137.
# (transport_worker is defined by multiprocess.cmake, under the same conditions as this file.)
foreach(transport tcp shm)
  foreach(mode stop keep_going)
    set(options "")
    if(mode STREQUAL "keep_going")
      set(options --keep-going)
    endif()
    add_test(NAME launcher.first_failure_status.${transport}.${mode}
      COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/launcher/first_failure.sh 30 137
              $<TARGET_FILE:qcoll-run> -n 4 --transport ${transport} ${options}
              $<TARGET_FILE:transport_worker> kill_survivors_give_up)
    set_tests_properties(launcher.first_failure_status.${transport}.${mode} PROPERTIES TIMEOUT 120
                         ENVIRONMENT QCOLL_TIMEOUT_MS=20000)
  endforeach()
endforeach()
qcoll_launcher_test(timeout
  CHECK EXIT=124 MIN_SECONDS=1 MAX_SECONDS=5 "STDERR_HAS=qcoll-run: job timed out after 1 s"
  COMMAND -n 1 --timeout 1 sleep 30)
qcoll_launcher_test(timeout_then_sigkill_after_grace
  CHECK EXIT=124 MIN_SECONDS=2 MAX_SECONDS=6
        "STDERR_HAS=job timed out after 1 s|rank 0 is still running 1 s after SIGTERM; sending SIGKILL|rank 1 is still running"
  COMMAND -n 2 --timeout 1 --grace 1 ${launcher_rank} ignore_term)

# Signals sent to qcoll-run alone reach every rank.
foreach(signal TERM HUP)
  add_test(NAME launcher.signal_forwarding.${signal}
    COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/launcher/signal_forwarding.sh $<TARGET_FILE:qcoll-run>
            ${CMAKE_CURRENT_SOURCE_DIR}/launcher/rank.sh ${signal})
  set_tests_properties(launcher.signal_forwarding.${signal} PROPERTIES TIMEOUT 30)
endforeach()

# Output relaying.
qcoll_launcher_test(output_interleaving CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=flood RANKS=4 LINES=2000
  COMMAND -n 4 ${launcher_rank} flood 2000)
qcoll_launcher_test(streams_and_partial_lines CHECK EXIT=0 VERIFY=streams
  COMMAND -n 2 ${launcher_rank} streams)
qcoll_launcher_test(long_line CHECK EXIT=0 STDERR_EMPTY=ON VERIFY=long_line
  COMMAND -n 1 ${launcher_rank} long_line)

# Programs that cannot run, and bad usage.
qcoll_launcher_test(cannot_run CHECK EXIT=127 STDOUT_EMPTY=ON
  "STDERR_HAS=qcoll-run: cannot run 'qcoll-no-such-program': No such file or directory"
  COMMAND -n 2 qcoll-no-such-program --flag)
qcoll_launcher_test(cannot_run_directory CHECK EXIT=127 STDOUT_EMPTY=ON
  "STDERR_HAS=qcoll-run: cannot run '${CMAKE_CURRENT_SOURCE_DIR}/launcher': Permission denied"
  COMMAND -n 1 ${CMAKE_CURRENT_SOURCE_DIR}/launcher)
set(usage_hint "Try 'qcoll-run --help' for more information.")
qcoll_launcher_test(usage.missing_rank_count CHECK EXIT=2 "STDERR_HAS=the number of ranks is missing (-n N)|${usage_hint}"
  COMMAND true)
qcoll_launcher_test(usage.zero_ranks CHECK EXIT=2 "STDERR_HAS=-n needs a number of ranks from 1 to 1024, not '0'"
  COMMAND -n 0 true)
qcoll_launcher_test(usage.too_many_ranks CHECK EXIT=2 "STDERR_HAS=-n needs a number of ranks from 1 to 1024, not '1025'"
  COMMAND -n1025 true)
qcoll_launcher_test(usage.unknown_option CHECK EXIT=2 "STDERR_HAS=unknown option '--frobnicate'"
  COMMAND -n 2 --frobnicate true)
qcoll_launcher_test(usage.missing_program CHECK EXIT=2 "STDERR_HAS=the program to run is missing"
  COMMAND -n 2 --)
qcoll_launcher_test(usage.bad_transport CHECK EXIT=2 "STDERR_HAS=--transport is shm, tcp or cuda_peer, not 'udp'"
  COMMAND -n 2 --transport=udp true)
qcoll_launcher_test(usage.ranks_per_node_not_dividing CHECK EXIT=2
  "STDERR_HAS=--ranks-per-node 3 does not divide -n 4" COMMAND -n 4 --ranks-per-node 3 true)
qcoll_launcher_test(usage.bad_timeout CHECK EXIT=2 "STDERR_HAS=--timeout needs a positive number of seconds, not '0'"
  COMMAND -n 2 --timeout 0 true)
qcoll_launcher_test(usage.missing_value CHECK EXIT=2 "STDERR_HAS=option '--grace' needs a value"
  COMMAND -n 2 --grace)
qcoll_launcher_test(help CHECK EXIT=0 "STDOUT_HAS=Usage: qcoll-run -n N [options] [--] program" STDERR_EMPTY=ON
  COMMAND --help)
qcoll_launcher_test(version CHECK EXIT=0 "STDOUT_HAS=qcoll-run (qcoll) ${PROJECT_VERSION}" STDERR_EMPTY=ON
  COMMAND --version)

# Shared memory a crashed job left behind. The job ids are unique to this build tree, so that
# two build trees can run their tests at the same time.
string(MD5 launcher_tree_hash "${CMAKE_CURRENT_BINARY_DIR}")
string(SUBSTRING "${launcher_tree_hash}" 0 12 launcher_tree_hash)
qcoll_launcher_test(shm_cleanup
  CHECK EXIT=137 VERIFY=shm_cleanup JOB_ID=test${launcher_tree_hash} REMOVED=ON
        "STDERR_HAS=removed shared memory the job left behind: /dev/shm/qcoll-test${launcher_tree_hash}"
  COMMAND -n 2 ${launcher_rank} shm_crash
  ENVIRONMENT QCOLL_JOB_ID=test${launcher_tree_hash})
qcoll_launcher_test(shm_cleanup_skips_unsafe_job_id  # a segment is named by a hash of such an id (shm_segment.hpp)
  CHECK EXIT=137 VERIFY=shm_cleanup JOB_ID=test.${launcher_tree_hash} REMOVED=OFF STDERR_LACKS=removed
  COMMAND -n 2 ${launcher_rank} shm_crash
  ENVIRONMENT QCOLL_JOB_ID=test.${launcher_tree_hash})
