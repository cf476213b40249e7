# Runs ports/qcoll/portfile.cmake as `vcpkg install qcoll[<features>]` runs it for
# x64-linux, where vcpkg is not at hand (CI): the portfile itself is executed, and the
# vcpkg helpers it calls are defined here to do what vcpkg's do (configure and install
# with vcpkg's fixed options, move and re-root the CMake config, copy tools, install the
# copyright). A helper or an argument this runner does not know is an error, never a
# silent no-op. Then come the checks vcpkg's post-build validation makes of this package,
# the manifest's agreement with the source tree, and a project written from the port's
# usage file, built against the installed tree and run.
#   cmake -DPORT_DIR=<qcoll>/ports/qcoll -DBINARY_DIR=… -DCOMPILER=… -DGENERATOR=…
#         -DFEATURES=tools -DCONSUMER=<program.cpp> -P vcpkg_portfile_runner.cmake
cmake_minimum_required(VERSION 3.25)

get_filename_component(qcoll_source_dir "${PORT_DIR}/../.." ABSOLUTE)
function(fail text)  # one argument: a message keeps its semicolons
  message(FATAL_ERROR "vcpkg port (${PORT_DIR}): ${text}")
endfunction()

# --- The manifest: valid JSON, the source tree's version, a port for each dependency.
# CMake's JSON reader takes comments, trailing commas and repeated keys; vcpkg's does not.
find_program(python3 NAMES python3 REQUIRED)
execute_process(COMMAND "${python3}" -c [[
import json, sys
def unique(pairs):
    keys = [key for key, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("a key is repeated in one object")
    return dict(pairs)
json.load(open(sys.argv[1]), object_pairs_hook=unique)
]] "${PORT_DIR}/vcpkg.json" RESULT_VARIABLE status ERROR_VARIABLE error)
if(NOT status EQUAL 0)
  fail("vcpkg.json is not strict JSON: ${error}")
endif()
file(READ "${PORT_DIR}/vcpkg.json" manifest)
string(JSON PORT ERROR_VARIABLE error GET "${manifest}" name)
if(error)
  fail("vcpkg.json: ${error}")
endif()
string(JSON VERSION ERROR_VARIABLE error GET "${manifest}" version)
if(error)
  fail("vcpkg.json has no \"version\" (${error})")
endif()
# The version: the portfile itself refuses one that differs from include/qcoll/version.hpp's.
if(NOT PORT STREQUAL "qcoll")
  fail("vcpkg.json names the port ${PORT}, not qcoll")
endif()

string(JSON count LENGTH "${manifest}" dependencies)
math(EXPR last "${count} - 1")
set(port_dependencies "")
foreach(i RANGE ${last})
  string(JSON type TYPE "${manifest}" dependencies ${i})
  if(type STREQUAL "STRING")
    string(JSON name GET "${manifest}" dependencies ${i})
  else()
    string(JSON name GET "${manifest}" dependencies ${i} name)
    string(JSON minimum ERROR_VARIABLE error GET "${manifest}" dependencies ${i} "version>=")
    if(NOT error)
      set(port_minimum_${name} "${minimum}")
    endif()
  endif()
  list(APPEND port_dependencies "${name}")
endforeach()
foreach(helper vcpkg-cmake vcpkg-cmake-config)
  if(NOT helper IN_LIST port_dependencies)
    fail("vcpkg.json lacks the host dependency ${helper} the portfile's helpers come from")
  endif()
endforeach()
# What the installed qcollConfig.cmake finds, and the port that provides it in vcpkg.
set(port_for_Boost boost-headers)  # qcoll links Boost::headers
set(port_for_fmt fmt)
set(port_for_xsimd xsimd)
set(port_for_OpenSSL openssl)
set(port_for_Threads "")  # the platform's
file(READ "${qcoll_source_dir}/cmake/qcollDependencies.cmake" dependencies_cmake)
string(REGEX MATCHALL "find_dependency\\([A-Za-z0-9_]+" found "${dependencies_cmake}")
list(TRANSFORM found REPLACE "^find_dependency\\(" "")
# Each Boost library the headers include is a port of its own (boost-asio, …).
file(GLOB_RECURSE headers "${qcoll_source_dir}/include/*.hpp")
set(boost_libraries "")
foreach(header IN LISTS headers)
  file(STRINGS "${header}" includes REGEX "^#include <boost/[a-z_0-9]+")
  foreach(line IN LISTS includes)
    string(REGEX MATCH "<boost/([a-z_0-9]+)" unused "${line}")
    string(REPLACE "_" "-" library "${CMAKE_MATCH_1}")
    list(APPEND boost_libraries "boost-${library}")
  endforeach()
endforeach()
list(REMOVE_DUPLICATES boost_libraries)
foreach(package IN LISTS found)
  if(NOT DEFINED port_for_${package})
    fail("cmake/qcollDependencies.cmake finds ${package}: name the vcpkg port that provides it in \
ports/qcoll/vcpkg.json and in ${CMAKE_CURRENT_LIST_FILE}")
  endif()
  if(port_for_${package} AND NOT port_for_${package} IN_LIST port_dependencies)
    fail("cmake/qcollDependencies.cmake finds ${package}, but vcpkg.json does not depend on ${port_for_${package}}")
  endif()
  # The port may ask for more than qcoll's CMake package accepts, never for less.
  string(REGEX MATCH "(find_dependency|qcoll_require_version)\\(${package} ([0-9][0-9.]*)" unused "${dependencies_cmake}")
  if(CMAKE_MATCH_2 AND DEFINED port_minimum_${port_for_${package}}
     AND port_minimum_${port_for_${package}} VERSION_LESS CMAKE_MATCH_2)
    fail("vcpkg.json accepts ${port_for_${package}} ${port_minimum_${port_for_${package}}}, \
qcoll's CMake package needs ${package} ${CMAKE_MATCH_2} or newer")
  endif()
endforeach()
foreach(port IN LISTS boost_libraries)
  if(NOT port IN_LIST port_dependencies)
    fail("include/qcoll includes <boost/…> headers of ${port}, which vcpkg.json does not depend on")
  endif()
endforeach()

# --- The vcpkg helpers the portfile calls, and the variables vcpkg gives it.
set(TARGET_TRIPLET x64-linux)
set(VCPKG_TARGET_IS_LINUX ON)
set(VCPKG_TARGET_EXECUTABLE_SUFFIX "")
set(CURRENT_PACKAGES_DIR "${BINARY_DIR}/packages/${PORT}_${TARGET_TRIPLET}")
set(CURRENT_BUILDTREES_DIR "${BINARY_DIR}/buildtrees/${PORT}")
set(CURRENT_INSTALLED_DIR "${BINARY_DIR}/installed/${TARGET_TRIPLET}")
set(FEATURES core ${FEATURES})
list(REMOVE_DUPLICATES FEATURES)
foreach(feature IN LISTS FEATURES)
  string(JSON unused ERROR_VARIABLE error GET "${manifest}" features ${feature})
  if(error AND NOT feature STREQUAL "core")
    fail("vcpkg.json has no feature '${feature}'")
  endif()
endforeach()
file(REMOVE_RECURSE "${BINARY_DIR}/packages" "${BINARY_DIR}/buildtrees" "${BINARY_DIR}/installed" "${BINARY_DIR}/consumer")

macro(z_reject_unknown_arguments)
  if(DEFINED arg_UNPARSED_ARGUMENTS)
    fail("${CMAKE_CURRENT_FUNCTION}(${arg_UNPARSED_ARGUMENTS}): arguments this runner does not emulate")
  endif()
endmacro()

function(vcpkg_check_features)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "OUT_FEATURE_OPTIONS" "FEATURES")
  z_reject_unknown_arguments()
  set(options "")
  set(pairs ${arg_FEATURES})
  while(pairs)
    list(POP_FRONT pairs feature option)
    string(JSON unused ERROR_VARIABLE error GET "${manifest}" features ${feature})
    if(error)
      fail("the portfile's vcpkg_check_features names '${feature}', which vcpkg.json does not declare")
    endif()
    if(feature IN_LIST FEATURES)
      list(APPEND options "-D${option}=ON")
    else()
      list(APPEND options "-D${option}=OFF")
    endif()
  endwhile()
  set(${arg_OUT_FEATURE_OPTIONS} "${options}" PARENT_SCOPE)
