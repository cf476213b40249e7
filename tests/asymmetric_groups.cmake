# examples/asymmetric_groups (seed 001): four processes, over each process transport,
# must end with weights equal to single-rank full-batch training bit for bit (the
# program compares on every rank and exits 1 otherwise); one process runs the
# baseline alone; three are refused with a clear error. 5 steps: 2–4 s on 2 cores.
foreach(transport shm tcp)
  add_test(NAME examples.asymmetric_groups.qcoll_run_${transport}
    COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=100
            "-DSTDOUT_HAS=weights after 5 steps equal single-rank full-batch training bit for bit on every rank"
            "-DCOUNT_LINES=1:^\\[0\\] asymmetric groups, 4 ranks +[0-9.]+ steps/s|1:^\\[0\\] data parallel, 1-bit allreduce +[0-9.]+ steps/s"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- $<TARGET_FILE:qcoll-run> -n 4 --transport ${transport} -- $<TARGET_FILE:asymmetric_groups> --steps 5)
  set_tests_properties(examples.asymmetric_groups.qcoll_run_${transport} PROPERTIES TIMEOUT 110 PROCESSORS 2)
endforeach()
add_test(NAME examples.asymmetric_groups.single_rank
  COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=100 "-DSTDOUT_HAS=single rank, full batch"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
          -- $<TARGET_FILE:qcoll-run> -n 1 -- $<TARGET_FILE:asymmetric_groups> --steps 3)
add_test(NAME examples.asymmetric_groups.refuses_three_ranks
  COMMAND ${CMAKE_COMMAND} -DEXIT=2 -DTIMEOUT=100 "-DSTDERR_HAS=the scheme runs on 4 ranks (or 1 for the baseline), not 3"
          -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
          -- $<TARGET_FILE:qcoll-run> -n 3 -- $<TARGET_FILE:asymmetric_groups> --steps 1)
set_tests_properties(examples.asymmetric_groups.single_rank examples.asymmetric_groups.refuses_three_ranks
                     PROPERTIES TIMEOUT 110)
