# Real multi-process jobs: tests/multiprocess/worker.cpp run by qcoll-run over each
# transport, checked by tests/multiprocess/check_job.cmake (exit status, verdict lines).
if(NOT TARGET qcoll-run)
  return()
endif()

add_executable(transport_worker multiprocess/worker.cpp)
target_link_libraries(transport_worker PRIVATE ${qcoll_device_target} qcoll_launch)  # "device" runs on a GPU too
qcoll_warnings(transport_worker)

# qcoll_job_test(<name> RANKS n TRANSPORT shm|tcp ARGS worker-args… [EXIT s] [LINES n:regex|…]
#                [LAUNCHER_OPTIONS …] [ENVIRONMENT var=value…] [CHECK var=value…]
#                [WORKER target] [GROUP name])
# The test is <GROUP>.<transport>.<name> (GROUP: job) and runs WORKER (transport_worker).
function(qcoll_job_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "RANKS;TRANSPORT;EXIT;LINES;WORKER;GROUP"
                        "ARGS;LAUNCHER_OPTIONS;ENVIRONMENT;CHECK")
  if(NOT DEFINED arg_EXIT)
    set(arg_EXIT 0)
  endif()
  if(NOT DEFINED arg_WORKER)
    set(arg_WORKER transport_worker)
  endif()
  if(NOT DEFINED arg_GROUP)
    set(arg_GROUP job)
  endif()
  list(TRANSFORM arg_CHECK PREPEND "-D")
  add_test(NAME ${arg_GROUP}.${arg_TRANSPORT}.${name}
    COMMAND ${CMAKE_COMMAND} -DEXIT=${arg_EXIT} "-DCOUNT_LINES=${arg_LINES}" -DTIMEOUT=110 ${arg_CHECK}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- $<TARGET_FILE:qcoll-run> -n ${arg_RANKS} --transport ${arg_TRANSPORT} ${arg_LAUNCHER_OPTIONS}
               $<TARGET_FILE:${arg_WORKER}> ${arg_ARGS})
  set_tests_properties(${arg_GROUP}.${arg_TRANSPORT}.${name} PROPERTIES TIMEOUT 120
                       ENVIRONMENT "QCOLL_TIMEOUT_MS=20000;${arg_ENVIRONMENT}")
endfunction()

# 256 MiB messages in the release builds; sanitizer builds are 5–20× slower, so 16 MiB there.
# Compressed allreduces: the largest count is 4 MiB of floats (1 MiB under sanitizers),
# odd, and no group size divides it; the one a rank is killed in is 32 MiB (8 MiB), a
# call long enough that the kill, halfway into it, finds frames in flight.
# The soak in CI is short (docs/testing.md has the long one's command and figures).
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  set(largest_message 16777216)
  set(compressed_values 262147)
  set(compressed_kill_values 2097152)
  set(soak_calls 200)
  # The frozen-rank job: join and a first 16 MiB allreduce take seconds under a
  # sanitizer on a busy machine, before the survivors' 2 s silence (up to twice that) starts.
  set(frozen_job_seconds 12)
else()
  set(largest_message 268435456)
  set(compressed_values 1048579)
  set(compressed_kill_values 8388608)
  set(soak_calls 1000)
  set(frozen_job_seconds 6)
endif()

# Sets out_var to COUNT_LINES checks for one line "rank <r>: <text>" from each rank r of
# first…last, with that rank's prefix.
function(qcoll_line_from_each_rank out_var first last text)
  set(checks "")
  foreach(rank RANGE ${first} ${last})
    if(NOT checks STREQUAL "")
      string(APPEND checks "|")
    endif()
    string(APPEND checks "1:^\\[${rank}\\] rank ${rank}: ${text}")
  endforeach()
  set(${out_var} "${checks}" PARENT_SCOPE)
endfunction()

