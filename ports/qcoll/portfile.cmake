# qcoll is header-only: the port installs the headers and the CMake package, whose
# qcollConfig.cmake compiles the quantizer kernels in the consumer's build. The one
# program, the tools feature's qcoll-run, needs no debug build either.
set(VCPKG_BUILD_TYPE release) # header-only port

# The source is the qcoll tree this port lives in (ports/qcoll), used as an overlay
# port: vcpkg install qcoll --overlay-ports=<clone>/ports. A registry copy of the port
# would take a release archive instead, e.g. vcpkg_from_github(OUT_SOURCE_PATH
# SOURCE_PATH REPO <owner>/qcoll REF "v${VERSION}" SHA512 <hash> HEAD_REF main).
get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT EXISTS "${SOURCE_PATH}/include/qcoll/version.hpp")
    message(FATAL_ERROR "This port builds the qcoll source tree it is part of (expected at ${SOURCE_PATH}); "
        "a copy outside that tree needs a vcpkg_from_github() call for a release.")
endif()
# A port and a tree that disagree would install a package whose version lies.
include("${SOURCE_PATH}/cmake/qcollVersion.cmake")
qcoll_read_version("${SOURCE_PATH}/include/qcoll/version.hpp" source_version)
if(NOT source_version STREQUAL VERSION)
    message(FATAL_ERROR "The port says version ${VERSION}, the source tree (${SOURCE_PATH}) is ${source_version}.")
endif()

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS
    FEATURES
        tools QCOLL_BUILD_LAUNCHER
)

# QCOLL_WITH_CUDA only adds qcoll's own CUDA tests and benchmarks; the CUDA headers are
# installed either way and compiled by the consumer's nvcc. OpenSSL always: vcpkg's
# features only add, and a port without authentication would be a downgrade to opt out of.
vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DQCOLL_BUILD_TESTS=OFF
        -DQCOLL_BUILD_EXAMPLES=OFF
        -DQCOLL_BUILD_BENCHMARKS=OFF
        -DQCOLL_INSTALL=ON
        -DQCOLL_WITH_CUDA=OFF
        -DQCOLL_WITH_OPENSSL=ON
        ${FEATURE_OPTIONS}
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(CONFIG_PATH share/cmake/qcoll)

if("tools" IN_LIST FEATURES)
    vcpkg_copy_tools(TOOL_NAMES qcoll-run AUTO_CLEAN)
endif()

# The tree has no LICENSE file yet, and the port does not invent one.
if(EXISTS "${SOURCE_PATH}/LICENSE")
    vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
else()
    message(WARNING "qcoll's source tree has no LICENSE file: the package's copyright file says so.")
    file(WRITE "${CURRENT_PACKAGES_DIR}/share/${PORT}/copyright"
        "qcoll ${VERSION}: the source tree carries no LICENSE file, so this package grants no license.\n"
        "Ask qcoll's authors before redistributing it.\n")
endif()
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
