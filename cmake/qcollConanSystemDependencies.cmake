# Conan build module (conanfile.py), included before qcollConanKernels.cmake only when the
# profile maps boost, fmt and xsimd to the system with [platform_requires]. Conan then
# generates no CMake config for them and leaves them out of qcoll::qcoll's links, so
# they are found here, the way qcoll's own installed config finds them.
include("${CMAKE_CURRENT_LIST_DIR}/qcollDependencies.cmake")
set_property(TARGET qcoll::qcoll APPEND PROPERTY INTERFACE_LINK_LIBRARIES
  Boost::headers fmt::fmt xsimd Threads::Threads)
