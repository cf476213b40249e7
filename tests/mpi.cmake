# The MPI transport (include/qcoll/transports/mpi.hpp) under each MPI that Debian ships,
# found through pkg-config (cmake/qcollMpi.cmake) and launched by that MPI's own mpirun: tests/multiprocess/worker.cpp built once per MPI with QCOLL_TEST_MPI, so the
# scenarios are the ones shm and TCP run. tools/install-deps installs both.
if(NOT QCOLL_WITH_MPI OR NOT TARGET transport_worker)
  return()
endif()

# qcoll_mpi_test(<mpi> <name> RANKS n ARGS worker-args… [EXIT s] [LINES n:regex|…] [ENVIRONMENT var=value…])
function(qcoll_mpi_test mpi name)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "RANKS;EXIT;LINES" "ARGS;ENVIRONMENT")
  if(NOT DEFINED arg_EXIT)
    set(arg_EXIT 0)
  endif()
  add_test(NAME job.mpi_${mpi}.${name}
    COMMAND ${CMAKE_COMMAND} -DEXIT=${arg_EXIT} "-DCOUNT_LINES=${arg_LINES}" -DTIMEOUT=110
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake
            -- ${QCOLL_MPIRUN_${mpi}} -np ${arg_RANKS} $<TARGET_FILE:transport_worker_${mpi}> ${arg_ARGS})
  # Open MPI refuses root and more ranks than cores unless told; MPICH needs neither.
  set_tests_properties(job.mpi_${mpi}.${name} PROPERTIES TIMEOUT 120 ENVIRONMENT
    "QCOLL_TIMEOUT_MS=20000;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;${arg_ENVIRONMENT}")
endfunction()

qcoll_mpi_benchmarks(mpi_benchmarks)  # collective_bench's MPI builds, run once each below

