#pragma once
/// @file
/// QCOLL_HOST_DEVICE marks code that nvcc compiles for the host and the GPU alike
/// (the reduce operators, the 16-bit float conversions); other compilers see plain
/// functions.

#if defined(__CUDACC__)
#define QCOLL_HOST_DEVICE __host__ __device__
#else
#define QCOLL_HOST_DEVICE
#endif

/// QCOLL_DEVICE_UNROLL(n) before a loop: unrolled n times in GPU code, where the
/// loads of several iterations then overlap (a warp issues in order, so one
/// iteration's latency is otherwise all exposed); nothing on the CPU.
#define QCOLL_PRAGMA(text) _Pragma(#text)
#if defined(__CUDA_ARCH__)
#define QCOLL_DEVICE_UNROLL(n) QCOLL_PRAGMA(unroll n)
#else
#define QCOLL_DEVICE_UNROLL(n)
#endif
