# Building without OpenSSL is a choice made at configure time, never a silent downgrade:
# - qcoll's own configuration, where OpenSSL is missing, stops and names both ways out;
# - with -DQCOLL_WITH_OPENSSL=OFF it configures, and qcoll::qcoll defines QCOLL_NO_OPENSSL;
# - an installed qcoll built with OpenSSL is not found where OpenSSL is missing.
# OpenSSL is made missing by a stand-in FindOpenSSL.cmake, first on the module path, that
# finds nothing (CMAKE_DISABLE_FIND_PACKAGE_OpenSSL would be an error under REQUIRED).
#   cmake -DSOURCE_DIR=<qcoll> -DPREFIX=<installed qcoll> -DCONSUMER=<tests/package> -DWORK=<dir>
#         -DCOMPILER=… -DGENERATOR=… -P without_openssl.cmake
file(REMOVE_RECURSE "${WORK}")
file(WRITE "${WORK}/no_openssl/FindOpenSSL.cmake" "set(OpenSSL_FOUND FALSE)\nset(OPENSSL_FOUND FALSE)\n")
function(configure name)
  execute_process(COMMAND ${CMAKE_COMMAND} -B "${WORK}/${name}" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${COMPILER}
                          "-DCMAKE_MODULE_PATH=${WORK}/no_openssl" ${ARGN}
                  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  string(REGEX REPLACE "[ \n]+" " " output "${output}")  # CMake wraps its messages
  set(status ${status} PARENT_SCOPE)
  set(output "${output}" PARENT_SCOPE)
endfunction()
set(only_the_library -DQCOLL_BUILD_TESTS=OFF -DQCOLL_BUILD_EXAMPLES=OFF -DQCOLL_BUILD_BENCHMARKS=OFF
                     -DQCOLL_BUILD_LAUNCHER=OFF -DQCOLL_WITH_MPI=OFF -DQCOLL_WITH_CUDA=OFF)

configure(missing -S "${SOURCE_DIR}" ${only_the_library})
if(status EQUAL 0)
  message(FATAL_ERROR "qcoll configured without OpenSSL although QCOLL_WITH_OPENSSL is on:\n${output}")
endif()
foreach(expected "found none" "libssl-dev" "-DQCOLL_WITH_OPENSSL=OFF")
  string(FIND "${output}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "qcoll's configuration without OpenSSL failed without saying '${expected}':\n${output}")
  endif()
endforeach()
message(STATUS "OpenSSL missing: the configuration stops and names -DQCOLL_WITH_OPENSSL=OFF")

configure(off -S "${SOURCE_DIR}" ${only_the_library} -DQCOLL_WITH_OPENSSL=OFF)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "qcoll did not configure with -DQCOLL_WITH_OPENSSL=OFF:\n${output}")
endif()
# The definition the headers read, on the target an installed package exports.
file(GLOB exported "${WORK}/off/CMakeFiles/Export/*/qcollTargets.cmake")
if(NOT exported)
  message(FATAL_ERROR "no exported qcollTargets.cmake under ${WORK}/off/CMakeFiles/Export")
endif()
file(READ "${exported}" targets)
if(NOT targets MATCHES "INTERFACE_COMPILE_DEFINITIONS \"QCOLL_NO_OPENSSL\"" OR targets MATCHES "OpenSSL::")
  message(FATAL_ERROR "qcoll::qcoll built with -DQCOLL_WITH_OPENSSL=OFF should define QCOLL_NO_OPENSSL and link no OpenSSL:\n${targets}")
endif()
message(STATUS "-DQCOLL_WITH_OPENSSL=OFF: configured without OpenSSL")

configure(installed -S "${CONSUMER}" "-DCMAKE_PREFIX_PATH=${PREFIX}" -DQCOLL_CONSUME=find_package)
if(status EQUAL 0)
  message(FATAL_ERROR "find_package(qcoll) succeeded without the OpenSSL it was built with:\n${output}")
endif()
string(FIND "${output}" "dependency OpenSSL could not be found" at)
if(at EQUAL -1)
  message(FATAL_ERROR "find_package(qcoll) failed without OpenSSL, but without naming it:\n${output}")
endif()
message(STATUS "installed qcoll, OpenSSL missing: not found, and says OpenSSL")
file(REMOVE_RECURSE "${WORK}")