foreach(transport shm tcp)
  qcoll_job_test(collectives_2_ranks_0_to_${largest_message}_bytes RANKS 2 TRANSPORT ${transport}
    ARGS collectives ${largest_message}
    LINES "2:all collectives correct .* up to ${largest_message} bytes")
  qcoll_job_test(collectives_4_ranks RANKS 4 TRANSPORT ${transport} ARGS collectives 16777216
    LINES "4:all collectives correct")
  qcoll_job_test(collectives_3_ranks RANKS 3 TRANSPORT ${transport} ARGS collectives 1048576
    LINES "3:all collectives correct")
  # The same on communicator::allocate's memory (shm: shared buffers, read in place by
  # the peers), on the world and on a sub-communicator; freed buffers are let go.
  qcoll_job_test(collectives_on_allocated_memory RANKS 3 TRANSPORT ${transport} ARGS allocated 16777216
    LINES "3:all collectives correct on allocated memory")
  qcoll_job_test(many_small_collectives RANKS 4 TRANSPORT ${transport} ARGS many_small
    LINES "4:1000 small allreduces correct")
  # Sub-communicators (halves by parity) next to the world, blocking and started calls.
  qcoll_job_test(split_into_halves RANKS 4 TRANSPORT ${transport} ARGS split 4194304
    LINES "4:split collectives correct as rank [01] of 2")
  qcoll_job_test(mismatched_sizes RANKS 3 TRANSPORT ${transport} ARGS mismatch
    LINES "3:count mismatch reported")
  # Collectives of every kind back to back, every result checked, and resources (memory,
  # descriptors, threads, shared mappings) no larger at the end than after the first half.
  qcoll_job_test(soak RANKS 4 TRANSPORT ${transport} ARGS soak ${soak_calls}
    LINES "4:soak of ${soak_calls} collectives correct")
  # The last rank's count is one the small-message algorithms take: messages of one
  # algorithm meet receives of another, and still every rank reports count_mismatch.
  qcoll_job_test(mismatched_sizes_across_algorithms RANKS 3 TRANSPORT ${transport} ARGS mismatch_algorithms 64
    LINES "3:count mismatch reported")
  # The killed rank makes the job fail (137); every survivor names it, well before the timeout.
  qcoll_job_test(kill_a_rank_mid_allreduce RANKS 4 TRANSPORT ${transport} ARGS kill 67108864 EXIT 137
    LAUNCHER_OPTIONS --keep-going
    LINES "3:survivor saw the loss of peer 3|1:rank 3 was killed by signal SIGKILL")
  # The same in 512 KiB calls, which 4 ranks make by halving-doubling on either transport.
  qcoll_job_test(kill_a_rank_mid_halving_doubling RANKS 4 TRANSPORT ${transport} ARGS kill 524288 EXIT 137
    LAUNCHER_OPTIONS --keep-going
    LINES "3:survivor saw the loss of peer 3.* via halving_doubling|1:rank 3 was killed by signal SIGKILL")
  # Every exact collective and a compressed plan on device buffers (the emulated device),
  # against the host calls on the same inputs, bit for bit; a rank killed in an allreduce
  # on device buffers is named by every survivor.
  qcoll_job_test(device_collectives_3_ranks RANKS 3 TRANSPORT ${transport} ARGS device 4194304
    ENVIRONMENT QCOLL_DEVICE=emulated LINES "3:device collectives equal the host's .* on the emulated device")
  qcoll_job_test(kill_a_rank_mid_device_allreduce RANKS 4 TRANSPORT ${transport} ARGS kill_device 16777216 EXIT 137
    LAUNCHER_OPTIONS --keep-going ENVIRONMENT QCOLL_DEVICE=emulated
    LINES "3:survivor saw the loss of peer 3|1:rank 3 was killed by signal SIGKILL")
  # A rank that stops answering without closing anything: timeouts, no hang. qcoll-run's
  # own --timeout then removes the stopped rank (124): it must leave the survivors the
  # time to start and to give up (the CI run of 2026-11-28 cut rank 1 off at 5 s under TSan).
  qcoll_job_test(frozen_rank_times_out RANKS 3 TRANSPORT ${transport} ARGS freeze EXIT 124
    LAUNCHER_OPTIONS --keep-going --timeout ${frozen_job_seconds} --grace 1 ENVIRONMENT QCOLL_TIMEOUT_MS=2000
    LINES "2:gave up on the frozen rank after")
  qcoll_job_test(wrong_secret_on_one_rank RANKS 2 TRANSPORT ${transport} ARGS wrong_secret
    ENVIRONMENT QCOLL_TIMEOUT_MS=3000
    LINES "1:rank 1: join failed as expected|1:rank 0: join failed as expected \\(timed out\\)")
  # Compressed allreduce with every quantizer over the direct and the forwarded route,
  # counts 0, 1, 2049, 100003 and compressed_values, three calls per plan: identity sums
  # exactly, the others agree bitwise on every rank and on both routes.
  foreach(ranks 2 3 4)
    math(EXPR last "${ranks} - 1")
    qcoll_line_from_each_rank(verdicts 0 ${last} "compressed ok")
    qcoll_job_test(compressed_allreduce_${ranks}_ranks RANKS ${ranks} TRANSPORT ${transport}
      ARGS compressed ${compressed_values} LINES "${verdicts}")
  endforeach()
  # The grid allreduce on a 2×4 torus with one degraded node, every quantizer, both
  # forwarding modes: the degraded node's rank is refused, the 7 others agree.
  qcoll_line_from_each_rank(verdicts 0 5 "grid ok")
  qcoll_job_test(grid_allreduce_2x4_torus RANKS 8 TRANSPORT ${transport} ARGS grid ${compressed_values}
    LINES "${verdicts}|1:^\\[6\\] rank 6: grid excluded as expected|1:^\\[7\\] rank 7: grid ok")
  # A rank killed in the middle of a compressed allreduce, blocking or started: every
  # survivor's call fails naming it and leaves the plan's residuals as they were.
  qcoll_line_from_each_rank(verdicts 0 2 "residuals unchanged after the loss of peer 3")
  foreach(call blocking started)
    set(scenario compressed_kill)
    if(call STREQUAL "started")
      set(scenario compressed_kill_started)
    endif()
    qcoll_job_test(kill_a_rank_mid_${call}_compressed_allreduce RANKS 4 TRANSPORT ${transport}
      ARGS ${scenario} ${compressed_kill_values} EXIT 137 LAUNCHER_OPTIONS --keep-going
      LINES "${verdicts}|1:rank 3 was killed by signal SIGKILL")
  endforeach()
