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
