# The randomized fault campaign (tests/faults/campaign.py; docs/testing.md has the long
# run): random transport, world size and fault (a rank killed or stopped at a random
# moment, an elastic job losing ranks, or a payload bit flipped on TCP), judged by what
# every rank says and leaves.
# CI runs a few trials in the release builds; under the sanitizers a trial's 2 s step
# deadline would be the sanitizer's slowness, not a fault. The network faults (cut, slow)
# need root and namespaces and are left to the long run (docs/testing.md).
if(NOT TARGET transport_worker OR NOT TARGET recovery_worker OR CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  return()
endif()
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Python3_FOUND)
  return()
endif()
set(campaign_transports shm,tcp)
if(TARGET transport_worker_mpich)
  set(campaign_transports shm,tcp,mpich)
endif()
# The `garbage` fault's sender (faults/garble.cpp), preloaded into the ranks.
add_library(qcoll_garble SHARED faults/garble.cpp)
set_target_properties(qcoll_garble PROPERTIES OUTPUT_NAME qcoll_garble)
target_link_libraries(qcoll_garble PRIVATE ${CMAKE_DL_LIBS})
qcoll_warnings(qcoll_garble)
# A rank that sends garbage once joined: the others name it (worker scenario "garble").
qcoll_job_test(garbage_after_the_handshake RANKS 4 TRANSPORT tcp ARGS garble LAUNCHER_OPTIONS --keep-going
  ENVIRONMENT LD_PRELOAD=$<TARGET_FILE:qcoll_garble>
  LINES "3:refused the garbage of rank 3|1:rank 3: its peers refused its garbage")
# TLS (QCOLL_TLS=1): a bit of the last rank's ciphertext flipped in transit, as a man in
# the middle would: the record fails its authentication, the reader names the victim, and
# every rank fails; each completed call's sum is checked.
qcoll_job_test(tls_record_altered_in_transit RANKS 3 TRANSPORT tcp ARGS alter_a_tls_record LAUNCHER_OPTIONS --keep-going
  ENVIRONMENT LD_PRELOAD=$<TARGET_FILE:qcoll_garble> QCOLL_GARBLE=payload QCOLL_TLS=1
  LINES "3:refused the altered TLS record of rank 2")
add_test(NAME faults.campaign
  COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/faults/campaign.py ${PROJECT_BINARY_DIR}
          --trials 10 --seed 1 --transports ${campaign_transports} --faults none,kill,stop,elastic)
set_tests_properties(faults.campaign PROPERTIES PASS_REGULAR_EXPRESSION "every trial passed" TIMEOUT 300)
# A payload bit flipped in transit over TCP (the `corrupt` fault): every trial whose flip
# went out ends in the CRC-32C mismatch's error, naming the victim on every rank.
add_test(NAME faults.campaign.corrupt
  COMMAND Python3::Interpreter ${CMAKE_CURRENT_SOURCE_DIR}/faults/campaign.py ${PROJECT_BINARY_DIR}
          --trials 8 --seed 1 --transports tcp --faults corrupt)
set_tests_properties(faults.campaign.corrupt PROPERTIES PASS_REGULAR_EXPRESSION
  "corrupt +tcp +CRC-32C mismatch reported.*every trial passed" TIMEOUT 200)
