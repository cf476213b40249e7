#pragma once
/// @file
/// The lossless quantizer: values travel as they are. It is the reference that
/// makes quantized collectives exactly checkable.

#include <qcoll/concepts.hpp>
#include <qcoll/error.hpp>

#include <bit>
#include <cstddef>
#include <cstring>
#include <span>
#include <system_error>

namespace qcoll::quantizers {

template <element T>
class identity {
 public:
  using value_type = T;
  static constexpr double bits_per_value = 8.0 * sizeof(T);
  /// Nothing is lost, so there is no error to feed back.
  static constexpr bool keeps_residual = false;

  std::size_t group_size() const noexcept { return 1; }
  std::size_t encoded_size(std::size_t n) const noexcept { return n * sizeof(T); }

  /// `residual` is ignored (it may be empty). `encoded` must hold encoded_size(in.size()) bytes.
  void encode(std::span<const T> in, std::span<T> /*residual*/, std::span<std::byte> encoded) const noexcept {
    std::memcpy(encoded.data(), in.data(), in.size_bytes());
  }

  std::error_code decode(std::span<const std::byte> encoded, std::span<T> out) const noexcept {
    if (encoded.size() != encoded_size(out.size())) return make_error_code(errc::protocol_error);
    std::memcpy(out.data(), encoded.data(), encoded.size());
    return {};
  }

  std::error_code decode_accumulate(std::span<const std::byte> encoded, std::span<T> out) const noexcept {
    if (encoded.size() != encoded_size(out.size())) return make_error_code(errc::protocol_error);
    for (std::size_t i = 0; i < out.size(); ++i) {
      T value;
      std::memcpy(&value, encoded.data() + i * sizeof(T), sizeof(T));  // encoded may be unaligned
      out[i] += value;
    }
    return {};
  }
};

// The wire format is little-endian; a big-endian port must byte-swap here.
static_assert(std::endian::native == std::endian::little, "qcoll's wire format assumes a little-endian host");
static_assert(quantizer<identity<float>>);
static_assert(quantizer<identity<double>>);

}  // namespace qcoll::quantizers
