# Recovery across processes (launch/elastic.hpp): jobs that lose ranks, rank 0 among them,
# and go on in a smaller world. tests/multiprocess/recovery_worker.cpp says what each checks.
if(NOT TARGET qcoll-run)
  return()
endif()

add_executable(recovery_worker multiprocess/recovery_worker.cpp)
target_link_libraries(recovery_worker PRIVATE qcoll::qcoll qcoll_launch)
qcoll_warnings(recovery_worker)

# qcoll_recovery_test(<name> RANKS n TRANSPORT shm|tcp ARGS worker-args… EXIT s LINES …
#                     [ENVIRONMENT var=value…]):
# qcoll_job_test of recovery_worker under --keep-going, with a directory of the test's own
# (the worker writes the dead ranks' residual mass there) as its last argument.
function(qcoll_recovery_test name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "RANKS;TRANSPORT;EXIT;LINES" "ARGS;ENVIRONMENT")
  set(directory ${CMAKE_CURRENT_BINARY_DIR}/recovery/${arg_TRANSPORT}.${name})
  file(MAKE_DIRECTORY ${directory})
  qcoll_job_test(${name} GROUP recovery WORKER recovery_worker RANKS ${arg_RANKS} TRANSPORT ${arg_TRANSPORT}
    EXIT ${arg_EXIT} LINES "${arg_LINES}" LAUNCHER_OPTIONS --keep-going ARGS ${arg_ARGS} ${directory}
    ENVIRONMENT ${arg_ENVIRONMENT})
endfunction()

foreach(transport shm tcp)
  # 6 ranks lose 0 and 3 (rank 0 served the first store): the 4 survivors agree, rejoin
  # with rank 1 as the new rank 0, keep every bit of residual mass but the dead's, and
  # re-plan a grid allreduce with the lost nodes degraded.
  set(survivors "")
  foreach(rank 1 2 4 5)
    string(APPEND survivors "|1:^\\[${rank}\\] rank ${rank}: recovered: old rank ${rank} of 6 is rank [0-3] of 4 "
                            "\\(shrink 1, .*lost: rank 0 \\(.*\\), rank 3 \\(.*\\)$"
                            "|1:^\\[${rank}\\] rank ${rank}: residual mass kept"
                            "|1:^\\[${rank}\\] rank ${rank}: grid allreduce re-planned around 2 lost node\\(s\\) of the 2x3 torus: correct")
  endforeach()
  string(SUBSTRING "${survivors}" 1 -1 survivors)
  qcoll_recovery_test(lose_rank_0_and_3_of_6 RANKS 6 TRANSPORT ${transport} ARGS residuals 0,3 EXIT 137
    LINES "${survivors}|2:was killed by signal SIGKILL")
  if(transport STREQUAL "tcp")
    # The same over TLS (QCOLL_TLS=1, keyed by qcoll-run's secret): the survivors'
    # agreement, the new world's store and its transport all encrypted (each of the 4
    # says so as it rejoins: QCOLL_DEBUG=INFO).
    qcoll_recovery_test(lose_rank_0_and_3_of_6_over_tls RANKS 6 TRANSPORT ${transport} ARGS residuals 0,3 EXIT 137
      LINES "${survivors}|2:was killed by signal SIGKILL|4:TLS 1.3 on all 6 connections"
      ENVIRONMENT QCOLL_TLS=1 QCOLL_DEBUG=INFO)
  endif()
  # 1 survivor of 3 is no majority: its shrink says so instead of training on alone.
  qcoll_recovery_test(no_quorum RANKS 3 TRANSPORT ${transport} ARGS quorum 0,1 EXIT 137
    LINES "1:^\\[2\\] rank 2: shrink refused: .*only 1 rank\\(s\\) agreed to go on .*fewer than the 2 required")
endforeach()
