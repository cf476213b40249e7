#pragma once
/// @file
/// The reproducible sum's machinery (qcoll/reproducible.hpp is its interface): the
/// conversions to and from the grid (float-family values through the CPU kernel table,
/// doubles here), the first round's agreement and checks, the two ways the integers are
/// summed (one allreduce; reduce-scatter and gather), the device path, and the checks at
/// the entry points' doors. docs/reproducibility.md explains the design.

#include <qcoll/core/error.hpp>
#include <qcoll/core/half.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/kernels/cpu/grid.hpp>
#include <qcoll/kernels/group/grid.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace qcoll {

/// The element types a reproducible sum takes.
template <class T>
concept reproducible_element =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, bfloat16> || std::same_as<T, float16>;

/// Values that share one grid (one exponent in the max round).
inline constexpr std::size_t reproducible_block = kernels::grid_detail::block;
/// At most this many addends in one sum (ranks × the addends each adds): their integers
/// must sum below 2^53.
inline constexpr std::size_t reproducible_max_addends = std::size_t{1} << 23;

namespace detail::reproducible {

namespace grid = kernels::grid_detail;

/// The element types a reproducible sum takes, and how each is carried: float-family
/// values take one integer-valued double per value (P = 30; kernels/group/grid.hpp, the
/// CPU kernel table's grid kernels); doubles take two, a 60-bit integer as high and low
/// 30-bit halves (P = 60; kernels/cpu/grid.hpp, one value at a time). A sum of count values is carriers<T>
/// planes of count doubles, plane k holding carrier k of every value, so each plane
/// splits into the ranks' blocks as the values do.
template <class T>
inline constexpr bool wide = std::same_as<T, double>;
template <class T>
inline constexpr std::size_t carriers = wide<T> ? 2 : 1;

/// Sums of at least this many carrier bytes are reduce-scattered, rounded by the rank that
/// owns each block and gathered as values (1.5× the bytes of an ordinary allreduce of a
/// float, where one allreduce of the carriers moves 2×); smaller ones are one allreduce.
inline constexpr std::size_t gather_from_bytes = std::size_t{256} << 10;

/// Whether a sum of `count` values of T over `ranks` ranks goes that way.
template <class T>
constexpr bool gathers(std::size_t count, std::size_t ranks) noexcept {
  return ranks > 1 && carriers<T> * count * sizeof(double) >= gather_from_bytes;
}

/// The bytes each rank sends in a reproducible allreduce of `count` values of T over
/// `ranks` ranks, counted as nccl-tests counts a ring's (an allreduce of b bytes:
/// 2(n − 1)/n · b; a reduce-scatter or all-gather: half that): the max round's exponents,
/// ops and addend counts, then the carriers. For benchmarks' wire columns.
template <class T>
constexpr double wire_bytes(std::size_t count, std::size_t ranks) noexcept {
  const double n = static_cast<double>(ranks), share = (n - 1) / n;
  const double round = 8.0 * static_cast<double>((count + reproducible_block - 1) / reproducible_block + 2 + ranks);
  const double carried = 8.0 * static_cast<double>(carriers<T> * count);
  return 2 * share * round +
         (gathers<T>(count, ranks) ? share * (carried + static_cast<double>(sizeof(T) * count)) : 2 * share * carried);
}

// The conversions (kernels/cpu/grid.hpp): float-family values through the dispatched
// kernels, doubles one value at a time — the rules of kernels/group/grid.hpp either way.

template <class T>
void cover(std::span<const T> values, std::span<double> exponents) noexcept {
  kernels::cpu::grid_cover(values, exponents);
}

/// sums = (first) or += (else) `values` on their blocks' grids: the planes of
/// carriers<T> · values.size() doubles, integer-valued (non-finite values added as
/// themselves to the first plane, so a value's sum holds NaN or ±Inf as IEEE addition
/// gives them, in any order).
template <class T>
void add_on_grid(std::span<const T> values, std::span<const double> exponents, std::span<double> sums,
                 bool first) noexcept {
  kernels::cpu::grid_add(values, exponents, sums, first);
}

/// out[i] = the summed integers on the grid (`high`, and for doubles `low`, the planes'
/// parts for out's values), rounded once into T, divided by `divide`. `first_index`:
/// out[0]'s place in the buffer the exponents' blocks cut (a rank's block starts anywhere).
template <class T>
void from_grid(std::span<const double> high, std::span<const double> low, std::span<const double> exponents,
               double divide, std::span<T> out, std::size_t first_index) {
  kernels::cpu::grid_round(high, low, exponents, divide, out, first_index);
}

/// A thread's scratch, kept at its largest size: calls allocate (and fault in) nothing
/// once a thread has summed a buffer of the size.
inline std::vector<double>& scratch(int which) {
  thread_local std::vector<double> buffers[2];
  return buffers[which];
}

/// What the ranks agreed on in the first round: one exponent per block, and how many
/// addends there are in all.
struct agreement {
  std::span<const double> exponents;
  double addends;
};

/// The first round's doubles, in scratch(0): `blocks` exponents (of empty blocks until
/// covered), the op and its negation (their maxima give every rank the largest and the
/// smallest op: ranks that disagree all see it), and each rank's number of addends in a
/// slot of its own (this rank's set, the others' 0).
inline std::span<double> first_round(std::size_t blocks, reduce_op op, rank_t rank, std::size_t ranks,
                                     std::size_t addends) {
  std::vector<double>& round = scratch(0);
  round.assign(blocks + 2 + ranks, 0.0);
  std::fill_n(round.begin(), blocks, grid::empty_block);
  round[blocks] = static_cast<double>(op);
  round[blocks + 1] = -static_cast<double>(op);
  round[blocks + 2 + rank] = static_cast<double>(addends);
  return round;
}

/// After the ranks' max of the first round, its part after the exponents: checks the ops
/// and the addends — on data every rank holds, so each check fails on every rank or on
/// none — and returns how many addends there are in all.
inline double check_first_round(std::span<const double> after_exponents, reduce_op op) {
  if (after_exponents[0] != -after_exponents[1])
    throw_error(errc::invalid_argument, "reproducible sum: the ranks passed different ops ({} and {})",
                to_string(static_cast<reduce_op>(-after_exponents[1])), to_string(static_cast<reduce_op>(after_exponents[0])));
  if (op != reduce_op::sum && op != reduce_op::avg)
    throw_error(errc::invalid_argument, "reproducible sum: op {} (sum or avg)", to_string(op));
  double all = 0;
  for (const double addends : after_exponents.subspan(2)) all += addends;
  if (all > static_cast<double>(reproducible_max_addends))
    throw_error(errc::invalid_argument, "reproducible sum: {} addends in all, more than the {} whose integers sum exactly",
                all, reproducible_max_addends);
  if (op == reduce_op::avg && all == 0) throw_error(errc::invalid_argument, "reproducible sum: the average of no addends");
  return all;
}

/// The first round: every block's exponent over `addends` (spans of `count` values) and
/// every rank's — `max_round(span)` makes a span the ranks' maximum — then checked.
template <class T, class MaxRound>
agreement agree_on_grid(std::span<const std::span<const T>> addends, std::size_t count, reduce_op op, rank_t rank,
                        std::size_t ranks, MaxRound&& max_round) {
  const std::size_t blocks = (count + reproducible_block - 1) / reproducible_block;
  const std::span<double> round = first_round(blocks, op, rank, ranks, addends.size());
  const std::span<double> exponents = round.first(blocks);
  for (const auto& addend : addends) cover(addend, exponents);
  max_round(round);
  return {exponents, check_first_round(round.subspan(blocks), op)};
}

/// The integers of `addends` on the grid, each value's summed, as carriers<T> planes of
/// `count` in scratch(1) (−0, addition's identity, where this rank has no addend).
template <class T>
std::span<double> on_grid(std::span<const std::span<const T>> addends, std::size_t count,
                          std::span<const double> exponents) {
  std::vector<double>& sums = scratch(1);
  sums.resize(carriers<T> * count);
  if (addends.empty()) std::fill(sums.begin(), sums.end(), -0.0);
  for (std::size_t a = 0; a < addends.size(); ++a) add_on_grid(addends[a], exponents, std::span<double>(sums), a == 0);
  return sums;
}

/// Carrier plane k of a sum of `count` values.
inline std::span<double> plane(std::span<double> sums, std::size_t count, std::size_t k) {
  return sums.subspan(k * count, count);
}

/// out = the sum (op sum) or mean (avg) over every rank of the addends given on each
/// (this is rank `rank` of `ranks`) in two rounds: `max_round(span)` and `sum_round(span)`
/// make a span of doubles the ranks' maximum and total, by any algorithm or route.
template <class T, class MaxRound, class SumRound>
void sum_in_rounds(std::span<const std::span<const T>> addends, std::span<T> out, reduce_op op, rank_t rank,
                   std::size_t ranks, MaxRound&& max_round, SumRound&& sum_round) {
  const std::size_t count = out.size();
  const agreement grid = agree_on_grid<T>(addends, count, op, rank, ranks, max_round);
  const std::span<double> sums = on_grid<T>(addends, count, grid.exponents);
  sum_round(sums);
  from_grid<T>(plane(sums, count, 0), plane(sums, count, carriers<T> - 1), grid.exponents,
               op == reduce_op::avg ? grid.addends : 1.0, out, 0);
}

/// The same with this rank's addends alone.
template <class T>
void sum_here(std::span<const std::span<const T>> addends, std::span<T> out, reduce_op op) {
  const auto alone = [](std::span<double>) {};
  sum_in_rounds<T>(addends, out, op, 0, 1, alone, alone);
}

/// Device scratch a queue_sum_here of up to `count` values takes: exponents, then carrier planes.
template <class T>
constexpr std::size_t device_scratch_doubles(std::size_t count) noexcept {
  return (count + reproducible_block - 1) / reproducible_block + carriers<T> * count;
}

/// sum_here's sum of `addends` (device memory of where's device, each out.size() values)
/// into `out` (which may be addends[0]), queued on where's stream: the same kernels' rules,
/// so the CPU's bits. `scratch`: device_scratch_doubles<T>(out.size()) doubles or more;
/// `empty`: device memory of at least as many blocks' grid::empty_block.
template <class T>
void queue_sum_here(execution::device_stream where, std::span<const std::span<const T>> addends, std::span<T> out,
                    std::span<double> scratch, std::span<const double> empty) {
  const std::size_t count = out.size(), blocks = (count + reproducible_block - 1) / reproducible_block;
  if (count == 0) return;
  const device::runtime& device = execution::device_runtime("reproducible sum");
  const std::span<double> exponents = scratch.first(blocks), sums = scratch.subspan(blocks, carriers<T> * count);
  execution::check_device(device, device.copy(exponents.data(), empty.data(), exponents.size_bytes(), where.stream),
                          "reproducible sum");
  for (const auto& addend : addends) execution::queue_grid_cover(where, addend, exponents);
  for (std::size_t a = 0; a < addends.size(); ++a)
    execution::queue_grid_add(where, addends[a], std::span<const double>(exponents), sums, a == 0);
  const std::span<const double> low = wide<T> ? std::span<const double>(plane(sums, count, 1)) : std::span<const double>();
  execution::queue_grid_round(where, std::span<const double>(plane(sums, count, 0)), low,
                              std::span<const double>(exponents), 1.0, out, 0);
}

/// The rounds over `comm`: a span of doubles made the ranks' maximum, or their total.
template <class Communicator>
auto max_over(Communicator& comm) {
  return [&comm](std::span<double> values) { comm.allreduce(values, reduce_op::max); };
}
template <class Communicator>
auto total_over(Communicator& comm) {
  return [&comm](std::span<double> values) { comm.allreduce(values, reduce_op::sum); };
}

/// Rank r's block (block_of(count, size, r)) of the sum or mean over every rank of
/// `comm` of the addends given on each, into `block`: each carrier plane reduce-scattered
/// in place, then rounded.
template <class T, class Communicator>
void scatter_sum(Communicator& comm, std::span<const std::span<const T>> addends, std::size_t count, reduce_op op,
                 std::span<T> block) {
  const agreement grid = agree_on_grid<T>(addends, count, op, comm.rank(), comm.size(), max_over(comm));
  const std::span<double> sums = on_grid<T>(addends, count, grid.exponents);
  const block_range mine = block_of(count, comm.size(), comm.rank());
  for (std::size_t k = 0; k < carriers<T>; ++k) {
    const std::span<double> all = plane(sums, count, k);
    comm.reduce_scatter(std::span<const double>(all), mine.of(all), reduce_op::sum);
  }
  from_grid<T>(mine.of(plane(sums, count, 0)), mine.of(plane(sums, count, carriers<T> - 1)), grid.exponents,
               op == reduce_op::avg ? grid.addends : 1.0, block, mine.offset);
}

/// out = the sum or mean over every rank of `comm` of the addends given on each. Small
/// sums: one allreduce of the carriers; larger: scatter_sum, then the values gathered.
template <class T, class Communicator>
void sum_over(Communicator& comm, std::span<const std::span<const T>> addends, std::span<T> out, reduce_op op) {
  const std::size_t count = out.size();
  if (gathers<T>(count, comm.size())) {
    const block_range mine = block_of(count, comm.size(), comm.rank());
    scatter_sum<T>(comm, addends, count, op, mine.of(out));
    comm.all_gather(std::span<const T>(mine.of(out)), out);
    return;
  }
  sum_in_rounds<T>(addends, out, op, comm.rank(), comm.size(), max_over(comm), total_over(comm));
}

/// Fails every rank of `comm` (abort) and this one with `why` for a bad call.
template <class Communicator>
[[noreturn]] void refuse(Communicator& comm, const std::string& why) {
  comm.abort(why);
  throw_error(errc::invalid_argument, "{}", why);
}

/// A host call's buffers must be host memory: else every rank fails (comm aborted).
template <class Communicator, class T>
void require_host(Communicator& comm, const char* call, std::span<const T> in, std::span<const T> out) {
  // (A named list: its buffers, which the answer points to, live as long as it.)
  const std::initializer_list<execution::named_buffer> buffers = {{"the input", in}, {"the output", out}};
  if (const execution::named_buffer* wrong = execution::misplaced(execution::memory_space::host, buffers))
    refuse(comm, qcoll::detail::format("{} on rank {}: {} is in device memory; this call takes host memory (its "
                                       "device_stream form takes device memory)",
                                       call, comm.rank(), wrong->name));
}

/// A device call's buffers must be device memory of where's device: else, and without a
/// device runtime, every rank fails (comm aborted).
template <class Communicator, class T>
void require_device(Communicator& comm, const char* call, execution::device_stream where, std::span<const T> in,
                    std::span<const T> out) {
  std::string why;
  const std::initializer_list<execution::named_buffer> buffers = {{"the input", in}, {"the output", out}};
  try {
    const device::runtime& runtime = execution::device_runtime(call);
    int ordinal = -1;
    if (runtime.stream_device(where.stream, &ordinal) != 0) {
      why = qcoll::detail::format("the stream is not a stream of the {} device runtime", runtime.name);
    } else if (const execution::device_misfit misfit = execution::misplaced_on_device(runtime, ordinal, buffers);
               misfit.buffer) {
      why = misfit.ordinal < 0 ? qcoll::detail::format("{} is in host memory; a call on device memory takes device pointers",
                                                       misfit.buffer->name)
                               : qcoll::detail::format("{} is on device {}, but the stream is on device {}",
                                                       misfit.buffer->name, misfit.ordinal, ordinal);
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) refuse(comm, qcoll::detail::format("{} on rank {}: {}", call, comm.rank(), why));
}

/// The reproducible sum of every rank's `in` (device memory) on where's stream: into `out`
/// whole (`everything`), or rank r's block of it. The conversions run as device kernels
/// (the device runtime's grid entries, the CPU's rules), the rounds as comm's device
/// collectives; the first round's checks read its last 2 + ranks doubles back. Returns once
/// the result is in place.
template <class T, class Communicator>
void sum_on_device(Communicator& comm, execution::device_stream where, std::span<const T> in, std::span<T> out,
                   reduce_op op, bool everything) {
  const std::size_t count = in.size(), ranks = comm.size();
  const std::size_t blocks = (count + reproducible_block - 1) / reproducible_block;
  const std::span<double> round = first_round(blocks, op, comm.rank(), ranks, 1);
  const device::runtime& device = execution::device_runtime("reproducible sum");
  const auto check = [&](int code, const char* what) { execution::check_device(device, code, what); };
  // One allocation: the first round's doubles, then the carriers' planes.
  const execution::device_memory<double> scratch_on_device(round.size() + carriers<T> * count);
  const std::span<double> round_on_device(scratch_on_device.data(), round.size());
  const std::span<double> exponents = round_on_device.first(blocks);
  const std::span<double> sums(scratch_on_device.data() + round.size(), carriers<T> * count);
  check(device.copy(round_on_device.data(), round.data(), round.size_bytes(), where.stream), "reproducible sum");
  execution::queue_grid_cover(where, in, exponents);
  comm.allreduce(where, round_on_device, reduce_op::max);
  const std::span<double> after_exponents = round.subspan(blocks);
  check(device.copy(after_exponents.data(), round_on_device.data() + blocks, after_exponents.size_bytes(), where.stream),
        "reproducible sum");
  check(device.synchronize(where.stream), "reproducible sum");
  const double addends = check_first_round(after_exponents, op);
  const double divide = op == reduce_op::avg ? addends : 1.0;
  execution::queue_grid_add(where, in, std::span<const double>(exponents), sums, true);
  const block_range mine = block_of(count, ranks, comm.rank());
  const auto low_of = [&](std::span<double> values) {  // doubles' low carriers; none for the others
    return wide<T> ? std::span<const double>(values) : std::span<const double>();
  };
  if (!everything || gathers<T>(count, ranks)) {
    for (std::size_t k = 0; k < carriers<T>; ++k) {
      const std::span<double> all = plane(sums, count, k);
      comm.reduce_scatter(where, std::span<const double>(all), mine.of(all), reduce_op::sum);
    }
    const std::span<T> block = everything ? mine.of(out) : out;
    execution::queue_grid_round(where, std::span<const double>(mine.of(plane(sums, count, 0))),
                                low_of(mine.of(plane(sums, count, carriers<T> - 1))),
                                std::span<const double>(exponents), divide, block, mine.offset);
    if (everything) comm.all_gather(where, std::span<const T>(block), out);
  } else {
    comm.allreduce(where, sums, reduce_op::sum);
    execution::queue_grid_round(where, std::span<const double>(plane(sums, count, 0)),
                                low_of(plane(sums, count, carriers<T> - 1)), std::span<const double>(exponents),
                                divide, out, 0);
  }
  check(device.synchronize(where.stream), "reproducible sum");  // the result in place, the scratch unused
}

}  // namespace detail::reproducible

}  // namespace qcoll
