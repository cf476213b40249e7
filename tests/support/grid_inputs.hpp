#pragma once
// Inputs for the reproducible sum's grid kernels (kernels/group/grid.hpp), shared by the
// CPU kernel tests and the device kernel tests.

#include <qcoll/kernels/group/grid.hpp>

#include "half_inputs.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace test {

/// Blocks of every kind the kernels branch on: wide and narrow spreads of normal values
/// (reaching subnormals), zeros and non-finite values only (an empty block), subnormals
/// only, every kind of float bit pattern, exact ties on the grid, and a block with its
/// largest value subnormal past the last whole register.
inline std::vector<float> grid_inputs() {
  std::mt19937_64 gen(29);
  constexpr std::size_t block = qcoll::kernels::grid_detail::block;
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  std::uniform_int_distribution<int> coin(0, 1), center(-150, 126), spread(0, 40);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float subnormal = std::numeric_limits<float>::denorm_min();
  std::vector<float> values;
  const auto sign = [&] { return coin(gen) ? 1.0 : -1.0; };
  for (int b = 0; b < 60; ++b) {
    std::vector<float> v(block);
    switch (b % 6) {
      case 0: {  // normal values around 2^c, within 2^s
        const int c = center(gen), s = spread(gen);
        for (float& x : v) x = static_cast<float>(sign() * std::ldexp(mantissa(gen), c - std::uniform_int_distribution<int>(0, s)(gen)));
        if (b % 12 == 0) v[7] = -0.0f, v[8] = 0.0f, v[200] = b % 24 == 0 ? inf : nan;
        break;
      }
      case 1:  // empty: zeros, and one block in two also NaN and ±Inf
        for (std::size_t i = 0; i < block; ++i) v[i] = i % 2 ? -0.0f : 0.0f;
        if (b % 12 == 1) v[3] = inf, v[100] = -inf, v[255] = nan;
        break;
      case 2:  // subnormals only
        for (float& x : v) x = static_cast<float>(sign()) * subnormal * static_cast<float>(std::uniform_int_distribution<int>(0, 1 << 22)(gen));
        break;
      case 3: {  // bit patterns of the whole range
        const auto all = narrowing_inputs();
        for (float& x : v) x = all[std::uniform_int_distribution<std::size_t>(0, all.size() - 1)(gen)];
        break;
      }
      case 4: {  // the largest value 1.5 · 2^(e−1), the others odd multiples of half a grid step
        const int e = std::uniform_int_distribution<int>(-90, 120)(gen);
        for (float& x : v)
          x = static_cast<float>(sign() * std::ldexp(2.0 * std::uniform_int_distribution<int>(0, 1000)(gen) + 1, e - 31));
        v[0] = static_cast<float>(std::ldexp(1.5, e - 1));
        break;
      }
      case 5:  // small values, the largest a subnormal in the tail of the block
        for (float& x : v) x = static_cast<float>(sign()) * subnormal * 3;
        v[block - 1] = 1000 * subnormal;
        break;
    }
    values.insert(values.end(), v.begin(), v.end());
  }
  return values;
}

}  // namespace test
