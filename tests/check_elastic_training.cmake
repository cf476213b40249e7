# cmake -DRUN=<qcoll-run> -DPROGRAM=<elastic_training> -DTRANSPORT=shm|tcp -DSEED=<s> -P check_elastic_training.cmake
#
# Trains twice on 6 ranks from the same start: unbroken, then losing ranks 0 and 3 in
# the middle of epoch 3. The broken run must finish on the 4 survivors with a final test
# accuracy at most MARGIN percentage points below the unbroken run's (the example checks
# it: --reference), after printing what its recovery found.
cmake_minimum_required(VERSION 3.25)

function(run_job out_var status_var)
  execute_process(COMMAND ${RUN} -n 6 --transport ${TRANSPORT} ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status TIMEOUT 100)
  set(${out_var} "${out}\n${err}" PARENT_SCOPE)
  set(${status_var} "${status}" PARENT_SCOPE)
endfunction()

run_job(unbroken status -- ${PROGRAM} --seed ${SEED})
string(REGEX MATCH "final test accuracy: ([0-9.]+) % on 6 ranks" _ "${unbroken}")
if(NOT status EQUAL 0 OR CMAKE_MATCH_1 STREQUAL "")
  message(FATAL_ERROR "the unbroken run failed (status ${status}):\n${unbroken}")
endif()
set(reference ${CMAKE_MATCH_1})

# The two killed ranks make qcoll-run's status 137 (SIGKILL); the survivors' verdict is in
# their output.
run_job(broken status --keep-going -- ${PROGRAM} --seed ${SEED} --kill 0,3@250 --reference ${reference} --margin ${MARGIN})
set(problems "")
foreach(wanted "recovery: old rank 1 of [56] is rank 0 of [45] \\(shrink [12], agreed in [0-9.]+ ms\\), lost: rank 0 \\("
               "go on from step 2(49|50)"
               "final test accuracy: [0-9.]+ % on 4 ranks \\(unbroken run: ${reference} %, [-+][0-9.]+ pp, margin ${MARGIN}"
               "rank 0 was killed by signal SIGKILL" "rank 3 was killed by signal SIGKILL")
  if(NOT broken MATCHES "${wanted}")
    string(APPEND problems "  no line matches '${wanted}'\n")
  endif()
endforeach()
if(NOT status EQUAL 137)
  string(APPEND problems "  exit status ${status}, expected 137 (the killed ranks'; a survivor below the reference exits 1)\n")
endif()
if(broken MATCHES "elastic_training: cannot go on|FAILED|rank [0-9]+ exited with status [123]")
  string(APPEND problems "  a survivor failed\n")
endif()
if(NOT problems STREQUAL "")
  message(FATAL_ERROR "elastic training over ${TRANSPORT} (reference ${reference} %):\n${problems}--- output:\n${broken}")
endif()
message(STATUS "unbroken ${reference} %; broken run within ${MARGIN} pp")
