#pragma once
/// @file
/// What every quantizer shares: the frame header, the argument checks, and the
/// check of a received frame before anything is decoded. A quantizer supplies its
/// header fields, its record layout, and its kernels (CRTP).

#include <qcoll/detail/check.hpp>
#include <qcoll/quantizers/format/options.hpp>
#include <qcoll/quantizers/format/wire.hpp>

#include <cstddef>
#include <span>
#include <system_error>

namespace qcoll::quantizers::detail {

/// Derived provides:
///   static constexpr const char* name;
///   wire::frame_header header() const;                  // all but the count
///   wire::record_layout layout(std::size_t n) const;
///   void encode_records(in, residual_in, residual_out, position, std::byte* records) const;
///     (residual_in and residual_out both empty, or the same range, or disjoint)
///   std::error_code check_records(const std::byte* records, std::size_t n) const noexcept;
///   void decode_records(const std::byte* records, std::span<T> out, bool accumulate) const noexcept;
template <class Derived, class T>
class framed {
 public:
  using value_type = T;

  /// Bytes of the frame for n values: the 24-byte header plus one record per group.
  std::size_t encoded_size(std::size_t n) const noexcept { return self().layout(n).frame_bytes(n); }

  /// Encodes `in` into the first encoded_size(in.size()) bytes of `encoded`.
  /// `residual` is empty (no error feedback) or one value per input. A group that
  /// holds NaN or Inf (in input + residual) decodes to NaN and keeps its residual.
  /// The same as encode(in, residual, residual, encoded, position).
  /// @par Errors
  /// qcoll::error (invalid_argument) when `residual` or `encoded` has the wrong size.
  void encode(std::span<const T> in, std::span<T> residual, std::span<std::byte> encoded,
              encode_position position = {}) const {
    if (!residual.empty() && residual.size() != in.size())
      qcoll::detail::throw_error(errc::invalid_argument, "{}::encode: the residual holds {} values for {} inputs",
                                 Derived::name, residual.size(), in.size());
    encode(in, std::span<const T>(residual), residual, encoded, position);
  }

  /// Encodes `in` with error feedback read from `residual_in` and written to
  /// `residual_out`: v = in + residual_in is quantized and residual_out = v − decoded(v).
  /// The frame and residual_out are bit for bit what the in-place encode gives with a
  /// residual holding residual_in; a group that holds NaN or Inf gets residual_out =
  /// residual_in. Lets a caller keep the old residual (to roll back a failed step)
  /// without copying it first.
  ///
  /// `residual_in` and `residual_out` are both empty (no error feedback) or both hold
  /// one value per input; they are the same range (in place) or do not overlap.
  /// Unless they are the same range, `residual_in` is only read.
  /// @par Errors
  /// qcoll::error (invalid_argument) when a residual or `encoded` has the wrong size,
  /// or when the residuals partly overlap.
  void encode(std::span<const T> in, std::span<const T> residual_in, std::span<T> residual_out,
              std::span<std::byte> encoded, encode_position position = {}) const {
    std::byte* records = start_frame(in, residual_in, residual_out, encoded);
    self().encode_records(in, residual_in, residual_out, position, records);
  }

  /// out = the decoded frame. On error `out` is untouched.
  std::error_code decode(std::span<const std::byte> frame, std::span<T> out) const noexcept {
    return decode_into(frame, out, false);
  }

  /// out += the decoded frame, the fused step of a reduction. On error `out` is untouched.
  std::error_code decode_accumulate(std::span<const std::byte> frame, std::span<T> out) const noexcept {
    return decode_into(frame, out, true);
  }

 protected:
  /// Checks an encode's arguments, writes the frame header and returns where the
  /// records go.
  std::byte* start_frame(std::span<const T> in, std::span<const T> residual_in, std::span<T> residual_out,
                         std::span<std::byte> encoded) const {
    if (residual_in.size() != residual_out.size() || (!residual_in.empty() && residual_in.size() != in.size()))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}::encode: the residuals hold {} and {} values for {} inputs", Derived::name,
                                 residual_in.size(), residual_out.size(), in.size());
    if (qcoll::detail::overlaps(residual_in, residual_out) && !qcoll::detail::same_range(residual_in, residual_out))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}::encode: the residuals overlap without being the same range", Derived::name);
    const std::size_t size = encoded_size(in.size());
    if (encoded.size() < size)
      qcoll::detail::throw_error(errc::invalid_argument, "{}::encode: {} values need {} bytes, the buffer has {}",
                                 Derived::name, in.size(), size, encoded.size());
    wire::frame_header header = self().header();
    header.count = in.size();
    wire::write_header(header, encoded);
    return encoded.data() + wire::header_size;
  }

 private:
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }

  std::error_code decode_into(std::span<const std::byte> frame, std::span<T> out, bool accumulate) const noexcept {
    wire::frame_header expected = self().header();
    expected.count = out.size();
    if (const auto failure = wire::check_header(frame, expected, encoded_size(out.size()))) return failure;
    const std::byte* records = frame.data() + wire::header_size;
    if (const auto failure = self().check_records(records, out.size())) return failure;
    self().decode_records(records, out, accumulate);
    return {};
  }
};

/// The group sizes one_bit and k_level accept: whole bytes of codes, exact counts.
inline void check_group_size(const char* quantizer, std::size_t group_size) {
  if (group_size < 8 || group_size % 8 != 0 || group_size > wire::max_group_size)
    qcoll::detail::throw_error(errc::invalid_argument,
                               "{}: the group size must be a multiple of 8 between 8 and {}, not {}", quantizer,
                               wire::max_group_size, group_size);
}

}  // namespace qcoll::quantizers::detail
