# qcoll_read_version(<version.hpp> <out var>): "MAJOR.MINOR.PATCH" as defined, once, in
# include/qcoll/version.hpp. Read by qcoll's CMakeLists.txt and by the vcpkg portfile.
function(qcoll_read_version header out)
  file(STRINGS "${header}" defines REGEX "^#define QCOLL_VERSION_(MAJOR|MINOR|PATCH) ")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "QCOLL_VERSION_${part} ([0-9]+)" unused "${defines}")
    list(APPEND version "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN version "." version)
  set(${out} "${version}" PARENT_SCOPE)
endfunction()