endforeach()
foreach(ranks 2 4)
  qcoll_job_test(device_collectives_${ranks}_ranks RANKS ${ranks} TRANSPORT shm ARGS device 1048576
    ENVIRONMENT QCOLL_DEVICE=emulated LINES "${ranks}:device collectives equal the host's")
endforeach()
# The single-copy steps' path chosen by measurement (tuning/copy_path.hpp, on with
# QCOLL_SINGLE_COPY_KERNEL_BYTES=auto): 3 ranks, 24 allreduces of 1 MiB (349,528-byte
# steps, every third a started call). Each rank's first call stages its blocks (peers map
# them), its calls 16 to 18 in that size class try the kernel's copy, and
# QCOLL_DEBUG=INFO's lines say so and what the bytes did; what the rounds then choose
# depends on the host and is not asserted. Then 6 calls with the ranks' paths forced
# apart (odd ranks the kernel's copy, even ranks staged). A size in
# QCOLL_SINGLE_COPY_KERNEL_BYTES replaces the measurement: every call reads through the kernel.
# (A check's regex holds no ';', which would split it: check_job reads it as ',', '.' here.)
set(staged_bytes "mapped [1-9][0-9]*, peer_read 0, staged [1-9][0-9]*$")
set(peer_read_bytes "mapped 0, peer_read [1-9][0-9]*, staged 0$")
qcoll_job_test(copy_path_by_measurement RANKS 3 TRANSPORT shm ARGS repeat_mixed 1048576
  ENVIRONMENT QCOLL_DEBUG=INFO QCOLL_SINGLE_COPY_KERNEL_BYTES=auto
  LINES "3:30 allreduces of 1048576 bytes correct|3:#0 via ring_single_copy .*outgoing blocks staged: not yet measured. .*${staged_bytes}|3:#16 via ring_single_copy .*outgoing blocks peer_read: a trial \\(call 16 of its size class\\). .*${peer_read_bytes}|3:#18 via ring_single_copy .*outgoing blocks peer_read: a trial \\(call 18 of|3:#19 via ring_single_copy .*outgoing blocks [a-z_]+: measured \\(last round: peer_read [0-9.]+ ns/B, staged [0-9.]+. 1 round|0:#2[4-9] via.*outgoing blocks")
