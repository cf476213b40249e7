#pragma once
/// @file
/// workspace: the memory a communicator's exact collectives reuse from call to call —
/// scratch blocks, where the transport lets peers map memory (shm) the staging buffer
/// single-copy steps offer blocks of ordinary memory from, and for calls on device
/// buffers the pinned mirror they run in (device_staging) — with the setup of a
/// step that reads the ring's blocks from the peer's memory, and the scripts whose
/// blocks live here: the ring allreduce and reduce-scatter (16-bit values reduced in
/// float and rounded once) and the allreduce by pairwise exchanges. The memory grows
/// once and is kept for later calls, as fresh memory costs page faults. Not a template:
/// only the members that touch a transport are.

#include <qcoll/algorithms/device_staging.hpp>
#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/ring.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/execution/kernels.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::algorithms {

class workspace {
 public:
  /// Sets `step` (a call of `count` values of `type` over `channel`) up to read each
  /// ring step from the peer's memory (algorithm::ring_single_copy): reductions go
  /// through a bounce buffer of the pipelined ring's slice (`slice_bytes`, at least 64
  /// bytes), and where the transport lets peers map memory and `stage(step_bytes)` says
  /// so for the call's largest step, steps offer blocks of ordinary memory from staging
  /// (the communicator's choice: tuning/copy_path.hpp or single_copy_kernel_bytes).
  template <transport Channel, class Stage>
  void prepare_single_copy(primitives<Channel>& step, [[maybe_unused]] Channel& channel,
                           [[maybe_unused]] std::size_t count, [[maybe_unused]] dtype type, std::size_t slice_bytes,
                           [[maybe_unused]] Stage stage) {
    // Slices of the pipelined ring's size (at least 64 bytes), 8-byte aligned.
    const std::size_t words = std::max<std::size_t>(slice_bytes, 64) / sizeof(double);
    step.read_directly(std::as_writable_bytes(scratch<double>(2, words)));
    if constexpr (shared_memory_transport<Channel>) {
      // The largest block a step sends (partials of 16-bit values travel as float),
      // with a spare of the same size where reduce-scatter has intermediate partials.
      const std::size_t step_bytes = largest_block(count, channel.size()) * std::max(size_of(type), sizeof(float));
      if (stage(step_bytes)) {
        const std::size_t half = (step_bytes + 63) / 64 * 64;  // the spare starts 64-byte aligned
        const std::span<std::byte> room = staging(channel, channel.size() > 2 ? 2 * half : step_bytes);
        if (room.size() >= 2 * half) step.stage_outgoing(room.first(half), room.subspan(half));
        else step.stage_outgoing(room);
      }
    }
  }

  /// allreduce by the ring, `in` into `out` (the same range or disjoint): reduce-scatter,
  /// then all-gather, in place in `out` with one scratch block.
  template <transport Channel, element T>
  void allreduce_by_ring(primitives<Channel>& step, const ring_view& ring, std::span<const T> in, std::span<T> out,
                         reduce_op op) {
    if constexpr (half_element<T>) {
      // Reduce in float, round this rank's block once, then gather the rounded blocks.
      // The input is read only before this rank's block of `out` is written. One rank
      // copies the bits, as reduce_scatter does (no rounding: nothing was added).
      if (ring.size() == 1) {
        if (!detail::same_range(in, out)) step.copy(in, out);
        return;
      }
      const block_range mine = ring.block_at(in.size(), 0);
      step.narrow(reduce_scatter_in_float(step, ring, in, op), mine.of(out));
      ring_all_gather<Channel, T>(step, ring, out);
    } else {
      if (!detail::same_range(in, out)) step.copy(in, out);
      struct in_place {
        std::span<T> data;
        std::span<T> incoming_block;
        std::span<const T> own(block_range b) const { return b.of(data); }
        std::span<T> incoming(std::size_t, block_range b) const { return incoming_block.first(b.size); }
        std::span<T> partial(std::size_t, block_range b) const { return b.of(data); }
      } buffers{out, scratch<T>(0, largest_block(out.size(), ring.size()))};
      ring_reduce_scatter<Channel, T>(step, ring, out.size(), op, buffers);
      ring_all_gather<Channel, T>(step, ring, out);
    }
  }

  /// reduce-scatter by the ring: this rank's block of the reduced `in` into `out` (that
  /// block's size; exactly that block of `in`, or disjoint from it).
  template <transport Channel, element T>
  void reduce_scatter_by_ring(primitives<Channel>& step, const ring_view& ring, std::span<const T> in,
                              std::span<T> out, reduce_op op) {
    if (ring.size() == 1) {  // the whole input is this rank's block, already checked to fit `out`
      if (!detail::same_range(in, out)) step.copy(in.first(out.size()), out);
      return;
    }
    if constexpr (half_element<T>) {
      step.narrow(reduce_scatter_in_float(step, ring, in, op), out);
    } else {
      const std::size_t block = largest_block(in.size(), ring.size());
      out_of_place<T> buffers{in, out, {scratch<T>(0, block), scratch<T>(1, block)}, ring.size() - 2};
      ring_reduce_scatter<Channel, T>(step, ring, in.size(), op, buffers);
    }
  }

