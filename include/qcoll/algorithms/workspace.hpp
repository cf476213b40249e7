#pragma once
/// @file
/// workspace: the memory a communicator's exact collectives reuse from call to call —
/// scratch blocks, and where the transport lets peers map memory (shm), the staging
/// buffer single-copy steps offer blocks of ordinary memory from — with the setup of a
/// step that reads the ring's blocks from the peer's memory. The memory grows once and
/// is kept for later calls, as fresh memory costs page faults. Not a template: only the
/// members that touch a transport are.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/log.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::algorithms {

class workspace {
 public:
  /// Scratch space for `elements` values of T in `slot` (0 and 1: blocks; 2: the
  /// single-copy bounce buffer), grown once and reused by later calls.
  template <class T>
  std::span<T> scratch(std::size_t slot, std::size_t elements) {
    std::vector<std::byte>& bytes = scratch_[slot];
    const std::size_t needed = elements * sizeof(T) + alignof(T);
    if (bytes.size() < needed) bytes.resize(needed);
    void* start = bytes.data();
    std::size_t space = bytes.size();
    start = std::align(alignof(T), elements * sizeof(T), start, space);
    return {static_cast<T*>(start), elements};
  }

  /// Sets `step` (a call of `count` values of `type` over `channel`) up to read each
  /// ring step from the peer's memory (algorithm::ring_single_copy): reductions go
  /// through a bounce buffer of the pipelined ring's slice (`slice_bytes`, at least 64
  /// bytes), and where the transport lets peers map memory, steps below `kernel_bytes`
  /// (tuning::single_copy_kernel_bytes) offer blocks of ordinary memory from staging.
  template <transport Channel>
  void prepare_single_copy(primitives<Channel>& step, [[maybe_unused]] Channel& channel,
                           [[maybe_unused]] std::size_t count, [[maybe_unused]] dtype type, std::size_t slice_bytes,
                           [[maybe_unused]] std::size_t kernel_bytes) {
    // Slices of the pipelined ring's size (at least 64 bytes), 8-byte aligned.
    const std::size_t words = std::max<std::size_t>(slice_bytes, 64) / sizeof(double);
    step.read_directly(std::as_writable_bytes(scratch<double>(2, words)));
    if constexpr (shared_memory_transport<Channel>) {
      // The largest block a step sends (partials of 16-bit values travel as float),
      // with a spare of the same size where reduce-scatter has intermediate partials.
      const std::size_t step_bytes = largest_block(count, channel.size()) * std::max(size_of(type), sizeof(float));
      if (step_bytes < kernel_bytes) {
        const std::size_t half = (step_bytes + 63) / 64 * 64;  // the spare starts 64-byte aligned
        const std::span<std::byte> room = staging(channel, channel.size() > 2 ? 2 * half : step_bytes);
        if (room.size() >= 2 * half) step.stage_outgoing(room.first(half), room.subspan(half));
        else step.stage_outgoing(room);
      }
    }
  }

 private:
  /// Block 0 is never smaller than any other block.
  static std::size_t largest_block(std::size_t count, std::size_t n) noexcept { return block_of(count, n, 0).size; }

  /// Memory the peers map, where single-copy steps stage blocks of ordinary memory;
  /// grown once and reused by later calls, like scratch(). Empty where the system
  /// refuses it (said once; not asked again): the steps then go through the kernel's copy.
  template <shared_memory_transport Channel>
  std::span<std::byte> staging(Channel& channel, std::size_t bytes) {
    if (staging_.size() >= bytes) return staging_.first(bytes);
    if (staging_refused_) return {};
    staging_ = {};
    staging_owner_.reset();  // before the new one: at most one is held
    try {
      auto memory = std::make_shared<decltype(channel.allocate_shared(bytes))>(channel.allocate_shared(bytes));
      staging_ = memory->bytes();
      staging_owner_ = std::move(memory);
    } catch (const error& refused) {
      staging_refused_ = true;
      detail::log_warning("qcoll: rank {}: no staging buffer of {} bytes ({}); single-copy steps of ordinary "
                          "memory go through the kernel's copy",
                          channel.rank(), bytes, refused.what());
    }
    return staging_;
  }

  std::vector<std::byte> scratch_[3];  // two blocks, and single-copy's bounce buffer
  std::shared_ptr<void> staging_owner_;  // the transport's shared memory behind staging_
  std::span<std::byte> staging_;
  bool staging_refused_ = false;
};

}  // namespace qcoll::algorithms
