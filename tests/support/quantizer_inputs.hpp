#pragma once
// Inputs that stress quantizer kernels, and the backends to compare with the
// reference. Shared by the quantizer test files.

#include <qcoll/kernels/cpu/dispatch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace test {

struct named_input {
  std::string name;
  std::vector<float> values;
};

/// Element counts around every boundary: SIMD widths (4, 8, 16), the 16-lane
/// summation block, and groups of `group` values.
inline std::vector<std::size_t> boundary_counts(std::size_t group) {
  std::vector<std::size_t> counts{0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 1000};
  for (std::size_t base : {group, 2 * group, 3 * group})
    for (std::size_t delta : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{17}}) {
      counts.push_back(base + delta);
      if (base > delta) counts.push_back(base - delta);
    }
  return counts;
}

/// n values of each kind: random, at the threshold (±0), denormal, huge, tiny,
/// all equal, mixed magnitudes, and groups holding NaN or ±Inf.
inline std::vector<named_input> edge_case_inputs(std::size_t n, unsigned seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> coin(0, 1);
  std::uniform_int_distribution<int> exponent(-140, 127);
  const auto fill = [&](auto&& value) {
    std::vector<float> values(n);
    for (float& v : values) v = value();
    return values;
  };
  std::vector<named_input> inputs;
  inputs.push_back({"normal", fill([&] { return normal(generator); })});
  inputs.push_back({"signed zeros", fill([&] { return coin(generator) ? 0.0f : -0.0f; })});
  inputs.push_back({"zeros and ones", fill([&] { return coin(generator) ? 0.0f : 1.0f; })});
  inputs.push_back({"denormals", fill([&] {
                      return normal(generator) * std::numeric_limits<float>::denorm_min() * 1000.0f;
                    })});
  inputs.push_back({"huge", fill([&] { return normal(generator) * 1e37f; })});
  inputs.push_back({"near float max", fill([&] {
                      return (coin(generator) ? 1.0f : -1.0f) * std::numeric_limits<float>::max() *
                             (0.5f + 0.5f * static_cast<float>(coin(generator)));
                    })});
  inputs.push_back({"tiny", fill([&] { return normal(generator) * 1e-30f; })});
  inputs.push_back({"all equal", fill([] { return 0.75f; })});
  inputs.push_back({"all equal negative", fill([] { return -3.0f; })});
  inputs.push_back({"mixed magnitudes", fill([&] {
                      return (coin(generator) ? 1.0f : -1.0f) * std::ldexp(1.0f + 0.5f * normal(generator), exponent(generator));
                    })});
  inputs.push_back({"powers of two", fill([&] { return std::ldexp(coin(generator) ? 1.0f : -1.0f, exponent(generator) / 4); })});
  if (n > 0) {
    auto with_nan = fill([&] { return normal(generator); });
    with_nan[n / 2] = std::numeric_limits<float>::quiet_NaN();
    inputs.push_back({"one NaN", std::move(with_nan)});
    auto with_inf = fill([&] { return normal(generator); });
    with_inf[n - 1] = std::numeric_limits<float>::infinity();
    inputs.push_back({"one +Inf", std::move(with_inf)});
    auto with_both = fill([&] { return normal(generator); });
    with_both[0] = -std::numeric_limits<float>::infinity();
    with_both[n - 1] = std::numeric_limits<float>::infinity();
    inputs.push_back({"-Inf and +Inf", std::move(with_both)});
  }
  return inputs;
}

inline const qcoll::kernels::cpu::kernel_table& reference_kernels() {
  return *qcoll::kernels::cpu::find_backend("reference");
}

/// The backends other than the reference that this CPU runs. Those built in but
/// not runnable here are named in `skipped`.
inline std::vector<const qcoll::kernels::cpu::kernel_table*> simd_backends(std::vector<std::string>* skipped = nullptr) {
  std::vector<const qcoll::kernels::cpu::kernel_table*> tables;
  for (const auto& backend : qcoll::kernels::cpu::compiled_backends()) {
    if (std::string(backend.kernels->name) == "reference") continue;
    if (backend.runs_here) tables.push_back(backend.kernels);
    else if (skipped) skipped->push_back(backend.kernels->name);
  }
  return tables;
}

/// Bitwise equality, so that NaN == NaN and -0 != +0.
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

/// A quiet NaN with a payload no encoder computes: what residual_out holds before a
/// split encode, so a value the encoder failed to write shows.
inline const float unwritten = std::bit_cast<float>(0x7fc5a5a5u);

/// Encodes once in place (`in_place(residual, bytes)`) and once with split residuals
/// (`split(residual_in, residual_out, bytes)`, residual_out prefilled with `unwritten`),
/// both from `residual0`. True when both give the same bytes and the same new residual
/// and the split encode left residual_in as it was.
template <class InPlace, class Split>
bool split_matches_in_place(std::span<const float> residual0, std::size_t bytes, InPlace&& in_place, Split&& split) {
  std::vector<float> residual(residual0.begin(), residual0.end());
  std::vector<std::byte> expected(bytes, std::byte{0xa5});
  in_place(std::span<float>(residual), std::span<std::byte>(expected));
  const std::vector<float> residual_in(residual0.begin(), residual0.end());
  std::vector<float> residual_out(residual0.size(), unwritten);
  std::vector<std::byte> actual(bytes, std::byte{0xa5});
  split(std::span<const float>(residual_in), std::span<float>(residual_out), std::span<std::byte>(actual));
  return same_bytes(actual, expected) && same_bits(residual_out, residual) &&
         same_bits(residual_in, residual0);
}

/// Residuals to start from: small values, and 0.03 × an input value (so it inherits
/// the input's NaN, Inf and zeros).
inline std::vector<std::vector<float>> starting_residuals(std::span<const float> in) {
  std::vector<float> small(in.size()), scaled(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    small[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
    scaled[i] = 0.03f * in[(7 * i + 3) % in.size()];
  }
  return {small, scaled};
}

}  // namespace test
