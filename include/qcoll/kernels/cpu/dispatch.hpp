#pragma once
/// @file
/// The one place that turns the CPU's instruction sets into a kernel table.
///
/// With the CMake target (`qcoll::qcoll` links `qcoll::kernels`), the kernels are
/// compiled once per x86 instruction set (SSE2, AVX2, AVX-512F) plus the reference,
/// and the best one this CPU runs is chosen at the first call. A header-only build
/// (include path only) gets the reference and the instruction set its own compiler
/// flags enable. QCOLL_KERNELS=<name> in the environment picks a backend by name
/// (for instance "reference"); an unknown or unsupported name is reported on
/// stderr and ignored.
///
/// With the compiled kernels this header includes no xsimd: which instruction sets
/// the CPU runs is asked of the reference kernels' translation unit (src/kernels.cpp,
/// built for the baseline), so the communicator and every quantizer — every
/// translation unit of a program — do not parse xsimd (about 16,000 preprocessed lines
/// of communicator.hpp's 133,000; guards.preprocessed_size keeps it out).

#include <qcoll/kernels/cpu/kernel_table.hpp>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(QCOLL_KERNELS_COMPILED)
namespace qcoll::kernels::cpu::compiled {
extern const kernel_table reference;
/// Whether this CPU runs the instruction set, as xsimd finds (src/kernels.cpp's
/// reference build answers: it runs on any x86-64).
bool cpu_runs_avx512f() noexcept;
bool cpu_runs_avx2() noexcept;
bool cpu_runs_sse2() noexcept;
#if defined(QCOLL_KERNELS_WITH_AVX512F)
extern const kernel_table avx512f;
#endif
#if defined(QCOLL_KERNELS_WITH_AVX2)
extern const kernel_table avx2;
#endif
#if defined(QCOLL_KERNELS_WITH_SSE2)
extern const kernel_table sse2;
#endif
}  // namespace qcoll::kernels::cpu::compiled
#else
#include <qcoll/kernels/cpu/tables.hpp>
#endif

namespace qcoll::kernels::cpu {

struct backend {
  const kernel_table* kernels;
  bool runs_here;  ///< this CPU has the instruction set the kernels were built for
};

/// Every backend built into this program, the most capable first, the reference last.
inline std::span<const backend> compiled_backends() {
  static const std::vector<backend> backends = [] {
    std::vector<backend> list;
#if defined(QCOLL_KERNELS_COMPILED)
#if defined(QCOLL_KERNELS_WITH_AVX512F)
    list.push_back({&compiled::avx512f, compiled::cpu_runs_avx512f()});
#endif
#if defined(QCOLL_KERNELS_WITH_AVX2)
    list.push_back({&compiled::avx2, compiled::cpu_runs_avx2()});
#endif
#if defined(QCOLL_KERNELS_WITH_SSE2)
    list.push_back({&compiled::sse2, compiled::cpu_runs_sse2()});
#endif
    list.push_back({&compiled::reference, true});
#else
    if constexpr (!std::is_same_v<xsimd::default_arch, xsimd::unavailable>) {
      // Built with this program's own flags, which it already needs to run.
      static constexpr kernel_table native = make_simd_table<xsimd::default_arch>();
      list.push_back({&native, true});
    }
    static constexpr kernel_table reference = make_reference_table();
    list.push_back({&reference, true});
#endif
    return list;
  }();
  return backends;
}

/// The table named `name` if it is built in and runs here, else nullptr.
inline const kernel_table* find_backend(std::string_view name) {
  for (const backend& candidate : compiled_backends())
    if (candidate.runs_here && name == candidate.kernels->name) return candidate.kernels;
  return nullptr;
}

/// The kernels every quantizer uses: QCOLL_KERNELS if set and usable, else the
/// most capable backend this CPU runs. Chosen once, at the first call.
inline const kernel_table& active_kernels() {
  static const kernel_table& chosen = []() -> const kernel_table& {
    if (const char* requested = std::getenv("QCOLL_KERNELS"); requested && *requested) {
      if (const kernel_table* named = find_backend(requested)) return *named;
      std::fprintf(stderr, "qcoll: QCOLL_KERNELS=%s is not a backend this program has and this CPU runs; ignored\n",
                   requested);
    }
    for (const backend& candidate : compiled_backends())
      if (candidate.runs_here) return *candidate.kernels;
    return *compiled_backends().back().kernels;  // the reference always runs
  }();
  return chosen;
}

}  // namespace qcoll::kernels::cpu
