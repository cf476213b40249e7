#pragma once
/// @file
/// Sums that do not depend on the algorithm, the topology, the route, the transport, the
/// order of the ranks — or, through reproducible_accumulator, on how many ranks there are:
///
/// @code
/// qcoll::reproducible_allreduce(comm, std::span(gradients), qcoll::reduce_op::avg);
///
/// qcoll::reproducible_accumulator<float> acc(gradients.size());  // micro-batches:
/// for (auto& micro_batch : mine) acc.add(gradient_of(micro_batch));
/// acc.allreduce(comm, std::span(gradients), qcoll::reduce_op::avg);  // the same bits on 1 rank or 64
/// @endcode
///
/// How: integer addition is associative. Every rank agrees on a power-of-two grid per block
/// of `reproducible_block` values — 2^(e − P), e the smallest exponent with |x| < 2^e for
/// every finite addend x of the block, on every rank (one allreduce(max), order-free) — and
/// each addend becomes an integer on it, rounded to nearest (ties to even), one value at a
/// time. The integers travel as doubles whose sums are exact (below 2^53), so every
/// algorithm adds them to the same bits; the result is rounded once into the element type.
/// P = 30 for float, bfloat16 and float16 (each addend's error ≤ 2^(e − 31), below 2^−7
/// of a float ulp at the block's largest value; one integer-valued double per value),
/// P = 60 for double (two per value). At most 2^23 addends in all. Large sums are
/// reduce-scattered as integers and gathered as values: 1.5× a float allreduce's bytes.
/// docs/reproducibility.md states the guarantee, the error bound and the cost.

#include <qcoll/collective_handle.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/half.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/reproducible/sum.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace qcoll {

template <reproducible_element T>
class reproducible_grid_allreduce;

/// A rank's addends of one reproducible sum (its micro-batches' gradients, say), summed
/// with every other rank's by allreduce() onto one grid set by all of them: the result
/// depends only on the set of addends, not on how they are spread over ranks, nor on the
/// algorithm, topology or transport. The addends are kept (a copy each) until the sum,
/// because the grid depends on all of them.
template <reproducible_element T>
class reproducible_accumulator {
 public:
  explicit reproducible_accumulator(std::size_t count) : count_(count) {}

  std::size_t count() const noexcept { return count_; }
  /// Addends this rank holds.
  std::size_t addends() const noexcept { return kept_.size() / std::max<std::size_t>(count_, 1) + empty_adds_; }

  /// Keeps a copy of `values` (count() of them, host memory) as one addend.
  /// @throws qcoll::error (invalid_argument) for another size, or device memory.
  void add(std::span<const T> values) {
    if (values.size() != count_)
      detail::throw_error(errc::invalid_argument, "reproducible_accumulator::add: {} values for {}", values.size(),
                          count_);
    execution::require_space("reproducible_accumulator::add", execution::memory_space::host, {{"the values", values}});
    if (count_ == 0) ++empty_adds_;
    kept_.insert(kept_.end(), values.begin(), values.end());
  }
  void clear() noexcept {
    kept_.clear();
    empty_adds_ = 0;
  }

  /// out = the sum (or, avg, the mean) of every rank's addends, the same bits on every
  /// rank whatever the ranks, their number and order, the algorithm or the transport.
  /// Collective over `comm`; the addends are kept (clear() forgets them).
  /// @par Errors
  /// As comm's collectives (a rank that calls another collective or passes another size
  /// fails every rank); invalid_argument on every rank for ranks that pass different ops,
  /// an op other than sum and avg, more than reproducible_max_addends addends in all, or
  /// an avg of none; an `out` of another size than count() fails every rank (comm is
  /// aborted).
  template <class Communicator>
  void allreduce(Communicator& comm, std::span<T> out, reduce_op op) const {
    if (out.size() != count_)
      detail::reproducible::refuse(
          comm, qcoll::detail::format("reproducible_accumulator::allreduce on rank {}: an output of {} values for {}",
                                      comm.rank(), out.size(), count_));
    detail::reproducible::require_host(comm, "reproducible_accumulator::allreduce", std::span<const T>(),
                                       std::span<const T>(out));
    detail::reproducible::sum_over<T>(comm, views(), out, op);
  }

