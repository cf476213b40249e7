// Fuzz target for the handshake every qcoll TCP connection starts with
// (rendezvous/handshake.hpp): the bytes an unauthenticated peer sends to either side.
//
// Input: [setup: 1 byte][frames…]. Setup bit 0 picks the side under test, bit 1 whether
// the job has a secret, bits 2–3 the channel, bits 4–7 the job's size − 1.
// - server side: frames = hello (64 bytes) then the client's proof (32). The server must
//   refuse a hello without "QCOL", and may admit only a client of its job's size with a
//   rank below it on its channel; with a secret it must admit nobody (the fuzzer cannot
//   know the server's fresh nonce, so a proof it makes up that verifies is a forgery).
// - client side: frames = the server's reply (56 bytes) then its ack (1). With a secret
//   the client must refuse (a server proof over our fresh nonce cannot be made up);
//   without one it may go on only for a reply "QCOL" of this version, status ok, and an ack 0.
// Every refusal is a qcoll::error with errc::protocol_error; anything else is a failure.

#include <qcoll/rendezvous/handshake.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>

namespace {

using namespace qcoll;
namespace rv = qcoll::rendezvous;

[[noreturn]] void failure(const std::string& what) {
  std::fprintf(stderr, "handshake_fuzz: %s\n", what.c_str());
  std::abort();
}

struct setup {
  bool server_side;
  rv::job job;
  rv::channel kind;
};

setup read_setup(std::uint8_t byte) {
  setup s{(byte & 1) != 0, {}, static_cast<rv::channel>(1 + (byte >> 2 & 3) % 3)};
  s.job.job_id = "fuzz-job";
  s.job.size = 1 + (byte >> 4);
  s.job.rank = s.job.size - 1;
  if (byte & 2) s.job.secret = "s3cret";
  return s;
}

/// `frames` padded with zeros (or cut) to exactly `size` bytes: a short frame is a
/// closed connection, which the socket layer reports before the logic sees it.
std::vector<std::byte> frame(std::span<const std::uint8_t> bytes, std::size_t& at, std::size_t size) {
  std::vector<std::byte> out(size);
  const std::size_t n = std::min(size, bytes.size() - std::min(at, bytes.size()));
  if (n) std::memcpy(out.data(), bytes.data() + at, n);
  at += size;
  return out;
}

void server_side(const setup& s, std::span<const std::uint8_t> bytes) {
  rv::detail::server_handshake server(s.job, s.kind);
  std::size_t at = 0;
  const auto hello = frame(bytes, at, rv::hello_size);
  try {
    server.check_magic(std::span(hello).first(4));
  } catch (const qcoll::error& e) {
    if (e.code() != errc::protocol_error) throw;
    return;
  }
  if (std::memcmp(hello.data(), "QCOL", 4) != 0) failure("the server took a hello without \"QCOL\"");
  if (auto refusal = server.on_hello(hello)) {
    if (refusal->code() != errc::protocol_error) failure("a refusal that is not a protocol_error");
    const auto status = std::to_integer<std::uint8_t>(server.reply()[6]);
    if (!server.silent() && status == 0) failure("a refused hello answered with status ok");
    return;
  }
  const auto proof = frame(bytes, at, rv::proof_size);
  if (auto refusal = server.on_proof(proof)) {
    if (refusal->code() != errc::protocol_error) failure("a refusal that is not a protocol_error");
    if (server.ack()[0] == std::byte{0}) failure("a refused proof acknowledged with status ok");
    return;
  }
  if (!s.job.secret.empty()) failure("the server admitted a client whose proof was made up");
  const rv::hello who = server.result();
  if (who.size != s.job.size || who.rank >= s.job.size || who.kind != s.kind)
    failure("the server admitted a client of another size, rank or channel");
  if (server.ack()[0] != std::byte{0}) failure("an admitted client acknowledged with a refusal");
}

void client_side(const setup& s, std::span<const std::uint8_t> bytes) {
  rv::detail::client_handshake client(s.job, s.kind, "fuzz");
  std::size_t at = 0;
  const auto reply = frame(bytes, at, rv::reply_size);
  try {
    if (auto refusal = client.on_reply(reply)) {
      if (refusal->code() != errc::protocol_error) failure("a refusal that is not a protocol_error");
      return;
    }
    if (!s.job.secret.empty()) failure("the client believed a server proof that was made up");
    const auto version = static_cast<unsigned>(reply[4]) | static_cast<unsigned>(reply[5]) << 8;
    if (std::memcmp(reply.data(), "QCOL", 4) != 0 || version != rv::handshake_version || reply[6] != std::byte{0})
      failure("the client went on after a reply that is not an ok of this version");
    const auto ack = frame(bytes, at, 1);
    client.on_ack(ack[0]);
    if (ack[0] != std::byte{0}) failure("the client took a refusing ack");
  } catch (const qcoll::error& e) {
    if (e.code() != errc::protocol_error) failure(std::string("an error other than protocol_error: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const setup s = read_setup(data[0]);
  const std::span<const std::uint8_t> frames(data + 1, size - 1);
  try {
    s.server_side ? server_side(s, frames) : client_side(s, frames);
  } catch (const std::exception& e) {
    failure(std::string("an unexpected exception: ") + e.what());
  }
  return 0;
}

#ifndef QCOLL_LIBFUZZER
#include "driver.hpp"

namespace {

/// What a real peer of a job like the setup's would send: a client's hello (of this or
/// another rank, sometimes another job or channel) or a server's reply to one.
qcoll::test::fuzz::bytes valid_input(std::mt19937_64& random) {
  const auto setup_byte = static_cast<std::uint8_t>(random());
  const setup s = read_setup(setup_byte);
  rv::job peer = s.job;
  peer.rank = random() % s.job.size;
  if (random() % 8 == 0) peer.job_id = "another-job";
  const rv::channel kind = random() % 8 == 0 ? rv::channel::store : s.kind;
  qcoll::test::fuzz::bytes input{setup_byte};
  const auto append = [&](std::span<const std::byte> bytes) {
    for (const std::byte b : bytes) input.push_back(std::to_integer<std::uint8_t>(b));
  };
  rv::detail::client_handshake client(s.server_side ? peer : s.job, kind, "generator");
  if (s.server_side) {
    append(client.hello());
    append(std::array<std::byte, rv::proof_size>{});
  } else {
    rv::detail::server_handshake server(peer, kind);
    (void)server.on_hello(client.hello());
    append(server.reply());
    input.push_back(static_cast<std::uint8_t>(random() % 4 == 0 ? random() % 8 : 0));
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) { return qcoll::test::fuzz::drive(argc, argv, "handshake_fuzz", valid_input, 1); }
#endif