# Unset, the path is measured where the ranks fit the host's cores (2 ranks here; CI's
# hosts have 2 cores, a host with fewer skips the test): calls 16 to 18 of the size class
# are a round of the kernel's copy.
cmake_host_system_information(RESULT qcoll_host_cores QUERY NUMBER_OF_LOGICAL_CORES)
if(qcoll_host_cores GREATER_EQUAL 2)
  qcoll_job_test(copy_path_measured_by_default RANKS 2 TRANSPORT shm ARGS repeat 1048576
    ENVIRONMENT QCOLL_DEBUG=INFO
    LINES "2:24 allreduces of 1048576 bytes correct|2:#0 via ring_single_copy .*outgoing blocks staged: not yet measured. .*${staged_bytes}|6:#1[678] via ring_single_copy .*outgoing blocks peer_read: a trial \\(call 1[678] of its size class\\). .*${peer_read_bytes}|2:#19 via ring_single_copy .*outgoing blocks [a-z_]+: measured")
endif()
qcoll_job_test(copy_path_forced RANKS 2 TRANSPORT shm ARGS repeat 1048576
  ENVIRONMENT QCOLL_DEBUG=INFO QCOLL_SINGLE_COPY_KERNEL_BYTES=0
  LINES "2:24 allreduces of 1048576 bytes correct|48:via ring_single_copy .*memory. [0-9.]+ us, .*${peer_read_bytes}|0:outgoing blocks")
# The CUDA peer transport between processes (its windows opened through the runtime's
# handles, shm its control channel), 2 emulated devices shared by 4 ranks (a power of two:
# halving-doubling beside shm's single copy, which cuda_peer cannot take): every exact
# collective and a compressed plan equal the host calls; a rank killed mid-allreduce is
# named by every survivor, well before the timeout.
qcoll_job_test(cuda_peer_collectives_4_ranks RANKS 4 TRANSPORT shm ARGS cuda_peer 1048576
  ENVIRONMENT QCOLL_DEVICE=emulated QCOLL_EMULATED_DEVICES=2
  LINES "4:device collectives equal the host's .* over cuda_peer on device")
qcoll_job_test(kill_a_rank_mid_cuda_peer_allreduce RANKS 4 TRANSPORT shm ARGS kill_cuda_peer 16777216 EXIT 137
  LAUNCHER_OPTIONS --keep-going ENVIRONMENT QCOLL_DEVICE=emulated QCOLL_EMULATED_DEVICES=2
  LINES "3:survivor saw the loss of peer 3|1:rank 3 was killed by signal SIGKILL")
# The two-level allreduce between processes: 2 nodes of 2 ranks on this machine
# (qcoll-run --ranks-per-node 2), each node over shm, the job over tcp (launch::join_nodes);
# with the node over cuda_peer on 2 emulated devices too; a rank killed mid-call fails
# every survivor, its node naming its world rank.
qcoll_job_test(two_level_2_nodes_of_2 RANKS 4 TRANSPORT tcp LAUNCHER_OPTIONS --ranks-per-node 2
  ARGS two_level 1048588 LINES "4:two-level allreduce \\(2 nodes of 2")
qcoll_job_test(two_level_over_cuda_peer_nodes RANKS 4 TRANSPORT tcp LAUNCHER_OPTIONS --ranks-per-node 2
  ARGS two_level_cuda_peer 1048588 ENVIRONMENT QCOLL_DEVICE=emulated QCOLL_EMULATED_DEVICES=2
  LINES "4:two-level allreduce .* over cuda_peer on device too")
qcoll_job_test(kill_a_rank_mid_two_level_allreduce RANKS 4 TRANSPORT tcp ARGS kill_two_level 16777216
  EXIT 137 LAUNCHER_OPTIONS --keep-going --ranks-per-node 2
  LINES "3:survivor's two-level call failed|1:rank 3 was killed by signal SIGKILL")
