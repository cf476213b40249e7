#pragma once
/// @file
/// The reproducible sum's float conversions over xsimd batches: the rules of
/// kernels/group/grid.hpp lane by lane in the same operations, whole registers of each
/// block vectorised, the rest (and a block whose largest value is subnormal) through the
/// scalar rule, so results match the reference bit for bit.

#include <qcoll/kernels/cpu/simd/lane_ops.hpp>
#include <qcoll/kernels/cpu/simd/xsimd_compat.hpp>
#include <qcoll/kernels/group/grid.hpp>

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace simd {

template <class Arch>
struct grid_kernels {
  using ints = xsimd::batch<std::int32_t, Arch>;
  using doubles = xsimd::batch<double, Arch>;
  using words = xsimd::batch<std::int64_t, Arch>;
  static constexpr std::size_t int_width = ints::size;
  static constexpr std::size_t double_width = doubles::size;

  static void cover(std::span<const float> values, std::span<double> exponents) noexcept {
    for (std::size_t b = 0; b < exponents.size(); ++b) {
      const std::size_t first = b * grid_detail::block;
      const std::size_t n = values.size() - first < grid_detail::block ? values.size() - first : grid_detail::block;
      const float* block = values.data() + first;
      const std::size_t body = n / int_width * int_width;
      // The largest exponent field below NaN/Inf's, and whether any value is subnormal.
      ints top(0), subnormal(0);
      for (std::size_t i = 0; i < body; i += int_width) {
        const ints magnitude = ints::load_unaligned(reinterpret_cast<const std::int32_t*>(block + i)) & ints(0x7fffffff);
        const ints field = magnitude & ints(0x7f800000);
        top = xsimd::max(top, xsimd::select(field == ints(0x7f800000), ints(0), field));
        subnormal = subnormal | xsimd::select(field == ints(0), magnitude, ints(0));
      }
      const std::int32_t largest = max_lane(top);
      double e = exponents[b];
      if (largest != 0) {  // a normal value: 1.f · 2^(field − 127) < 2^(field − 126)
        const double cover = static_cast<double>((largest >> 23) - 126);
        e = cover > e ? cover : e;
      } else if (max_lane(subnormal) != 0) {
        e = grid_detail::cover_block(block, body, e);
      }
      exponents[b] = grid_detail::cover_block(block + body, n - body, e);
    }
  }

  static void add(std::span<const float> values, std::span<const double> exponents, std::span<double> sums,
                  bool first) noexcept {
    // The sign is moved in integer lanes: xsimd 8.1's bitwise operations on AVX-512 doubles
    // need AVX512DQ.
    const doubles magic(6755399441055744.0), zero(0.0);
    const words sign(static_cast<std::int64_t>(grid_detail::sign_bit)), magnitude(~sign);
    for (std::size_t start = 0; start < values.size(); start += grid_detail::block) {
      const std::size_t n =
          values.size() - start < grid_detail::block ? values.size() - start : grid_detail::block;
      const double scale = grid_detail::to_grid(exponents[start / grid_detail::block]);
      const doubles scales(scale);
      const std::size_t body = n / double_width * double_width;
      const float* in = values.data() + start;
      double* out = sums.data() + start;
      for (std::size_t i = 0; i < body; i += double_width) {
        const doubles x = load_as_doubles<Arch>(in + i);
        const doubles s = x * scales;
        const doubles t = (s + magic) - magic;
        const doubles q = xsimd::select((x - x) == zero,  // finite
                                        bit_cast<double>((bit_cast<std::int64_t>(t) & magnitude) |
                                                         (bit_cast<std::int64_t>(s) & sign)),
                                        x);
        (first ? q : doubles::load_unaligned(out + i) + q).store_unaligned(out + i);
      }
      for (std::size_t i = body; i < n; ++i) {
        const double q = grid_detail::on_grid(in[i], scale);
        out[i] = first ? q : qcoll::kernels::add(out[i], q);
      }
    }
  }

  static void round(std::span<const double> sums, std::span<const double> exponents, double divide,
                    std::span<float> out, std::size_t first_index) noexcept {
    const doubles nan(static_cast<double>(quiet_nan())), divisor(divide);
    for (std::size_t i = 0; i < out.size();) {
      const std::size_t b = (first_index + i) / grid_detail::block;
      const std::size_t end = (b + 1) * grid_detail::block - first_index < out.size()
                                  ? (b + 1) * grid_detail::block - first_index
                                  : out.size();
      const double scale = grid_detail::from_grid(exponents[b]);
      const doubles scales(scale);
      for (; i + double_width <= end; i += double_width) {
        doubles value = doubles::load_unaligned(sums.data() + i) * scales;
        value = xsimd::select(value == value, value, nan);  // (xsimd's != is ordered on AVX: false for NaN)
        if (divide != 1.0) value = value / divisor;
        store_as_floats<Arch>(value, out.data() + i);
      }
      for (; i < end; ++i) out[i] = grid_detail::rounded(sums[i], scale, divide);
    }
  }
};

}  // namespace simd
QCOLL_CPU_KERNELS_END
