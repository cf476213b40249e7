// A peer that sends garbage after the handshake, for the fault campaign's `garbage`
// fault (tests/faults/campaign.py). Preloaded (LD_PRELOAD) into every process of a
// trial, it does nothing until the process gets SIGUSR1; from then on every sendmsg on
// a TCP socket sends as many pseudo-random bytes as it was given instead of its bytes
// (the caller's buffers are left alone). The TCP transport writes through sendmsg
// (Boost.Asio's write_some), so the victim's peers read garbage from wherever its
// next write begins: a record boundary or the middle of a chunk.

#include <dlfcn.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
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

}  // namespace

extern "C" ssize_t sendmsg(int fd, const msghdr* message, int flags) {
  static const auto real = reinterpret_cast<sendmsg_function>(dlsym(RTLD_NEXT, "sendmsg"));
  if (!garbling.load(std::memory_order_relaxed) || !is_tcp(fd)) return real(fd, message, flags);
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
