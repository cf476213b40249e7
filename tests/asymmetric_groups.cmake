# examples/asymmetric_groups (seed 001): four processes, over each process transport,
# must end with weights equal to single-rank full-batch training bit for bit (the
# program compares on every rank and exits 1 otherwise); one process runs the
# baseline alone; three are refused with a clear error. 5 steps: 2–4 s on 2 cores.
# One row per scheme on rank 0: steps/s, then the loss of the first and the last step.
# The 4-rank schemes' rows end with the bytes the transport wrote per step (measured, so
# never 0 over a process transport).
set(asymmetric_rows "1:^\\[0\\] single rank, full batch \\(rank 0\\) +[0-9.]+ steps/s   loss [0-9.]+ -> [0-9.]+")
foreach(scheme "asymmetric groups, 4 ranks" "data parallel, exact allreduce" "data parallel, 1-bit allreduce")
  string(APPEND asymmetric_rows "|1:^\\[0\\] ${scheme} +[0-9.]+ steps/s   loss [0-9.]+ -> [0-9.]+   sends [1-9]")
endforeach()
foreach(transport shm tcp)
  add_test(NAME examples.asymmetric_groups.qcoll_run_${transport}
    COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=100
            "-DSTDOUT_HAS=weights after 5 steps equal single-rank full-batch training bit for bit on every rank"
            "-DCOUNT_LINES=${asymmetric_rows}"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- $<TARGET_FILE:qcoll-run> -n 4 --transport ${transport} -- $<TARGET_FILE:asymmetric_groups> --steps 5)
  set_tests_properties(examples.asymmetric_groups.qcoll_run_${transport} PROPERTIES TIMEOUT 110 PROCESSORS 2)
endforeach()
add_test(NAME examples.asymmetric_groups.single_rank
  COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=100
          "-DCOUNT_LINES=1:^\\[0\\] single rank, full batch +[0-9.]+ steps/s   loss [0-9.]+ -> [0-9.]+   sends 0 B"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
          -- $<TARGET_FILE:qcoll-run> -n 1 -- $<TARGET_FILE:asymmetric_groups> --steps 3)
add_test(NAME examples.asymmetric_groups.refuses_three_ranks
  COMMAND ${CMAKE_COMMAND} -DEXIT=2 -DTIMEOUT=100 "-DSTDERR_HAS=the scheme runs on 4 ranks (or 1 for the baseline), not 3"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
          -- $<TARGET_FILE:qcoll-run> -n 3 -- $<TARGET_FILE:asymmetric_groups> --steps 1)
set_tests_properties(examples.asymmetric_groups.single_rank examples.asymmetric_groups.refuses_three_ranks
                     PROPERTIES TIMEOUT 110)