endfunction()

# vcpkg's own options that matter to the installed layout (vcpkg_cmake_configure.cmake).
function(vcpkg_cmake_configure)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "SOURCE_PATH" "OPTIONS;OPTIONS_RELEASE")
  z_reject_unknown_arguments()
  if(NOT VCPKG_BUILD_TYPE STREQUAL "release")
    fail("the portfile builds a debug configuration too; a header-only port sets VCPKG_BUILD_TYPE release")
  endif()
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${arg_SOURCE_PATH}" -B "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel"
            -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${COMPILER}
            -DCMAKE_BUILD_TYPE=Release "-DCMAKE_INSTALL_PREFIX=${CURRENT_PACKAGES_DIR}"
            -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DCMAKE_EXPORT_NO_PACKAGE_REGISTRY=ON
            -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_ERROR_ON_ABSOLUTE_INSTALL_DESTINATION=ON
            -DCMAKE_INSTALL_LIBDIR:STRING=lib -DCMAKE_INSTALL_BINDIR:STRING=bin -DCMAKE_DISABLE_SOURCE_CHANGES=ON
            ${arg_OPTIONS} ${arg_OPTIONS_RELEASE}
    RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    fail("configuring with the portfile's options failed:\n${output}")
  endif()
  # vcpkg only warns about an option the project does not read; here a renamed qcoll
  # option the portfile still passes is an error.
  if(output MATCHES "not used by the project:\n\n(( +[^\n]+\n)+)")
    string(REGEX MATCHALL "QCOLL_[A-Z0-9_]+" unused "${CMAKE_MATCH_1}")
    if(unused)
      list(JOIN unused ", " unused)
      fail("the portfile passes options qcoll does not read: ${unused}")
    endif()
  endif()
  # The package build builds the package and, with the tools feature, the launcher:
  # none of qcoll's tests, examples, benchmarks or CUDA code.
  set(launcher OFF)
  if("tools" IN_LIST FEATURES)
    set(launcher ON)
  endif()
  file(STRINGS "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel/CMakeCache.txt" cache REGEX "^QCOLL_[A-Z_]+:BOOL=")
  foreach(expected QCOLL_BUILD_TESTS:BOOL=OFF QCOLL_BUILD_EXAMPLES:BOOL=OFF QCOLL_BUILD_BENCHMARKS:BOOL=OFF
                   QCOLL_WITH_CUDA:BOOL=OFF QCOLL_WITH_OPENSSL:BOOL=ON QCOLL_INSTALL:BOOL=ON
                   QCOLL_BUILD_LAUNCHER:BOOL=${launcher})
    if(NOT expected IN_LIST cache)
      list(JOIN cache ", " cache)
      fail("the portfile's configuration should have ${expected}; it has ${cache}")
    endif()
  endforeach()
