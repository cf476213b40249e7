// The quantizer kernels of one backend, compiled once per instruction set by
// cmake/qcollKernels.cmake: QCOLL_KERNEL_ARCH names the xsimd architecture (none
// for the reference), QCOLL_KERNEL_TABLE the table's name, QCOLL_KERNEL_ABI the
// namespace that keeps this build's inline functions apart from the others'.
// All of them are built with -ffp-contract=off, so no backend fuses a multiply
// and an add that another computes in two roundings.

#include <qcoll/kernels/cpu/tables.hpp>

namespace qcoll::kernels::cpu::compiled {

extern const kernel_table QCOLL_KERNEL_TABLE;
#if defined(QCOLL_KERNEL_ARCH)
constinit const kernel_table QCOLL_KERNEL_TABLE = make_simd_table<xsimd::QCOLL_KERNEL_ARCH>();
#else
constinit const kernel_table QCOLL_KERNEL_TABLE = make_reference_table();

// The dispatch asks which instruction sets this CPU runs here, in the baseline build
// (never in a kernel TU, which may not run on this CPU), so that no other translation
// unit parses xsimd (kernels/cpu/dispatch.hpp).
bool cpu_runs_avx512f() noexcept { return simd::cpu_has<xsimd::avx512f>(); }
bool cpu_runs_avx2() noexcept { return simd::cpu_has<xsimd::avx2>(); }
bool cpu_runs_sse2() noexcept { return simd::cpu_has<xsimd::sse2>(); }
#endif

}  // namespace qcoll::kernels::cpu::compiled
