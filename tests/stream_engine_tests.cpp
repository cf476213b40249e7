// The stream engine the process transports share, over in-memory pipes: streaming
// through small pipes, matching, wrong sizes, malformed and hostile streams, abort,
// backpressure and withdrawal. One thread drives both ranks with test().

#include <qcoll/detail/crc32c.hpp>
#include <qcoll/transports/stream/engine.hpp>

#include "support/memory_pipes.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

namespace {

using namespace qcoll;
using transports::message_header;
namespace stream = transports::stream;

using test::pair_of_engines;

message_header header_for(std::size_t count, std::uint64_t sequence = 0) {
  return {sequence, count, 0, collective::allreduce, dtype::f32, reduce_op::sum, algorithm::unspecified};
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return bytes;
}

std::vector<std::byte> record(stream::record_type type, std::uint32_t tag, std::uint64_t length) {
  std::vector<std::byte> bytes(stream::record_header_bytes);
  stream::write_record_header(std::span<std::byte, stream::record_header_bytes>(bytes.data(), bytes.size()),
                              {type, tag, length});
  return bytes;
}

std::vector<std::byte> message_record(std::uint32_t tag, std::uint64_t length, const message_header& h) {
  auto bytes = record(stream::record_type::message, tag, length);
  bytes.resize(bytes.size() + stream::message_header_bytes);
  stream::write_message_header(
      std::span<std::byte, stream::message_header_bytes>(bytes.data() + stream::record_header_bytes,
                                                         stream::message_header_bytes),
      h);
  return bytes;
}

/// Streams one message of `size` bytes from rank 0 to rank 1; it must arrive whole.
void stream_one_message(pair_of_engines& pair, std::size_t size, unsigned seed) {
  const auto sent = pattern(size, seed);
  std::vector<std::byte> received(size, std::byte{0xee});
  stream::request send, recv;
  pair.ranks[1]->post_recv(recv, 0, 7, received);
  pair.ranks[0]->post_send(send, 1, 7, header_for(size), sent);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(send) && pair.ranks[1]->test(recv); }));
  BOOST_TEST(!pair.ranks[1]->wait(recv, clock::now()));
  BOOST_TEST(recv.transferred() == size);
  BOOST_TEST((recv.header() == header_for(size)));
  BOOST_TEST((received == sent), "payload of " << size << " bytes differs");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stream_engine)

BOOST_AUTO_TEST_CASE(messages_of_every_size_stream_through_a_small_pipe) {
  // Sizes around the chunk size and far above the 64 KiB pipe, so every message is streamed.
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, stream::max_chunk_bytes - 1, stream::max_chunk_bytes,
                                 stream::max_chunk_bytes + 1, std::size_t{3} << 20}) {
    pair_of_engines pair;
    stream_one_message(pair, size, static_cast<unsigned>(size));
  }
}

BOOST_AUTO_TEST_CASE(writes_cut_anywhere_in_a_gathered_header_and_chunk_keep_the_stream_intact) {
  // A record's header goes out in the same write as the chunk it opens; a write that
  // stops inside the header, at its end or inside the chunk must resume exactly there.
  // Caps of 1 to 61 bytes cut the 16-byte headers at many offsets; larger ones cut chunks.
  for (const std::size_t largest : {std::size_t{61}, std::size_t{70001}}) {
    BOOST_TEST_CONTEXT("writes of at most " << largest << " bytes") {
      pair_of_engines pair;
      pair.world->write_cap = [largest](std::size_t call) { return call * 7919 % largest + 1; };
      for (const std::size_t size : {std::size_t{9000}, stream::max_chunk_bytes + 1, 3 * stream::max_chunk_bytes + 5})
        stream_one_message(pair, size, static_cast<unsigned>(size + largest));
      BOOST_TEST(pair.world->gathered_writes > 0);  // the engine did hand header and chunk over together
    }
  }
}

