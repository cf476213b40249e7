// Fuzz target for the record stream the process transports receive (stream/engine.hpp).
//
// Input: [receive count: 1 byte][per receive: size u16 LE, tag 1 byte, when 1 byte]
// [stream bytes…]. The receives are posted on rank 1 with guard bytes around each
// buffer, each once `when` × 64 bytes of the stream have been fed (so messages also
// arrive before their receive: staged, or parked once the peer is gone), or after rank
// 0 has left when that is past the stream's end; the stream is what "rank 0" wrote. The target aborts if any byte outside a
// posted buffer changed, if a receive reported success with a size other than its own,
// or if a receive is still pending after the peer left (a hang in a real job).
// Out-of-bounds accesses are for the sanitizers (the asan preset runs it).
//
// Built as a libFuzzer binary with -DQCOLL_FUZZ=ON and clang; otherwise ctest runs
// driver.hpp's main over the corpus and for a few seconds on valid streams (messages
// of random sizes and tags in data chunks, plain or with their CRC-32C, waiting records
// between them, aborts), mutated.

#include <qcoll/detail/crc32c.hpp>
#include <qcoll/transports/stream/engine.hpp>

#include "../support/memory_pipes.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

namespace {

using namespace qcoll;
namespace stream = transports::stream;

constexpr std::size_t guard_bytes = 64;
constexpr std::byte guard{0xA5};

[[noreturn]] void failure(const char* what) {
  std::fprintf(stderr, "stream_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t receives = std::min<std::size_t>(data[0] % 5, (size - 1) / 4);
  std::size_t at = 1;
  struct posted {
    std::vector<std::byte> storage;
    std::size_t size;
    transports::tag_t tag;
    std::size_t when;  // stream bytes fed before it is posted
    bool live = false;
    stream::request request;
  };
  std::vector<posted> posts(receives);
  for (posted& p : posts) {
    p.size = static_cast<std::size_t>(data[at] | data[at + 1] << 8);
    p.tag = static_cast<transports::tag_t>(data[at + 2] % 3);
    p.when = std::size_t{data[at + 3]} * 64;
    at += 4;
    p.storage.assign(p.size + 2 * guard_bytes, guard);
  }
  // A pipe smaller than most messages, so payloads are read in pieces.
  test::pair_of_engines pair(4096);
  std::size_t receiver = 1;  // rank 1's engine: index 1 while rank 0 is there, then 0
  const auto post_due = [&](std::size_t fed) {
    for (posted& p : posts)
      if (!p.live && p.when <= fed) {
        pair.ranks[receiver]->post_recv(p.request, 0, p.tag, std::span(p.storage).subspan(guard_bytes, p.size));
        p.live = true;
      }
  };
  // Feed the stream through the pipe in pieces, posting receives as they fall due,
  // then let rank 0 leave.
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data + at), size - at);
  for (std::size_t fed = 0; fed < bytes.size();) {
    post_due(fed);
    std::size_t next_post = bytes.size();
    for (const posted& p : posts)
      if (!p.live) next_post = std::min(next_post, p.when);
    const std::size_t room = 4096 - pair.world->pipes[0][1].bytes.size();
    const std::size_t n = std::min({room, bytes.size() - fed, next_post - fed});
    pair.inject(bytes.subspan(fed, n));
    fed += n;
    pair.ranks[1]->test(pair.probe);
    if (n == 0 && pair.world->pipes[0][1].bytes.size() == 4096) {  // stalled: nobody reads
      if (next_post == bytes.size()) break;
      post_due(next_post);  // the next receive, early: it may be the one the reader waits for
    }
  }
  // Receives due past the stream's end are posted once rank 0 has left: they too must
  // complete, from a message parked or staged before, or with an error.
  pair.ranks.erase(pair.ranks.begin());
  receiver = 0;
  post_due(bytes.size() + 256 * 64);
  for (posted& p : posts) {
    if (!pair.ranks[0]->test(p.request)) failure("a receive is still pending after its peer left");
    const std::error_code result = pair.ranks[0]->wait(p.request, clock::now());
    if (!result && p.request.transferred() != p.size) failure("a receive succeeded with the wrong size");
    const auto outside_intact = [&](std::span<const std::byte> region) {
      return std::all_of(region.begin(), region.end(), [](std::byte b) { return b == guard; });
    };
    if (!outside_intact(std::span(p.storage).first(guard_bytes)) ||
        !outside_intact(std::span(p.storage).last(guard_bytes)))
      failure("bytes outside a posted buffer changed");
  }
  return 0;
}

#ifndef QCOLL_LIBFUZZER
#include "driver.hpp"

namespace {

void append_record(std::vector<std::uint8_t>& out, stream::record_type type, std::uint32_t tag, std::uint64_t length) {
  std::array<std::byte, stream::record_header_bytes> header{};
  stream::write_record_header(header, {type, tag, length});
  for (const std::byte b : header) out.push_back(std::to_integer<std::uint8_t>(b));
}

/// A valid input: receives, and a stream of messages that (mostly) match them.
std::vector<std::uint8_t> valid_input(std::mt19937_64& rng) {
  std::vector<std::uint8_t> input;
  const std::size_t receives = 1 + rng() % 4;
  input.push_back(static_cast<std::uint8_t>(receives));
  std::vector<std::pair<std::size_t, std::uint32_t>> shapes;
  for (std::size_t i = 0; i < receives; ++i) {
    const std::size_t size = rng() % 3 == 0 ? rng() % 16 : rng() % 9000;
    const auto tag = static_cast<std::uint32_t>(rng() % 3);
    shapes.emplace_back(size, tag);
    input.push_back(static_cast<std::uint8_t>(size));
    input.push_back(static_cast<std::uint8_t>(size >> 8));
    input.push_back(static_cast<std::uint8_t>(tag));
    // Most before the stream, some during it, a few once rank 0 has left.
    input.push_back(static_cast<std::uint8_t>(rng() % 2 ? 0 : rng() % 8 == 0 ? 255 : rng() % 64));
  }
  for (const auto& [size, tag] : shapes) {
    if (rng() % 4 == 0) append_record(input, stream::record_type::waiting, 1, 0);  // "alive, waiting for rank 1"
    append_record(input, stream::record_type::message, tag, size);
    std::array<std::byte, stream::message_header_bytes> header{};
    stream::write_message_header(header, {1, size / 4, 0, collective::allreduce, dtype::f32, reduce_op::sum, algorithm::unspecified});
    for (const std::byte b : header) input.push_back(std::to_integer<std::uint8_t>(b));
    const bool checked = rng() % 2 == 0;  // data records with their CRC-32C, or plain
    for (std::size_t sent = 0; sent < size;) {
      const std::size_t chunk = std::min<std::size_t>(size - sent, 1 + rng() % 5000);
      std::vector<std::byte> bytes(chunk);
      for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
      if (checked) append_record(input, stream::record_type::checked_data, qcoll::detail::crc32c::of(bytes), chunk);
      else append_record(input, stream::record_type::data, 0, chunk);
      for (const std::byte b : bytes) input.push_back(std::to_integer<std::uint8_t>(b));
      sent += chunk;
    }
  }
  if (rng() % 4 == 0) {
    append_record(input, stream::record_type::abort, 6, 5);
    for (const char c : std::string_view("gone!")) input.push_back(static_cast<std::uint8_t>(c));
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) { return qcoll::test::fuzz::drive(argc, argv, "stream_fuzz", valid_input); }
#endif
