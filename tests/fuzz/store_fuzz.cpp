// Fuzz target for the key-value store's protocol (rendezvous/tcp_store.hpp): the
// requests rank 0's store takes from every rank, and the responses a rank reads back.
//
// Input: [setup: 1 byte][bytes…]. Setup bit 0 picks the side under test.
// - server side: steps [connection: 1 byte][request header: 12 bytes][key and value].
//   Connection bits 0–1 name one of four clients; bit 7 closes that client instead (the
//   step has no request then). Each request goes through parse_request, as the server's
//   reads do: a malformed one closes its client. The store_table's replies are checked
//   against a model: each answers a request its client made and has not cancelled, at
//   most once, to a client still open; a get answers the key's current value; a wait
//   only once every key of its range exists; a missing reply counts and lists the
//   absent keys. At the end no parked get or wait may be one the model says is done.
// - client side: the bytes a client received; take_response must take whole responses
//   (value ≤ max_value_size) until what is left is not one, or throw protocol_error.

#include <qcoll/rendezvous/tcp_store.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace qcoll;
namespace rd = qcoll::rendezvous::detail;

[[noreturn]] void failure(const std::string& what) {
  std::fprintf(stderr, "store_fuzz: %s\n", what.c_str());
  std::abort();
}

struct outstanding {
  rd::store_op op;
  std::uint32_t id;
  std::string key;
  std::uint32_t count;
};

struct client {
  bool closed = false;
  std::vector<outstanding> requests;
};

using model = std::map<std::string, std::string>;

bool all_exist(const model& data, const std::string& prefix, std::uint32_t count) {
  if (count > data.size()) return false;
  for (std::uint32_t i = 0; i < count; ++i)
    if (!data.contains(prefix + std::to_string(i))) return false;
  return true;
}

/// Whether `reply` is a right answer to `request` now.
bool answers(const outstanding& request, const std::string& value, const model& data) {
  switch (request.op) {
    case rd::store_op::set: return value.empty();
    case rd::store_op::get: return data.contains(request.key) && data.at(request.key) == value;
    case rd::store_op::wait: return value.empty() && all_exist(data, request.key, request.count);
    case rd::store_op::missing: {
      if (value.size() < 4 || value.size() % 4 != 0 || value.size() > 4 * (1 + rd::missing_listed)) return false;
      const auto* bytes = reinterpret_cast<const std::byte*>(value.data());
      const std::uint32_t total = qcoll::detail::load_le<std::uint32_t>(bytes);
      const std::size_t listed = value.size() / 4 - 1;
      if (listed != std::min<std::size_t>(total, rd::missing_listed)) return false;
      std::int64_t previous = -1;
      for (std::size_t k = 0; k < listed; ++k) {
        const std::uint32_t index = qcoll::detail::load_le<std::uint32_t>(bytes + 4 * (k + 1));
        if (index >= request.count || index <= previous || data.contains(request.key + std::to_string(index)))
          return false;
        previous = index;
      }
      if (request.count <= 64) {  // the count itself, where counting is cheap
        std::uint32_t absent = 0;
        for (std::uint32_t i = 0; i < request.count; ++i) absent += !data.contains(request.key + std::to_string(i));
        if (absent != total) return false;
      }
      return true;
    }
    case rd::store_op::cancel: return false;
  }
  return false;
}

void server_side(std::span<const std::uint8_t> bytes) {
  rd::store_table table;
  model data;
  std::array<client, 4> clients;
  for (std::size_t at = 0; at < bytes.size();) {
    const std::uint8_t step = bytes[at++];
    const std::size_t number = step & 3;
    client& from = clients[number];
    if (step & 0x80) {
      from.closed = true;
      from.requests.clear();
      table.forget(number);
      continue;
    }
    if (bytes.size() - at < rd::store_header_size) break;
    rd::store_request request;
    const auto header = std::as_bytes(bytes.subspan(at, rd::store_header_size));
    at += rd::store_header_size;
    if (from.closed) continue;  // a closed client's bytes are never read
    if (rd::parse_request(header, request)) {
      from.closed = true;  // the server closes a client that sent a malformed request
      from.requests.clear();
      table.forget(number);
      continue;
    }
    const std::size_t body_size = std::size_t{request.key_size} + request.value_size;
    if (bytes.size() - at < body_size) break;  // the server waits for the rest
    const std::vector<std::byte> body(reinterpret_cast<const std::byte*>(bytes.data() + at),
                                      reinterpret_cast<const std::byte*>(bytes.data() + at + body_size));
    at += body_size;
    const std::string key(reinterpret_cast<const char*>(body.data()), request.key_size);
    const std::uint32_t count =
        request.value_size == 4 ? qcoll::detail::load_le<std::uint32_t>(body.data() + request.key_size) : 0;
    if (request.op == rd::store_op::set)
      data[key] = std::string(reinterpret_cast<const char*>(body.data()) + request.key_size, request.value_size);
    if (request.op == rd::store_op::cancel) {
      std::erase_if(from.requests, [&](const outstanding& r) { return r.id == request.id; });
    } else {
      from.requests.push_back({request.op, request.id, key, count});
    }
    for (const auto& reply : table.handle(number, request, body)) {
      if (reply.connection >= clients.size() || clients[reply.connection].closed)
        failure("a reply to a client that is closed or never was");
      auto& pending = clients[reply.connection].requests;
      const auto match = std::find_if(pending.begin(), pending.end(), [&](const outstanding& r) {
        return r.id == reply.id && answers(r, reply.value, data);
      });
      if (match == pending.end()) failure("a reply that answers no open request of its client rightly");
      pending.erase(match);
    }
    // What the store answers at once, it must have answered now.
    for (const outstanding& r : from.requests)
      if (r.op == rd::store_op::set || r.op == rd::store_op::missing) failure("a set or missing left unanswered");
  }
  for (const client& c : clients)
    for (const outstanding& r : c.requests)
      if ((r.op == rd::store_op::get && data.contains(r.key)) ||
          (r.op == rd::store_op::wait && all_exist(data, r.key, r.count)))
        failure("a get or wait still parked although what it waits for exists");
}