BOOST_AUTO_TEST_CASE(both_directions_flow_at_once_and_tags_match_in_order) {
  pair_of_engines pair(4096);
  const auto a = pattern(100000, 1), b = pattern(70000, 2), c = pattern(5000, 3);
  std::vector<std::byte> got_a(a.size()), got_b(b.size()), got_c(c.size());
  stream::request s1, s2, s3, r1, r2, r3;
  // Rank 0 sends tag 1 then tag 2; rank 1 sends tag 1 back. All posted before any progress.
  pair.ranks[0]->post_send(s1, 1, 1, header_for(1), a);
  pair.ranks[0]->post_send(s2, 1, 2, header_for(2), b);
  pair.ranks[1]->post_send(s3, 0, 1, header_for(3), c);
  pair.ranks[1]->post_recv(r1, 0, 1, got_a);
  pair.ranks[1]->post_recv(r2, 0, 2, got_b);
  pair.ranks[0]->post_recv(r3, 1, 1, got_c);
  BOOST_TEST_REQUIRE(pair.run([&] {
    return pair.ranks[1]->test(r1) && pair.ranks[1]->test(r2) && pair.ranks[0]->test(r3) && pair.ranks[0]->test(s2);
  }));
  BOOST_TEST((got_a == a));
  BOOST_TEST((got_b == b));
  BOOST_TEST((got_c == c));
  BOOST_TEST(r2.header().count == 2u);
}

BOOST_AUTO_TEST_CASE(a_message_waits_for_its_receive_without_buffering) {
  pair_of_engines pair(1024);
  const auto sent = pattern(50000, 9);
  std::vector<std::byte> received(sent.size());
  stream::request send, recv;
  pair.ranks[0]->post_send(send, 1, 3, header_for(9), sent);
  pair.run([] { return false; });
  // Only a pipe's worth left rank 0: the rest waits for the receive (backpressure).
  BOOST_TEST(!pair.ranks[0]->test(send));
  BOOST_TEST(pair.world->pipes[0][1].bytes.size() <= 1024u);
  pair.ranks[1]->post_recv(recv, 0, 3, received);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(recv) && pair.ranks[0]->test(send); }));
  BOOST_TEST((received == sent));
}

BOOST_AUTO_TEST_CASE(a_receive_of_the_wrong_size_gets_the_senders_header_and_the_stream_stays_in_sync) {
  pair_of_engines pair;
  const auto big = pattern(300000, 4), next = pattern(100, 5);
  std::vector<std::byte> small(1000), got_next(next.size());
  stream::request s1, s2, r1, r2;
  pair.ranks[0]->post_send(s1, 1, 0, header_for(75000, 1), big);
  pair.ranks[0]->post_send(s2, 1, 0, header_for(25, 2), next);
  pair.ranks[1]->post_recv(r1, 0, 0, small);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(r1); }));
  BOOST_TEST(pair.ranks[1]->wait(r1, clock::now()) == errc::protocol_error);
  BOOST_TEST(r1.transferred() == big.size());
  BOOST_TEST(r1.header().count == 75000u);
  BOOST_TEST(std::all_of(small.begin(), small.end(), [](std::byte b) { return b == std::byte{0}; }),
             "nothing is written into a buffer of the wrong size");
  pair.ranks[1]->post_recv(r2, 0, 0, got_next);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(r2); }));
  BOOST_TEST(!pair.ranks[1]->wait(r2, clock::now()));
  BOOST_TEST((got_next == next));
}

