# Tests that run under benchmarks/netlab (netlab.md), with root, iproute2 and network
# namespaces (reported as skipped without):
# - its --wire counters, against a known payload;
# - recovery on a network that fails like a real one: four ranks in network namespaces
#   behind a bridge, and rank 2's link cut while they train. Nothing tells the others:
#   its packets are dropped, no RST, no ICMP. They must notice within the communicator's
#   deadline, agree without rank 2 (their probes of it go unanswered) and finish in a
#   world of 3; rank 2, cut off from everyone, must refuse to go on alone.
#   tests/multiprocess/recovery_worker.cpp (scenario "cut") says what each rank does.
set(netlab_dir ${CMAKE_CURRENT_BINARY_DIR}/netlab)
# The wrapper every netlab test runs under: exits 77 (SKIP_RETURN_CODE) when this machine
# cannot build a lab, else empties the test's directory (a failure_time.* left by an
# earlier run would pass for this one's) and runs the check.
file(CONFIGURE OUTPUT ${netlab_dir}/lab_or_skip.sh CONTENT [=[
# lab_or_skip.sh DIRECTORY -- command...  (written by tests/netlab.cmake)
dir=$1
shift 2
skip() {
  echo "skipped: $* (benchmarks/netlab needs root, iproute2 and network namespaces)"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "not root"
for tool in bash ip tc; do
  command -v "$tool" >/dev/null 2>&1 || skip "'$tool' not found"
done
# A throw-away namespace with what a lab is made of: a veth pair, a bridge, a tbf.
ns=qcoll-probe-$$
why=$(ip netns add "$ns" 2>&1) || skip "network namespaces are not permitted here: ip netns add: $why"
why=$( { ip -n "$ns" link add qa type veth peer name qb &&
         ip -n "$ns" link add qbr type bridge &&
         tc -n "$ns" qdisc add dev qa root tbf rate 1gbit burst 16k limit 64k; } 2>&1)
built=$?
ip netns del "$ns"
[ "$built" -eq 0 ] || skip "cannot build a lab in a namespace: $why"
mkdir -p "$dir" && find "$dir" -mindepth 1 -delete || exit 1
exec "$@"
]=] @ONLY)

# --wire reports what each rank's link carried (benchmarks/netlab.md): rank 0 sends 8 MB
# to rank 1, so its link carries those bytes plus 4-6 % of headers (66 bytes a frame
# with TCP timestamps, 54 without, and a few bytes of handshake), and the payload's
# ceiling on it is what the headers leave. Segments TCP sends again count too: a busy
# host (the sanitizer preset of a CI run) made 61 of 5529 retransmitted, 8.46 MB in all,
# so up to 8.5 MB is accepted.
set(directory ${netlab_dir}/wire)
file(MAKE_DIRECTORY ${directory})
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_FOUND)
  add_test(NAME benchmarks.netlab.wire_counts_the_payload_and_its_headers
    COMMAND sh ${netlab_dir}/lab_or_skip.sh ${directory} --
            ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=60
            "-DCOUNT_LINES=1:^\\[1\\] received 8000000 bytes$|1:^netlab: wire r0: 8\\.[3-5] MB in [0-9]+ frames through the rate limiter \\([0-9]+ dropped\\), [0-9]+ TCP segments sent \\([0-9]+ retransmitted\\), headers [56][46] B a frame = [3-5]\\.[0-9][0-9] % of the bytes: payload at most 9[5-6]\\.[0-9][0-9] % of the link$|1:^netlab: wire r1: [0-9.]+ MB in [0-9]+ frames .*: payload at most [0-9.]+ % of the link$"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- ${PROJECT_SOURCE_DIR}/benchmarks/netlab -n 2 --rate 1gbit --delay 0 --wire
               -- ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/netlab_stream.py 8000000)
  set_tests_properties(benchmarks.netlab.wire_counts_the_payload_and_its_headers PROPERTIES
                       TIMEOUT 90 SKIP_RETURN_CODE 77 RUN_SERIAL ON)
endif()

if(NOT TARGET recovery_worker)
  return()
endif()

# qcoll_netlab_test(<name> RANKS n NETLAB_OPTIONS … ARGS worker-args… EXIT s MAX_SECONDS t
#                   LINES n:regex|… [ENVIRONMENT var=value…])
# Runs recovery_worker <ARGS…> <directory> under benchmarks/netlab with --event-dir
# <directory>: a directory of the test's own, emptied before each run.
function(qcoll_netlab_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "RANKS;EXIT;MAX_SECONDS;LINES" "NETLAB_OPTIONS;ARGS;ENVIRONMENT")
  set(directory ${netlab_dir}/${name})
  file(MAKE_DIRECTORY ${directory})
  add_test(NAME recovery.netlab.${name}
    COMMAND sh ${netlab_dir}/lab_or_skip.sh ${directory} --
            ${CMAKE_COMMAND} -DEXIT=${arg_EXIT} "-DCOUNT_LINES=${arg_LINES}" -DMAX_SECONDS=${arg_MAX_SECONDS}
            -DTIMEOUT=110 -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- ${PROJECT_SOURCE_DIR}/benchmarks/netlab -n ${arg_RANKS} ${arg_NETLAB_OPTIONS} --event-dir ${directory}
               -- $<TARGET_FILE:recovery_worker> ${arg_ARGS} ${directory})
  # RUN_SERIAL: the ranks' deadlines are seconds; a lab fighting other tests for 2 cores
  # would measure the machine, not the recovery.
  set_tests_properties(recovery.netlab.${name} PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77 RUN_SERIAL ON
                       ENVIRONMENT "${arg_ENVIRONMENT}")
endfunction()

# Rank 2's link goes down 1.5 s into the job (mid-training: 60 steps, 50 ms apart). With
# a 2 s deadline the others' collective fails by 3.5 s, their probes of rank 2 give up
# after 2 s, and they go on as ranks 0-2 of 3. Rank 2's own shrink finds no one: exit 3,
# the job's status under --keep-going. The bound is far below a hang, far above a run.
set(lines "")
foreach(rank 0 1 3)
  string(APPEND lines "|1:^\\[${rank}\\] rank ${rank}: recovered: old rank ${rank} of 4 is rank [0-2] of 3 "
                      "\\(shrink 1, agreed in [0-9.]+ ms\\), lost: rank 2 \\(no answer from its host \\(host or link down\\)\\)$"
                      "|1:^\\[${rank}\\] rank ${rank}: training again [0-9]+ ms after the failure$"
                      "|1:^\\[${rank}\\] rank ${rank}: finished 60 steps in a world of 3$")
endforeach()
string(APPEND lines "|1:^\\[2\\] rank 2: shrink refused: .*only 1 rank\\(s\\) agreed"
                    "|0:^\\[2\\] rank 2: recovered|0:^\\[2\\] rank 2: finished|0:FAILED|1:^netlab: rank 2 link down$")
string(SUBSTRING "${lines}" 1 -1 lines)
qcoll_netlab_test(link_down RANKS 4 NETLAB_OPTIONS --rate 1gbit --keep-going --link-down 2@1.5 ARGS cut 2
  EXIT 3 MAX_SECONDS 30 ENVIRONMENT QCOLL_TIMEOUT_MS=2000 LINES "${lines}")
