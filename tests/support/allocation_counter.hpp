#pragma once
// How many times operator new ran in this process (tests/support/allocation_counter.cpp).

#include <cstddef>

namespace qcoll::test {
std::size_t allocations_so_far() noexcept;
}
