#pragma once
/// @file
/// Quantized schedules on device memory: a plan's state kept on a GPU, and the runner
/// of its schedule there. The schedule is the host plan's, step for step
/// (quantized_schedule.hpp); what differs is where each verb runs:
///   encode         the device encodes into the frame's device copy, which is then
///                  copied to its pinned host copy, an event after it;
///   send           waits for that event, then hands the pinned copy to the transport
///                  (only frames cross to the host: one_bit's are 32× smaller than the
///                  values);
///   post/complete  receives land in the frame's pinned copy, which is then copied to
///   receive        the device;
///   decode         the device checks and decodes the frame into the values (its
///                  verdict copied to pinned memory), average divides there.
/// Over a transport that moves device memory (cuda_peer) the frames stay on the device:
/// a send hands the transport the frame itself once its encode has run, and a receive
/// lands in it (the transport completes a receive once its copies have run).
/// Everything of the device is queued, in schedule order, on the plan's own stream:
/// the host waits only where the transport needs bytes (a send), so encoding chunk
/// k + 1 overlaps sending chunk k. A decode's verdict is read before the next send —
/// whose event implies it ran — and at the end, so a frame that does not decode fails
/// the call before anything computed from it leaves this rank, as on the host.
///
/// A call works in place on the plan's device buffer of the call's values (`work`): the
/// input is copied (16-bit: widened) in first, and the result copied (rounded) out only
/// once the call succeeded — so a failed call leaves the output, the residuals and the
/// quantizer's memory as they were.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/quantized_schedule.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/optimizers/owner_update.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <utility>
#include <vector>

namespace qcoll::algorithms {

/// A quantizer whose encode and decode run on a device runtime (framed quantizers:
/// queue_encode and queue_decode).
template <class Q>
concept device_quantizer =
    quantizer<Q> && requires(const Q& q, const device::runtime& runtime, device::stream_handle stream,
                             std::span<const typename Q::value_type> in, std::span<typename Q::value_type> out,
                             std::span<std::byte> frame, std::span<const std::byte> received, std::uint32_t* status,
                             quantizers::encode_position position) {
      { q.queue_encode(runtime, stream, in, in, out, frame, position) } -> std::same_as<int>;
      { q.queue_decode(runtime, stream, received, out, true, status) } -> std::same_as<int>;
    };

/// The device's part of a quantized plan: as quantized_state<Q> (residuals committed
/// and staging, the quantizer's memory, frames), in device memory of one device, plus
/// the pinned host copies of the frames, a status word per decode, an event per
/// encode, and the plan's stream. Made once, at plan creation.
template <quantizer Q>
struct quantized_state<Q, execution::device_space> {
  static_assert(device_quantizer<Q>, "a plan on device memory needs a quantizer with device kernels (queue_encode, "
                                     "queue_decode: qcoll's quantizers have them)");
  using value_type = typename Q::value_type;

  static constexpr std::size_t no_wait = std::numeric_limits<std::size_t>::max();

  Q quantizer;
  quantized_schedule schedule;
  owner_update<value_type> update;  // refused on device plans: stays empty
  const device::runtime* runtime = nullptr;
  int ordinal = -1;
  execution::device_stream_owner stream;
  execution::device_memory<value_type> residual[2];
  execution::device_memory<value_type> memory[2];  // the quantizer's, if it remembers between encodes
  std::vector<value_type> owner_state[2];          // none: owner updates run on the host
  execution::device_memory<std::byte> frames[3];   // by frame_buffer
  execution::pinned_memory<std::byte> staged[3];   // the frames' host copies, what the transport moves
  execution::device_memory<value_type> work;       // the call's values, in place
  execution::device_memory<value_type> scratch;    // decoded frames a sum_on_grid adds
  execution::device_memory<double> grid;           // a sum_on_grid's exponents and carriers
  execution::device_memory<double> empty_blocks;   // grid::empty_block, a sum's exponents' start
  std::vector<std::span<const value_type>> addends;  // a sum_on_grid's, kept to allocate nothing
  execution::device_memory<std::uint32_t> statuses;  // one per decode step
  execution::pinned_memory<std::uint32_t> verdicts;  // their copies, read by the host
  std::vector<execution::device_event> downloads;    // one per encode step: its frame is on the host
  std::vector<std::size_t> decode_peers;             // whose frame each decode step decodes
  std::vector<std::size_t> decodes_before;           // per encode: decode steps queued before it
  std::vector<std::size_t> send_waits_for;           // per step: for a send, the encode whose copy it waits for
  execution::device_event entry, exit, ready;        // ready: recorded when a call was started
  unsigned committed = 0;
  std::uint64_t calls = 0;
  call_statistics last_call{};

