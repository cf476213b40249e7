# An installed qcoll meets a dependency outside its supported range (xsimd 15, fmt 13):
# find_package(qcoll) must fail, and say which versions it supports and which it found.
# A stand-in package of that version is put first on the prefix path.
#   cmake -DPREFIX=<installed qcoll> -DCONSUMER=<tests/package> -DWORK=<dir> -DCOMPILER=… -DGENERATOR=… -P unsupported_dependency.cmake
foreach(case "xsimd;15.0.0;xsimd;xsimd 8.1 to 14.x" "fmt;13.0.0;fmt::fmt;fmt 9.0 to 12.x")
  list(GET case 0 package)
  list(GET case 1 version)
  list(GET case 2 target)
  list(GET case 3 supported)
  set(stand_in "${WORK}/${package}-${version}")
  file(REMOVE_RECURSE "${WORK}")
  file(WRITE "${stand_in}/share/cmake/${package}/${package}Config.cmake"
    "add_library(${target} INTERFACE IMPORTED)\n")
  # As the real packages' version files: any request of the same major version.
  file(WRITE "${stand_in}/share/cmake/${package}/${package}ConfigVersion.cmake"
    "set(PACKAGE_VERSION ${version})\n"
    "set(PACKAGE_VERSION_COMPATIBLE TRUE)\n"
    "if(PACKAGE_FIND_VERSION AND NOT PACKAGE_FIND_VERSION_MAJOR EQUAL ${version})\n"
    "  set(PACKAGE_VERSION_COMPATIBLE FALSE)\n"
    "endif()\n")
  execute_process(
    COMMAND ${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}/build" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${COMPILER}
            "-DCMAKE_PREFIX_PATH=${stand_in};${PREFIX}" -DQCOLL_CONSUME=find_package
    RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  string(REGEX REPLACE "[ \n]+" " " output "${output}")  # CMake wraps its messages
  if(status EQUAL 0)
    message(FATAL_ERROR "find_package(qcoll) accepted ${package} ${version}:\n${output}")
  endif()
  string(FIND "${output}" "qcoll supports ${supported}, found ${package} ${version}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "find_package(qcoll) failed with ${package} ${version}, but without naming the supported range:\n${output}")
  endif()
  message(STATUS "${package} ${version} refused: qcoll supports ${supported}")
endforeach()
file(REMOVE_RECURSE "${WORK}")
