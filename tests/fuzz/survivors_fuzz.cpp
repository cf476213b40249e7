// Fuzz target for the survivors' agreement messages (rendezvous/survivors.hpp): the
// check-in a coordinator reads from each member and the answer each member reads back,
// both from a peer that passed the handshake but may be broken.
//
// Input: [setup: 1 byte][message…]. Setup bit 0 picks the message (check-in or answer),
// bits 1–7 the old world's size − 1. The reader throws errc::peer_lost where the bytes
// end (a closed connection). A read must either throw qcoll::error (protocol_error or
// peer_lost) or return ascending ranks below the size, members and lost disjoint, and
// an answer that encode_answer() writes back to the very bytes it read.

#include <qcoll/rendezvous/survivors.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>

namespace {

using namespace qcoll;
namespace rd = qcoll::rendezvous::detail;

[[noreturn]] void failure(const std::string& what) {
  std::fprintf(stderr, "survivors_fuzz: %s\n", what.c_str());
  std::abort();
}

bool ascending_below(std::span<const rank_t> ranks, rank_t size) {
  return std::all_of(ranks.begin(), ranks.end(), [&](rank_t r) { return r < size; }) &&
         std::adjacent_find(ranks.begin(), ranks.end(), std::greater_equal<>()) == ranks.end();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const bool is_answer = (data[0] & 1) != 0;
  const rank_t world = 1 + (data[0] >> 1);
  const std::span<const std::byte> message(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  std::size_t at = 0;
  const auto read = [&](std::span<std::byte> bytes) {
    if (bytes.size() > message.size() - at) qcoll::detail::throw_error(errc::peer_lost, "the peer closed");
    if (!bytes.empty()) std::memcpy(bytes.data(), message.data() + at, bytes.size());
    at += bytes.size();
  };
  try {
    if (!is_answer) {
      const std::vector<rank_t> view = rd::read_ranks(read, world, "fuzz");
      if (!ascending_below(view, world)) failure("a check-in with ranks out of order or range");
      return 0;
    }
    const rd::answer answer = rd::read_answer(read, world, "fuzz");
    std::vector<rank_t> lost;
    for (const auto& [rank, why] : answer.lost) lost.push_back(rank);
    if (!ascending_below(answer.members, world) || !ascending_below(lost, world))
      failure("an answer with ranks out of order or range");
    for (rank_t r : lost)
      if (std::binary_search(answer.members.begin(), answer.members.end(), r)) failure("a rank both member and lost");
    const std::vector<std::byte> again = rd::encode_answer(answer);
    const bool known_reasons = std::all_of(message.begin() + static_cast<std::ptrdiff_t>(at - lost.size()),
                                           message.begin() + static_cast<std::ptrdiff_t>(at),
                                           [](std::byte b) { return std::to_integer<int>(b) <= 2; });
    if (again.size() != at || (known_reasons && !std::equal(again.begin(), again.end(), message.begin())))
      failure("an answer that does not encode back to the bytes it was read from");
  } catch (const qcoll::error& e) {
    if (e.code() != errc::protocol_error && e.code() != errc::peer_lost)
      failure(std::string("an error other than protocol_error or peer_lost: ") + e.what());
  }
  return 0;
}

#ifndef QCOLL_LIBFUZZER
#include "driver.hpp"

namespace {

/// A check-in or answer as a survivor writes it, for a world of up to 128 ranks.
qcoll::test::fuzz::bytes valid_input(std::mt19937_64& random) {
  const auto setup = static_cast<std::uint8_t>(random());
  const rank_t world = 1 + (setup >> 1);
  std::vector<rank_t> alive, gone;
  for (rank_t r = 0; r < world; ++r) (random() % 4 == 0 ? gone : alive).push_back(r);
  std::vector<std::byte> message;
  if (setup & 1) {
    rd::answer answer;
    answer.outcome = random() % 4 == 0 ? rd::verdict::too_few : rd::verdict::go_on;
    answer.store_port = static_cast<std::uint16_t>(random());
    answer.members = alive;
    for (rank_t r : gone) answer.lost.emplace_back(r, static_cast<rendezvous::loss>(random() % 3));
    message = rd::encode_answer(answer);
  } else {
    rd::put_ranks(message, alive);
  }
  qcoll::test::fuzz::bytes input{setup};
  for (const std::byte b : message) input.push_back(std::to_integer<std::uint8_t>(b));
  return input;
}

}  // namespace

int main(int argc, char** argv) { return qcoll::test::fuzz::drive(argc, argv, "survivors_fuzz", valid_input, 1); }
#endif
