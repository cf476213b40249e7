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
/// of a float ulp at the block's largest value; two doubles' worth per value on the wire),
/// P = 60 for double (two integer-valued doubles per value). At most 2^23 addends in all.
/// docs/reproducibility.md states the guarantee, the error bound and the cost.

#include <qcoll/core/error.hpp>
#include <qcoll/core/half.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/format.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace qcoll {

/// Values that share one grid (one exponent in the max round).
inline constexpr std::size_t reproducible_block = 256;
/// At most this many addends in one sum (ranks × the addends each adds): their integers
/// must sum below 2^53.
inline constexpr std::size_t reproducible_max_addends = std::size_t{1} << 23;

namespace detail::reproducible {

/// The element types a reproducible sum takes, and how each is carried: float-family
/// values widen to double and take one integer-valued double (P = 30); doubles take two
/// (a 60-bit integer as high and low 30-bit halves).
template <class T>
inline constexpr bool wide = std::same_as<T, double>;
template <class T>
inline constexpr int grid_bits = wide<T> ? 60 : 30;
template <class T>
inline constexpr std::size_t carriers = wide<T> ? 2 : 1;

/// The exponent of a block that holds no finite nonzero value: it rounds everything to 0.
inline constexpr double empty_block = -2000.0;

template <class T>
double widened(T x) noexcept {
  if constexpr (std::same_as<T, float> || std::same_as<T, double>) return static_cast<double>(x);
  else return static_cast<double>(static_cast<float>(x));
}

/// 2^k for k in double's normal range [−1022, 1023], from its bits.
inline double power_of_two(int k) noexcept {
  return std::bit_cast<double>(static_cast<std::uint64_t>(k + 1023) << 52);
}

/// x · 2^k, exactly when the result is a normal double: one multiply when 2^k is normal,
/// else std::ldexp (blocks at the ends of double's range).
inline double scaled_by(double x, int k) noexcept {
  return k >= -1022 && k <= 1023 ? x * power_of_two(k) : std::ldexp(x, k);
}

/// Raises `exponents` (one per block) to cover every finite value of `values`: e with
/// |x| < 2^e, from the bits (x normal) or std::ilogb (a denormal double).
template <class T>
void cover(std::span<const T> values, std::span<double> exponents) noexcept {
  if constexpr (std::same_as<T, float>) {
    // From the float's own bits: the largest finite exponent field of the block (a
    // branch-free max the compiler can keep in registers), denormals through std::ilogb.
    for (std::size_t b = 0; b < exponents.size(); ++b) {
      const std::size_t first = b * reproducible_block, last = std::min(values.size(), first + reproducible_block);
      std::uint32_t top = 0, denormal = 0;
      for (std::size_t i = first; i < last; ++i) {
        const std::uint32_t magnitude = std::bit_cast<std::uint32_t>(values[i]) & 0x7fffffffu;
        const std::uint32_t field = magnitude & 0x7f800000u;
        top = std::max(top, field == 0x7f800000u ? 0u : field);
        denormal |= field == 0 ? magnitude : 0u;
      }
      int e = static_cast<int>(exponents[b]);
      if (top != 0) e = std::max(e, static_cast<int>(top >> 23) - 126);  // 1.f · 2^(field − 127) < 2^(field − 126)
      else if (denormal != 0)
        for (std::size_t i = first; i < last; ++i)
          if (values[i] != 0 && std::isfinite(values[i])) e = std::max(e, std::ilogb(values[i]) + 1);
      exponents[b] = e;
    }
    return;
  }
  for (std::size_t b = 0; b < exponents.size(); ++b) {
    const std::size_t first = b * reproducible_block, last = std::min(values.size(), first + reproducible_block);
    int e = static_cast<int>(exponents[b]);
    for (std::size_t i = first; i < last; ++i) {
      const double x = widened(values[i]);
      const auto field = static_cast<int>((std::bit_cast<std::uint64_t>(x) >> 52) & 0x7ff);
      if (field == 0x7ff) continue;                              // NaN, ±Inf: added as themselves
      if (field != 0) e = std::max(e, field - 1022);             // 1.f · 2^(field − 1023) < 2^(field − 1022)
      else if (x != 0) e = std::max(e, std::ilogb(x) + 1);       // a denormal double
    }
    exponents[b] = e;
  }
}

/// The nearest integer to s (ties to even), for |s| < 2^52, signed as s (−0.3 → −0):
/// adding and taking away 1.5 · 2^52 leaves s rounded to an integer in the current
/// rounding mode, round to nearest unless a program changed it (std::nearbyint's rule).
inline double nearest_integer(double s) noexcept {
  constexpr double shift = 6755399441055744.0;  // 1.5 · 2^52
  return std::copysign((s + shift) - shift, s);
}

/// Adds `values`, each rounded onto its block's grid, to `sums` (carriers<T> doubles per
/// value, integer-valued; non-finite values are added as themselves, so the sum of a
/// value holds NaN or ±Inf as IEEE addition gives them, in any order).
template <class T>
void add_on_grid(std::span<const T> values, std::span<const double> exponents, std::span<double> sums) noexcept {
  constexpr int p = grid_bits<T>;
  for (std::size_t b = 0; b < exponents.size(); ++b) {
    const std::size_t first = b * reproducible_block, last = std::min(values.size(), first + reproducible_block);
    const int shift = p - static_cast<int>(exponents[b]);
    if (exponents[b] == empty_block) {  // zeros and non-finite values only, everywhere: added as they are
      for (std::size_t i = first; i < last; ++i) sums[carriers<T> * i] += widened(values[i]);
      continue;
    }
    const double scale = wide<T> ? 0.0 : power_of_two(shift);
    for (std::size_t i = first; i < last; ++i) {
      const double x = widened(values[i]);
      double* sum = sums.data() + carriers<T> * i;
      if constexpr (wide<T>) {
        if (!std::isfinite(x)) {
          sum[0] += x;
          continue;
        }
        const double scaled = scaled_by(x, shift);  // |scaled| ≤ 2^60; from 2^52 up already an integer
        const double rounded = std::fabs(scaled) < 4503599627370496.0 ? nearest_integer(scaled) : scaled;
        if (rounded == 0) {  // ±0, signed as the float path's
          sum[0] += rounded;
          continue;
        }
        const auto q = static_cast<std::int64_t>(rounded);
        const std::int64_t low = q & ((std::int64_t{1} << 30) - 1);  // q = high · 2^30 + low, 0 ≤ low < 2^30
        sum[0] += static_cast<double>((q - low) >> 30);
        sum[1] += static_cast<double>(low);
      } else {
        // Floats, widened: |x · 2^shift| ≤ 2^30 and exact (2^shift is normal for every float block).
        sum[0] += std::isfinite(x) ? nearest_integer(x * scale) : x;
      }
    }
  }
}

/// out[i] = the summed integers on the grid, rounded once into T, divided by `divide`.
/// `first_index`: out[0]'s place in the buffer the exponents' blocks cut (a reduce_scatter's
/// block starts anywhere).
template <class T>
void from_grid(std::span<const double> sums, std::span<const double> exponents, double divide, std::span<T> out,
               std::size_t first_index = 0) {
  constexpr int p = grid_bits<T>;
  for (std::size_t i = 0; i < out.size();) {
    const std::size_t b = (first_index + i) / reproducible_block;
    const std::size_t last = std::min(out.size(), (b + 1) * reproducible_block - first_index);
    const int shift = static_cast<int>(exponents[b]) - p;
    // An empty block holds ±0 and non-finite sums only: scaled by 1. Otherwise 2^shift,
    // normal for every float block (a double block at the ends of the range: ldexp).
    const bool plain = exponents[b] == empty_block || shift < -1022 || shift > 1023;
    const double scale = exponents[b] == empty_block ? 1.0 : plain ? 0.0 : power_of_two(shift);
    for (; i < last; ++i) {
      const double* sum = sums.data() + carriers<T> * i;
      // (high · 2^30 and low are exact doubles; their sum, the integer, rounds once.)
      const double integer = wide<T> ? sum[0] * 1073741824.0 + sum[carriers<T> - 1] : sum[0];
      double value = plain && exponents[b] != empty_block ? std::ldexp(integer, shift) : integer * scale;
      if (std::isnan(value)) value = std::numeric_limits<double>::quiet_NaN();  // one NaN for all
      if (divide != 1) value /= divide;
      if constexpr (std::same_as<T, double> || std::same_as<T, float>) out[i] = static_cast<T>(value);
      else out[i] = T(static_cast<float>(value));  // float16/bfloat16: through float (an extra rounding; stated)
    }
  }
}

/// A thread's scratch for the two rounds, kept at its largest size: calls allocate
/// (and fault in) nothing once a thread has summed a buffer of the size.
inline std::vector<double>& scratch(int which) {
  thread_local std::vector<double> buffers[2];
  return buffers[which];
}

/// The first round: every block's exponent over `addends` (spans of `count` values) and
/// every rank's — `max_round(exponents)` makes them the ranks' maximum — with the op and
/// its negation riding along (their maxima give every rank the largest and the smallest
/// op: ranks that disagree all see it). Returns the grid, one exponent per block.
template <class T, class MaxRound>
std::span<const double> agree_on_grid(std::span<const std::span<const T>> addends, std::size_t count, reduce_op op,
                                      MaxRound&& max_round) {
  const std::size_t blocks = (count + reproducible_block - 1) / reproducible_block;
  std::vector<double>& exponents = scratch(0);
  exponents.assign(blocks + 2, empty_block);
  exponents[blocks] = static_cast<double>(op);
  exponents[blocks + 1] = -static_cast<double>(op);
  const std::span<double> grid = std::span<double>(exponents).first(blocks);
  for (const auto& addend : addends) cover(addend, grid);
  max_round(std::span<double>(exponents));
  if (exponents[blocks] != -exponents[blocks + 1])
    throw_error(errc::invalid_argument, "reproducible sum: the ranks passed different ops ({} and {})",
                to_string(static_cast<reduce_op>(-exponents[blocks + 1])),
                to_string(static_cast<reduce_op>(exponents[blocks])));
  if (op != reduce_op::sum && op != reduce_op::avg)
    throw_error(errc::invalid_argument, "reproducible sum: op {} (sum or avg)", to_string(op));
  return grid;
}

/// The integers of `addends` on `grid`, carriers<T> per value, each value's summed, in
/// scratch(1) with one more slot (−0 is addition's identity: a value whose every addend
/// is −0 stays −0).
template <class T>
std::span<double> on_grid(std::span<const std::span<const T>> addends, std::size_t count,
                          std::span<const double> grid) {
  std::vector<double>& sums = scratch(1);
  sums.assign(carriers<T> * count + 1, -0.0);
  for (const auto& addend : addends) add_on_grid(addend, grid, std::span<double>(sums));
  return sums;
}

/// out = the sum (op sum) or mean (avg) over every rank of the addends given here
/// (`addends` spans of out.size() values each, on this rank): `max_round` and
/// `sum_round` make a span every rank's maximum and total (no-ops for this rank alone).
template <class T, class MaxRound, class SumRound>
void sum_addends(std::span<const std::span<const T>> addends, std::span<T> out, reduce_op op, MaxRound&& max_round,
                 SumRound&& sum_round) {
  const std::size_t count = out.size();
  const std::span<const double> grid = agree_on_grid<T>(addends, count, op, max_round);
  const std::span<double> sums = on_grid<T>(addends, count, grid);
  sums.back() = static_cast<double>(addends.size());  // (−0 + a count: the count)
  sum_round(sums);
  const double all = sums.back();
  if (all > static_cast<double>(reproducible_max_addends))
    throw_error(errc::invalid_argument,
                "reproducible sum: {} addends in all, more than the {} whose integers sum exactly", all,
                reproducible_max_addends);
  if (op == reduce_op::avg && all == 0) throw_error(errc::invalid_argument, "reproducible sum: the average of no addends");
  from_grid(std::span<const double>(sums).first(carriers<T> * count), grid, op == reduce_op::avg ? all : 1.0, out);
}

/// The rounds over `comm`: a span's maximum, and its total.
template <class Communicator>
auto max_over(Communicator& comm) {
  return [&comm](std::span<double> values) { comm.allreduce(values, reduce_op::max); };
}
template <class Communicator>
auto sum_over(Communicator& comm) {
  return [&comm](std::span<double> values) { comm.allreduce(values, reduce_op::sum); };
}
inline constexpr auto here_alone = [](std::span<double>) {};

}  // namespace detail::reproducible

