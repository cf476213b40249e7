// Replaces the global operator new to count every allocation in the process, so a
// test can show that a call allocates nothing. A translation unit of its own: the
// replacements must not be inlined where the compiler pairs new with free.

#include "allocation_counter.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<std::size_t> allocations{0};
}

std::size_t qcoll::test::allocations_so_far() noexcept { return allocations.load(std::memory_order_relaxed); }

// Where the sanitizer's runtime brings its own operator new (clang's, linked statically),
// nothing is counted, and the suite that asks is not run (tests/CMakeLists.txt).
#ifndef QCOLL_TEST_NO_COUNTER

void* operator new(std::size_t bytes) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's temporary buffer uses them): otherwise
// the library's nothrow new would pair with the free above.
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
#endif
