# Finds what qcoll's headers need. Used by qcoll's own build and by the installed
# qcollConfig.cmake, so both resolve dependencies the same way.
#
# Supported versions: Boost 1.74 and newer, fmt 9.0 to 12.x, xsimd 8.1 to 14.x, and
# OpenSSL 1.1.1 and newer when qcoll_with_openssl is set (QCOLL_WITH_OPENSSL in qcoll's
# build; the installed qcollConfig.cmake sets it as the package was built).
# Boost's version files accept any newer version, so find_package checks Boost.
# xsimd's version file accepts only its own major version, and so does every
# version file Conan's CMakeDeps writes (fmt's too); a version range that spans
# major versions is refused by both. fmt and xsimd are therefore found without a
# version, and the version found is checked here against the supported range.
include(CMakeFindDependencyMacro)

# In qcoll's own build a missing dependency stops the configuration (find_dependency
# makes it required only inside a find_package(qcoll REQUIRED)).
set(qcoll_dependency_required "")
if(NOT CMAKE_FIND_PACKAGE_NAME)
  set(qcoll_dependency_required REQUIRED)
endif()

# Rejects `package` unless lowest <= its version < first_unsupported. qcoll's own
# build stops with the message; the installed config reports qcoll as not found
# with it, as find_dependency does (qcollConfig.cmake returns at once).
macro(qcoll_require_version package lowest first_unsupported supported)
  if(NOT ${package}_VERSION OR ${package}_VERSION VERSION_LESS ${lowest}
     OR NOT ${package}_VERSION VERSION_LESS ${first_unsupported})
    set(qcoll_found_version "${${package}_VERSION}")
    if(NOT qcoll_found_version)
      set(qcoll_found_version "of unknown version")
    endif()
    set(qcoll_message "qcoll supports ${package} ${supported}, found ${package} ${qcoll_found_version} \
(${${package}_DIR}); point ${package}_DIR or CMAKE_PREFIX_PATH at a supported one")
    if(CMAKE_FIND_PACKAGE_NAME)
      set(${CMAKE_FIND_PACKAGE_NAME}_NOT_FOUND_MESSAGE "${qcoll_message}")
      set(${CMAKE_FIND_PACKAGE_NAME}_FOUND FALSE)
      unset(qcoll_message)
      unset(qcoll_found_version)
      unset(qcoll_dependency_required)
      return()
    endif()
    message(FATAL_ERROR "${qcoll_message}")
  endif()
endmacro()

find_dependency(Threads ${qcoll_dependency_required})
find_dependency(Boost 1.74 ${qcoll_dependency_required})  # headers only; Asio is header-only
find_dependency(fmt ${qcoll_dependency_required})
qcoll_require_version(fmt 9.0 13 "9.0 to 12.x")
find_dependency(xsimd ${qcoll_dependency_required})
qcoll_require_version(xsimd 8.1 15 "8.1 to 14.x")  # also include/qcoll/kernels/cpu/simd/xsimd_compat.hpp
if(qcoll_with_openssl)
  if(CMAKE_FIND_PACKAGE_NAME)
    find_dependency(OpenSSL 1.1.1)  # not found: qcoll is not found either, and says so
  else()
    find_package(OpenSSL 1.1.1)
    if(NOT TARGET OpenSSL::SSL)
      message(FATAL_ERROR "qcoll authenticates ranks with OpenSSL's libcrypto (1.1.1 or newer) and found none: \
install it (Debian: libssl-dev) or point OPENSSL_ROOT_DIR at it, or configure with -DQCOLL_WITH_OPENSSL=OFF \
to build qcoll without authentication (a job with QCOLL_SECRET is then refused)")
    endif()
  endif()
endif()

# Debian 12's xsimd 8.1 target lists "xtl" as a link dependency without finding it,
# which turns into a failing -lxtl. xsimd needs xtl only for its optional xtl::xcomplex
# support, which qcoll does not use: use xtl when it is there, else drop the entry.
get_target_property(qcoll_xsimd_links xsimd INTERFACE_LINK_LIBRARIES)
if(qcoll_xsimd_links AND "xtl" IN_LIST qcoll_xsimd_links AND NOT TARGET xtl)
  find_package(xtl QUIET)
  if(NOT TARGET xtl)
    list(REMOVE_ITEM qcoll_xsimd_links xtl)
    set_property(TARGET xsimd PROPERTY INTERFACE_LINK_LIBRARIES "${qcoll_xsimd_links}")
  endif()
endif()
unset(qcoll_xsimd_links)
unset(qcoll_dependency_required)