/// A rank's addends of one reproducible sum (its micro-batches' gradients, say), summed
/// with every other rank's by allreduce() onto one grid set by all of them: the result
/// depends only on the set of addends, not on how they are spread over ranks, nor on the
/// algorithm, topology or transport. The addends are kept (a copy each) until the sum,
/// because the grid depends on all of them.
template <class T>
  requires std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, bfloat16> ||
           std::same_as<T, float16>
class reproducible_accumulator {
 public:
  explicit reproducible_accumulator(std::size_t count) : count_(count) {}

  std::size_t count() const noexcept { return count_; }
  /// Addends this rank holds.
  std::size_t addends() const noexcept { return kept_.size() / std::max<std::size_t>(count_, 1) + empty_adds_; }

  /// Keeps a copy of `values` (count() of them) as one addend.
  /// @throws qcoll::error (invalid_argument) for another size.
  void add(std::span<const T> values) {
    if (values.size() != count_)
      detail::throw_error(errc::invalid_argument, "reproducible_accumulator::add: {} values for {}", values.size(),
                          count_);
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
  /// As comm's allreduce (a rank that calls another collective or passes another size
  /// fails every rank); invalid_argument on every rank for ranks that pass different ops,
  /// an op other than sum and avg, more than reproducible_max_addends addends in all, or
  /// an avg of none.
  template <class Communicator>
  void allreduce(Communicator& comm, std::span<T> out, reduce_op op) const {
    check_output(out);
    detail::reproducible::sum_addends<T>(views(), out, op, detail::reproducible::max_over(comm),
                                         detail::reproducible::sum_over(comm));
  }

  /// The same sum over this rank's addends alone: the bits allreduce() gives when every
  /// addend is here (a world of one rank).
  void sum(std::span<T> out, reduce_op op = reduce_op::sum) const {
    check_output(out);
    detail::reproducible::sum_addends<T>(views(), out, op, detail::reproducible::here_alone,
                                         detail::reproducible::here_alone);
  }

 private:
  void check_output(std::span<T> out) const {
    if (out.size() != count_)
      detail::throw_error(errc::invalid_argument, "reproducible sum: an output of {} values for {}", out.size(),
                          count_);
  }
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
template <class Communicator, class T>
  requires std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, bfloat16> ||
           std::same_as<T, float16>
void reproducible_allreduce(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
  if (in.size() != out.size())
    detail::throw_error(errc::invalid_argument, "reproducible_allreduce: an input of {} values and an output of {}",
                        in.size(), out.size());
  const std::span<const T> addend[1] = {in};
  detail::reproducible::sum_addends<T>(std::span<const std::span<const T>>(addend), out, op,
                                       detail::reproducible::max_over(comm), detail::reproducible::sum_over(comm));
}
template <class Communicator, class T>
void reproducible_allreduce(Communicator& comm, std::span<T> data, reduce_op op) {
  reproducible_allreduce(comm, std::span<const T>(data), data, op);
}

/// Rank r receives block r (block_of(in.size(), size(), r)) of the reproducible sum (or
/// mean) of every rank's `in`: the bits of that block of reproducible_allreduce's result,
/// whatever the ranks' order. `out` has exactly that block's size; it may be exactly that
/// block of `in`, or disjoint from it. Collective.
/// @par Errors
/// As reproducible_allreduce; an `out` of another size aborts `comm` (every rank fails).
template <class Communicator, class T>
  requires std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, bfloat16> ||
           std::same_as<T, float16>
void reproducible_reduce_scatter(Communicator& comm, std::span<const T> in, std::span<T> out, reduce_op op) {
  namespace r = detail::reproducible;
  const block_range mine = block_of(in.size(), comm.size(), comm.rank());
  if (out.size() != mine.size) {
    const std::string why = qcoll::detail::format(
        "reproducible_reduce_scatter on rank {}: an output of {} values for a block of {}", comm.rank(), out.size(),
        mine.size);
    comm.abort(why);
    detail::throw_error(errc::invalid_argument, "{}", why);
  }
  const std::span<const T> addend[1] = {in};
  const std::span<const std::span<const T>> addends(addend);
  const std::span<const double> grid = r::agree_on_grid<T>(addends, in.size(), op, r::max_over(comm));
  const std::span<double> sums = r::on_grid<T>(addends, in.size(), grid);
  // Carrier k of every value as a plane of its own, so each plane splits into the ranks'
  // blocks as the values do; each plane reduce-scattered; rank r's block interleaved again.
  // (One carrier per value: the sums are that plane already.)
  std::vector<double> plane(r::carriers<T> == 1 ? 0 : in.size()), summed(mine.size),
      block(r::carriers<T> == 1 ? 0 : r::carriers<T> * mine.size);
  for (std::size_t k = 0; k < r::carriers<T>; ++k) {
    if constexpr (r::carriers<T> == 1) {
      comm.reduce_scatter(std::span<const double>(sums.first(in.size())), std::span<double>(summed), reduce_op::sum);
    } else {
      for (std::size_t i = 0; i < in.size(); ++i) plane[i] = sums[r::carriers<T> * i + k];
      comm.reduce_scatter(std::span<const double>(plane), std::span<double>(summed), reduce_op::sum);
      for (std::size_t i = 0; i < mine.size; ++i) block[r::carriers<T> * i + k] = summed[i];
    }
  }
  const std::span<const double> result = r::carriers<T> == 1 ? std::span<const double>(summed) : block;
  // One addend per rank: the mean divides by the ranks.
  r::from_grid(result, grid, op == reduce_op::avg ? static_cast<double>(comm.size()) : 1.0, out, mine.offset);
}

}  // namespace qcoll
