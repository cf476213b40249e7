// The CUDA backend's kernel table, compiled once by nvcc (cmake/qcollKernels.cmake,
// target qcoll::cuda): the quantizer, reduce and conversion kernels a program's
// host code reaches through the execution layer (execution/dispatch.hpp) without
// CUDA's headers. QCOLL_KERNEL_ABI keeps this TU's copies of the shared inline
// code (kernels/group/) apart from the CPU builds'. No --use_fast_math and no
// -ftz=true: the results must match the CPU's bit for bit (quantizers.cuh checks).

#include <qcoll/kernels/cuda/table.cuh>

namespace qcoll::kernels::cuda::compiled {

extern const kernel_table table;
constinit const kernel_table table = make_kernel_table();

}  // namespace qcoll::kernels::cuda::compiled
