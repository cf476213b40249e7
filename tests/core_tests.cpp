// The vocabulary, the partition, the topologies, the reference kernels, the
// in-process transport's contract, tested directly.

#define BOOST_TEST_MODULE qcoll core
#include <boost/test/unit_test.hpp>

#include <qcoll/detail/crc32c.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/qcoll.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

using namespace qcoll;
namespace inproc = qcoll::transports::inproc;

BOOST_AUTO_TEST_SUITE(vocabulary)

BOOST_AUTO_TEST_CASE(version_is_the_one_cmake_parsed) {
  BOOST_TEST(std::string(QCOLL_TEST_EXPECTED_VERSION) ==
             std::to_string(version_major) + "." + std::to_string(version_minor) + "." + std::to_string(version_patch));
}

BOOST_AUTO_TEST_CASE(errors_map_to_two_conditions) {
  for (errc e : {errc::invalid_argument, errc::count_mismatch, errc::type_mismatch, errc::operation_mismatch}) {
    BOOST_TEST((make_error_code(e) == condition::contract_violation));
    BOOST_TEST((make_error_code(e) != condition::transport_failure));
  }
  for (errc e : {errc::timeout, errc::peer_lost, errc::protocol_error, errc::aborted})
    BOOST_TEST((make_error_code(e) == condition::transport_failure));
  BOOST_TEST(make_error_code(errc::count_mismatch).message() == "element counts differ across ranks");
  BOOST_TEST(std::string(error_category().name()) == "qcoll");
  const error e(make_error_code(errc::timeout), "qcoll allreduce on rank 1 of 2: slow");
  const std::system_error& base = e;  // one exception type, derived from std::system_error
  BOOST_TEST(std::string(base.what()).find("rank 1 of 2") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(names_of_types_ops_and_collectives) {
  BOOST_TEST(to_string(dtype_of<float>::value) == "f32");
  BOOST_TEST(to_string(dtype_of<double>::value) == "f64");
  BOOST_TEST(size_of(dtype::bf16) == 2u);
  BOOST_TEST(to_string(reduce_op::avg) == "avg");
  BOOST_TEST(to_string(collective::reduce_scatter) == "reduce_scatter");
  static_assert(element<float> && element<double> && !element<int>);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(partition)

BOOST_AUTO_TEST_CASE(blocks_tile_the_buffer_and_differ_by_at_most_one) {
  for (std::size_t parts = 1; parts <= 9; ++parts)
    for (std::size_t count = 0; count <= 40; ++count) {
      std::size_t next = 0, smallest = count, largest = 0;
      for (std::size_t b = 0; b < parts; ++b) {
        const block_range r = block_of(count, parts, b);
        BOOST_TEST(r.offset == next);
        next += r.size;
        smallest = std::min(smallest, r.size);
        largest = std::max(largest, r.size);
        BOOST_TEST(r.size <= block_of(count, parts, 0).size);  // block 0 is a largest one
      }
      BOOST_TEST(next == count);
      BOOST_TEST(largest - smallest <= 1u);
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(topology)

BOOST_AUTO_TEST_CASE(ring_links_neighbours_in_its_order) {
  const topologies::ring ring(std::vector<rank_t>{2, 0, 3, 1});
  BOOST_TEST(ring.size() == 4u);
  BOOST_TEST(ring.linked(2, 0));
  BOOST_TEST(ring.linked(1, 2));  // wraps around
  BOOST_TEST(!ring.linked(2, 3));
  BOOST_TEST(!ring.linked(0, 0));
  BOOST_TEST(ring.position_of(3) == 2u);
  BOOST_TEST(topologies::ring(1).linked(0, 0) == false);
}

BOOST_AUTO_TEST_CASE(fully_connected_links_every_pair) {
  const topologies::fully_connected full(5);
  for (rank_t a = 0; a < 5; ++a)
    for (rank_t b = 0; b < 5; ++b) BOOST_TEST(full.linked(a, b) == (a != b));
  BOOST_TEST(full.ring_order().size() == 5u);
  static_assert(topologies::ring::max_fan_out == 2);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(reference_kernels)

BOOST_AUTO_TEST_CASE(reduce_semantics) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a{1, 5, nan, 2, -0.0f, 3};
  std::vector<float> b{4, 2, 1, nan, 0.0f, 3};
  std::vector<float> out(6);
  kernels::cpu::reduce<float>(reduce_op::min, a, b, out);
  BOOST_TEST(out[0] == 1);
  BOOST_TEST(out[1] == 2);
  BOOST_TEST(std::isnan(out[2]));  // NaN on the left propagates
  BOOST_TEST(std::isnan(out[3]));  // and on the right
  BOOST_TEST(!std::signbit(out[4]));  // a tie keeps the right operand
  kernels::cpu::reduce<float>(reduce_op::max, a, b, out);
  BOOST_TEST(out[0] == 4);
  BOOST_TEST(std::isnan(out[2]));
  BOOST_TEST(std::isnan(out[3]));
  kernels::cpu::reduce<float>(reduce_op::sum, a, b, std::span<float>(a));  // in place
  BOOST_TEST(a[0] == 5);
  std::vector<double> avg{3, 9};
  kernels::cpu::finish_avg<double>(avg, 3);
  BOOST_TEST(avg[0] == 1.0);
  BOOST_TEST(avg[1] == 3.0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(checksums)

std::span<const std::byte> bytes_of(std::string_view text) { return std::as_bytes(std::span(text)); }

BOOST_AUTO_TEST_CASE(crc32c_gives_the_published_values_in_both_implementations) {
  namespace crc = detail::crc32c;
  // RFC 3720, B.4, and the check value of "123456789".
  std::array<std::byte, 32> zeros{}, ones{}, rising{}, falling{};
  for (std::size_t i = 0; i < 32; ++i) {
    ones[i] = std::byte{0xff};
    rising[i] = static_cast<std::byte>(i);
    falling[i] = static_cast<std::byte>(31 - i);
  }
  for (const auto extend : {&crc::extend, &crc::extend_sse42, &crc::extend_reference}) {
    BOOST_TEST(extend(0, bytes_of("123456789")) == 0xE3069283u);
    BOOST_TEST(extend(0, zeros) == 0x8A9136AAu);
    BOOST_TEST(extend(0, ones) == 0x62A8AB43u);
    BOOST_TEST(extend(0, rising) == 0x46DD794Eu);
    BOOST_TEST(extend(0, falling) == 0x113FDB5Cu);
    BOOST_TEST(extend(0, {}) == 0u);
  }
  BOOST_TEST_MESSAGE("crc32c: " << crc::implementation());
}

BOOST_AUTO_TEST_CASE(crc32c_hardware_matches_the_reference_bit_for_bit_and_extends) {
  namespace crc = detail::crc32c;
  std::mt19937_64 rng(42);
  std::vector<std::byte> data(5 * crc::stride + 1000);
  for (std::byte& b : data) b = static_cast<std::byte>(rng());
  // Every length around the three streams' step, and every one up to 1100 bytes (the
  // folding's steps of 256, 64 and 16 bytes and its tails), at every alignment mod 8:
  // extend() (folding where the CPU has AVX-512 and VPCLMULQDQ) and the crc32
  // instruction's streams, each against the reference.
  std::vector<std::size_t> lengths;
  for (std::size_t n = 0; n < 1100; ++n) lengths.push_back(n);
  for (const std::size_t base : {3 * crc::stride, 6 * crc::stride / 2, 4 * crc::stride})
    for (std::size_t d = 0; d < 10; ++d) lengths.push_back(base - 5 + d);
  lengths.push_back(data.size() - 8);
  BOOST_TEST_MESSAGE("crc32c: extend() uses " << crc::implementation());
  for (const std::size_t n : lengths)
    for (std::size_t offset = 0; offset < 8; ++offset) {
      if (offset + n > data.size()) continue;
      const std::span<const std::byte> piece = std::span(data).subspan(offset, n);
      const std::uint32_t expected = crc::extend_reference(0x12345678u, piece);
      BOOST_TEST_REQUIRE(crc::extend(0x12345678u, piece) == expected, "length " << n << " at offset " << offset);
      BOOST_TEST_REQUIRE(crc::extend_sse42(0x12345678u, piece) == expected, "length " << n << " at offset " << offset);
    }
  // Extending piece by piece gives the whole's checksum, wherever it is cut.
  const std::span<const std::byte> whole = std::span(data).first(3 * crc::stride + 17);
  const std::uint32_t expected = crc::of(whole);
  for (const std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{9}, crc::stride, 3 * crc::stride, whole.size()})
    BOOST_TEST(crc::extend(crc::of(whole.first(cut)), whole.subspan(cut)) == expected, "cut at " << cut);
  // One flipped bit anywhere changes it.
  std::vector<std::byte> flipped(whole.begin(), whole.end());
  for (const std::size_t at : {std::size_t{0}, crc::stride + 3, flipped.size() - 1}) {
    flipped[at] ^= std::byte{0x10};
    BOOST_TEST(crc::of(flipped) != expected);
    flipped[at] ^= std::byte{0x10};
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(inproc_transport)

namespace {
using transports::message_header;
const message_header header_a{1, 4, 0, collective::allreduce, dtype::f32, reduce_op::sum, algorithm::unspecified};
deadline soon() { return clock::now() + std::chrono::seconds(5); }

struct two_ranks {
  inproc::world world{2};
  inproc::transport a = world.endpoint(0);
  inproc::transport b = world.endpoint(1);
};
}  // namespace

BOOST_FIXTURE_TEST_CASE(messages_with_one_tag_arrive_in_order_and_tags_are_independent, two_ranks) {
  int x1 = 1, x2 = 2, y = 3;
  inproc::request s1, s2, s3;
  a.post_send(s1, 1, 0, header_a, std::as_bytes(std::span(&x1, 1)));
  a.post_send(s2, 1, 0, header_a, std::as_bytes(std::span(&x2, 1)));
  a.post_send(s3, 1, 7, header_a, std::as_bytes(std::span(&y, 1)));
  BOOST_TEST(!a.test(s1));  // nobody has received yet
  int got_tag7 = 0, got1 = 0, got2 = 0;
  inproc::request r3, r1, r2;
  b.post_recv(r3, 0, 7, std::as_writable_bytes(std::span(&got_tag7, 1)));
  b.post_recv(r1, 0, 0, std::as_writable_bytes(std::span(&got1, 1)));
  b.post_recv(r2, 0, 0, std::as_writable_bytes(std::span(&got2, 1)));
  for (auto* r : {&r1, &r2, &r3}) BOOST_TEST(!b.wait(*r, soon()));
  for (auto* s : {&s1, &s2, &s3}) BOOST_TEST(!a.wait(*s, soon()));
  BOOST_TEST(got1 == 1);
  BOOST_TEST(got2 == 2);
  BOOST_TEST(got_tag7 == 3);
  BOOST_TEST((r1.header() == header_a));
  BOOST_TEST(r1.transferred() == sizeof(int));
}

BOOST_FIXTURE_TEST_CASE(a_size_mismatch_is_reported_and_nothing_is_written, two_ranks) {
  std::vector<std::byte> big(64, std::byte{1}), small(16, std::byte{0});
  inproc::request s, r;
  b.post_recv(r, 0, 0, small);
  a.post_send(s, 1, 0, header_a, big);
  BOOST_TEST(b.wait(r, soon()) == make_error_code(errc::protocol_error));
  BOOST_TEST(r.transferred() == 64u);  // what the sender offered
  BOOST_TEST(small == std::vector<std::byte>(16, std::byte{0}));
}

BOOST_FIXTURE_TEST_CASE(waits_end_at_their_deadline, two_ranks) {
  int x = 0;
  inproc::request r;
  a.post_recv(r, 1, 0, std::as_writable_bytes(std::span(&x, 1)));
  const auto start = clock::now();
  BOOST_TEST(a.wait(r, start + std::chrono::milliseconds(50)) == make_error_code(errc::timeout));
  BOOST_TEST((clock::now() - start >= std::chrono::milliseconds(50)));
  // The timed-out receive was withdrawn: a later send does not land in it.
  int y = 5;
  inproc::request s, r2;
  b.post_send(s, 0, 0, header_a, std::as_bytes(std::span(&y, 1)));
  BOOST_TEST(x == 0);
  int z = 0;
  a.post_recv(r2, 1, 0, std::as_writable_bytes(std::span(&z, 1)));
  BOOST_TEST(!a.wait(r2, soon()));
  BOOST_TEST(z == 5);
}

BOOST_FIXTURE_TEST_CASE(destroying_a_posted_request_cancels_it, two_ranks) {
  int x = 0;
  {
    inproc::request r;
    a.post_recv(r, 1, 0, std::as_writable_bytes(std::span(&x, 1)));
  }
  int y = 9;
  inproc::request s;
  b.post_send(s, 0, 0, header_a, std::as_bytes(std::span(&y, 1)));
  BOOST_TEST(!b.test(s));  // the cancelled receive did not match it
  BOOST_TEST(x == 0);
}

BOOST_AUTO_TEST_CASE(run_ranks_reports_what_each_rank_threw) {
  const auto errors = inproc::run_ranks(3, [](inproc::transport endpoint) {
    if (endpoint.rank() == 1) throw std::runtime_error("rank 1 gives up");
    int x = 0;
    inproc::request r;  // waits for rank 1, which threw and so left
    endpoint.post_recv(r, 1, 0, std::as_writable_bytes(std::span(&x, 1)));
    if (auto ec = endpoint.wait(r, soon())) throw error(ec, "waiting for rank 1");
  });
  BOOST_TEST_REQUIRE(errors.size() == 3u);
  BOOST_CHECK_THROW(std::rethrow_exception(errors[1]), std::runtime_error);
  for (std::size_t r : {0u, 2u}) {
    BOOST_TEST_REQUIRE(static_cast<bool>(errors[r]));
    try {
      std::rethrow_exception(errors[r]);
    } catch (const error& e) {
      BOOST_TEST(e.code() == make_error_code(errc::peer_lost));
    }
  }
}

BOOST_AUTO_TEST_CASE(abort_and_departure_wake_waiters) {
  inproc::world world(3);
  auto a = world.endpoint(0);
  auto b = world.endpoint(1);
  std::optional<inproc::transport> c(world.endpoint(2));
  int x = 0;
  inproc::request from_c;
  a.post_recv(from_c, 2, 0, std::as_writable_bytes(std::span(&x, 1)));
  std::thread leaver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.reset();
  });
  BOOST_TEST(a.wait(from_c, soon()) == make_error_code(errc::peer_lost));
  leaver.join();

  inproc::request from_b;
  a.post_recv(from_b, 1, 0, std::as_writable_bytes(std::span(&x, 1)));
  std::thread aborter([&] { b.abort(make_error_code(errc::aborted), "stop"); });
  BOOST_TEST(a.wait(from_b, soon()) == make_error_code(errc::aborted));
  aborter.join();
  BOOST_TEST(a.failure().reason == "stop");
  BOOST_TEST(a.failure().code == make_error_code(errc::aborted));
  inproc::request late;
  a.post_send(late, 1, 0, header_a, std::as_bytes(std::span(&x, 1)));
  BOOST_TEST(a.test(late));
  BOOST_TEST(a.wait(late, soon()) == make_error_code(errc::aborted));
}

BOOST_AUTO_TEST_SUITE_END()