BOOST_AUTO_TEST_CASE(malformed_streams_fail_the_receive_with_a_protocol_error) {
  struct hostile {
    const char* what;
    std::vector<std::byte> bytes;
  };
  auto bad_magic = record(stream::record_type::message, 0, 16);
  bad_magic[0] = std::byte{0x47};  // "GET /" would start like this
  auto bad_version = record(stream::record_type::message, 0, 16);
  bad_version[2] = std::byte{stream::record_version - 1};  // a peer of the previous release
  auto bad_type = record(stream::record_type::message, 0, 16);
  bad_type[3] = std::byte{42};
  auto bad_enums = message_record(0, 16, header_for(4));
  bad_enums[stream::record_header_bytes + 20] = std::byte{77};
  auto data_first = record(stream::record_type::data, 0, 16);
  auto oversize_chunk = message_record(0, 4 * stream::max_chunk_bytes, header_for(stream::max_chunk_bytes));
  const auto chunk = record(stream::record_type::data, 0, stream::max_chunk_bytes + 1);
  oversize_chunk.insert(oversize_chunk.end(), chunk.begin(), chunk.end());
  auto chunk_past_end = message_record(0, 16, header_for(4));
  const auto long_chunk = record(stream::record_type::data, 0, 17);
  chunk_past_end.insert(chunk_past_end.end(), long_chunk.begin(), long_chunk.end());
  auto huge_reason = record(stream::record_type::abort, 7, stream::max_reason_bytes + 1);
  auto nested = message_record(0, 16, header_for(4));
  const auto chunk8 = record(stream::record_type::data, 0, 8);
  nested.insert(nested.end(), chunk8.begin(), chunk8.end());
  nested.resize(nested.size() + 8);
  const auto second = message_record(0, 16, header_for(4));
  nested.insert(nested.end(), second.begin(), second.end());

  const auto waiting_with_payload = record(stream::record_type::waiting, 1, 4);
  const auto waiting_for_no_rank = record(stream::record_type::waiting, 2, 0);
  const auto waiting_for_itself = record(stream::record_type::waiting, 0, 0);
  auto waiting_inside = message_record(0, 16, header_for(4));
  waiting_inside.insert(waiting_inside.end(), chunk8.begin(), chunk8.end());
  waiting_inside.resize(waiting_inside.size() + 8);
  const auto waiting = record(stream::record_type::waiting, 1, 0);
  waiting_inside.insert(waiting_inside.end(), waiting.begin(), waiting.end());

  const std::vector<hostile> cases{{"bad magic", bad_magic},       {"bad version", bad_version},
                                   {"waiting record with a payload", waiting_with_payload},
                                   {"waiting for a rank out of range", waiting_for_no_rank},
                                   {"waiting for itself", waiting_for_itself},
                                   {"waiting record inside a message", waiting_inside},
                                   {"unknown record type", bad_type}, {"unknown enum values", bad_enums},
                                   {"data before any message", data_first},
                                   {"chunk over the limit", oversize_chunk},
                                   {"chunk past the message's end", chunk_past_end},
                                   {"abort reason over the limit", huge_reason},
                                   {"message inside a message", nested}};
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      pair_of_engines pair;
      std::vector<std::byte> buffer(16);
      stream::request recv;
      pair.ranks[1]->post_recv(recv, 0, 0, buffer);
      pair.inject(c.bytes);
      // The message inside a message is matched first; the receive after it sees the error.
      stream::request second_recv;
      pair.ranks[1]->post_recv(second_recv, 0, 0, buffer);
      BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(second_recv); }));
      const std::error_code first = pair.ranks[1]->wait(recv, clock::now());
      const std::error_code later = pair.ranks[1]->wait(second_recv, clock::now());
      BOOST_TEST((first == errc::protocol_error || later == errc::protocol_error));
      BOOST_TEST(pair.ranks[1]->lost_reason(0).find("malformed") != std::string_view::npos);
      if (std::string_view(c.what) == "bad version") {  // what a job of two releases reports
        const std::string names = "record version " + std::to_string(stream::record_version - 1) + ", expected " +
                                  std::to_string(stream::record_version);
        BOOST_TEST(pair.ranks[1]->lost_reason(0).find(names) != std::string_view::npos, pair.ranks[1]->lost_reason(0));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(payload_checksums_let_intact_messages_through_and_fail_corrupted_ones) {
  {  // Checked data records between engines: every size arrives whole, in several chunks too.
    pair_of_engines pair(64 << 10, true);
    for (const std::size_t size : {std::size_t{1}, std::size_t{100}, std::size_t{8192}, std::size_t{8193},
                                   3 * stream::max_chunk_bytes + 5})
      stream_one_message(pair, size, static_cast<unsigned>(size));
  }
  // A peer's message of 16 bytes as one checked record, its CRC right or one bit off.
  const auto payload = pattern(16, 9);
  const std::uint32_t crc = qcoll::detail::crc32c::of(payload);
  const auto checked_message = [&](std::uint32_t claimed, std::size_t flip_at) {
    auto bytes = message_record(0, 16, header_for(4, 12));
    const auto data = record(stream::record_type::checked_data, claimed, 16);
    bytes.insert(bytes.end(), data.begin(), data.end());
    const std::size_t at = bytes.size();
    bytes.insert(bytes.end(), payload.begin(), payload.end());
    if (flip_at < 16) bytes[at + flip_at] ^= std::byte{0x04};
    return bytes;
  };
  const auto receive = [](pair_of_engines& pair, const std::vector<std::byte>& bytes, std::vector<std::byte>& into) {
    stream::request recv;
    pair.ranks[1]->post_recv(recv, 0, 0, into);
    pair.inject(bytes);
    BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(recv); }));
    return pair.ranks[1]->wait(recv, clock::now());
  };
  for (const bool required : {true, false}) {
    BOOST_TEST_CONTEXT("checksums required: " << required) {
      {  // Its CRC right: delivered.
        pair_of_engines pair(64 << 10, required);
        std::vector<std::byte> got(16);
        BOOST_TEST(!receive(pair, checked_message(crc, 16), got));
        BOOST_TEST((got == payload));
      }
      for (const std::size_t flip : {std::size_t{0}, std::size_t{15}}) {  // one bit flipped in transit
        pair_of_engines pair(64 << 10, required);
        std::vector<std::byte> got(16);
        BOOST_TEST((receive(pair, checked_message(crc, flip), got) == errc::protocol_error));
        const std::string_view why = pair.ranks[1]->lost_reason(0);
        BOOST_TEST(why.find("peer 0 sent a malformed stream: the CRC-32C of a data record's 16 bytes") !=
                   std::string_view::npos, why);
        BOOST_TEST(why.find("corrupted in transit, in allreduce(count=4, f32, sum) #12") != std::string_view::npos, why);
      }
    }
  }
  {  // A plain data record where checksums are on: refused, naming the setting.
    pair_of_engines pair(64 << 10, true);
    auto bytes = message_record(0, 16, header_for(4));
    const auto data = record(stream::record_type::data, 0, 16);
    bytes.insert(bytes.end(), data.begin(), data.end());
    bytes.insert(bytes.end(), payload.begin(), payload.end());
    std::vector<std::byte> got(16);
    BOOST_TEST((receive(pair, bytes, got) == errc::protocol_error));
    BOOST_TEST(pair.ranks[1]->lost_reason(0).find("without its CRC-32C, where payload checksums are on") !=
               std::string_view::npos, pair.ranks[1]->lost_reason(0));
  }
}