endfunction()

function(vcpkg_cmake_install)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "")
  z_reject_unknown_arguments()
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${CURRENT_BUILDTREES_DIR}/${TARGET_TRIPLET}-rel" --target install --parallel 2
    RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    fail("building and installing failed:\n${output}")
  endif()
endfunction()

# Moves the config to share/<package> and re-roots the paths it computes from its own
# location, which vcpkg rewrites for a config two levels below the prefix. Unlike
# vcpkg, absolute paths into the build are left alone: the checks below reject them.
function(vcpkg_cmake_config_fixup)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "PACKAGE_NAME;CONFIG_PATH" "")
  z_reject_unknown_arguments()
  if(NOT arg_PACKAGE_NAME)
    set(arg_PACKAGE_NAME "${PORT}")
  endif()
  set(share "${CURRENT_PACKAGES_DIR}/share/${arg_PACKAGE_NAME}")
  if(arg_CONFIG_PATH AND NOT arg_CONFIG_PATH STREQUAL "share/${arg_PACKAGE_NAME}")
    set(config "${CURRENT_PACKAGES_DIR}/${arg_CONFIG_PATH}")
    if(NOT IS_DIRECTORY "${config}")
      fail("vcpkg_cmake_config_fixup: '${config}' does not exist")
    endif()
    file(GLOB entries "${config}/*")
    file(COPY ${entries} DESTINATION "${share}")
    file(REMOVE_RECURSE "${config}")
    get_filename_component(parent "${config}" DIRECTORY)
    get_filename_component(parent_name "${parent}" NAME)
    if(parent_name STREQUAL "cmake")  # lib/cmake/<name>, share/cmake/<name>
      file(REMOVE_RECURSE "${parent}")
    endif()
  endif()
  if(NOT IS_DIRECTORY "${share}")
    fail("vcpkg_cmake_config_fixup: '${share}' does not exist")
  endif()
  set(up [[get_filename_component(_IMPORT_PREFIX "${_IMPORT_PREFIX}" PATH)]])
  file(GLOB_RECURSE cmake_files "${share}/*.cmake")
  foreach(file IN LISTS cmake_files)
    file(READ "${file}" contents)
    string(REGEX REPLACE "(get_filename_component\\(_IMPORT_PREFIX \"\\\${CMAKE_CURRENT_LIST_FILE}\" PATH\\))(\n[^\n]*\\\${_IMPORT_PREFIX}\" PATH\\))*"
           "\\1\n${up}\n${up}" contents "${contents}")
    string(REGEX REPLACE "(get_filename_component\\(PACKAGE_PREFIX_DIR \"\\\${CMAKE_CURRENT_LIST_DIR}/)(\\.\\./)+\" ABSOLUTE\\)"
           "\\1../../\" ABSOLUTE)" contents "${contents}")
    file(WRITE "${file}" "${contents}")
  endforeach()