  /// Rank r receives block r (block_of(count(), size(), r)) of allreduce()'s result, the
  /// same bits, in `out` of exactly that block's size. Collective.
  /// @par Errors
  /// As allreduce(); an `out` of another size fails every rank (comm is aborted).
  template <class Communicator>
  void reduce_scatter(Communicator& comm, std::span<T> out, reduce_op op) const {
    const block_range mine = block_of(count_, comm.size(), comm.rank());
    if (out.size() != mine.size)
      detail::reproducible::refuse(
          comm, qcoll::detail::format("reproducible_accumulator::reduce_scatter on rank {}: an output of {} values for a block of {}",
                                      comm.rank(), out.size(), mine.size));
    detail::reproducible::require_host(comm, "reproducible_accumulator::reduce_scatter", std::span<const T>(),
                                       std::span<const T>(out));
    detail::reproducible::scatter_sum<T>(comm, views(), count_, op, out);
  }

  /// The same sum over this rank's addends alone: the bits allreduce() gives when every
  /// addend is here (a world of one rank).
  void sum(std::span<T> out, reduce_op op = reduce_op::sum) const {
    if (out.size() != count_)
      detail::throw_error(errc::invalid_argument, "reproducible_accumulator::sum: an output of {} values for {}",
                          out.size(), count_);
    detail::reproducible::sum_here<T>(views(), out, op);
  }

 private:
  friend class reproducible_grid_allreduce<T>;

  /// The addends, each a span of count() values.
  std::vector<std::span<const T>> views() const {
    std::vector<std::span<const T>> all(addends());
    for (std::size_t a = 0; a < all.size(); ++a)
      all[a] = count_ == 0 ? std::span<const T>() : std::span<const T>(kept_).subspan(a * count_, count_);
    return all;
  }

  std::size_t count_;
  std::vector<T> kept_;  // the addends end to end
  std::size_t empty_adds_ = 0;  // addends of no values (count() 0)
};

/// out = the sum (or average) of every rank's `in` on the shared grid: the same bits
/// whatever the algorithm, topology, route, transport or order of the ranks (for the same
/// number of ranks: to be independent of it too, sum the addends with a
/// reproducible_accumulator). Collective. `in` and `out` have the same size on every rank
/// and are the same range or disjoint. Errors as reproducible_accumulator::allreduce.
template <class Communicator, reproducible_element T>
void reproducible_allreduce(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
  if (in.size() != out.size())
    detail::reproducible::refuse(comm, qcoll::detail::format(
                                           "reproducible_allreduce on rank {}: an input of {} values and an output of {}",
                                           comm.rank(), in.size(), out.size()));
  detail::reproducible::require_host(comm, "reproducible_allreduce", in, std::span<const T>(out));
  const std::span<const T> addend[1] = {in};
  detail::reproducible::sum_over<T>(comm, std::span<const std::span<const T>>(addend), out, op);
}
template <class Communicator, reproducible_element T>
void reproducible_allreduce(Communicator& comm, std::span<T> data, reduce_op op) {
  reproducible_allreduce(comm, std::span<const T>(data), data, op);
}

/// reproducible_allreduce on device memory (docs/gpu.md): `in` and `out` live on the
/// device of `where`'s stream; the call runs after the work queued there before it and
/// returns once the result is in place, with the bits of the host call on the same
/// values. The conversions run on the device; the rounds are comm's device collectives
/// (GPU to GPU over cuda_peer, staged through pinned memory over host transports).
/// Every element type (double: its two carriers' planes, as on the host).
/// @par Errors
/// As the host call; a buffer in host memory or on another device, or no device
/// runtime, fails every rank (comm is aborted); device_error for a runtime failure.
template <class Communicator, reproducible_element T>
void reproducible_allreduce(Communicator& comm, execution::device_stream where, std::span<const T> in,
                            std::span<T> out, reduce_op op) {
  if (in.size() != out.size())
    detail::reproducible::refuse(comm, qcoll::detail::format(
                                           "reproducible_allreduce on rank {}: an input of {} values and an output of {}",
                                           comm.rank(), in.size(), out.size()));
  detail::reproducible::require_device(comm, "reproducible_allreduce", where, in, std::span<const T>(out));
  detail::reproducible::sum_on_device<T>(comm, where, in, out, op, true);
}
template <class Communicator, reproducible_element T>
void reproducible_allreduce(Communicator& comm, execution::device_stream where, std::span<T> data, reduce_op op) {
  reproducible_allreduce(comm, where, std::span<const T>(data), data, op);
}