BOOST_AUTO_TEST_CASE(payload_checksums_are_per_connection_unless_qcoll_payload_crc_says) {
  ::unsetenv("QCOLL_PAYLOAD_CRC");
  BOOST_TEST(!stream::resolve({}, 2).payload_checksums.has_value());  // each connection: crosses_network()
  ::setenv("QCOLL_PAYLOAD_CRC", "0", 1);
  BOOST_TEST(!stream::resolve({}, 2).payload_checksums.value());
  ::setenv("QCOLL_PAYLOAD_CRC", "1", 1);
  BOOST_TEST(stream::resolve({}, 2).payload_checksums.value());
  stream::engine_options given;
  given.payload_checksums = false;  // given in the transport's options: kept
  BOOST_TEST(!stream::resolve(given, 2).payload_checksums.value());
  ::setenv("QCOLL_PAYLOAD_CRC", "yes", 1);
  try {
    (void)stream::resolve({}, 2);
    BOOST_ERROR("QCOLL_PAYLOAD_CRC=yes was accepted");
  } catch (const error& e) {
    BOOST_TEST((e.code() == errc::invalid_argument));
    BOOST_TEST(std::string_view(e.what()).find("QCOLL_PAYLOAD_CRC=yes is not 1 or 0") != std::string_view::npos);
  }
  ::unsetenv("QCOLL_PAYLOAD_CRC");
}

