#pragma once
/// @file
/// The pipelined ring phase: a phase of ring steps cut into slices, each its own
/// message, so the link stays busy from one step to the next (primitives::ring_phase,
/// which ring.hpp's reduce-scatter and all-gather call). Apart from the step verbs
/// because it is a schedule, not a verb: it decides when each slice of each step is
/// posted and completed, and does all of it through a call's primitives (post_send,
/// post_recv, poll, complete_send, complete_recv, fail, abandon), as NCCL's ring
/// scripts drive its Primitives.

#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <deque>
#include <span>
#include <system_error>
#include <vector>

namespace qcoll::algorithms {

/// The most receives a ring pipeline keeps posted ahead (primitives::slice_reductions
/// clamps its in-flight count to it).
inline constexpr std::size_t max_ring_slices_in_flight = 8;

namespace ring_detail {  // not `detail`: that would hide qcoll::detail from this namespace

/// A step's `count` elements as slices of `slice` (one slice when fewer than two fit).
struct slicing {
  slicing(std::size_t elements, std::size_t slice_elements)
      : size(slice_elements == 0 || elements < 2 * slice_elements ? elements : slice_elements),
        count(size == 0 ? 1 : (elements + size - 1) / size) {}
  template <class U>
  std::span<U> of(std::span<U> whole, std::size_t k) const {
    const std::size_t offset = std::min(k * size, whole.size());
    return whole.subspan(offset, std::min(size, whole.size() - offset));
  }
  std::size_t size;
  std::size_t count;
};

}  // namespace ring_detail

/// primitives::ring_phase on `step` (a call's primitives), its messages tagged `tag`,
/// in slices of `slice_bytes` (0: whole steps) with up to `in_flight` receives posted
/// (1 to max_ring_slices_in_flight). Slice k of step s leaves as soon as slice k of
/// step s − 1 has arrived (the ring's data dependence), not when the whole step has;
/// slice k of step s is received only once this rank is done with slice k of step
/// s − 1 both ways. Receives are posted up to the in-flight count ahead; sends
/// whenever their data is there (a send window could hold a sender back while its
/// peer waits for exactly that send). On a failure every request still posted is
/// abandoned before the exception leaves.
template <class T, class Steps, class Outgoing, class Incoming, class Arrived>
void run_ring_pipeline(Steps& step, transports::tag_t tag, rank_t to, rank_t from, std::size_t steps,
                       std::size_t slice_bytes, std::size_t in_flight, Outgoing&& outgoing, Incoming&& incoming,
                       Arrived&& arrived) {
  using request = typename Steps::request;
  struct stream {  // one direction: which slices are posted and done
    std::vector<std::size_t> first_unit{0};  // first_unit[s]: slices of the steps before s
    std::size_t posted = 0, done = 0;
    std::size_t step_of_posted = 0;  // the step of the next slice to post
    std::size_t step_of_done = 0;    // the step of the oldest slice not done
  };
  const std::size_t slice = std::max<std::size_t>(1, slice_bytes / sizeof(T));
  const std::size_t window = in_flight;
  using ring_detail::slicing;
  const auto cut = [&](std::size_t elements) { return slicing(elements, slice); };
  std::vector<std::span<const T>> out_blocks;
  std::vector<std::span<T>> in_blocks;
  stream sends, receives;
  std::deque<request> send_requests;  // one per slice sent; a deque never moves them
  std::array<request, max_ring_slices_in_flight> receive_requests;
  // A slice done in either direction; false when the oldest is still pending.
  const auto finish_oldest_receive = [&](bool block) {
    request& r = receive_requests[receives.done % window];
    if (!block && !step.poll(r)) return false;
    while (receives.first_unit[receives.step_of_done + 1] <= receives.done) ++receives.step_of_done;
    const std::size_t s = receives.step_of_done, k = receives.done - receives.first_unit[s];
    const slicing pieces = cut(in_blocks[s].size());
    const std::span<T> landed = pieces.of(in_blocks[s], k);
    step.complete_recv(r, from, landed.size_bytes());
    ++receives.done;
    arrived(s, std::min(k * pieces.size, in_blocks[s].size()), landed.size());
    return true;
  };
  const auto finish_oldest_send = [&](bool block) {
    request& r = send_requests[sends.done];
    if (!block && !step.poll(r)) return false;
    while (sends.first_unit[sends.step_of_done + 1] <= sends.done) ++sends.step_of_done;
    const std::size_t s = sends.step_of_done, k = sends.done - sends.first_unit[s];
    step.complete_send(r, to, cut(out_blocks[s].size()).of(out_blocks[s], k).size_bytes());
    ++sends.done;
    return true;
  };
  // Whether step s − 1 is done up to element `end` in `st`: every slice of it that
  // starts before `end` (blocks of neighbouring steps may differ by an element, and
  // so in how they are cut, so slices are matched by elements, not by index).
  const auto done_before = [&](const stream& st, std::size_t s, std::size_t block_elements, std::size_t end) {
    if (st.first_unit.size() <= s) return false;  // step s − 1 not even posted
    const slicing pieces = cut(block_elements);
    const std::size_t last = end == 0 || pieces.size == 0 ? 0 : (end - 1) / pieces.size;
    return st.done > st.first_unit[s - 1] + std::min(last, st.first_unit[s] - st.first_unit[s - 1] - 1);
  };
  try {
    for (;;) {
      bool moved = false;
      while (sends.done < sends.posted && finish_oldest_send(false)) moved = true;
      while (receives.done < receives.posted && finish_oldest_receive(false)) moved = true;
      // Sends, in order, as their data arrives.
      while (sends.step_of_posted < steps) {
        const std::size_t s = sends.step_of_posted;
        if (out_blocks.size() == s) {
          out_blocks.push_back(outgoing(s));
          sends.first_unit.push_back(sends.first_unit[s] + cut(out_blocks[s].size()).count);
        }
        const std::size_t k = sends.posted - sends.first_unit[s];
        const slicing pieces = cut(out_blocks[s].size());
        const std::size_t end = std::min((k + 1) * pieces.size, out_blocks[s].size());
        if (s > 0 && (in_blocks.size() < s || !done_before(receives, s, in_blocks[s - 1].size(), end)))
          break;  // its data has not arrived
        step.post_send(send_requests.emplace_back(), to, tag, pieces.of(out_blocks[s], k));
        if (++sends.posted == sends.first_unit[s + 1]) ++sends.step_of_posted;
        moved = true;
      }
      // Receives, in order, once the previous step's slice is done with both ways.
      while (receives.step_of_posted < steps && receives.posted - receives.done < window) {
        const std::size_t s = receives.step_of_posted;
        if (in_blocks.size() == s) {
          in_blocks.push_back(incoming(s));
          receives.first_unit.push_back(receives.first_unit[s] + cut(in_blocks[s].size()).count);
        }
        const std::size_t k = receives.posted - receives.first_unit[s];
        const slicing pieces = cut(in_blocks[s].size());
        const std::size_t end = std::min((k + 1) * pieces.size, in_blocks[s].size());
        if (s > 0 && (!done_before(receives, s, in_blocks[s - 1].size(), end) ||
                      out_blocks.size() < s || !done_before(sends, s, out_blocks[s - 1].size(), end)))
          break;  // the previous step still uses these elements of the buffers
        step.post_recv(receive_requests[receives.posted % window], from, tag, pieces.of(in_blocks[s], k));
        if (++receives.posted == receives.first_unit[s + 1]) ++receives.step_of_posted;
        moved = true;
      }
      if (moved) continue;
      // Nothing to do but wait: for the oldest receive (it unblocks the most), else the oldest send.
      if (receives.done < receives.posted) finish_oldest_receive(true);
      else if (sends.done < sends.posted) finish_oldest_send(true);
      else break;  // everything posted has completed, and nothing is left to post
    }
    if (sends.step_of_posted < steps || receives.step_of_posted < steps)
      step.fail(errc::invalid_argument, "internal error: the ring pipeline stalled at step {} of {}",
                std::min(sends.step_of_posted, receives.step_of_posted), steps);
  } catch (const std::system_error& failure) {
    step.abandon(receive_requests, failure);
    for (request& r : send_requests) step.abandon(std::span<request>(&r, 1), failure);
    throw;
  }
}

}  // namespace qcoll::algorithms
