#pragma once
// Mismatches the ranks' threads record (Boost.Test's assertions are not thread-safe),
// asserted on the main thread after the ranks joined.

#include <boost/test/unit_test.hpp>

#include <mutex>
#include <string>
#include <vector>

namespace qcoll::test {

struct per_rank {
  std::mutex mutex;
  std::vector<std::string> mismatches;
  void differ(const std::string& what) {
    std::lock_guard lock(mutex);
    mismatches.push_back(what);
  }
  void check() {
    for (const auto& m : mismatches) BOOST_ERROR(m);
    BOOST_TEST(mismatches.empty());
  }
};

}  // namespace qcoll::test
