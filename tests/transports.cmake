# The process transports' pieces: rendezvous (environment, HMAC, handshake, store), launch::join and the
# record stream they share. Whole jobs over shm and tcp are in multiprocess.cmake.
qcoll_test_executable(transport_tests rendezvous_tests.cpp stream_engine_tests.cpp)
qcoll_register_suites(transport_tests hmac environment handshake store join survivors_agreement stream_engine)
