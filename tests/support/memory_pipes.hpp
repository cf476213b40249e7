#pragma once
// In-memory pipes for the stream engine: each direction between two ranks a bounded
// byte queue, guarded by one mutex so ranks may run in threads of their own. Used by
// the engine's unit tests and its stream fuzz target.

#include <qcoll/transports/stream/engine.hpp>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace qcoll::test {

struct memory_world {
  struct pipe {
    std::deque<std::byte> bytes;
    std::size_t capacity = 0;
    bool writer_closed = false;
    bool reader_closed = false;
  };
  explicit memory_world(std::size_t capacity, rank_t ranks = 2)
      : pipes(ranks, std::vector<pipe>(ranks, pipe{{}, capacity, false, false})) {}
  std::vector<std::vector<pipe>> pipes;  // [from][to]
  std::mutex mutex;
  /// When set, each write moves at most write_cap(call number) bytes, as a socket's
  /// write may stop anywhere, inside a record header as well as inside its payload.
  std::function<std::size_t(std::size_t)> write_cap;
  std::size_t writes = 0;
  std::size_t gathered_writes = 0;  // writes handed two non-empty parts
};

class memory_channels final : public transports::stream::channels {
 public:
  memory_channels(std::shared_ptr<memory_world> world, rank_t rank) : world_(std::move(world)), rank_(rank) {}

  std::size_t write_some(rank_t peer, std::span<const std::byte> bytes, std::string& lost) override {
    return write_some_gathered(peer, bytes, {}, lost);
  }

  /// Both parts in one write, as TCP's sendmsg gathers them.
  std::size_t write_some_gathered(rank_t peer, std::span<const std::byte> first, std::span<const std::byte> second,
                                  std::string& lost) override {
    const std::lock_guard lock(world_->mutex);
    auto& p = world_->pipes[rank_][peer];
    if (p.reader_closed || p.writer_closed) {
      lost = "closed";
      return 0;
    }
    if (!first.empty() && !second.empty()) ++world_->gathered_writes;
    std::size_t room = p.capacity - p.bytes.size();
    if (world_->write_cap) room = std::min(room, world_->write_cap(world_->writes++));
    std::size_t moved = 0;
    for (const std::span<const std::byte> part : {first, second}) {
      const std::size_t n = std::min(part.size(), room - moved);
      p.bytes.insert(p.bytes.end(), part.begin(), part.begin() + static_cast<std::ptrdiff_t>(n));
      moved += n;
      if (n < part.size()) break;
    }
    return moved;
  }

  std::size_t read_some(rank_t peer, std::span<std::byte> into, std::string& lost) override {
    const std::lock_guard lock(world_->mutex);
    auto& p = world_->pipes[peer][rank_];
    const std::size_t n = std::min(into.size(), p.bytes.size());
    std::copy_n(p.bytes.begin(), n, into.begin());
    p.bytes.erase(p.bytes.begin(), p.bytes.begin() + static_cast<std::ptrdiff_t>(n));
    if (n == 0 && !into.empty() && (p.writer_closed || p.reader_closed)) lost = "it closed the pipe";
    return n;
  }

  void notify(rank_t) noexcept override {}

  bool peer_gone(rank_t peer) override {
    const std::lock_guard lock(world_->mutex);
    return world_->pipes[peer][rank_].writer_closed || world_->pipes[peer][rank_].reader_closed;
  }
  std::uint64_t activity() override { return 0; }
  /// No wakeups here: a short nap, so that ranks in threads of their own take turns.
  void wait_for_activity(std::uint64_t, std::span<const char>, std::span<const char>, deadline until) override {
    const deadline now = clock::now();
    if (until > now) std::this_thread::sleep_for(std::min<clock::duration>(until - now, std::chrono::microseconds(200)));
  }
  void close(rank_t peer) noexcept override {
    const std::lock_guard lock(world_->mutex);
    world_->pipes[rank_][peer].writer_closed = true;
    world_->pipes[peer][rank_].reader_closed = true;
  }

 private:
  std::shared_ptr<memory_world> world_;
  rank_t rank_;
};

/// `ranks` engines over memory pipes, each for a thread of its own.
inline std::vector<std::unique_ptr<transports::stream::engine>> engines_over_memory(
    const std::shared_ptr<memory_world>& world, const transports::stream::engine_options& options) {
  std::vector<std::unique_ptr<transports::stream::engine>> engines;
  const rank_t ranks = world->pipes.size();
  for (rank_t r = 0; r < ranks; ++r)
    engines.push_back(std::make_unique<transports::stream::engine>(r, ranks, std::make_unique<memory_channels>(world, r),
                                                                   "test transport", options));
  return engines;
}

/// Two engines over memory pipes, driven by one thread.
struct pair_of_engines {
  /// With `checksums`, both send checked data records and refuse plain ones.
  explicit pair_of_engines(std::size_t capacity = 64 << 10, bool checksums = false)
      : world(std::make_shared<memory_world>(capacity)) {
    const transports::stream::engine_options no_waiting{.spin = std::chrono::microseconds(0),
                                                         .abort_flush = std::chrono::milliseconds(0),
                                                         .pause = std::chrono::microseconds(0),
                                                         .payload_checksums = checksums};
    ranks = engines_over_memory(world, no_waiting);
  }

  /// Drives both ranks until `done` holds or a bounded number of rounds passed.
  template <class Done>
  bool run(Done done) {
    for (int round = 0; round < 100000; ++round) {
      if (done()) return true;
      for (auto& e : ranks) e->test(probe);
    }
    return done();
  }

  /// Raw bytes into the pipe rank 0 → rank 1, as a hostile peer would write them.
  void inject(std::span<const std::byte> bytes) {
    const std::lock_guard lock(world->mutex);
    auto& p = world->pipes[0][1].bytes;
    p.insert(p.end(), bytes.begin(), bytes.end());
  }

  std::shared_ptr<memory_world> world;
  std::vector<std::unique_ptr<transports::stream::engine>> ranks;
  transports::stream::request probe;  // never posted: test() on it only makes progress
};

}  // namespace qcoll::test
