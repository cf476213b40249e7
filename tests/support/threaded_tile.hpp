#pragma once
// A tile (include/qcoll/kernels/simt/tile.hpp) on the CPU: 16 threads in lockstep at
// every collective, so the GPU kernels' code runs — and is compared with the CPU
// reference — on a machine without a GPU. Each collective is one barrier: a lane
// writes its value into one of two slot arrays, waits for the others, reads all 16;
// the next collective uses the other array, so no lane overwrites a slot another
// is still reading (a lane cannot reach the collective after next before every
// lane has passed the next barrier, that is, finished reading this one).

#include <qcoll/kernels/group/lanes.hpp>
#include <qcoll/kernels/simt/tile.hpp>

#include <array>
#include <barrier>
#include <bit>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace test {

class threaded_tile {
 public:
  static constexpr unsigned lanes = qcoll::kernels::simt::tile_lanes;

  struct shared {
    std::barrier<> barrier{lanes};
    std::uint32_t slots[2][lanes] = {};
  };

  threaded_tile(shared& state, unsigned lane) : state_(&state), lane_(lane) {}

  unsigned lane() const noexcept { return lane_; }

  float fold(float v) const {
    const auto all = gather(std::bit_cast<std::uint32_t>(v));
    qcoll::kernels::lane_sums sums;
    for (unsigned j = 0; j < lanes; ++j) sums[j] = std::bit_cast<float>(all[j]);
    return qcoll::kernels::fold_lanes(sums);
  }
  float lowest(float v) const {
    return reduce_floats(v, [](float a, float b) { return b < a ? b : a; });
  }
  float highest(float v) const {
    return reduce_floats(v, [](float a, float b) { return b > a ? b : a; });
  }
  std::uint32_t highest(std::uint32_t v) const {
    std::uint32_t result = 0;
    for (std::uint32_t x : gather(v)) result = x > result ? x : result;
    return result;
  }
  std::uint32_t total(std::uint32_t v) const {
    std::uint32_t sum = 0;
    for (std::uint32_t x : gather(v)) sum += x;
    return sum;
  }
  bool any(bool p) const { return ballot(p) != 0; }
  bool all(bool p) const { return ballot(p) == (1u << lanes) - 1; }
  std::uint32_t ballot(bool p) const {
    const auto all = gather(p ? 1u : 0u);
    std::uint32_t bits = 0;
    for (unsigned j = 0; j < lanes; ++j) bits |= all[j] << j;
    return bits;
  }
  std::uint32_t shuffle(std::uint32_t v, unsigned from) const { return gather(v)[from]; }
  float shuffle(float v, unsigned from) const {
    return std::bit_cast<float>(gather(std::bit_cast<std::uint32_t>(v))[from]);
  }
  void sync() const { state_->barrier.arrive_and_wait(); }

 private:
  std::array<std::uint32_t, lanes> gather(std::uint32_t mine) const {
    std::uint32_t* slots = state_->slots[parity_];
    parity_ ^= 1;
    slots[lane_] = mine;
    state_->barrier.arrive_and_wait();
    std::array<std::uint32_t, lanes> all;
    for (unsigned j = 0; j < lanes; ++j) all[j] = slots[j];
    return all;
  }
  template <class Pick>
  float reduce_floats(float v, Pick pick) const {
    const auto all = gather(std::bit_cast<std::uint32_t>(v));
    float result = std::bit_cast<float>(all[0]);
    for (unsigned j = 1; j < lanes; ++j) result = pick(result, std::bit_cast<float>(all[j]));
    return result;
  }

  shared* state_;
  unsigned lane_;
  mutable unsigned parity_ = 0;
};

/// The 16 lane threads, kept from one tile's run to the next (starting 16 threads per
/// encode cost more than the encodes).
class tile_pool {
 public:
  tile_pool() {
    for (unsigned lane = 0; lane < threaded_tile::lanes; ++lane)
      lanes_.emplace_back([this, lane] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          (*body_)(threaded_tile(state_, lane));
          done_.arrive_and_wait();
        }
      });
  }
  ~tile_pool() {
    stop_ = true;
    start_.arrive_and_wait();
  }

  /// Runs body(tile) on every lane and returns when all have.
  void run(const std::function<void(const threaded_tile&)>& body) {
    body_ = &body;
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }

 private:
  threaded_tile::shared state_;
  std::barrier<> start_{threaded_tile::lanes + 1}, done_{threaded_tile::lanes + 1};
  const std::function<void(const threaded_tile&)>* body_ = nullptr;
  bool stop_ = false;
  std::vector<std::jthread> lanes_;  // last: they stop before the barriers go
};

/// Runs body(tile) on the 16 lanes of one tile, each a thread, and returns when all have.
inline void run_on_tile(const std::function<void(const threaded_tile&)>& body) {
  static tile_pool pool;
  pool.run(body);
}

}  // namespace test
