# Finds what qcoll's headers need. Used by qcoll's own build and by the installed
# qcollConfig.cmake, so both resolve dependencies the same way.
include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(Boost 1.74)  # headers only; Asio is header-only
find_dependency(fmt 9)
find_dependency(xsimd 8)

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
