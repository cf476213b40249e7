// A peer that sends garbage after the handshake, for the fault campaign's `garbage`
// and `corrupt` faults (tests/faults/campaign.py). Preloaded (LD_PRELOAD) into every
// process of a trial, it does nothing until the process gets SIGUSR1. From then on:
// - by default (`garbage`), every sendmsg on a TCP socket sends as many pseudo-random
//   bytes as it was given instead of its bytes (the caller's buffers are left alone).
//   The TCP transport writes through sendmsg (Boost.Asio's write_some), so the victim's
//   peers read garbage from wherever its next write begins: a record boundary or the
//   middle of a chunk.
// - with QCOLL_GARBLE=payload (`corrupt`), one bit of the next write of at least 4 KiB
//   is flipped, in the middle of its last buffer — a data chunk's bytes, as the transport
//   writes them (record headers go first, in a buffer of their own or in the first 56
//   bytes ahead of a small message's payload) — once, and the process says so on stderr
//   ("garble: flipped …");
//   the stream's structure stays intact, so only a payload checksum can tell.
// Under QCOLL_TLS=1 the transport's TLS writes go through sendmsg too
// (rendezvous/tls.hpp), so the flip lands in a TLS record's ciphertext, as a man in the
// middle's would.

#include <dlfcn.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

std::atomic<bool> garbling{false};

void start_garbling(int) { garbling.store(true, std::memory_order_relaxed); }

__attribute__((constructor)) void install() {
  struct sigaction action {};
  action.sa_handler = start_garbling;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
}

bool is_tcp(int fd) {
  int type = 0, protocol = 0;
  socklen_t length = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0 || type != SOCK_STREAM) return false;
  length = sizeof protocol;
  return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &length) == 0 && protocol == IPPROTO_TCP;
}

using sendmsg_function = ssize_t (*)(int, const msghdr*, int);

std::atomic<bool> flipped{false};

/// The `corrupt` fault: this write with one bit flipped in the middle of its last buffer,
/// when the write has at least 4 KiB and the flip is among the bytes the socket takes
/// (else the next such write tries again); once per process.
ssize_t flip_one_payload_bit(int fd, const msghdr* message, int flags, sendmsg_function real) {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < message->msg_iovlen; ++i) bytes += message->msg_iov[i].iov_len;
  const std::size_t last = message->msg_iovlen - 1;
  if (flipped.load(std::memory_order_relaxed) || message->msg_iovlen == 0 || bytes < 4096 ||
      message->msg_iov[last].iov_len < 256)
    return real(fd, message, flags);
  thread_local std::vector<unsigned char> copy;
  const iovec& tail = message->msg_iov[last];
  copy.assign(static_cast<const unsigned char*>(tail.iov_base), static_cast<const unsigned char*>(tail.iov_base) + tail.iov_len);
  const std::size_t at = tail.iov_len / 2;
  copy[at] ^= 0x08;
  std::vector<iovec> pieces(message->msg_iov, message->msg_iov + message->msg_iovlen);
  pieces[last] = {copy.data(), copy.size()};
  msghdr changed = *message;
  changed.msg_iov = pieces.data();
  const ssize_t sent = real(fd, &changed, flags);
  if (sent > 0 && static_cast<std::size_t>(sent) > bytes - tail.iov_len + at && !flipped.exchange(true)) {
    static const char line[] = "garble: flipped a bit in the middle of a payload write\n";
    [[maybe_unused]] const ssize_t ignored = ::write(2, line, sizeof line - 1);
  }
  return sent;
}

}  // namespace

extern "C" ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  static const auto real = reinterpret_cast<sendmsg_function>(dlsym(RTLD_NEXT, "sendmsg"));
  if (!garbling.load(std::memory_order_relaxed) || !is_tcp(fd)) return real(fd, message, flags);
  static const bool payload_only = [] {
    const char* mode = std::getenv("QCOLL_GARBLE");
    return mode != nullptr && std::strcmp(mode, "payload") == 0;
  }();
  if (payload_only) return flip_one_payload_bit(fd, message, flags, real);
  thread_local std::vector<unsigned char> noise;
  thread_local std::uint64_t state = 0x9e3779b97f4a7c15u;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < message->msg_iovlen; ++i) bytes += message->msg_iov[i].iov_len;
  noise.resize(bytes);
  for (unsigned char& b : noise) {  // xorshift64: cheap, and never the stream's magic for long
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    b = static_cast<unsigned char>(state);
  }
  iovec one{noise.data(), noise.size()};
  msghdr garbled = *message;
  garbled.msg_iov = &one;
  garbled.msg_iovlen = 1;
  return real(fd, &garbled, flags);
}
