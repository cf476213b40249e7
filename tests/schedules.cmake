# The two seed schedules as jobs (docs/schedules.md): examples/asymmetric_groups
# (seed 001) and examples/sideways_training (seed 004), over each process transport.
if(NOT QCOLL_BUILD_EXAMPLES OR NOT TARGET qcoll-run)
  return()
endif()

include(${CMAKE_CURRENT_SOURCE_DIR}/asymmetric_groups.cmake)

# Sideways with 4 blocks on 4 processes: all four runs print a row, and Sideways on
# smooth frames ends within 5 pp of backprop's test accuracy. The defaults, seeds 1–6
# on 2 cores: 0.0–1.7 pp, in 6 s over shm and 12 s over TCP.
set(sideways_row "^\\[0\\] [a-z]+ +[a-z]+ +[0-9]+ +[0-9.]+ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ %$")
foreach(transport shm tcp)
  add_test(NAME examples.sideways_training.qcoll_run_${transport}
    COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=100
            "-DSTDOUT_HAS=a sequence: Sideways 54 steps (k + 2L − 2), backprop 336 (k (2L − 1))"
            "-DCOUNT_LINES=4:${sideways_row}|1:^\\[0\\] smooth frames: backprop − Sideways test accuracy = -?[0-9.]+ pp \\(limit 5\\.00\\): ok$"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- $<TARGET_FILE:qcoll-run> -n 4 --transport ${transport} -- $<TARGET_FILE:sideways_training>)
  # Alone under ctest -j2: Sideways's 4 ranks meet at every step, so each step costs
  # a scheduling round; next to a compiling test (guards, compile_fail) on 2 cores a
  # run took 31 s instead of 0.7 s (measured). PROCESSORS 2 keeps the cores for it.
  set_tests_properties(examples.sideways_training.qcoll_run_${transport} PROPERTIES TIMEOUT 110 PROCESSORS 2)
endforeach()
