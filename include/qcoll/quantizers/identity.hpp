#pragma once
/// @file
/// The lossless quantizer: values travel as they are, in a frame like every other
/// quantizer's. It is the reference that makes quantized collectives exactly
/// checkable.

#include <qcoll/core/concepts.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/quantizers/framed.hpp>
#include <qcoll/quantizers/spec.hpp>

#include <cstddef>
#include <cstring>
#include <span>
#include <system_error>

namespace qcoll::quantizers {

template <arithmetic_element T>
class identity : public detail::framed<identity<T>, T> {
 public:
  static constexpr const char* name = "identity";
  /// Nothing is lost, so there is no error to feed back; the residual is ignored.
  static constexpr bool keeps_residual = false;

  constexpr double bits_per_value() const noexcept { return 8.0 * sizeof(T); }
  constexpr std::size_t group_size() const noexcept { return 0; }

  /// From a spec written "identity" (quantizers/by_name.hpp): no settings.
  static constexpr spec_reads reads{};
  static identity from_spec(const quantizer_spec& spec) {
    detail::refuse_unread(name, reads, spec);
    return identity();
  }

 private:
  friend class detail::framed<identity<T>, T>;

  wire::frame_header header() const noexcept { return {.scheme = wire::scheme::identity, .type = dtype_of<T>::value}; }
  wire::record_layout layout(std::size_t) const noexcept { return {.group = 1, .table_bytes = 0, .code_bits = 8 * sizeof(T)}; }

  /// The residual passes through unchanged: residual_out = residual_in.
  void encode_records(std::span<const T> in, std::span<const T> residual_in, std::span<T> residual_out,
                      encode_position, std::byte* records) const noexcept {
    if (!in.empty()) std::memcpy(records, in.data(), in.size_bytes());  // an empty span may hold nullptr
    if (residual_in.data() != residual_out.data() && !residual_in.empty())
      std::memcpy(residual_out.data(), residual_in.data(), residual_in.size_bytes());
  }
  /// The residual passes through unchanged here too.
  int encode_on(const device::runtime& device, const wire::frame_header& header, dtype type, const void* in,
                std::size_t n, const T* residual_in, T* residual_out, encode_position, std::byte* frame,
                void* stream) const {
    if (residual_out && residual_out != residual_in)
      if (const int failed = device.copy(residual_out, residual_in, n * sizeof(T), stream)) return failed;
    return device.identity_encode(header, type, in, n, frame, stream);
  }
  int decode_on(const device::runtime& device, const wire::frame_header& expected, const std::byte* frame,
                std::size_t frame_bytes, std::size_t n, T* out, bool accumulate, std::uint32_t* status,
                void* stream) const {
    return device.identity_decode(expected, dtype_of<T>::value, frame, frame_bytes, n, out, accumulate, status, stream);
  }
  std::error_code check_records(const std::byte*, std::size_t) const noexcept { return {}; }
  void decode_records(const std::byte* records, std::span<T> out, bool accumulate) const noexcept {
    if (!accumulate) {
      if (!out.empty()) std::memcpy(out.data(), records, out.size_bytes());
      return;
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      T value;
      std::memcpy(&value, records + i * sizeof(T), sizeof(T));  // records may be unaligned
      out[i] += value;
    }
  }
};

static_assert(quantizer<identity<float>>);
static_assert(quantizer<identity<double>>);

}  // namespace qcoll::quantizers