  /// The device of `where`'s stream (the current device for the null stream) holds the state.
  void bind(execution::device_stream where) {
    runtime = &execution::device_runtime("a plan on device memory");
    if (const int failed = runtime->stream_device(where.stream, &ordinal))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "a plan on device memory: the stream is not a stream of the {} device runtime ({})",
                                 runtime->name, runtime->error_string(failed));
    on_device([&] {
      stream = execution::device_stream_owner("a plan on device memory");
      ready = execution::device_event("a plan on device memory");
    });
  }

  /// Sizes everything for `compiled` on the bound device: residuals zero, memory fresh.
  void install(quantized_schedule compiled) {
    if (update)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "a plan on device memory takes no owner update rule (rules run on the host)");
    schedule = std::move(compiled);
    schedule.give_encodes_memory([&](std::size_t n) { return encode_memory_size(quantizer, n); });
    // Which download each send waits for: the last of any frame inside its message (a
    // fused chunk's message is several frames); none for a frame that was received.
    std::size_t encodes = 0, decodes = 0, values = 0, summed = 0, most_addends = 0;
    std::map<std::pair<int, std::size_t>, std::size_t> encoded;  // (buffer, offset) -> encode index
    decode_peers.clear();
    decodes_before.clear();
    send_waits_for.assign(schedule.steps.size(), no_wait);
    for (std::size_t i = 0; i < schedule.steps.size(); ++i) {
      const schedule_step& s = schedule.steps[i];
      const int buffer = static_cast<int>(s.frame.buffer);
      if (s.verb == step_verb::encode) {
        decodes_before.push_back(decodes);
        encoded[{buffer, s.frame.offset}] = encodes++;
      } else if (s.verb == step_verb::decode) {
        ++decodes;
        decode_peers.push_back(s.peer);
      } else if (s.verb == step_verb::send) {
        for (auto it = encoded.lower_bound({buffer, s.frame.offset});
             it != encoded.end() && it->first.first == buffer && it->first.second < s.frame.offset + s.frame.bytes; ++it)
          send_waits_for[i] = send_waits_for[i] == no_wait ? it->second : std::max(send_waits_for[i], it->second);
      } else if (s.verb == step_verb::complete_receive) {
        // A frame received into a range forgets the encodes that once filled it.
        encoded.erase(encoded.lower_bound({buffer, s.frame.offset}),
                      encoded.lower_bound({buffer, s.frame.offset + s.frame.bytes}));
      }
      if (s.verb == step_verb::encode || (s.verb == step_verb::decode && !s.into_scratch) ||
          s.verb == step_verb::average || s.verb == step_verb::sum_on_grid)
        values = std::max(values, s.values.offset + s.values.size);
      if (s.verb == step_verb::sum_on_grid) {
        summed = std::max(summed, s.values.size);
        most_addends = std::max(most_addends, s.addends);
      }
    }
    on_device([&] {
      for (auto& r : residual) r = execution::device_memory<value_type>(Q::keeps_residual ? schedule.residual_values : 0);
      for (auto& m : memory) m = execution::device_memory<value_type>(schedule.memory_values);
      for (int b = 0; b < 3; ++b) {
        frames[b] = execution::device_memory<std::byte>(schedule.buffer_bytes[b]);
        staged[b] = execution::pinned_memory<std::byte>(schedule.buffer_bytes[b]);
      }
      work = execution::device_memory<value_type>(values);
      scratch = execution::device_memory<value_type>(schedule.scratch_values);
      grid = execution::device_memory<double>(detail::reproducible::device_scratch_doubles<value_type>(summed));
      empty_blocks = execution::device_memory<double>((summed + reproducible_block - 1) / reproducible_block);
      statuses = execution::device_memory<std::uint32_t>(decodes);
      verdicts = execution::pinned_memory<std::uint32_t>(decodes);
      downloads.clear();
      for (std::size_t e = 0; e < encodes; ++e) downloads.emplace_back("a plan on device memory");
      entry = execution::device_event("a plan on device memory");
      exit = execution::device_event("a plan on device memory");
    });
    for (auto& r : residual) fill(r.span(), value_type{});
    if (!empty_blocks.span().empty()) {
      const std::vector<double> empty(empty_blocks.size(), kernels::grid_detail::empty_block);
      copy_and_wait(empty_blocks.data(), empty.data(), empty_blocks.span().size_bytes());
    }
    addends.clear();
    addends.reserve(most_addends);
    forget_memory();
    committed = 0;
    calls = 0;
  }

  /// The work buffer holds the call's values from `count` on (a plan sizes it from its schedule).
  void reserve_work(std::size_t count) {
    if (work.size() < count) on_device([&] { work = execution::device_memory<value_type>(count); });
  }

  /// A fresh quantizer memory: NaN, which the quantizer reads as "none yet".
  void forget_memory() {
    for (auto& m : memory) fill(m.span(), std::numeric_limits<value_type>::quiet_NaN());
  }
  /// Every value of `values` (device memory of this state) = `value`; waits for it.
  void fill(std::span<value_type> values, value_type value) {
    if (values.empty()) return;
    const std::vector<value_type> host(values.size(), value);
    copy_and_wait(values.data(), host.data(), values.size_bytes());
  }
  /// Copies host memory to the device (or back) on the state's stream, and waits for it.
  void copy_and_wait(void* to, const void* from, std::size_t bytes) {
    execution::check_device(*runtime, runtime->copy(to, from, bytes, stream.get()), "a plan on device memory");
    execution::check_device(*runtime, runtime->synchronize(stream.get()), "a plan on device memory");
  }

  std::span<std::byte> frame(const frame_slice& f) const noexcept {
    return frames[static_cast<int>(f.buffer)].span().subspan(f.offset, f.bytes);
  }
  std::span<std::byte> staged_frame(const frame_slice& f) const noexcept {
    return staged[static_cast<int>(f.buffer)].span().subspan(f.offset, f.bytes);
  }
  /// The committed residual (device memory).
  std::span<const value_type> committed_residual() const noexcept { return residual[committed].span(); }

 private:
  /// Runs `make` with the state's device current (its memory, streams and events belong there).
  template <class Make>
  void on_device(Make&& make) {
    execution::with_current_device(*runtime, ordinal, std::forward<Make>(make));
  }
};

