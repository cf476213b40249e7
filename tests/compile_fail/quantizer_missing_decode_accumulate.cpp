// Must not compile: the policy lacks decode_accumulate, and the concept says so.
#include <qcoll/core/concepts.hpp>

struct quantizer_without_decode_accumulate {
  using value_type = float;
  static constexpr bool keeps_residual = true;
  double bits_per_value() const { return 1.0; }
  std::size_t group_size() const { return 1; }
  std::size_t encoded_size(std::size_t n) const { return n; }
  void encode(std::span<const float>, std::span<float>, std::span<std::byte>, qcoll::quantizers::encode_position) const {}
  std::error_code decode(std::span<const std::byte>, std::span<float>) const { return {}; }
};

static_assert(qcoll::quantizer<quantizer_without_decode_accumulate>);