# A rank killed while the survivors reduce straight out of its shared buffer: they fail
# naming it, and read nothing freed (their mapping keeps the pages).
qcoll_job_test(kill_a_rank_mid_allreduce_on_shared_buffers RANKS 4 TRANSPORT shm ARGS kill_allocated 67108864 EXIT 137
  LAUNCHER_OPTIONS --keep-going
  LINES "3:survivor saw the loss of peer 3|1:rank 3 was killed by signal SIGKILL")
# Single-copy steps of ordinary memory are staged in the communicator's shared staging
# buffer, which the ring's reader maps (one peer region per rank), here in slices of
# 64 KiB (1.4 MiB steps: 22 slices, the last a part); forced through the kernel's copy
# (QCOLL_SINGLE_COPY_KERNEL_BYTES=0), nothing is mapped. Both correct.
qcoll_job_test(collectives_staged_in_shared_memory RANKS 3 TRANSPORT shm ARGS collectives 4194304
  ENVIRONMENT QCOLL_RING_SLICE_BYTES=64K
  LINES "3:all collectives correct .*, peer regions mapped: 1\\)")
qcoll_job_test(collectives_through_the_kernel_copy RANKS 3 TRANSPORT shm ARGS collectives 4194304
  ENVIRONMENT QCOLL_SINGLE_COPY_KERNEL_BYTES=0
  LINES "3:all collectives correct .*, peer regions mapped: 0\\)")
# Peers' shared regions refused (pidfd_getfd denied by a seccomp filter, as a container
# runtime's may): steps read staged blocks through the kernel's copy, nothing is mapped.
qcoll_job_test(collectives_when_peer_mappings_are_refused RANKS 3 TRANSPORT shm ARGS refuse_peer_mappings 4194304
  ENVIRONMENT QCOLL_RING_SLICE_BYTES=64K
  LINES "3:all collectives correct .*, peer regions mapped: 0\\)")
# Single copy refused between two ranks (one is non-dumpable, none may ptrace): every rank
# takes the pipes, rank 0 says why once, and every collective is still correct.
qcoll_job_test(single_copy_refused_falls_back RANKS 3 TRANSPORT shm ARGS refuse_single_copy 4194304
  LINES "3:single copy off|1:single copy is off for this job: rank 0 may not read rank 1's memory|3:all collectives correct \\(|3:all collectives correct on allocated memory .*, 0 peer regions mapped")
qcoll_job_test(intruders_are_refused RANKS 2 TRANSPORT tcp ARGS intruders
  LINES "1:impostor refused as expected|2:tcp transport refused a connection|2:all collectives correct")
# TLS (QCOLL_TLS=1, keyed by qcoll-run's secret): every collective's bits as without, on
# sizes from 0 to 4 MiB (TLS records of 16 KiB, writes retried where the socket is full),
# and many small messages (records gathered with their headers).
qcoll_job_test(collectives_over_tls RANKS 4 TRANSPORT tcp ARGS collectives 4194304 ENVIRONMENT QCOLL_TLS=1
  LINES "4:all collectives correct")
qcoll_job_test(many_small_collectives_over_tls RANKS 3 TRANSPORT tcp ARGS many_small ENVIRONMENT QCOLL_TLS=1
  LINES "3:1000 small allreduces correct")
# A crashed job left a segment under this job's name: the new job must not inherit it, and
# nothing is left in /dev/shm afterwards.
qcoll_job_test(stale_segment_is_replaced RANKS 2 TRANSPORT shm ARGS collectives 4096
  ENVIRONMENT QCOLL_JOB_ID=ctest-stale-segment
  CHECK SETUP_FILE=/dev/shm/qcoll-ctest-stale-segment "SETUP_TEXT=stale state of a crashed job"
        GONE=/dev/shm/qcoll-ctest-stale-segment
  LINES "2:all collectives correct")

