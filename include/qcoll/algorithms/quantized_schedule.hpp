#pragma once
/// @file
/// One form for every quantized collective: a plan compiles its algorithm, once, into
/// a quantized_schedule — this rank's list of step verbs (post a receive, encode,
/// send, complete a receive, decode, average, complete a send), each naming its
/// peer, its values, its frame and its request slot — and one function runs any
/// schedule (run_schedule). The compressed allreduce and the grid allreduce differ
/// only in how they build their schedule (compressed_allreduce.hpp,
/// grid_allreduce.hpp); a new quantized collective adds a builder and nothing else.
///
/// The schedule is plain data, non-template (only byte and value ranges): built and
/// inspected without a quantizer or a transport. The state a plan owns around it
/// (quantized_state<Q>) holds the quantizer, the residuals and the frame buffers.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/quantized_steps.hpp>
#include <qcoll/algorithms/value_view.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/optimizers/owner_update.hpp>
#include <qcoll/reproducible/sum.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace qcoll {

/// What one call of a quantized allreduce moved, as counted by the algorithm:
/// payload bytes handed to the transport (the transport's own framing, 40 bytes per
/// message on shm and TCP, is not included).
struct call_statistics {
  std::size_t bytes_sent = 0;
  std::size_t bytes_received = 0;
  std::size_t messages_sent = 0;
  std::size_t messages_received = 0;
  /// Plans on device memory: where this rank's call waited, by the host's clock — for
  /// the device to encode a frame and copy it to the host before sending it, for the
  /// transport (completing receives and sends), and at the end for the last decodes
  /// and copies. What the device did while the host was busy elsewhere is not in them.
  /// Zero on host plans.
  std::chrono::nanoseconds device_wait{0};
  std::chrono::nanoseconds transport_wait{0};
  std::chrono::nanoseconds device_tail{0};
};

}  // namespace qcoll

namespace qcoll::algorithms {

/// The three byte buffers a schedule's frames live in.
enum class frame_buffer : std::uint8_t {
  outgoing,  ///< this rank's encodes of its own values (to send, or to decode itself)
  incoming,  ///< frames received to be added (or passed on as they are)
  results,   ///< the frames of the result, which every rank decodes
};

/// A frame: `bytes` bytes at `offset` of one of the buffers.
struct frame_slice {
  frame_buffer buffer = frame_buffer::outgoing;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

enum class step_verb : std::uint8_t {
  post_receive,      ///< post a receive of `frame` from `peer`, into request `request`
  encode,            ///< encode `values` (of the input, or of the output) into `frame`, with error feedback
  send,              ///< post a send of `frame` to `peer`, and move what is queued
  complete_receive,  ///< wait for request `request`'s receive from `peer`
  decode,            ///< decode `frame` from `peer` into `values` of the output (or add it), or into the scratch
  average,           ///< avg only: divide `values` of the output by the schedule's divisor
  update,            ///< apply the owner's update rule to `values` of the output (state at `residual_offset`)
  sum_on_grid,       ///< `values` of the output = their sum with `addends` − 1 scratch slots, on one grid
                     ///< per block of reproducible_block values from values.offset (docs/reproducibility.md)
  complete_send,     ///< wait for request `request`'s send to `peer`
};

struct schedule_step {
  step_verb verb = step_verb::encode;
  bool from_input = false;  ///< encode: read the input (else the output, the work buffer)
  bool accumulate = false;  ///< decode: add to the output instead of overwriting it
  bool into_scratch = false;  ///< decode: into the scratch at `scratch_offset` instead of the output
  transports::tag_t tag = 0;
  rank_t peer = 0;          ///< communicator rank; decode: whose frame it is (for errors)
  block_range values{};     ///< of the whole buffer
  frame_slice frame{};
  std::size_t residual_offset = 0;  ///< encode: where its part of the residual starts (update: of the owner's state)
  std::size_t sequence = 0;         ///< encode: its index in the call's stochastic-rounding sequence
  std::size_t memory_offset = 0;    ///< encode: where its part of the quantizer's memory starts (if it keeps one)
  std::size_t request = 0;          ///< post_receive, send, complete_*: the request slot
  std::size_t scratch_offset = 0;   ///< decode into_scratch; sum_on_grid: its first scratch slot's values
  std::size_t addends = 0;          ///< sum_on_grid: the output's values and addends − 1 slots
};

/// This rank's part of one call of a quantized collective, in the order it runs.
/// Receives are posted before anything waits, and every rank's waits are for what
/// an earlier step (of any rank) sent, so no two ranks wait for each other.
struct quantized_schedule {
  std::vector<schedule_step> steps;
  std::size_t buffer_bytes[3] = {0, 0, 0};  ///< by frame_buffer
  std::size_t residual_values = 0;          ///< values of residual the encodes use
  std::size_t owner_state_values = 0;       ///< values of state the update steps use
  std::size_t memory_values = 0;            ///< values of quantizer memory the encodes use (remembers_between_encodes)
  std::size_t requests = 0;                 ///< request slots the steps name
  std::size_t scratch_values = 0;           ///< values of scratch decodes may go to
  std::size_t scratch_stride = 0;           ///< sum_on_grid: from one scratch slot to the next
  /// Encode i of call c draws its stochastic rounding at sequence c · stride + i.
  std::size_t sequence_stride = 1;
  std::size_t divisor = 1;       ///< what avg divides by
  bool input_to_output = false;  ///< the output is the work buffer: it starts as the input

