#pragma once
// Inputs for the 16-bit conversion tests, shared by the CPU tests and cuda_tests.

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace test {

/// The value of a finite float16 pattern, exactly, in double.
inline double f16_value(std::uint16_t bits) {  // finite bits only; 0x7c00 stands for 2^16, the first value past the largest
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
  return (bits & 0x8000) ? -magnitude : magnitude;
}

/// Floats that exercise the rounding: a sweep over every exponent, each 16-bit
/// value's neighbourhood (exact, the half-way points and one float either side of
/// them), zeros, infinities, NaNs with payloads, float subnormals.
inline std::vector<float> narrowing_inputs() {
  std::vector<std::uint32_t> bits;
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 40009) bits.push_back(static_cast<std::uint32_t>(b));
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const std::uint32_t upper = h << 16;  // bf16 value h, its half-way point to h + 1, and around
    for (std::uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u}) bits.push_back(upper | low);
    if ((h & 0x7fff) < 0x7c00) {  // f16 value h and the float half-way to the next
      const double here = f16_value(static_cast<std::uint16_t>(h));
      const double next = (h & 0x7fff) == 0x7bff ? ((h & 0x8000) ? -65536.0 : 65536.0)
                                                  : f16_value(static_cast<std::uint16_t>(h + 1));
      const std::uint32_t middle = std::bit_cast<std::uint32_t>(static_cast<float>((here + next) / 2));
      for (std::uint32_t b : {std::bit_cast<std::uint32_t>(static_cast<float>(here)), middle - 1, middle, middle + 1})
        bits.push_back(b);
    }
  }
  for (std::uint32_t b : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                          0x7fa5a5a5u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x477fefffu, 0x477ff000u, 0x33000000u,
                          0x33000001u, 0x387fffffu})
    bits.push_back(b);
  std::vector<float> values;
  values.reserve(bits.size());
  for (std::uint32_t b : bits) values.push_back(std::bit_cast<float>(b));
  return values;
}

}  // namespace test