# The example, unchanged, under every launcher it documents.
if(QCOLL_BUILD_EXAMPLES)
  set(example_checks -DEXIT=0 "-DCOUNT_LINES=4:rank [0-3] of 4: gradient\\[0\\] = 10 .*: correct"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake --)
  foreach(transport shm tcp)
    add_test(NAME examples.multiprocess_allreduce.qcoll_run_${transport}
      COMMAND ${CMAKE_COMMAND} ${example_checks}
              $<TARGET_FILE:qcoll-run> -n 4 --transport ${transport} $<TARGET_FILE:multiprocess_allreduce>)
  endforeach()
  foreach(transport shm tcp)
    add_test(NAME examples.bf16_gradients.qcoll_run_${transport}
      COMMAND ${CMAKE_COMMAND} -DEXIT=0 "-DCOUNT_LINES=4:rank [0-3] of 4: exact bf16 sum = 1.25 .*: correct"
              -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake --
              $<TARGET_FILE:qcoll-run> -n 4 --transport ${transport} $<TARGET_FILE:bf16_gradients>)
  endforeach()
  # A build without OpenSSL (QCOLL_NO_OPENSSL: QCOLL_WITH_OPENSSL=OFF's definition): the
  # example again, in the one build of g++ without sanitizers (one more compile). Without a
  # secret its ranks join a job with the OpenSSL build's (the job field is a fingerprint
  # both compute); with one, every rank refuses before a byte is sent, and says why.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=")
    add_executable(multiprocess_allreduce_without_openssl ${PROJECT_SOURCE_DIR}/examples/multiprocess_allreduce.cpp)
    target_link_libraries(multiprocess_allreduce_without_openssl PRIVATE qcoll::qcoll)
    target_compile_definitions(multiprocess_allreduce_without_openssl PRIVATE QCOLL_NO_OPENSSL)
    target_compile_options(multiprocess_allreduce_without_openssl PRIVATE ${QCOLL_PROGRAMS_OPTIMIZATION})
    qcoll_warnings(multiprocess_allreduce_without_openssl)
    add_test(NAME examples.multiprocess_allreduce.with_and_without_openssl
      COMMAND ${CMAKE_COMMAND} ${example_checks} $<TARGET_FILE:qcoll-run> -n 4 --transport tcp
              sh -c "[ $((QCOLL_RANK % 2)) = 0 ] && exec \"$0\" || exec \"$1\""
              $<TARGET_FILE:multiprocess_allreduce> $<TARGET_FILE:multiprocess_allreduce_without_openssl>)
    set_tests_properties(examples.multiprocess_allreduce.with_and_without_openssl PROPERTIES ENVIRONMENT "QCOLL_SECRET=")
    add_test(NAME examples.multiprocess_allreduce.without_openssl_refuses_a_secret
      COMMAND ${CMAKE_COMMAND} -DEXIT=1 -DMAX_SECONDS=20
              "-DCOUNT_LINES=2:multiprocess_allreduce: .*this job has a secret .* built without OpenSSL .* cannot authenticate"
              -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake --
              $<TARGET_FILE:qcoll-run> -n 2 --keep-going --transport tcp $<TARGET_FILE:multiprocess_allreduce_without_openssl>)
  endif()
  add_test(NAME examples.multiprocess_allreduce.torchrun_variables
    COMMAND ${CMAKE_COMMAND} ${example_checks}
            ${CMAKE_CURRENT_SOURCE_DIR}/multiprocess/launcher_style.sh torchrun 4 29561 $<TARGET_FILE:multiprocess_allreduce>)
  add_test(NAME examples.multiprocess_allreduce.slurm_variables
    COMMAND ${CMAKE_COMMAND} ${example_checks}
            ${CMAKE_CURRENT_SOURCE_DIR}/multiprocess/launcher_style.sh slurm 4 $<TARGET_FILE:multiprocess_allreduce>)
  # `mpirun -np 4 prog` as a user types it; the environment allows root and 4 ranks on fewer cores.
  find_program(QCOLL_MPIRUN mpirun)
  if(QCOLL_MPIRUN)
    add_test(NAME examples.multiprocess_allreduce.mpirun
      COMMAND ${CMAKE_COMMAND} ${example_checks} ${QCOLL_MPIRUN} -np 4 $<TARGET_FILE:multiprocess_allreduce>)
    set_tests_properties(examples.multiprocess_allreduce.mpirun PROPERTIES ENVIRONMENT
      "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  else()
    message(STATUS "qcoll: mpirun not found; the example's Open MPI test is not registered (apt-get install openmpi-bin)")
  endif()
endif()