BOOST_AUTO_TEST_CASE(an_abort_mid_message_reaches_the_peer_with_its_code_and_reason) {
  // The pipe (1⅛ chunks) has room for the rest of a chunk and the abort record once rank
  // 1 has read, as it would while waiting; a peer that does not read learns of the abort
  // from the close. Two pipes' worth stops a quarter into the third of four chunks.
  pair_of_engines pair(stream::max_chunk_bytes * 9 / 8);
  const auto big = pattern(4 * stream::max_chunk_bytes, 6);
  std::vector<std::byte> received(big.size());
  stream::request send, recv;
  pair.ranks[1]->post_recv(recv, 0, 0, received);
  pair.ranks[0]->post_send(send, 1, 0, header_for(stream::max_chunk_bytes), big);
  for (int i = 0; i < 2; ++i) {  // two pipes' worth, then rank 0 gives up
    pair.ranks[0]->test(send);
    pair.ranks[1]->test(recv);
  }
  BOOST_TEST_REQUIRE(!pair.ranks[1]->test(recv));
  pair.ranks[0]->abort(make_error_code(errc::count_mismatch), "rank 0 saw a count mismatch");
  BOOST_TEST(pair.ranks[0]->wait(send, clock::now()) == errc::count_mismatch);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(recv); }));
  BOOST_TEST(pair.ranks[1]->wait(recv, clock::now()) == errc::count_mismatch);
  BOOST_TEST(pair.ranks[1]->failure().reason == "rank 0 saw a count mismatch");
  // Everything later fails at once on both sides.
  stream::request later;
  pair.ranks[1]->post_recv(later, 0, 0, received);
  BOOST_TEST(pair.ranks[1]->wait(later, clock::now()) == errc::count_mismatch);
}

BOOST_AUTO_TEST_CASE(a_stalled_message_outlives_its_sender_and_unmatchable_receives_fail) {
  pair_of_engines pair(1 << 20);
  const auto sent = pattern(1000, 7);
  stream::request send, other, stalled;
  pair.ranks[0]->post_send(send, 1, 5, header_for(250), sent);  // rank 1 posts tag 6 first
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(send); }));
  pair.ranks.erase(pair.ranks.begin());  // rank 0 finished and left
  std::vector<std::byte> buffer(8), received(sent.size());
  pair.ranks[0]->post_recv(other, 0, 6, buffer);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(other); }));
  BOOST_TEST(pair.ranks[0]->wait(other, clock::now()) == errc::peer_lost);
  pair.ranks[0]->post_recv(stalled, 0, 5, received);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(stalled); }));
  BOOST_TEST(!pair.ranks[0]->wait(stalled, clock::now()));
  BOOST_TEST((received == sent));
}

// A rank that finds a mismatch aborts behind a message its peer has not matched (the
// peer waits for another tag: the ranks disagree about the call) and exits. The peer
// reads past that message and fails with the abort's code and words, not peer_lost.
BOOST_AUTO_TEST_CASE(an_abort_behind_a_message_nobody_waits_for_reaches_the_receives_waiting_for_others) {
  pair_of_engines pair(1 << 20);
  const auto sent = pattern(3000, 9);
  stream::request send, waiting;
  pair.ranks[0]->post_send(send, 1, 5, header_for(750), sent);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(send); }));
  pair.ranks[0]->abort(make_error_code(errc::count_mismatch), "rank 0 saw a count mismatch");
  pair.ranks.erase(pair.ranks.begin());  // rank 0 threw and exited
  std::vector<std::byte> buffer(8);
  pair.ranks[0]->post_recv(waiting, 0, 6, buffer);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(waiting); }));
  BOOST_TEST(pair.ranks[0]->wait(waiting, clock::now()) == errc::count_mismatch);
  BOOST_TEST(pair.ranks[0]->failure().reason == "rank 0 saw a count mismatch");
}

