# Conan build module (conanfile.py): compiles the quantizer kernels in the consumer's
# build, once per instruction set, and links them into qcoll::qcoll, as qcoll's own
# installed qcollConfig.cmake does; Conan's CMakeDeps writes its own config and never
# runs that one. CMakeDeps includes this file after it has created qcoll::qcoll and
# found xsimd (whose target the kernels link), so the package stays header-only.
if(DEFINED qcoll_FOUND AND NOT qcoll_FOUND)
  return()  # the system's dependencies were refused (qcollConanSystemDependencies.cmake)
endif()
include("${CMAKE_CURRENT_LIST_DIR}/qcollKernels.cmake")
# This file lies in <package>/lib/cmake/qcoll; the headers in <package>/include.
get_filename_component(qcoll_conan_include_dir "${CMAKE_CURRENT_LIST_DIR}/../../../include" ABSOLUTE)
qcoll_add_kernels("${CMAKE_CURRENT_LIST_DIR}/src" "${qcoll_conan_include_dir}")  # once per build
# The CUDA backend, qcoll::cuda, where the consumer's project has enabled CUDA.
if(CMAKE_CUDA_COMPILER)
  qcoll_add_cuda_kernels("${CMAKE_CURRENT_LIST_DIR}/src" "${qcoll_conan_include_dir}")
endif()
unset(qcoll_conan_include_dir)
# qcoll::qcoll is created anew by each directory that finds qcoll; link the kernels into each.
get_target_property(qcoll_conan_links qcoll::qcoll INTERFACE_LINK_LIBRARIES)
if(NOT "qcoll_kernels" IN_LIST qcoll_conan_links)
  set_property(TARGET qcoll::qcoll APPEND PROPERTY INTERFACE_LINK_LIBRARIES qcoll_kernels)
endif()
unset(qcoll_conan_links)
