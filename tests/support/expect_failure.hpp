#pragma once
// Assertions on what every rank of a run_ranks job threw (Boost.Test, main thread only).

#include <boost/test/unit_test.hpp>

#include <qcoll/core/error.hpp>

#include "ranks.hpp"

#include <chrono>
#include <string>
#include <system_error>
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

/// `culprit` failed with `code`, every other rank with some error, and all of them well
/// within `limit` of `started` (none waited for its timeout): codes[r] is rank r's.
inline void expect_culprit_fails_everyone(const std::vector<std::error_code>& codes, rank_t culprit, errc code,
                                          std::chrono::steady_clock::time_point started,
                                          std::chrono::seconds limit = std::chrono::seconds(15)) {
  BOOST_TEST(codes.at(culprit) == make_error_code(code), "rank " << culprit << ": " << codes[culprit].message());
  for (rank_t r = 0; r < codes.size(); ++r) BOOST_TEST(static_cast<bool>(codes[r]), "rank " << r << " did not fail");
  const bool at_once = std::chrono::steady_clock::now() - started < limit;
  BOOST_TEST(at_once, "the others waited for their timeout");
}

}  // namespace qcoll::test
