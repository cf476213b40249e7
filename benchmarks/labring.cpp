// labring BYTES ROUNDS: the network lab's raw TCP ring, the bound an exact ring allreduce
// is measured against (docs/transports-performance.md). Run as
//   benchmarks/netlab -n 4 --rate 1gbit -- build/…/benchmarks/labring 100663296 5
// One rank of a TCP ring in benchmarks/netlab (QCOLL_RANK,
// QCOLL_WORLD_SIZE, QCOLL_BIND = this rank's address; rank r's address is the lab's
// subnet .(r+1)). Each round every rank sends BYTES to the next and receives BYTES from
// the previous at once (one thread, non-blocking sockets and poll, as qcoll's engine;
// TCP_NODELAY), after a token passed twice around the ring lines the ranks up. Rank 0
// prints each round's time and BYTES/time as % of --rate (LINK_BPS): with BYTES =
// 2(n-1)/n*S that is the ring allreduce's link% with no reduction and no framing.
// On loopback it is the floor for moving an allreduce's bytes over the kernel's TCP on
// this host (docs/transports-performance.md, "One connection per direction"):
//   qcoll-run -n 4 bash -c 'QCOLL_BIND=127.0.0.$((QCOLL_RANK+1)) exec labring 25165824 23'
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>
static void all(int fd, char* p, size_t n, bool out) {
  while (n) { ssize_t m = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (m > 0) { p += m; n -= m; } else if (m < 0 && errno == EAGAIN) { pollfd q{fd, short(out ? POLLOUT : POLLIN), 0}; poll(&q, 1, 100); } else { perror("io"); exit(1); } }
}
int main(int argc, char** argv) {
  if (argc != 3 || !getenv("QCOLL_RANK") || !getenv("QCOLL_WORLD_SIZE") || !getenv("QCOLL_BIND")) {
    fprintf(stderr, "usage (under benchmarks/netlab): labring BYTES ROUNDS\n");
    return 2;
  }
  size_t bytes = strtoull(argv[1], 0, 10); int rounds = atoi(argv[2]);
  int r = atoi(getenv("QCOLL_RANK")), n = atoi(getenv("QCOLL_WORLD_SIZE"));
  std::string me = getenv("QCOLL_BIND"); std::string subnet = me.substr(0, me.rfind('.'));
  double link = atof(getenv("QCOLL_NETLAB_RATE") ? getenv("QCOLL_NETLAB_RATE") : "1e9") / 8;
  int next = (r + 1) % n;
  int l = socket(AF_INET, SOCK_STREAM, 0); int one = 1; setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, 4);
  sockaddr_in a{}; a.sin_family = AF_INET; a.sin_port = htons(29555); inet_pton(AF_INET, me.c_str(), &a.sin_addr);
  if (bind(l, (sockaddr*)&a, sizeof a) || listen(l, 4)) { perror("bind"); return 1; }
  int out = socket(AF_INET, SOCK_STREAM, 0); sockaddr_in b{}; b.sin_family = AF_INET; b.sin_port = htons(29555);
  inet_pton(AF_INET, (subnet + "." + std::to_string(next + 1)).c_str(), &b.sin_addr);
  while (connect(out, (sockaddr*)&b, sizeof b) != 0) { close(out); usleep(10000); out = socket(AF_INET, SOCK_STREAM, 0); }
  int in = accept(l, 0, 0);
  setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, 4); setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, 4);
  fcntl(out, F_SETFL, O_NONBLOCK); fcntl(in, F_SETFL, O_NONBLOCK);
  std::vector<char> src(bytes, 1), dst(bytes);
  for (int k = 0; k < rounds; ++k) {
    for (int pass = 0; pass < 2; ++pass) {  // token around the ring twice
      char t = 0;
      if (r == 0) { all(out, &t, 1, true); all(in, &t, 1, false); } else { all(in, &t, 1, false); all(out, &t, 1, true); }
    }
    auto t0 = std::chrono::steady_clock::now();
    size_t sent = 0, got = 0;
    while (sent < bytes || got < bytes) {
      bool moved = false;
      if (sent < bytes) { ssize_t m = send(out, src.data() + sent, std::min<size_t>(bytes - sent, 4 << 20), MSG_NOSIGNAL); if (m > 0) { sent += m; moved = true; } }
      if (got < bytes) { ssize_t m = recv(in, dst.data() + got, bytes - got, 0); if (m > 0) { got += m; moved = true; } }
      if (!moved) { pollfd p[2] = {{out, short(sent < bytes ? POLLOUT : 0), 0}, {in, short(got < bytes ? POLLIN : 0), 0}}; poll(p, 2, 100); }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) printf("round %d: %.3f ms, %.1f %% of the link\n", k, s * 1e3, 100 * bytes / s / link);
  }
}
