#pragma once
/// @file
/// The k_level reference kernels: plain loops that define the results every other
/// backend must reproduce bit for bit (quantizers/k_level.hpp states the semantics).

#include <qcoll/kernels/group/abi.hpp>
#include <qcoll/kernels/group/codes.hpp>
#include <qcoll/kernels/group/k_level.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

QCOLL_CPU_KERNELS_BEGIN
namespace reference {

template <bool stochastic>
inline void k_level_encode_group(const quantizers::k_level_options& options, const float* x,
                                 const float* residual_in, float* residual_out, std::size_t g,
                                 const k_level_detail::group_stream& stream, std::byte* record) noexcept {
  using namespace k_level_detail;
  const unsigned bits = code_bits(options.levels);
  float low = std::numeric_limits<float>::infinity();
  float high = -std::numeric_limits<float>::infinity();
  bool finite = true;
  for (std::size_t i = 0; i < g; ++i) {
    const float v = fed(x, residual_in, i);
    finite = finite && is_finite(v);
    low = lower(v, low);
    high = higher(v, high);
  }
  if (!finite) {
    keep_residual(residual_in, residual_out, g);
    store_nonfinite(options, record, g);
    return;
  }
  const table t = make_table(low, high, options.levels);
  store_table(record, t.min, t.step);
  std::array<std::uint32_t, chunk> buffer;
  for (std::size_t first = 0; first < g; first += chunk) {
    const std::size_t count = g - first < chunk ? g - first : chunk;
    encode_values<stochastic>(x, residual_in, residual_out, first, first + count, t, stream, buffer.data());
    pack_codes(std::span<const std::uint32_t>(buffer.data(), count), bits, codes_of(record) + first * bits / 8);
  }
}

/// Encodes in.size() values into the records of a frame (header excluded).
/// The residuals are both empty (no error feedback) or both as long as `in`, and
/// either the same range or disjoint.
inline void k_level_encode(const quantizers::k_level_options& options, std::span<const float> in,
                           std::span<const float> residual_in, std::span<float> residual_out,
                           quantizers::encode_position position, std::byte* records) noexcept {
  k_level_detail::encode_groups(options, in, residual_in, residual_out, position, records,
                                [&](auto stochastic, const float* x, const float* r_in, float* r_out, std::size_t g,
                                    auto stream, std::byte* record) {
                                  k_level_encode_group<decltype(stochastic)::value>(options, x, r_in, r_out, g, stream,
                                                                                    record);
                                });
}

/// out = decoded (accumulate false) or out += decoded (accumulate true).
inline void k_level_decode(const quantizers::k_level_options& options, const std::byte* records,
                           std::span<float> out, bool accumulate) noexcept {
  using namespace k_level_detail;
  const auto records_layout = layout(options);
  const unsigned bits = records_layout.code_bits;
  std::array<std::uint32_t, chunk> buffer;
  for_each_group(records_layout, out.size(), records, [&](std::size_t start, std::size_t g, auto* records) {
    const float min = load<float>(records);
    const float step = load<float>(records + sizeof(float));
    float* y = out.data() + start;
    for (std::size_t first = 0; first < g; first += chunk) {
      const std::size_t count = g - first < chunk ? g - first : chunk;
      unpack_codes(codes_of(records) + first * bits / 8, bits, std::span<std::uint32_t>(buffer.data(), count));
      decode_values(min, step, buffer.data(), count, y + first, accumulate);
    }
  });
}

}  // namespace reference
QCOLL_CPU_KERNELS_END