  /// Payload bytes the send steps move.
  std::size_t bytes_sent() const noexcept {
    std::size_t total = 0;
    for (const schedule_step& s : steps)
      if (s.verb == step_verb::send) total += s.frame.bytes;
    return total;
  }

  // ---- what builders write with ----

  /// A new request slot.
  std::size_t new_request() noexcept { return requests++; }
  /// Room for `bytes` more bytes in `buffer`.
  frame_slice new_frame(frame_buffer buffer, std::size_t bytes) noexcept {
    const frame_slice f{buffer, buffer_bytes[static_cast<int>(buffer)], bytes};
    buffer_bytes[static_cast<int>(buffer)] += bytes;
    return f;
  }
  /// Room for `values` more values of residual; returns where it starts.
  std::size_t new_residual(std::size_t values) noexcept {
    residual_values += values;
    return residual_values - values;
  }

  void post_receive(std::size_t request, rank_t from, transports::tag_t tag, frame_slice frame) {
    steps.push_back({.verb = step_verb::post_receive, .tag = tag, .peer = from, .frame = frame, .request = request});
  }
  void encode(block_range values, bool from_input, std::size_t residual_offset, std::size_t sequence,
              frame_slice frame) {
    steps.push_back({.verb = step_verb::encode, .from_input = from_input, .values = values, .frame = frame,
                     .residual_offset = residual_offset, .sequence = sequence});
  }

  /// Gives every encode a part of its own of the quantizer's memory, in step order:
  /// memory_size(n) values for an encode of n values (encode_memory_size).
  template <class MemorySize>
  void give_encodes_memory(MemorySize&& memory_size) {
    memory_values = 0;
    for (schedule_step& s : steps)
      if (s.verb == step_verb::encode) {
        s.memory_offset = memory_values;
        memory_values += memory_size(s.values.size);
      }
  }
  void send(std::size_t request, rank_t to, transports::tag_t tag, frame_slice frame) {
    steps.push_back({.verb = step_verb::send, .tag = tag, .peer = to, .frame = frame, .request = request});
  }
  void complete_receive(std::size_t request, rank_t from, frame_slice frame) {
    steps.push_back({.verb = step_verb::complete_receive, .peer = from, .frame = frame, .request = request});
  }
  void decode(frame_slice frame, rank_t from, block_range into, bool accumulate) {
    steps.push_back({.verb = step_verb::decode, .accumulate = accumulate, .peer = from, .values = into, .frame = frame});
  }
  void decode_to_scratch(frame_slice frame, rank_t from, block_range values, std::size_t scratch_offset) {
    steps.push_back({.verb = step_verb::decode, .into_scratch = true, .peer = from, .values = values, .frame = frame,
                     .scratch_offset = scratch_offset});
  }
  void sum_on_grid(block_range values, std::size_t first_slot, std::size_t addends) {
    steps.push_back({.verb = step_verb::sum_on_grid, .values = values, .scratch_offset = first_slot, .addends = addends});
  }
  void average(block_range values) { steps.push_back({.verb = step_verb::average, .values = values}); }
  void update(block_range values, std::size_t state_offset) {
    steps.push_back({.verb = step_verb::update, .values = values, .residual_offset = state_offset});
  }
  void complete_send(std::size_t request, rank_t to, frame_slice frame) {
    steps.push_back({.verb = step_verb::complete_send, .peer = to, .frame = frame, .request = request});
  }
};

/// Everything a quantized plan owns on one rank: the quantizer, the compiled
/// schedule, both residuals (committed and staging), the owner's update rule and
/// its state, and the frame buffers, in the memory space `Space` — host memory here;
/// device memory in device_schedule.hpp's specialisation. Built once; a call
/// allocates nothing.
template <quantizer Q, execution::memory_space_tag Space = execution::host_space>
struct quantized_state {
  static_assert(std::same_as<Space, execution::host_space>,
                "a plan's state on device memory is algorithms/device_schedule.hpp's; include it");
  using value_type = typename Q::value_type;

  Q quantizer;
  quantized_schedule schedule;
  owner_update<value_type> update;
  // Residuals double-buffered: a call encodes from the committed residual into the
  // staging one and swaps them only once the whole call succeeded (failure atomicity).
  // The owner's state is kept the same way, under the same index.
  std::vector<value_type> residual[2];
  std::vector<value_type> owner_state[2];
  std::vector<value_type> memory[2];  // the quantizer's, if it remembers between encodes
  unsigned committed = 0;
  std::uint64_t calls = 0;  // successful calls: keys stochastic rounding
  std::vector<std::byte> buffers[3];
  std::vector<value_type> scratch;                     // decoded frames a sum_on_grid adds
  std::vector<std::span<const value_type>> addends;   // a sum_on_grid's, kept to allocate nothing
  call_statistics last_call{};