endfunction()

function(vcpkg_copy_tools)
  cmake_parse_arguments(PARSE_ARGV 0 arg "AUTO_CLEAN" "" "TOOL_NAMES")
  z_reject_unknown_arguments()
  foreach(tool IN LISTS arg_TOOL_NAMES)
    if(NOT EXISTS "${CURRENT_PACKAGES_DIR}/bin/${tool}")
      fail("vcpkg_copy_tools: ${CURRENT_PACKAGES_DIR}/bin/${tool} does not exist")
    endif()
    file(COPY "${CURRENT_PACKAGES_DIR}/bin/${tool}" DESTINATION "${CURRENT_PACKAGES_DIR}/tools/${PORT}")
    if(arg_AUTO_CLEAN)
      file(REMOVE "${CURRENT_PACKAGES_DIR}/bin/${tool}")
    endif()
  endforeach()
  file(GLOB left "${CURRENT_PACKAGES_DIR}/bin/*")
  if(arg_AUTO_CLEAN AND NOT left)
    file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/bin")
  endif()
endfunction()

function(vcpkg_install_copyright)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "FILE_LIST")
  z_reject_unknown_arguments()
  list(LENGTH arg_FILE_LIST count)
  if(NOT count EQUAL 1)
    fail("vcpkg_install_copyright: this runner copies one file, got '${arg_FILE_LIST}'")
  endif()
  file(INSTALL "${arg_FILE_LIST}" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}" RENAME copyright)
endfunction()

string(TIMESTAMP started "%s")
include("${PORT_DIR}/portfile.cmake")
string(TIMESTAMP finished "%s")
math(EXPR port_seconds "${finished} - ${started}")

# --- vcpkg's post-build checks that apply to this package.
set(package "${CURRENT_PACKAGES_DIR}")
foreach(required include/qcoll/qcoll.hpp share/${PORT}/copyright share/${PORT}/usage share/${PORT}/qcollConfig.cmake
                 share/${PORT}/qcollConfigVersion.cmake share/${PORT}/src/kernels.cpp)
  if(NOT EXISTS "${package}/${required}")
    fail("the package lacks ${required}")
  endif()
endforeach()
if(NOT EXISTS "${qcoll_source_dir}/LICENSE")
  file(READ "${package}/share/${PORT}/copyright" copyright)
  if(NOT copyright MATCHES "no LICENSE file")
    fail("without a LICENSE file in the tree, the copyright file must say there is none")
  endif()