/// Rank r receives block r (block_of(in.size(), size(), r)) of the reproducible sum (or
/// mean) of every rank's `in`: the bits of that block of reproducible_allreduce's result,
/// whatever the ranks' order. `out` has exactly that block's size; it may be exactly that
/// block of `in`, or disjoint from it. Collective.
/// @par Errors
/// As reproducible_allreduce; an `out` of another size aborts `comm` (every rank fails).
template <class Communicator, reproducible_element T>
void reproducible_reduce_scatter(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
  const block_range mine = block_of(in.size(), comm.size(), comm.rank());
  if (out.size() != mine.size)
    detail::reproducible::refuse(comm, qcoll::detail::format(
                                           "reproducible_reduce_scatter on rank {}: an output of {} values for a block of {}",
                                           comm.rank(), out.size(), mine.size));
  detail::reproducible::require_host(comm, "reproducible_reduce_scatter", in, std::span<const T>(out));
  const std::span<const T> addend[1] = {in};
  detail::reproducible::scatter_sum<T>(comm, std::span<const std::span<const T>>(addend), in.size(), op, out);
}

/// reproducible_reduce_scatter on device memory, as reproducible_allreduce's device form.
template <class Communicator, reproducible_element T>
void reproducible_reduce_scatter(Communicator& comm, execution::device_stream where, std::span<const T> in,
                                 std::span<T> out, reduce_op op) {
  const block_range mine = block_of(in.size(), comm.size(), comm.rank());
  if (out.size() != mine.size)
    detail::reproducible::refuse(comm, qcoll::detail::format(
                                           "reproducible_reduce_scatter on rank {}: an output of {} values for a block of {}",
                                           comm.rank(), out.size(), mine.size));
  detail::reproducible::require_device(comm, "reproducible_reduce_scatter", where, in, std::span<const T>(out));
  detail::reproducible::sum_on_device<T>(comm, where, in, out, op, false);
}

namespace detail::reproducible {
/// The blocking forms as plain functions, for started calls.
template <class Communicator, class T>
void allreduce_call(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
  reproducible_allreduce(comm, in, out, op);
}
template <class Communicator, class T>
void reduce_scatter_call(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
  reproducible_reduce_scatter(comm, in, out, op);
}
}  // namespace detail::reproducible

/// reproducible_allreduce and reproducible_reduce_scatter started on comm's progress
/// thread (communicator::start_composed): they return at once and `handle` finishes
/// them (handle.wait()); in start order with comm's other started calls. `in` and `out`
/// stay valid and untouched until wait() returns. Errors as the blocking forms, reported
/// by wait() (invalid_argument at once for a handle in flight).
template <class Communicator, reproducible_element T>
void start_reproducible_allreduce(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op,
                                  collective_handle& handle) {
  comm.start_composed(&detail::reproducible::allreduce_call<Communicator, T>, in, out, op, handle);
}
template <class Communicator, reproducible_element T>
void start_reproducible_allreduce(Communicator& comm, std::span<T> data, reduce_op op, collective_handle& handle) {
  start_reproducible_allreduce(comm, std::span<const T>(data), data, op, handle);
}
template <class Communicator, reproducible_element T>
void start_reproducible_reduce_scatter(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op,
                                       collective_handle& handle) {
  comm.start_composed(&detail::reproducible::reduce_scatter_call<Communicator, T>, in, out, op, handle);
}

}  // namespace qcoll