/// Runs one call of `state`'s schedule on its device, in place on state.work (which
/// holds the call's input). Queues everything on the state's stream, which must
/// already be ordered after the caller's work; returns once every decode's verdict has
/// been read (the schedule's device work has run). A failure aborts the communicator
/// and throws, from whichever step found it.
template <transport Transport, quantizer Q>
void run_schedule(primitives<Transport>& step, quantized_state<Q, execution::device_space>& state,
                  std::span<typename Transport::request> requests, reduce_op op) {
  using T = typename Q::value_type;
  // Where the transport takes and leaves frames: their device copies, or the pinned ones.
  constexpr bool frames_on_device = moves_device_memory<Transport>;
  const auto wire_frame = [&](const frame_slice& f) {
    if constexpr (frames_on_device) return state.frame(f);
    else return state.staged_frame(f);
  };
  const device::runtime& runtime = *state.runtime;
  const device::stream_handle stream = state.stream.get();
  const quantized_schedule& schedule = state.schedule;
  call_statistics& counted = state.last_call;
  counted = {};
  const auto device_failed = [&](int code, const char* what) {
    step.fail(errc::device_error, "{}: {} error {}: {}", what, runtime.name, code, runtime.error_string(code));
  };
  const auto queued = [&](int code, const char* what) {
    if (code != 0) device_failed(code, what);
  };
  const std::span<T> values = state.work.span();
  std::size_t encodes = 0, decodes = 0, verdicts_read = 0;
  const auto read_verdicts = [&](std::size_t upto) {
    for (; verdicts_read < upto; ++verdicts_read)
      if (const std::uint32_t verdict = state.verdicts.data()[verdicts_read])
        step.fail(errc::protocol_error, "a frame from rank {} does not decode as values of {}: {}",
                  state.decode_peers[verdicts_read], Q::name, make_error_code(static_cast<errc>(verdict)).message());
  };
  for (std::size_t i = 0; i < schedule.steps.size(); ++i) {
    const schedule_step& s = schedule.steps[i];
    switch (s.verb) {
      case step_verb::post_receive: step.post_recv(requests[s.request], s.peer, s.tag, wire_frame(s.frame)); break;
      case step_verb::encode: {
        const block_range at{s.residual_offset, s.values.size};
        const std::span<const T> in = values.subspan(s.values.offset, s.values.size);
        const std::span<std::byte> frame = state.frame(s.frame);
        const quantizers::encode_position position{state.calls * schedule.sequence_stride + s.sequence, s.values.offset};
        std::span<const T> residual_in;
        std::span<T> residual_out;
        if constexpr (Q::keeps_residual) {
          residual_in = at.of(std::span<const T>(state.residual[state.committed].span()));
          residual_out = at.of(state.residual[1 - state.committed].span());
        }
        int code = 0;
        if constexpr (remembers_between_encodes<Q> && Q::keeps_residual) {
          const block_range kept{s.memory_offset, state.quantizer.memory_size(s.values.size)};
          code = state.quantizer.queue_encode(runtime, stream, in, residual_in, residual_out,
                                              kept.of(std::span<const T>(state.memory[state.committed].span())),
                                              kept.of(state.memory[1 - state.committed].span()), frame, position);
        } else {
          code = state.quantizer.queue_encode(runtime, stream, in, residual_in, residual_out, frame, position);
        }
        queued(code, "encoding on the device");
        if constexpr (!frames_on_device) {
          const std::span<std::byte> host = state.staged_frame(s.frame);
          queued(runtime.copy(host.data(), frame.data(), frame.size(), stream), "copying a frame to the host");
        }
        queued(runtime.event_record(state.downloads[encodes++].get(), stream), "recording a frame's copy");
        break;
      }
      case step_verb::send: {
        if (const std::size_t last = state.send_waits_for[i]; last != state.no_wait) {
          const auto waited = clock::now();
          queued(runtime.event_synchronize(state.downloads[last].get()), "copying a frame to the host");
          counted.device_wait += clock::now() - waited;
          read_verdicts(state.decodes_before[last]);  // what this frame was computed from decoded well
        }
        step.post_send(requests[s.request], s.peer, s.tag, std::span<const std::byte>(wire_frame(s.frame)));
        counted.bytes_sent += s.frame.bytes;
        ++counted.messages_sent;
        step.poll(requests[s.request]);
        break;
      }
      case step_verb::complete_receive: {
        const auto waited = clock::now();
        step.complete_recv(requests[s.request], s.peer, s.frame.bytes);
        counted.transport_wait += clock::now() - waited;
        counted.bytes_received += s.frame.bytes;
        ++counted.messages_received;
        if constexpr (!frames_on_device) {
          const std::span<std::byte> frame = state.frame(s.frame);
          queued(runtime.copy(frame.data(), state.staged_frame(s.frame).data(), frame.size(), stream),
                 "copying a frame to the device");
        }
        break;
      }
      case step_verb::decode: {
        std::uint32_t* status = state.statuses.data() + decodes;
        const std::span<T> into = s.into_scratch ? state.scratch.span().subspan(s.scratch_offset, s.values.size)
                                                  : values.subspan(s.values.offset, s.values.size);
        queued(state.quantizer.queue_decode(runtime, stream, state.frame(s.frame), into, s.accumulate, status),
               "decoding on the device");
        queued(runtime.copy(state.verdicts.data() + decodes, status, sizeof *status, stream), "reading a decode's verdict");
        ++decodes;
        break;
      }
      case step_verb::average:
        if (op == reduce_op::avg && s.values.size != 0)
          queued(runtime.divide(dtype_of<T>::value, values.data() + s.values.offset, s.values.size, schedule.divisor,
                                stream),
                 "averaging on the device");
        break;
      case step_verb::sum_on_grid: {
        const std::span<T> sum = values.subspan(s.values.offset, s.values.size);
        state.addends.assign(1, sum);
        for (std::size_t k = 1; k < s.addends; ++k)
          state.addends.push_back(
              state.scratch.span().subspan(s.scratch_offset + (k - 1) * schedule.scratch_stride, s.values.size));
        try {
          detail::reproducible::queue_sum_here<T>({stream}, state.addends, sum, state.grid.span(),
                                                  state.empty_blocks.span());
        } catch (const std::exception& e) {
          step.fail(errc::device_error, "summing on the grid on the device: {}", e.what());
        }
        break;
      }
      case step_verb::update:
        step.fail(errc::invalid_argument, "internal error: an owner update on a plan on device memory");
      case step_verb::complete_send: {
        const auto waited = clock::now();
        step.complete_send(requests[s.request], s.peer, s.frame.bytes);
        counted.transport_wait += clock::now() - waited;
        break;
      }
    }
  }
  const auto waited = clock::now();
  queued(runtime.event_record(state.exit.get(), stream), "finishing on the device");
  queued(runtime.event_synchronize(state.exit.get()), "finishing on the device");
  counted.device_tail = clock::now() - waited;
  read_verdicts(decodes);
}

}  // namespace qcoll::algorithms
