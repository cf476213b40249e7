#pragma once
/// @file
/// A hint to the core that this thread is polling: it pauses the pipeline (x86 `pause`,
/// Arm `yield`) so a polling loop leaves the sibling hyperthread its share and costs
/// less power, without the system call of std::this_thread::yield.

namespace qcoll::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace qcoll::detail
