#pragma once
/// @file
/// Parameters kept in 8-bit block floating point, updated through a 16-bit lazy-update
/// accumulator (spec bfp-lazy-update.md §4) — no float master copy: 8 + 16 bits of
/// state per parameter instead of 8 + 32.
///
/// @par State
/// One tensor of n parameters: mantissas w (int8, in [−127, 127]) sharing the
/// exponent e_w (the spec's whole-tensor block), so parameter i is w_i · 2^e_w; and
/// accumulator mantissas a (int16) aligned one parameter LSB below,
/// e_acc = e_w − 15, so a_i / 2^15 is in parameter LSBs. After every step
/// |a_i| ≤ 2^14 (half a parameter LSB).
///
/// @par One step, apply(update) (the spec's algorithm with its sign error corrected)
/// 1. The update (the optimizer's, e.g. −lr·g) becomes 32-bit BFP over the whole
///    tensor by the bfp rules (quantizers/bfp.hpp): exponent e_ch, mantissas c_i.
/// 2. a_i += rshift_round(c_i, e_acc − e_ch)   (the update in accumulator units)
/// 3. A_i  = rshift_round(a_i, 15)            (whole parameter LSBs accumulated)
/// 4. w_i += A_i;  a_i −= A_i · 2^15
/// Intermediates are int64. rshift_round is an arithmetic shift with round half
/// away from zero; a negative shift is a saturating left shift.
///
/// @par Edge cases (the spec leaves them open; nothing is dropped silently)
/// - Accumulator overflow (an update above half a parameter LSB): A_i is as many
///   LSBs as step 3 says, not only ±1; the remainder always fits int16.
/// - Parameter overflow (some |w_i + A_i| > 127): the whole tensor is
///   renormalised. With T_i = w_i · 2^15 + a_i (parameter plus accumulator, exact,
///   in accumulator units) and the smallest k ≥ 1 that brings every parameter back
///   into range: e_w += k, T_i = rshift_round(T_i, k), w_i = rshift_round(T_i, 15),
///   a_i = T_i − w_i · 2^15. Each parameter's dropped low bits thus move into its
///   accumulator; the realignment itself loses at most half of the new accumulator
///   LSB (2^(e_acc + k) / 2) per element — the only rounding.
/// - An update so large that it sits more than 2^24 accumulator units above its
///   own LSB alignment (e_ch > e_acc + 24, i.e. above ~2^39 parameter LSBs — it
///   must overflow the parameters anyway) first renormalises by the excess, so the
///   int64 sums cannot overflow; that adds a second rounding of at most half an
///   intermediate LSB, still below one new accumulator LSB in all.
/// - The exponent only grows, by renormalisation; it never shrinks on its own.
///   e_w stays within the 8-bit BFP range [−127, 121]: a step that would push it
///   past 121 (values near float's maximum) throws and changes nothing.
/// - Ties: A_i rounds half away from zero as the spec says, so an accumulator left
///   at exactly ±2^14 hands a parameter LSB back and forth on later steps whose
///   update rounds to 0; parameter plus accumulator stays exact.
/// - A zero update (every value ±0) changes nothing.
/// - Without the accumulator (`lazy_update_options::lazy = false`, the baseline
///   that stalls) step 2–4 become w_i += rshift_round(c_i, e_w − e_ch): updates
///   under half a parameter LSB are lost, and renormalising rounds the parameters
///   themselves (at most half a new parameter LSB).
///
/// @par Initial parameters
/// Quantised as 8-bit BFP with the whole tensor as one block (the bfp rule: e_w =
/// ceil(log2 max|x|) − 7, mantissas rounded half away from zero, an exact
/// power-of-two maximum saturating to 127), but e_w at least
/// `lazy_update_options::min_exponent`. An all-zero tensor thus starts at e_w =
/// min_exponent (default −127); its first nonzero update renormalises it to the
/// update's own scale. Set min_exponent to the scale the parameters will reach to
/// skip that.
///
/// @par Thread safety
/// apply() modifies the object; the const accessors may run concurrently with each
/// other, not with apply().

#include <qcoll/core/error.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/kernels/group/bfp.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace qcoll::quantizers {

/// x / 2^s rounded half away from zero, for s > 0; x unchanged for s = 0; x · 2^−s
/// for s < 0, saturated to the int64 range.
constexpr std::int64_t rshift_round(std::int64_t x, int s) noexcept {
  if (s == 0 || x == 0) return x;
  if (s < 0) {
    const int k = -s;
    constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
    constexpr std::int64_t min = std::numeric_limits<std::int64_t>::min();
    if (k >= 63) return x > 0 ? max : min;
    if (x > (max >> k)) return max;
    if (x < (min >> k)) return min;
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(x) << k);
  }
  // |x| / 2^s <= 2^63 / 2^64: a tie only for the most negative x at s = 64.
  if (s >= 64) return s == 64 && x == std::numeric_limits<std::int64_t>::min() ? -1 : 0;
  const std::int64_t floor = x >> s;  // arithmetic: rounds toward −∞
  const std::uint64_t dropped = static_cast<std::uint64_t>(x) & ((std::uint64_t{1} << s) - 1);
  const std::uint64_t half = std::uint64_t{1} << (s - 1);
  // The exact quotient is floor + dropped/2^s: ties go up for x > 0, stay (away from zero) for x < 0.
  return floor + ((x > 0 ? dropped >= half : dropped > half) ? 1 : 0);
}

