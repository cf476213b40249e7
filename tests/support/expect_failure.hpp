#pragma once
// Assertions on what every rank of a run_ranks job threw (Boost.Test, main thread only).

#include <boost/test/unit_test.hpp>

#include <qcoll/core/error.hpp>

#include "ranks.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace qcoll::test {

/// A timeout short enough that a test of failures ends soon, long enough for a loaded machine.
inline const communicator_options quick{std::chrono::milliseconds(2000)};

/// Every rank failed with `code`, and (if given) some rank's message mentions each of `mentions`.
inline void expect_every_rank_fails(const rank_outcomes& outcome, errc code, std::vector<std::string> mentions = {}) {
  std::string messages;
  for (std::size_t r = 0; r < outcome.errors.size(); ++r) {
    const auto [got, what] = outcome.failure(r);
    BOOST_TEST(got == make_error_code(code), "rank " << r << " got '" << got.message() << "': " << what);
    messages += what + "\n";
  }
  for (const auto& m : mentions)
    BOOST_TEST(messages.find(m) != std::string::npos, "no message mentions '" << m << "':\n" << messages);
}

}  // namespace qcoll::test
