# The compression_choice example: adaptive_allreduce picks exact or compressed per bucket
# from its own measurements.
# - On loopback (4 ranks over shm, 2 cores) which one wins is the machine's and the
#   load's to say, not a test's: a 16 MiB bfp8 bucket took 12.8-14.6 ms exact against
#   31.2-33.1 ms compressed on 2026-11-25, but after the 8-bit bfp kernels got 1.3-2.8x
#   faster it came out compressed 16.6 ms against exact 25.6 ms while other tests loaded
#   both cores (2026-11-26); 1 MiB buckets flip under load too (exact 17.1 against one_bit
#   8.3 ms). So the loopback test checks the rule, with real measurements: every bucket's
#   choice is the one its own printed times imply (compressed exactly when exact >= 1.2x
#   compressed). docs/compressed-performance.md has what it picks on a quiet machine.
# - In the 1 Gbit/s lab a 16 MiB bucket must compress by one_bit: exact takes ~230 ms
#   there, 1-bit ~25 ms (docs/compressed-performance.md), a margin no load closes.
if(NOT QCOLL_BUILD_EXAMPLES OR NOT TARGET qcoll-run)
  return()
endif()

add_test(NAME examples.compression_choice.loopback_choice_follows_its_measurements
  COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=60 -DVERIFY=choice_follows_measurements -DEXPECT_BUCKETS=3
          -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
          -- $<TARGET_FILE:qcoll-run> -n 4 -- $<TARGET_FILE:compression_choice> --quantizer bfp8 --sizes 64K,1M,16M)
set_tests_properties(examples.compression_choice.loopback_choice_follows_its_measurements PROPERTIES TIMEOUT 90)

if(DEFINED netlab_dir)  # tests/netlab.cmake: root, iproute2 and namespaces, or SKIPPED
  set(directory ${netlab_dir}/compression_choice)
  file(MAKE_DIRECTORY ${directory})
  add_test(NAME examples.compression_choice.lab_large_bucket_compresses
    COMMAND sh ${netlab_dir}/lab_or_skip.sh ${directory} --
            ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=110
            "-DCOUNT_LINES=1:^\\[0\\] 16777216 bytes: compressed \\(one_bit, chunk 262144\\): [0-9.]+ ms against exact [0-9.]+ ms"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- ${PROJECT_SOURCE_DIR}/benchmarks/netlab -n 4 --rate 1gbit
               -- $<TARGET_FILE:compression_choice> --sizes 16M --calls 5)
  # RUN_SERIAL: the probes time the machine; other tests on the 2 cores would blur them.
  set_tests_properties(examples.compression_choice.lab_large_bucket_compresses PROPERTIES
                       TIMEOUT 120 SKIP_RETURN_CODE 77 RUN_SERIAL ON)
endif()