struct lazy_update_options {
  /// Collect updates below a parameter LSB in the 16-bit accumulator (the spec's
  /// lazy update). false: add each update to the 8-bit parameters directly.
  bool lazy = true;
  /// The smallest parameter exponent, in [−127, 121]; it decides the exponent of an
  /// all-zero (or very small) initial tensor.
  int min_exponent = -127;
};

/// A tensor of 8-bit BFP parameters updated by the lazy-update algorithm (see the
/// file comment for the exact rules).
class lazy_bfp_parameters {
 public:
  static constexpr unsigned parameter_bits = 8;
  static constexpr unsigned accumulator_bits = 16;
  static constexpr unsigned update_bits = 32;
  /// e_acc = e_w − accumulator_shift: the accumulator sits one parameter LSB below.
  static constexpr int accumulator_shift = static_cast<int>(accumulator_bits) - 1;
  static constexpr int max_mantissa = 127;
  /// The 8-bit BFP exponent range (quantizers/bfp.hpp: [−127, 129 − b]).
  static constexpr int min_exponent = -127;
  static constexpr int max_exponent = 129 - static_cast<int>(parameter_bits);

  /// Quantises `initial` (see the file comment). The accumulator starts at 0.
  /// @throws qcoll::error (invalid_argument) for a NaN or Inf value, or a
  /// min_exponent outside [−127, 121].
  explicit lazy_bfp_parameters(std::span<const float> initial, lazy_update_options options = {})
      : options_(options), mantissas_(initial.size()), accumulator_(options.lazy ? initial.size() : 0) {
    namespace rules = kernels::bfp_detail;
    if (options.min_exponent < min_exponent || options.min_exponent > max_exponent)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "lazy_bfp_parameters: min_exponent must be in [{}, {}], not {}", min_exponent,
                                 max_exponent, options.min_exponent);
    const std::uint32_t largest = max_magnitude(initial);
    if (largest >= 0x7f800000u)
      qcoll::detail::throw_error(errc::invalid_argument, "lazy_bfp_parameters: the initial values hold NaN or Inf");
    const int exponent = rules::decide(largest, parameter_bits).exponent;
    exponent_ = exponent > options.min_exponent ? exponent : options.min_exponent;
    const float scale = rules::pow2(-exponent_);
    for (std::size_t i = 0; i < initial.size(); ++i)
      mantissas_[i] = static_cast<std::int8_t>(rules::mantissa(initial[i], scale, parameter_bits));
  }

  /// Adds `update` (one value per parameter) by the lazy-update step.
  /// @par Errors
  /// qcoll::error (invalid_argument) when `update` has the wrong size or holds NaN
  /// or Inf, or when the parameters would outgrow the 8-bit BFP range (exponent
  /// above 121); the state is then unchanged.
  /// @par Complexity
  /// Three passes over the update, no allocation.
  void apply(std::span<const float> update) {
    namespace rules = kernels::bfp_detail;
    if (update.size() != size())
      qcoll::detail::throw_error(errc::invalid_argument, "lazy_bfp_parameters::apply: {} update values for {} parameters",
                                 update.size(), size());
    const std::uint32_t largest = max_magnitude(update);
    if (largest >= 0x7f800000u)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "lazy_bfp_parameters::apply: the update holds NaN or Inf; nothing was changed");
    if (largest == 0) return;
    const rules::block_scale change = rules::decide(largest, update_bits);

    const int fraction = options_.lazy ? accumulator_shift : 0;  // accumulator bits below a parameter LSB
    int align = exponent_ - fraction - change.exponent;          // shift of c_i into accumulator units
    int pre = 0;  // a renormalisation forced before the sums, for huge updates
    if (align < -max_left_shift) {
      pre = -max_left_shift - align;
      align = -max_left_shift;
    }
    const step plan{.fraction = fraction, .align = align, .pre = pre, .scale = change.scale};

    // Pass 1, read-only: does any parameter overflow, and how large is the largest total?
    bool overflow = false;
    std::int64_t largest_total = 0;
    for (std::size_t i = 0; i < size(); ++i) {
      const element e = plan.run(*this, update[i], i);
      overflow = overflow || e.parameter > max_mantissa || e.parameter < -max_mantissa;
      const std::int64_t magnitude = e.total < 0 ? -e.total : e.total;
      largest_total = magnitude > largest_total ? magnitude : largest_total;
    }
    int k = 0;
    if (overflow) {
      k = 1;
      while (rshift_round(rshift_round(largest_total, k), fraction) > max_mantissa) ++k;
    }
    if (exponent_ + pre + k > max_exponent)
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "lazy_bfp_parameters::apply: the parameters would need exponent {}, above the 8-bit "
                                 "BFP maximum {}; nothing was changed",
                                 exponent_ + pre + k, max_exponent);

    // Pass 2: commit, renormalising by k when a parameter left [−127, 127].
    for (std::size_t i = 0; i < size(); ++i) {
      element e = plan.run(*this, update[i], i);
      if (k > 0) {
        const std::int64_t total = rshift_round(e.total, k);
        e.parameter = rshift_round(total, fraction);
        e.accumulator = total - e.parameter * (std::int64_t{1} << fraction);
      }
      mantissas_[i] = static_cast<std::int8_t>(e.parameter);
      if (options_.lazy) accumulator_[i] = static_cast<std::int16_t>(e.accumulator);
    }
    exponent_ += pre + k;
  }

  std::size_t size() const noexcept { return mantissas_.size(); }
  /// The parameters' mantissas w, each in [−127, 127].
  std::span<const std::int8_t> mantissas() const noexcept { return mantissas_; }
  /// The parameters' shared exponent e_w: parameter i is mantissas()[i] · 2^exponent().
  int exponent() const noexcept { return exponent_; }
  /// The accumulator's mantissas, each in [−2^14, 2^14]; empty without the lazy update.
  std::span<const std::int16_t> accumulator() const noexcept { return accumulator_; }
  /// e_acc = e_w − 15: accumulator i holds accumulator()[i] · 2^accumulator_exponent().
  int accumulator_exponent() const noexcept { return exponent_ - accumulator_shift; }
  const lazy_update_options& options() const noexcept { return options_; }

  /// out[i] = the parameter's value, float(w_i) · 2^e_w (exact; the accumulator's
  /// pending part is not included).
  /// @throws qcoll::error (invalid_argument) when out.size() != size().
  void values(std::span<float> out) const {
    if (out.size() != size())
      qcoll::detail::throw_error(errc::invalid_argument, "lazy_bfp_parameters::values: {} outputs for {} parameters",
                                 out.size(), size());
    const float unit = kernels::bfp_detail::pow2(exponent_);
    for (std::size_t i = 0; i < size(); ++i) out[i] = kernels::bfp_detail::decoded(mantissas_[i], unit);
  }

 private:
  /// Updates are aligned with a left shift of at most this much (|c_i| < 2^31, so
  /// sums stay below 2^56 in int64).
  static constexpr int max_left_shift = 24;

  /// One element's step, before any renormalisation after it.
  struct element {
    std::int64_t parameter = 0;    ///< w_i + A_i
    std::int64_t accumulator = 0;  ///< a_i + u_i − A_i · 2^fraction
    std::int64_t total = 0;        ///< (w_i · 2^fraction + a_i) + u_i, exact
  };

  struct step {
    int fraction;  ///< accumulator bits below a parameter LSB: 15, or 0 without the lazy update
    int align;     ///< c_i → accumulator units: rshift_round(c_i, align)
    int pre;       ///< renormalisation before the sums (0 unless the update is huge)
    float scale;   ///< 2^−e_ch, to compute c_i by the bfp rule

    element run(const lazy_bfp_parameters& self, float update, std::size_t i) const noexcept {
      namespace rules = kernels::bfp_detail;
      const std::int64_t one = std::int64_t{1} << fraction;
      std::int64_t w = self.mantissas_[i];
      std::int64_t a = self.options_.lazy ? self.accumulator_[i] : 0;
      if (pre > 0) {
        const std::int64_t old = rshift_round(w * one + a, pre);
        w = rshift_round(old, fraction);
        a = old - w * one;
      }
      const std::int64_t change = rshift_round(rules::mantissa(update, scale, update_bits), align);
      const std::int64_t pending = a + change;
      const std::int64_t transfer = rshift_round(pending, fraction);  // A_i, any number of LSBs
      return {.parameter = w + transfer, .accumulator = pending - transfer * one, .total = w * one + pending};
    }
  };

  static std::uint32_t max_magnitude(std::span<const float> values) noexcept {
    std::uint32_t largest = 0;
    for (const float value : values) {
      const std::uint32_t magnitude = kernels::bfp_detail::magnitude_bits(value);
      largest = magnitude > largest ? magnitude : largest;
    }
    return largest;
  }

  lazy_update_options options_;
  int exponent_ = min_exponent;
  std::vector<std::int8_t> mantissas_;
  std::vector<std::int16_t> accumulator_;
};

}  // namespace qcoll::quantizers