void client_side(std::span<const std::uint8_t> bytes) {
  std::vector<std::byte> inbox(reinterpret_cast<const std::byte*>(bytes.data()),
                               reinterpret_cast<const std::byte*>(bytes.data() + bytes.size()));
  std::size_t consumed = 0;
  try {
    while (auto response = rd::take_response(inbox)) {
      if (response->value.size() > rendezvous::max_value_size) failure("a response over max_value_size");
      consumed += rd::store_header_size + response->value.size();
      if (consumed + inbox.size() != bytes.size()) failure("bytes lost or made up between responses");
    }
  } catch (const qcoll::error& e) {
    if (e.code() != errc::protocol_error) failure(std::string("an error other than protocol_error: ") + e.what());
    return;
  }
  if (inbox.size() >= rd::store_header_size &&
      inbox.size() >= rd::store_header_size + qcoll::detail::load_le<std::uint32_t>(inbox.data() + 8))
    failure("a whole response left untaken");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::span<const std::uint8_t> rest(data + 1, size - 1);
  try {
    (data[0] & 1) ? server_side(rest) : client_side(rest);
  } catch (const std::exception& e) {
    failure(std::string("an unexpected exception: ") + e.what());
  }
  return 0;
}

#ifndef QCOLL_LIBFUZZER
#include "driver.hpp"

namespace {

/// A rendezvous as ranks run it (sets of "k/<rank>", gets, barriers over "k/", the
/// missing query, cancels, a client leaving), or responses as the store sends them.
qcoll::test::fuzz::bytes valid_input(std::mt19937_64& random) {
  qcoll::test::fuzz::bytes input{static_cast<std::uint8_t>(random() % 2)};
  const auto append = [&](std::span<const std::byte> bytes) {
    for (const std::byte b : bytes) input.push_back(std::to_integer<std::uint8_t>(b));
  };
  const int steps = 1 + static_cast<int>(random() % 12);
  for (int s = 0; s < steps; ++s) {
    const auto id = static_cast<std::uint32_t>(random() % 8);
    const std::string key = "k/" + std::to_string(random() % 4), value(random() % 24, 'v');
    if (input[0] == 0) {
      append(rd::encode_frame(rd::store_ok, 0, id, {}, rd::as_bytes(value)));
      continue;
    }
    const auto op = static_cast<rd::store_op>(1 + random() % 5);
    input.push_back(static_cast<std::uint8_t>(random() % 16 == 0 ? 0x80 | random() % 4 : random() % 4));
    if (input.back() & 0x80) continue;
    std::array<std::byte, 4> count{};
    qcoll::detail::store_le<std::uint32_t>(count.data(), static_cast<std::uint32_t>(1 + random() % 4));
    switch (op) {
      case rd::store_op::set: append(rd::encode_frame(1, 3, id, rd::as_bytes(key), rd::as_bytes(value))); break;
      case rd::store_op::get: append(rd::encode_frame(2, 3, id, rd::as_bytes(key), {})); break;
      case rd::store_op::wait: append(rd::encode_frame(3, 2, id, rd::as_bytes(std::string_view("k/")), count)); break;
      case rd::store_op::cancel: append(rd::encode_frame(4, 0, id, {}, {})); break;
      case rd::store_op::missing: append(rd::encode_frame(5, 2, id, rd::as_bytes(std::string_view("k/")), count)); break;
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) { return qcoll::test::fuzz::drive(argc, argv, "store_fuzz", valid_input, 1); }
#endif
