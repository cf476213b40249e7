// The CUDA instance of the device runtime, compiled once by nvcc
// (cmake/qcollKernels.cmake, target qcoll::cuda): the quantizer, reduce and
// conversion kernels and the CUDA runtime's memory, streams, events and IPC handles,
// which a program's host code reaches through the execution layer
// (execution/dispatch.hpp) without CUDA's headers. QCOLL_KERNEL_ABI keeps this TU's
// copies of the shared inline code (kernels/group/) apart from the CPU builds'. No
// --use_fast_math and no -ftz=true: the results must match the CPU's bit for bit
// (quantizers.cuh checks).

#include <qcoll/device/cuda.cuh>

namespace qcoll::device::compiled {

extern const runtime cuda;
constinit const runtime cuda = make_cuda_runtime();

}  // namespace qcoll::device::compiled
