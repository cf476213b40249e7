# qcoll_add_kernels(<source dir>): the qcoll::kernels static library, the
# quantizer kernels compiled once per instruction set so that
# kernels/cpu/dispatch.hpp can pick the best one this CPU runs. Used by qcoll's
# own build and by the installed qcollConfig.cmake (which compiles them in the
# consumer's build, so the package stays architecture independent).
function(qcoll_add_kernels source_dir)
  if(TARGET qcoll_kernels)
    return()
  endif()
  add_library(qcoll_kernels STATIC)
  add_library(qcoll::kernels ALIAS qcoll_kernels)
  target_compile_features(qcoll_kernels PUBLIC cxx_std_20)
  target_link_libraries(qcoll_kernels PRIVATE xsimd)
  target_include_directories(qcoll_kernels PRIVATE ${ARGN})
  target_compile_definitions(qcoll_kernels INTERFACE QCOLL_KERNELS_COMPILED)

  # (backend, xsimd architecture, flags); the reference has no architecture.
  set(backends reference)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
    list(APPEND backends sse2 avx2 avx512f)
  endif()
  set(flags_reference "")
  set(flags_sse2 -msse2)
  set(flags_avx2 -mavx2)
  set(flags_avx512f -mavx512f)
  foreach(backend IN LISTS backends)
    set(object qcoll_kernels_${backend})
    add_library(${object} OBJECT ${source_dir}/kernels.cpp)
    target_compile_features(${object} PRIVATE cxx_std_20)
    target_link_libraries(${object} PRIVATE xsimd)
    target_include_directories(${object} PRIVATE ${ARGN})
    set_target_properties(${object} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    # No fused multiply-add in one backend and not in another: results must match bit for bit.
    target_compile_options(${object} PRIVATE ${flags_${backend}} $<$<CXX_COMPILER_ID:GNU,Clang>:-ffp-contract=off>)
    target_compile_definitions(${object} PRIVATE QCOLL_KERNEL_TABLE=${backend} QCOLL_KERNEL_ABI=abi_${backend})
    if(NOT backend STREQUAL "reference")
      target_compile_definitions(${object} PRIVATE QCOLL_KERNEL_ARCH=${backend})
      string(TOUPPER ${backend} upper)
      target_compile_definitions(qcoll_kernels INTERFACE QCOLL_KERNELS_WITH_${upper})
    endif()
    target_sources(qcoll_kernels PRIVATE $<TARGET_OBJECTS:${object}>)
  endforeach()
  set_target_properties(qcoll_kernels PROPERTIES LINKER_LANGUAGE CXX POSITION_INDEPENDENT_CODE ON)
endfunction()

# qcoll_add_cuda_kernels(<source dir> <include dirs…>): the CUDA backend, when the
# project has enabled CUDA: qcoll_cuda_kernels compiles src/cuda_kernels.cu once
# with nvcc, and the target qcoll::cuda — qcoll::qcoll plus these kernels and the
# CUDA runtime — is what a program links to run qcoll on device memory
# (execution/dispatch.hpp finds the table through QCOLL_CUDA_KERNELS_COMPILED).
# Programs that link only qcoll::qcoll neither need nor get the CUDA runtime.
function(qcoll_add_cuda_kernels source_dir)
  if(TARGET qcoll_cuda_kernels OR NOT CMAKE_CUDA_COMPILER)
    return()
  endif()
  find_package(CUDAToolkit REQUIRED)
  add_library(qcoll_cuda_kernels STATIC ${source_dir}/cuda_kernels.cu)
  target_include_directories(qcoll_cuda_kernels PRIVATE ${ARGN})
  # CMake 3.25 does not know nvcc's C++20 flag, so it is given directly. No
  # --use_fast_math and no -ftz: the kernels must match the CPU bit for bit.
  target_compile_options(qcoll_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
  target_compile_definitions(qcoll_cuda_kernels PRIVATE QCOLL_KERNEL_ABI=abi_cuda)
  target_link_libraries(qcoll_cuda_kernels PUBLIC CUDA::cudart_static)
  set_target_properties(qcoll_cuda_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY Static)
  add_library(qcoll_cuda INTERFACE)
  add_library(qcoll::cuda ALIAS qcoll_cuda)
  target_link_libraries(qcoll_cuda INTERFACE qcoll::qcoll qcoll_cuda_kernels)
  target_compile_definitions(qcoll_cuda INTERFACE QCOLL_CUDA_KERNELS_COMPILED)
endfunction()