# Which MPIs to test under, of those found (the tsan preset: none, as its MPI jobs would not run).
set(QCOLL_TEST_MPIS "openmpi;mpich" CACHE STRING "The MPIs whose transport tests are built and run, where found")
foreach(mpi IN LISTS QCOLL_TEST_MPIS)
  if(NOT mpi MATCHES "^(openmpi|mpich)$")
    message(FATAL_ERROR "qcoll: QCOLL_TEST_MPIS: '${mpi}' is not openmpi or mpich")
  endif()
  string(TOUPPER ${mpi} upper)
  find_program(QCOLL_MPIRUN_${mpi} NAMES mpirun.${mpi})
  if(NOT TARGET PkgConfig::QCOLL_${upper} OR NOT QCOLL_MPIRUN_${mpi})
    message(STATUS "qcoll: ${mpi} not found (pkg-config module or mpirun.${mpi}); its MPI transport tests are not "
                   "registered (apt-get install lib${mpi}-dev)")
    continue()
  endif()
  add_executable(transport_worker_${mpi} multiprocess/worker.cpp)
  target_link_libraries(transport_worker_${mpi} PRIVATE qcoll::qcoll qcoll_launch PkgConfig::QCOLL_${upper})
  target_compile_definitions(transport_worker_${mpi} PRIVATE QCOLL_TEST_MPI)
  qcoll_warnings(transport_worker_${mpi})

  qcoll_mpi_test(${mpi} collectives_2_ranks_0_to_${largest_message}_bytes RANKS 2 ARGS collectives ${largest_message}
    LINES "2:all collectives correct .* up to ${largest_message} bytes")
  qcoll_mpi_test(${mpi} collectives_3_ranks RANKS 3 ARGS collectives 1048576 LINES "3:all collectives correct")
  qcoll_mpi_test(${mpi} collectives_4_ranks RANKS 4 ARGS collectives 16777216 LINES "4:all collectives correct")
  qcoll_mpi_test(${mpi} many_small_collectives RANKS 4 ARGS many_small LINES "4:1000 small allreduces correct")
  qcoll_mpi_test(${mpi} split_into_halves RANKS 4 ARGS split 4194304
    LINES "4:split collectives correct as rank [01] of 2")
  qcoll_mpi_test(${mpi} mismatched_sizes RANKS 3 ARGS mismatch LINES "3:count mismatch reported")
  qcoll_mpi_test(${mpi} soak RANKS 4 ARGS soak ${soak_calls} LINES "4:soak of ${soak_calls} collectives correct")
  qcoll_mpi_test(${mpi} mismatched_sizes_across_algorithms RANKS 3 ARGS mismatch_algorithms 64
    LINES "3:count mismatch reported")
  # A rank asleep for three timeouts: the others give up within their deadline and abort;
  # the sleeper wakes to their abort. No hang, and every rank exits 0.
  qcoll_mpi_test(${mpi} stalled_rank_times_out RANKS 3 ARGS stall ENVIRONMENT QCOLL_TIMEOUT_MS=1500
    LINES "2:gave up on the stalled rank after|1:rank 2: woke up to the others' abort")
  qcoll_mpi_test(${mpi} abort_reaches_every_rank RANKS 4 ARGS abort LINES "4:aborted with rank 0's words")
  qcoll_mpi_test(${mpi} needs_thread_serialized RANKS 2 ARGS thread_single
    LINES "2:refused as expected: .*MPI_THREAD_SERIALIZED")
  foreach(ranks 2 3 4)
    math(EXPR last "${ranks} - 1")
    qcoll_mpi_test(${mpi} compressed_allreduce_${ranks}_ranks RANKS ${ranks} ARGS compressed ${compressed_values}
      LINES "${ranks}:compressed ok")
  endforeach()
  # A message over 2 GiB each way (MPI's counts are int), in the release builds only.
  if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
    qcoll_mpi_test(${mpi} message_over_2_GiB RANKS 2 ARGS over_2GiB LINES "2:2147487756 bytes each way correct")
  endif()
  qcoll_mpi_test(${mpi} device_collectives_3_ranks RANKS 3 ARGS device 1048576 ENVIRONMENT QCOLL_DEVICE=emulated
    LINES "3:device collectives equal the host's .* on the emulated device")
  qcoll_mpi_test(${mpi} grid_allreduce_2x4_torus RANKS 8 ARGS grid ${compressed_values}
    LINES "7:grid ok|1:rank 6: grid excluded as expected")

  # The benchmark over this MPI (benchmarks/qcoll_peer_bench's QCOLL_BENCH_TRANSPORT=mpi).
  qcoll_mpi_benchmark(${mpi} bench)
  if(mpi IN_LIST mpi_benchmarks)
    qcoll_bench_job_test(benchmarks.${bench}.job ${QCOLL_MPIRUN_${mpi}} -np 2 $<TARGET_FILE:${bench}>)
    set_tests_properties(benchmarks.${bench}.job PROPERTIES ENVIRONMENT
      "QCOLL_TIMEOUT_MS=20000;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endif()
  # benchmarks/interleaved_peers end to end, qcoll's own MPI benchmark standing in for Open
  # MPI's (../shared/peers is not in the tree): every cell gets both rows and a same-round
  # ratio. No timing is asserted.
  if(mpi STREQUAL "openmpi" AND mpi IN_LIST mpi_benchmarks AND TARGET qcoll-run)
    add_test(NAME benchmarks.interleaved_peers
      COMMAND ${CMAKE_COMMAND} -DEXIT=0 -DTIMEOUT=120
              "-DCOUNT_LINES=4:^ +[st][hc][mp] +2 +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+-[0-9.]+ +[0-2]/2$"
              -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake --
              ${PROJECT_SOURCE_DIR}/benchmarks/interleaved_peers --rounds 2 --ranks 2 --transports shm,tcp
              --sizes 4K,64K --build ${PROJECT_BINARY_DIR} --peer-name qcoll-mpi
              "--peer-command=${QCOLL_MPIRUN_${mpi}} -np {ranks} $<TARGET_FILE:${bench}> --job -b {first} -e {size} -f 2")
    set_tests_properties(benchmarks.interleaved_peers PROPERTIES TIMEOUT 150 ENVIRONMENT
      "QCOLL_TIMEOUT_MS=20000;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
  endif()
endforeach()

# The example, as its users start it (examples/CMakeLists.txt builds it where Open MPI is
# found; it is configured after tests/, so its target is not there yet to ask).
if(QCOLL_BUILD_EXAMPLES AND TARGET PkgConfig::QCOLL_OPENMPI AND QCOLL_MPIRUN_openmpi)
  add_test(NAME examples.mpi_allreduce.mpirun
    COMMAND ${CMAKE_COMMAND} -DEXIT=0 "-DCOUNT_LINES=4:rank [0-3] of 4: gradient\\[0\\] = 10 .*: correct"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/check_job.cmake -- ${QCOLL_MPIRUN_openmpi} -np 4 $<TARGET_FILE:mpi_allreduce>)
  set_tests_properties(examples.mpi_allreduce.mpirun PROPERTIES TIMEOUT 120 ENVIRONMENT
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()