endif()
foreach(absent share/cmake lib debug bin)
  if(EXISTS "${package}/${absent}")
    fail("the package has ${absent}/: a header-only package has its config in share/${PORT}, \
no libraries, no debug tree, and programs in tools/${PORT}")
  endif()
endforeach()
if("tools" IN_LIST FEATURES AND NOT EXISTS "${package}/tools/${PORT}/qcoll-run")
  fail("the tools feature did not install tools/${PORT}/qcoll-run")
endif()
if(NOT "tools" IN_LIST FEATURES AND EXISTS "${package}/tools")
  fail("without the tools feature the package has tools/")
endif()
file(GLOB_RECURSE directories LIST_DIRECTORIES true "${package}/*")
foreach(directory IN LISTS directories)
  file(GLOB entries "${directory}/*")
  if(IS_DIRECTORY "${directory}" AND NOT entries)
    fail("the package has an empty directory: ${directory}")
  endif()
endforeach()
# The package is copied into an installed tree: no file may name the build or the source.
file(GLOB_RECURSE files "${package}/*")
foreach(path "${BINARY_DIR}" "${qcoll_source_dir}")
  string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" pattern "${path}")
  foreach(file IN LISTS files)
    file(STRINGS "${file}" leaks REGEX "${pattern}")
    if(leaks)
      list(GET leaks 0 leak)
      fail("${file} names ${path}, which does not exist where the package is installed:\n${leak}")
    endif()
  endforeach()
endforeach()

# --- Installed as vcpkg installs it, consumed as the usage file says.
file(COPY "${package}/" DESTINATION "${CURRENT_INSTALLED_DIR}")
file(STRINGS "${package}/share/${PORT}/usage" usage REGEX "^    [a-z_]+\\(.*\\)$")
list(FILTER usage INCLUDE REGEX "find_package\\(|target_link_libraries\\(main ")
list(LENGTH usage count)
if(NOT count EQUAL 2)
  fail("the usage file should show one find_package(…) and one target_link_libraries(main …) line")
endif()
list(JOIN usage "\n" usage)
set(consumer "${BINARY_DIR}/consumer")
file(WRITE "${consumer}/CMakeLists.txt" "cmake_minimum_required(VERSION 3.25)\nproject(vcpkg_usage LANGUAGES CXX)\n"
     "add_executable(main \"${CONSUMER}\")\n# ports/qcoll/usage:\n${usage}\n")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${consumer}" -B "${consumer}/build" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${COMPILER}
          -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${CURRENT_INSTALLED_DIR}"
  RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(status EQUAL 0)
  execute_process(COMMAND "${CMAKE_COMMAND}" --build "${consumer}/build" --parallel 2
    RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
endif()
if(NOT status EQUAL 0)
  fail("the usage file's project failed to build against the installed tree:\n${output}")
endif()
file(STRINGS "${consumer}/build/CMakeCache.txt" qcoll_dir REGEX "^qcoll_DIR:")
if(NOT qcoll_dir STREQUAL "qcoll_DIR:PATH=${CURRENT_INSTALLED_DIR}/share/${PORT}")
  fail("the usage file's project found another qcoll: ${qcoll_dir}")
endif()
execute_process(COMMAND "${consumer}/build/main" RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT status EQUAL 0 OR NOT output MATCHES "^qcoll ${VERSION} consumer: sum = 3, one_bit on [a-z0-9]+: ok")
  fail("the usage file's program failed (${status}): ${output}")
endif()
string(STRIP "${output}" consumer_said)
if("tools" IN_LIST FEATURES)
  execute_process(COMMAND "${CURRENT_INSTALLED_DIR}/tools/${PORT}/qcoll-run" --version
    RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0 OR NOT output MATCHES "qcoll-run \\(qcoll\\) ${VERSION}")
    fail("tools/${PORT}/qcoll-run --version failed (${status}): ${output}")
  endif()
endif()
list(JOIN FEATURES "," features)
message(STATUS "qcoll[${features}] ${VERSION}: portfile run in ${port_seconds} s, post-build checks passed; ${consumer_said}")