// Without an abort, the messages read past stay deliverable, in order, each to a
// receive of its tag and size; a wrong size gets the sender's header.
BOOST_AUTO_TEST_CASE(messages_read_past_after_their_sender_left_are_delivered_later) {
  pair_of_engines pair(4 << 20);  // room for all three: the receiver reads nothing until the sender left
  const auto first = pattern(2 * stream::max_chunk_bytes + 100, 10), second = pattern(40, 11);
  stream::request send_first, send_second, send_third, waiting, wrong, a, b;
  pair.ranks[0]->post_send(send_first, 1, 5, header_for(first.size() / 4), first);
  pair.ranks[0]->post_send(send_second, 1, 5, header_for(10), second);
  pair.ranks[0]->post_send(send_third, 1, 7, header_for(10, 3), second);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(send_third); }));
  pair.ranks.erase(pair.ranks.begin());
  std::vector<std::byte> buffer(8), got_first(first.size()), got_second(second.size()), small(4);
  pair.ranks[0]->post_recv(waiting, 0, 6, buffer);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[0]->test(waiting); }));
  BOOST_TEST(pair.ranks[0]->wait(waiting, clock::now()) == errc::peer_lost);
  pair.ranks[0]->post_recv(wrong, 0, 7, small);
  BOOST_TEST(pair.ranks[0]->wait(wrong, clock::now()) == errc::protocol_error);
  BOOST_TEST((wrong.header() == header_for(10, 3)));
  pair.ranks[0]->post_recv(a, 0, 5, got_first);
  pair.ranks[0]->post_recv(b, 0, 5, got_second);
  BOOST_TEST(!pair.ranks[0]->wait(a, clock::now()));
  BOOST_TEST(!pair.ranks[0]->wait(b, clock::now()));
  BOOST_TEST((got_first == first));
  BOOST_TEST((got_second == second));
}

BOOST_AUTO_TEST_CASE(a_peer_that_closes_fails_what_waits_on_it_after_its_bytes_are_read) {
  pair_of_engines pair;
  const auto sent = pattern(5000, 8);
  std::vector<std::byte> received(sent.size()), more(4);
  stream::request send, recv, after;
  pair.ranks[0]->post_send(send, 1, 0, header_for(1250), sent);
  pair.run([&] { return pair.ranks[0]->test(send); });
  pair.ranks.erase(pair.ranks.begin());  // rank 0 closes its transport
  pair.ranks[0]->post_recv(recv, 0, 0, received);
  pair.ranks[0]->post_recv(after, 0, 0, more);
  BOOST_TEST_REQUIRE(pair.ranks[0]->test(after));
  BOOST_TEST(!pair.ranks[0]->wait(recv, clock::now()), "what was sent before the close is delivered");
  BOOST_TEST((received == sent));
  BOOST_TEST(pair.ranks[0]->wait(after, clock::now()) == errc::peer_lost);
}

