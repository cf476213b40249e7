#pragma once
/// @file
/// reproducible_grid_allreduce<T>: the reproducible sum (qcoll/reproducible.hpp) over an
/// N-D mesh or torus, healthy or degraded, routed as grid_allreduce_plan routes it:
///
/// @code
/// namespace topo = qcoll::topologies;
/// const topo::grid_routing routing = topo::route_grid(topo::torus({4, 4}, faults));
/// qcoll::reproducible_grid_allreduce<float> sum(comm, routing, gradients.size());
/// sum.allreduce(comm, std::span(gradients), qcoll::reduce_op::avg);
/// @endcode
///
/// The result is the bits reproducible_allreduce gives over the included ranks alone:
/// the shape, the degraded set and the route change nothing. Both rounds run as grid
/// allreduce plans: the exponents' round through a plan whose frames combine by maximum,
/// the integers' round through an identity<double> plan (exact, so any route adds them
/// to the same bits).

#include <qcoll/grid_allreduce.hpp>
#include <qcoll/quantizers/framed.hpp>
#include <qcoll/quantizers/identity.hpp>
#include <qcoll/reproducible.hpp>

#include <cstddef>
#include <cstring>
#include <span>
#include <system_error>

namespace qcoll {

namespace detail::reproducible {

/// A lossless "quantizer" of doubles whose frames combine by maximum: a grid allreduce
/// plan of it computes the ranks' maximum along the plan's routes (a plan's every
/// combination of two contributions is a decode with accumulate). Host memory only;
/// for the exponents' round of a reproducible sum.
class maximum : public quantizers::detail::framed<maximum, double> {
 public:
  static constexpr const char* name = "maximum";
  static constexpr bool keeps_residual = false;
  constexpr double bits_per_value() const noexcept { return 64.0; }
  constexpr std::size_t group_size() const noexcept { return 0; }

 private:
  friend class quantizers::detail::framed<maximum, double>;

  quantizers::wire::frame_header header() const noexcept {
    return {.scheme = quantizers::wire::scheme::identity, .type = dtype::f64};
  }
  quantizers::wire::record_layout layout(std::size_t) const noexcept {
    return {.group = 1, .table_bytes = 0, .code_bits = 64};
  }
  void encode_records(std::span<const double> in, std::span<const double>, std::span<double>,
                      quantizers::encode_position, std::byte* records) const noexcept {
    if (!in.empty()) std::memcpy(records, in.data(), in.size_bytes());
  }
  std::error_code check_records(const std::byte*, std::size_t) const noexcept { return {}; }
  void decode_records(const std::byte* records, std::span<double> out, bool accumulate) const noexcept {
    for (std::size_t i = 0; i < out.size(); ++i) {
      double value;
      std::memcpy(&value, records + i * sizeof value, sizeof value);  // records may be unaligned
      out[i] = accumulate && out[i] > value ? out[i] : value;
    }
  }
};

}  // namespace detail::reproducible

/// A reproducible allreduce of `count` values of T over a grid routing, on one rank: two
/// grid allreduce plans, made once (their frames and schedules kept from call to call).
/// Ranks the routing excludes take no part: their calls fail at once, saying why, and
/// nobody waits for them. One call at a time.
template <reproducible_element T>
class reproducible_grid_allreduce {
 public:
  /// For this rank of `comm` (options: which node each rank plays, as for
  /// grid_allreduce_plan). Errors as grid_allreduce_plan's constructor.
  template <class Communicator>
  reproducible_grid_allreduce(const Communicator& comm, const topologies::grid_routing& routing, std::size_t count,
                              grid_allreduce_options options = {})
      : count_(count),
        ranks_(comm.size()),
        maxima_(comm, routing, (count + reproducible_block - 1) / reproducible_block + 2 + comm.size(),
                detail::reproducible::maximum{}, options),
        sums_(comm, routing, detail::reproducible::carriers<T> * count, quantizers::identity<double>{},
              std::move(options)) {}

  std::size_t count() const noexcept { return count_; }
  /// Whether this rank's addends are in the result (and it receives the result).
  bool included() const noexcept { return sums_.included(); }
  /// Payload bytes this rank sends in one call (both rounds), from the plans' schedules.
  std::size_t bytes_sent_per_call() const noexcept {
    return maxima_.bytes_sent_per_call() + sums_.bytes_sent_per_call();
  }

  /// out = the reproducible sum (or mean) of the included ranks' `in`: the bits of
  /// reproducible_allreduce over those ranks. Collective over the included ranks.
  /// @par Errors
  /// As reproducible_allreduce and a grid allreduce plan's call: invalid_argument at once
  /// on an excluded rank; sizes other than count() or buffers in device memory fail
  /// every rank (comm is aborted).
  template <class Communicator>
  void allreduce(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
    check_call(comm, in.size(), in, out);
    const std::span<const T> addend[1] = {in};
    run(comm, std::span<const std::span<const T>>(addend), out, op);
  }
  template <class Communicator>
  void allreduce(Communicator& comm, std::span<T> data, reduce_op op) {
    allreduce(comm, std::span<const T>(data), data, op);
  }
  /// The same for each included rank's addends of a reproducible_accumulator: the bits
  /// of its allreduce over those ranks, however many addends each holds.
  template <class Communicator>
  void allreduce(Communicator& comm, const reproducible_accumulator<T>& addends, std::span<T> out, reduce_op op) {
    check_call(comm, addends.count(), std::span<const T>(), out);
    const auto views = addends.views();
    run(comm, std::span<const std::span<const T>>(views), out, op);
  }

 private:
  /// A call whose addends (`in_count` values each; `in`, if not an accumulator's) or
  /// output differ from the plan's size, or lie outside host memory, fails every rank
  /// (comm aborted).
  template <class Communicator>
  void check_call(Communicator& comm, std::size_t in_count, std::span<const T> in, std::span<T> out) const {
    if (in_count != count_ || out.size() != count_)
      detail::reproducible::refuse(
          comm, qcoll::detail::format("reproducible_grid_allreduce on rank {}: {} values in and {} out for a plan of {}",
                                      comm.rank(), in_count, out.size(), count_));
    detail::reproducible::require_host(comm, "reproducible_grid_allreduce", in, std::span<const T>(out));
  }

  template <class Communicator>
  void run(Communicator& comm, std::span<const std::span<const T>> addends, std::span<T> out, reduce_op op) {
    if (comm.size() != ranks_)
      detail::reproducible::refuse(comm, qcoll::detail::format(
                                             "reproducible_grid_allreduce on rank {}: made for {} ranks, called on {}",
                                             comm.rank(), ranks_, comm.size()));
    detail::reproducible::sum_in_rounds<T>(
        addends, out, op, comm.rank(), comm.size(),
        [&](std::span<double> v) { comm.allreduce(maxima_, v, reduce_op::sum); },  // (combined by maximum)
        [&](std::span<double> v) { comm.allreduce(sums_, v, reduce_op::sum); });
  }

  std::size_t count_;
  std::size_t ranks_;
  grid_allreduce_plan<detail::reproducible::maximum> maxima_;
  grid_allreduce_plan<quantizers::identity<double>> sums_;
};

}  // namespace qcoll
