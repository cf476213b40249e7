# Conan build module (conanfile.py), included before qcollConanKernels.cmake only when the
# profile maps boost, fmt, xsimd and openssl to the system with [platform_requires]. Conan
# then generates no CMake config for them and leaves them out of qcoll::qcoll's links, so
# they are found here, the way qcoll's own installed config finds them. OpenSSL unless the
# recipe's option with_openssl=False defined QCOLL_NO_OPENSSL.
get_target_property(qcoll_conan_definitions qcoll::qcoll INTERFACE_COMPILE_DEFINITIONS)
if("QCOLL_NO_OPENSSL" IN_LIST qcoll_conan_definitions)
  set(qcoll_with_openssl OFF)
else()
  set(qcoll_with_openssl ON)
endif()
unset(qcoll_conan_definitions)
include("${CMAKE_CURRENT_LIST_DIR}/qcollDependencies.cmake")
if(DEFINED qcoll_FOUND AND NOT qcoll_FOUND)
  return()  # a dependency is missing or unsupported; qcoll_NOT_FOUND_MESSAGE says which
endif()
# qcoll::qcoll is created anew by each directory that finds qcoll; link them into each once.
get_target_property(qcoll_conan_links qcoll::qcoll INTERFACE_LINK_LIBRARIES)
if(NOT "fmt::fmt" IN_LIST qcoll_conan_links)
  set_property(TARGET qcoll::qcoll APPEND PROPERTY INTERFACE_LINK_LIBRARIES
    Boost::headers fmt::fmt xsimd Threads::Threads $<$<BOOL:${qcoll_with_openssl}>:OpenSSL::SSL>)
endif()
unset(qcoll_with_openssl)
unset(qcoll_conan_links)