BOOST_AUTO_TEST_CASE(a_timed_out_receive_is_withdrawn_and_a_half_filled_one_breaks_the_stream) {
  pair_of_engines pair(4096);
  std::vector<std::byte> buffer(100000);
  stream::request waiting;
  pair.ranks[1]->post_recv(waiting, 0, 0, buffer);
  BOOST_TEST(pair.ranks[1]->wait(waiting, clock::now() + std::chrono::milliseconds(5)) == errc::timeout);

  const auto sent = pattern(buffer.size(), 1);
  stream::request send, half;
  pair.ranks[0]->post_send(send, 1, 0, header_for(25000), sent);
  pair.ranks[1]->post_recv(half, 0, 0, buffer);
  for (int i = 0; i < 5; ++i) {
    pair.ranks[0]->test(send);
    pair.ranks[1]->test(half);
  }
  BOOST_TEST_REQUIRE(half.transferred() > 0u);
  BOOST_TEST_REQUIRE(half.transferred() < buffer.size());
  BOOST_TEST(pair.ranks[1]->wait(half, clock::now()) == errc::timeout);
  stream::request next;
  pair.ranks[1]->post_recv(next, 0, 0, buffer);
  BOOST_TEST(pair.ranks[1]->wait(next, clock::now()) == errc::timeout, "the broken stream fails what comes after");
}

namespace {

/// Three engines over memory pipes for ranks in threads of their own, polling briefly.
struct three_ranks {
  std::shared_ptr<test::memory_world> world = std::make_shared<test::memory_world>(64 << 10, 3);
  std::vector<std::unique_ptr<stream::engine>> ranks =
      test::engines_over_memory(world, {.spin = std::chrono::microseconds(0), .abort_flush = std::chrono::milliseconds(50),
                                        .pause = std::chrono::microseconds(0), .payload_checksums = false});
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_rank_waiting_on_a_live_rank_lets_the_silent_one_be_named) {
  // Rank 2 stopped: nothing drives its engine. Rank 1 waits on rank 0, which waits on
  // rank 2 from half a span later. Were deadlines hard, rank 1's would pass first and it
  // would blame rank 0; rank 0 says it is alive and waiting, so rank 0's deadline passes
  // first, on the silent rank, and rank 1 hears rank 0's abort naming it.
  three_ranks job;
  constexpr auto span = std::chrono::milliseconds(400);
  std::vector<std::byte> from_0(64), from_2(64);
  std::error_code waited_on_2;
  transports::stall stall_of_2;
  const deadline started = clock::now();  // before rank 0 starts: its abort comes after span / 2 + span
  std::thread rank_0([&] {
    std::this_thread::sleep_for(span / 2);
    stream::request recv;
    job.ranks[0]->post_recv(recv, 2, 0, from_2);
    waited_on_2 = job.ranks[0]->wait(recv, clock::now() + span);
    stall_of_2 = job.ranks[0]->stall(2);
    job.ranks[0]->abort(make_error_code(errc::timeout), "no progress from peer 2");
  });
  stream::request recv;
  job.ranks[1]->post_recv(recv, 0, 0, from_0);
  const std::error_code waited_on_0 = job.ranks[1]->wait(recv, clock::now() + span);
  const auto took = clock::now() - started;
  rank_0.join();
  BOOST_TEST(waited_on_2 == errc::timeout);
  BOOST_TEST(!stall_of_2.peer_alive, "rank 2 said nothing");
  BOOST_TEST(waited_on_0 == errc::timeout);
  BOOST_TEST(job.ranks[1]->failure().reason == "no progress from peer 2", "rank 1 reports rank 0's finding");
  // Causal, not a timing guess: rank 1's wait can only end this way after rank 0's abort.
  BOOST_TEST(took >= span + span / 2, "rank 1 waited until rank 0 gave up, not for its own span alone");
}

BOOST_AUTO_TEST_CASE(ranks_waiting_on_each_other_time_out_at_twice_the_span_and_say_so) {
  // A deadlock of live ranks (say, two roots of one broadcast): each hears the other,
  // so silence never ends the waits; the bound of twice the span does, and each learns
  // that the other waits for it.
  three_ranks job;
  constexpr auto span = std::chrono::milliseconds(200);
  std::error_code results[2];
  transports::stall stalls[2];
  std::chrono::milliseconds took[2];
  std::vector<std::thread> threads;
  for (rank_t r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      std::vector<std::byte> buffer(16);
      stream::request recv;
      job.ranks[r]->post_recv(recv, 1 - r, 0, buffer);
      const deadline started = clock::now();
      results[r] = job.ranks[r]->wait(recv, started + span);
      took[r] = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - started);
      stalls[r] = job.ranks[r]->stall(1 - r);
    });
  for (std::thread& t : threads) t.join();
  for (rank_t r = 0; r < 2; ++r) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST(results[r] == errc::timeout);
      // The engine's span starts when its wait does, a scheduling delay d after
      // `started`, and is span - d long: the bound of twice it ends the wait 2 * span - 2d
      // after the engine's start, where silence alone would have ended it before span.
      // More than one span is the causal check (it holds while d < span / 2).
      BOOST_TEST(took[r] > span);
      BOOST_TEST(stalls[r].peer_alive);
      BOOST_TEST((stalls[r].waits_for == std::optional<rank_t>(r)), "the peer waits for this rank");
      BOOST_TEST((stalls[r].waited > span && stalls[r].waited <= took[r]));
    }
  }
}