  /// allreduce by an algorithm of pairwise exchanges over the whole world (recursive or
  /// halving-doubling: `run(step, rank, n, data, scratch, op)`); 16-bit values are
  /// widened into float scratch, reduced there and rounded once.
  template <transport Channel, element T, class Algorithm>
  void allreduce_by_exchanges(primitives<Channel>& step, rank_t rank, std::size_t n, std::span<const T> in,
                              std::span<T> out, reduce_op op, Algorithm run) {
    if constexpr (half_element<T>) {
      const std::span<float> values = scratch<float>(0, in.size());
      step.widen(in, values);
      run(step, rank, n, values, scratch<float>(1, in.size()), op);
      step.narrow(std::span<const float>(values), out);
    } else {
      if (!detail::same_range(in, out)) step.copy(in, out);
      run(step, rank, n, out, scratch<T>(0, in.size()), op);
    }
  }

  /// What calls on device buffers run through: made at the first one, kept.
  device_staging& device_stage() {
    if (!device_stage_) device_stage_ = std::make_unique<device_staging>();
    return *device_stage_;
  }

  /// Scratch in device memory of `ordinal` from now on (a communicator over a transport
  /// that moves device memory: its scripts run on the device buffers themselves).
  void scratch_on_device(int ordinal) noexcept { device_ordinal_ = ordinal; }

 private:
  /// Scratch space for `elements` values of T in `slot` (0 and 1: blocks; 2: the
  /// single-copy bounce buffer; 3: a device call's widened input), grown once and
  /// reused by later calls; in device memory after scratch_on_device().
  template <class T>
  std::span<T> scratch(std::size_t slot, std::size_t elements) {
    const std::size_t needed = elements * sizeof(T) + alignof(T);
    std::span<std::byte> bytes;
    if (device_ordinal_ >= 0) {
      execution::device_memory<std::byte>& memory = device_scratch_[slot];
      if (memory.size() < needed)
        execution::with_current_device(execution::device_runtime("workspace"), device_ordinal_, [&] {
          memory = {};
          memory = execution::device_memory<std::byte>(needed);
        });
      bytes = memory.span();
    } else {
      if (scratch_[slot].size() < needed) scratch_[slot].resize(needed);
      bytes = scratch_[slot];
    }
    void* start = bytes.data();
    std::size_t space = bytes.size();
    start = std::align(alignof(T), elements * sizeof(T), start, space);
    return {static_cast<T*>(start), elements};
  }

  /// The ring reduce-scatter's buffers with the input kept: partials alternate between
  /// two scratch blocks (step s sends one while receiving into the other), and the last
  /// step writes the result straight into `out`.
  template <class T>
  struct out_of_place {
    std::span<const T> input;
    std::span<T> out;
    std::span<T> scratch[2];
    std::size_t last_step;
    std::span<const T> own(block_range b) const { return b.of(input); }
    std::span<T> incoming(std::size_t s, block_range b) const { return scratch[s % 2].first(b.size); }
    std::span<T> partial(std::size_t s, block_range b) const { return s == last_step ? out : scratch[s % 2].first(b.size); }
  };

  /// Block 0 is never smaller than any other block.
  static std::size_t largest_block(std::size_t count, std::size_t n) noexcept { return block_of(count, n, 0).size; }

  /// The ring reduce-scatter of 16-bit values, in float: the block sent at step 0 is
  /// widened (exactly) into scratch, every later contribution is widened as it is
  /// added (reduce_widened), partials travel and add as float, so the float result
  /// returned — this rank's block, avg divided — is the float reduction of the widened
  /// inputs, in the documented order, still to be rounded once. Scratch: two float
  /// blocks (8/n bytes per element). n ≥ 2.
  template <transport Channel, half_element T>
  std::span<const float> reduce_scatter_in_float(primitives<Channel>& step, const ring_view& ring,
                                                 std::span<const T> in, reduce_op op) {
    const std::size_t block = largest_block(in.size(), ring.size());
    if (step.on_device()) {
      // Kernels widen whole buffers: the input is widened first (exactly), then reduced
      // as float by the same ring in the same order — the same float sums as below.
      const std::span<float> values = scratch<float>(3, in.size());
      step.widen(in, values);
      const block_range mine = ring.block_at(in.size(), 0);
      // The last step reduces block `mine` in place: no other step reads it.
      out_of_place<float> buffers{values, mine.of(values), {scratch<float>(0, block), scratch<float>(1, block)},
                                  ring.size() - 2};
      ring_reduce_scatter<Channel, float>(step, ring, in.size(), op, buffers);
      return mine.of(values);
    }
    struct widening {
      std::span<const T> input;
      std::span<float> partials[2];  // step s receives and reduces into partials[s % 2]
      // Asked once, for the block step 0 sends: it goes where partial(−1) would be,
      // which step 0 leaves alone.
      std::span<const float> own(block_range b) const {
        const std::span<float> into = partials[1].first(b.size);
        execution::widen(b.of(input), into);
        return into;
      }
      std::span<const T> contribution(block_range b) const { return b.of(input); }
      std::span<float> incoming(std::size_t s, block_range b) const { return partials[s % 2].first(b.size); }
      std::span<float> partial(std::size_t s, block_range b) const { return partials[s % 2].first(b.size); }
    } buffers{in, {scratch<float>(0, block), scratch<float>(1, block)}};
    ring_reduce_scatter<Channel, float>(step, ring, in.size(), op, buffers);
    return buffers.partial(ring.size() - 2, ring.block_at(in.size(), 0));
  }

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

  std::vector<std::byte> scratch_[4];  // two blocks, single-copy's bounce buffer, widened input
  execution::device_memory<std::byte> device_scratch_[4];  // the same on the device
  int device_ordinal_ = -1;
  std::shared_ptr<void> staging_owner_;  // the transport's shared memory behind staging_
  std::span<std::byte> staging_;
  bool staging_refused_ = false;
  std::unique_ptr<device_staging> device_stage_;
};

}  // namespace qcoll::algorithms