  /// Sizes the residuals, the memory and the buffers for `schedule` (residuals start
  /// at zero); gives its encodes their memory.
  void install(quantized_schedule compiled) {
    schedule = std::move(compiled);
    schedule.give_encodes_memory([&](std::size_t n) { return encode_memory_size(quantizer, n); });
    for (auto& r : residual) r.assign(Q::keeps_residual ? schedule.residual_values : 0, value_type{});
    for (auto& o : owner_state) o.assign(schedule.owner_state_values, value_type{});
    forget_memory();
    for (int b = 0; b < 3; ++b) buffers[b].assign(schedule.buffer_bytes[b], std::byte{});
    scratch.assign(schedule.scratch_values, value_type{});
    addends.clear();
    for (const schedule_step& s : schedule.steps)
      if (s.verb == step_verb::sum_on_grid) addends.reserve(s.addends);
    committed = 0;
    calls = 0;
  }

  /// A fresh quantizer memory: NaN, which the quantizer reads as "none yet".
  void forget_memory() {
    for (auto& m : memory) m.assign(schedule.memory_values, std::numeric_limits<value_type>::quiet_NaN());
  }

  std::span<std::byte> frame(const frame_slice& f) noexcept {
    return std::span(buffers[static_cast<int>(f.buffer)]).subspan(f.offset, f.bytes);
  }
  /// The committed residual.
  std::span<const value_type> committed_residual() const noexcept { return residual[committed]; }
};

/// Runs one call of `state`'s schedule. A failure aborts the communicator and
/// throws, from whichever step found it.
template <transport Transport, quantizer Q>
void run_schedule(primitives<Transport>& step, quantized_state<Q, execution::host_space>& state,
                  std::span<typename Transport::request> requests, value_view<const typename Q::value_type> in,
                  value_view<typename Q::value_type> out, reduce_op op) {
  using T = typename Q::value_type;
  const quantized_schedule& schedule = state.schedule;
  call_statistics& counted = state.last_call;
  counted = {};
  if (schedule.input_to_output && !in.same_as(out)) in.copy_to(out);
  for (const schedule_step& s : schedule.steps) {
    switch (s.verb) {
      case step_verb::post_receive: step.post_recv(requests[s.request], s.peer, s.tag, state.frame(s.frame)); break;
      case step_verb::encode:
        staged_encode(state.quantizer, s.from_input ? in.of(s.values) : std::span<const T>(out.of(s.values)),
                      state.residual, state.memory, state.committed, {s.residual_offset, s.values.size},
                      s.memory_offset, state.frame(s.frame),
                      {state.calls * schedule.sequence_stride + s.sequence, s.values.offset});
        break;
      case step_verb::send:
        step.post_send(requests[s.request], s.peer, s.tag, std::span<const std::byte>(state.frame(s.frame)));
        counted.bytes_sent += s.frame.bytes;
        ++counted.messages_sent;
        step.poll(requests[s.request]);  // moves what is queued while this rank computes
        break;
      case step_verb::complete_receive:
        step.complete_recv(requests[s.request], s.peer, s.frame.bytes);
        counted.bytes_received += s.frame.bytes;
        ++counted.messages_received;
        break;
      case step_verb::decode:
        decode_or_fail(step, state.quantizer, state.frame(s.frame),
                       s.into_scratch ? block_range{s.scratch_offset, s.values.size}.of(std::span(state.scratch))
                                      : out.of(s.values),
                       s.accumulate, s.peer);
        break;
      case step_verb::sum_on_grid: {
        const std::span<T> sum = out.of(s.values);
        state.addends.assign(1, sum);
        for (std::size_t k = 1; k < s.addends; ++k)
          state.addends.push_back(block_range{s.scratch_offset + (k - 1) * schedule.scratch_stride, s.values.size}.of(
              std::span<const T>(state.scratch)));
        detail::reproducible::sum_here<T>(state.addends, sum, reduce_op::sum);
        break;
      }
      case step_verb::average:
        if (op == reduce_op::avg) execution::finish_avg(out.of(s.values), schedule.divisor);
        break;
      case step_verb::update: {
        const block_range at{s.residual_offset, s.values.size * state.update.state_per_value()};
        state.update({out.of(s.values), at.of(std::span<const T>(state.owner_state[state.committed])),
                      at.of(std::span<T>(state.owner_state[1 - state.committed])), s.values.offset, state.calls});
        break;
      }
      case step_verb::complete_send: step.complete_send(requests[s.request], s.peer, s.frame.bytes); break;
    }
  }
}

}  // namespace qcoll::algorithms