BOOST_AUTO_TEST_CASE(destroying_a_posted_request_cancels_it) {
  pair_of_engines pair(1024);
  const auto sent = pattern(4000, 2);
  {
    std::vector<std::byte> gone(sent.size());
    stream::request recv;
    pair.ranks[1]->post_recv(recv, 0, 0, gone);
  }  // withdrawn before anything arrived: the next receive gets the message
  std::vector<std::byte> received(sent.size());
  stream::request send, recv;
  pair.ranks[0]->post_send(send, 1, 0, header_for(1000), sent);
  pair.ranks[1]->post_recv(recv, 0, 0, received);
  BOOST_TEST_REQUIRE(pair.run([&] { return pair.ranks[1]->test(recv); }));
  BOOST_TEST((received == sent));
}

BOOST_AUTO_TEST_CASE(waits_poll_without_yielding_when_every_rank_has_a_core) {
  // The transports' joins resolve the poll times from the ranks on this host.
  ::unsetenv("QCOLL_SPIN_US");
  ::unsetenv("QCOLL_PAUSE_US");
  const auto cores = static_cast<rank_t>(std::max(1u, std::thread::hardware_concurrency()));
  const stream::engine_options own_core = stream::resolve({}, cores);
  BOOST_TEST(own_core.spin.value().count() == tuning_table::spin_when_cores_suffice.count());
  BOOST_TEST(own_core.pause.value().count() == own_core.spin.value().count());  // never a sched_yield
  const stream::engine_options shared_cores = stream::resolve({}, cores + 1);
  BOOST_TEST(shared_cores.spin.value().count() == tuning_table::spin_when_oversubscribed.count());
  BOOST_TEST(shared_cores.pause.value().count() == 0);  // a yield between every two polls
  // Given values are kept; QCOLL_PAUSE_US overrides the table's.
  stream::engine_options given;
  given.pause = std::chrono::microseconds(7);
  BOOST_TEST(stream::resolve(given, cores).pause.value().count() == 7);
  ::setenv("QCOLL_PAUSE_US", "30", 1);
  BOOST_TEST(stream::resolve({}, cores + 1).pause.value().count() == 30);
  ::unsetenv("QCOLL_PAUSE_US");
}

BOOST_AUTO_TEST_CASE(bad_posts_are_rejected) {
  pair_of_engines pair;
  std::vector<std::byte> buffer(4);
  stream::request r;
  BOOST_CHECK_THROW(pair.ranks[0]->post_recv(r, 0, 0, buffer), qcoll::error);
  BOOST_CHECK_THROW(pair.ranks[0]->post_recv(r, 2, 0, buffer), qcoll::error);
  pair.ranks[0]->post_recv(r, 1, 0, buffer);
  BOOST_CHECK_THROW(pair.ranks[0]->post_recv(r, 1, 0, buffer), qcoll::error);
  stream::request never_posted;
  BOOST_TEST(pair.ranks[0]->wait(never_posted, clock::now()) == errc::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
