#pragma once
/// @file
/// What every quantizer shares: the frame header, the argument checks, and the
/// check of a received frame before anything is decoded, for host memory and for
/// device memory (a device_stream first argument, docs/gpu.md). A quantizer
/// supplies its header fields, its record layout, and its kernels through the
/// execution layer (CRTP).

#include <qcoll/core/half.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
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
///   int encode_on(const device::runtime&, header, dtype in, const void* in, n, residual_in,
///                 residual_out, position, std::byte* frame, stream) const;        (device memory)
///   int decode_on(const device::runtime&, expected header, frame, frame bytes, n, T* out,
///                 bool accumulate, std::uint32_t* status, stream) const;          (device memory)
template <class Derived, class T>
class framed {
 public:
  using value_type = T;

  /// The inputs a device encode takes: T, and for float quantizers the 16-bit
  /// types too, widened as they are read (the same frame as for their float values).
  template <class In>
  static constexpr bool device_input = std::same_as<In, T> || (std::same_as<T, float> && half_element<In>);

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

  /// The encode of device memory: `in`, the residuals and `encoded` are GPU
  /// buffers, and the work is queued on where.stream (the call returns once it is).
  /// The frame and residual_out are byte for byte the host encode's for the same
  /// values; 16-bit inputs give the frame of their float values.
  /// @par Errors
  /// qcoll::error: invalid_argument for the host encode's reasons, for a buffer in
  /// host memory, or without a device runtime (qcoll::cuda and a GPU, or the emulated
  /// device: docs/gpu.md); device_error when the runtime refuses the launch.
  template <class In>
    requires device_input<In>
  void encode(execution::device_stream where, std::span<const In> in, std::span<const T> residual_in,
              std::span<T> residual_out, std::span<std::byte> encoded, encode_position position = {}) const {
    const auto& device = execution::device_runtime(Derived::name);
    checked_encode(in.size(), residual_in, residual_out, encoded);
    execution::require_space(Derived::name, execution::memory_space::device,
                             {{"the input", in}, {"residual_in", residual_in}, {"residual_out", residual_out},
                              {"the frame", encoded}});
    execution::check_device(device, queue_encode(device, where.stream, in, residual_in, residual_out, encoded, position),
                            Derived::name);
  }

  /// What a device collective runs between its steps, once it has checked its buffers
  /// (sizes and memory spaces) at its door: the encode queued on `stream` of `device`,
  /// with no check of its own. Returns 0 or the runtime's error.
  template <class In>
    requires device_input<In>
  int queue_encode(const device::runtime& device, device::stream_handle stream, std::span<const In> in,
                   std::span<const T> residual_in, std::span<T> residual_out, std::span<std::byte> encoded,
                   encode_position position = {}) const {
    wire::frame_header header = self().header();
    header.count = in.size();
    return self().encode_on(device, header, dtype_of<In>::value, in.data(), in.size(), residual_in.data(),
                            residual_out.data(), position, encoded.data(), stream);
  }

  /// The same for a decode: `frame` checked on the device into *status (a device word:
  /// 0, or the errc the host decode would return), then decoded into (or added to)
  /// `out` if it is 0. Returns 0 or the runtime's error.
  int queue_decode(const device::runtime& device, device::stream_handle stream, std::span<const std::byte> frame,
                   std::span<T> out, bool accumulate, std::uint32_t* status) const {
    wire::frame_header expected = self().header();
    expected.count = out.size();
    return self().decode_on(device, expected, frame.data(), frame.size(), out.size(), out.data(), accumulate, status,
                            stream);
  }

  /// out = the decoded frame, all in device memory: the frame is checked on the
  /// device (as the host decode checks it), then decoded on where.stream. Waits for
  /// the stream, to return the check's verdict. On error `out` is untouched.
  /// @par Errors
  /// The host decode's codes for a frame that is not right; qcoll::error thrown as
  /// for the device encode (memory spaces, no CUDA, a refused launch).
  std::error_code decode(execution::device_stream where, std::span<const std::byte> frame, std::span<T> out) const {
    return decode_on_device(where, frame, out, false);
  }

  /// out += the decoded frame, on the device (as decode).
  std::error_code decode_accumulate(execution::device_stream where, std::span<const std::byte> frame,
                                    std::span<T> out) const {
    return decode_on_device(where, frame, out, true);
  }

 protected:
  /// Checks an encode's arguments and returns the frame's header.
  wire::frame_header checked_encode(std::size_t n, std::span<const T> residual_in, std::span<T> residual_out,
                                    std::span<std::byte> encoded) const {
    if (residual_in.size() != residual_out.size() || (!residual_in.empty() && residual_in.size() != n))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}::encode: the residuals hold {} and {} values for {} inputs", Derived::name,
                                 residual_in.size(), residual_out.size(), n);
    if (qcoll::detail::overlaps(residual_in, residual_out) && !qcoll::detail::same_range(residual_in, residual_out))
      qcoll::detail::throw_error(errc::invalid_argument,
                                 "{}::encode: the residuals overlap without being the same range", Derived::name);
    const std::size_t size = encoded_size(n);
    if (encoded.size() < size)
      qcoll::detail::throw_error(errc::invalid_argument, "{}::encode: {} values need {} bytes, the buffer has {}",
                                 Derived::name, n, size, encoded.size());
    wire::frame_header header = self().header();
    header.count = n;
    return header;
  }

  /// Checks a host encode's arguments, writes the frame header and returns where the
  /// records go.
  std::byte* start_frame(std::span<const T> in, std::span<const T> residual_in, std::span<T> residual_out,
                         std::span<std::byte> encoded) const {
    const wire::frame_header header = checked_encode(in.size(), residual_in, residual_out, encoded);
    execution::require_space(Derived::name, execution::memory_space::host,
                             {{"the input", in}, {"residual_in", residual_in}, {"residual_out", residual_out},
                              {"the frame", encoded}});
    wire::write_header(header, encoded);
    return encoded.data() + wire::header_size;
  }

 private:
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }

  std::error_code decode_into(std::span<const std::byte> frame, std::span<T> out, bool accumulate) const noexcept {
    try {
      if (execution::misplaced(execution::memory_space::host, {{"the frame", frame}, {"out", out}}))
        return make_error_code(errc::invalid_argument);
    } catch (...) {
      return make_error_code(errc::invalid_argument);
    }
    wire::frame_header expected = self().header();
    expected.count = out.size();
    if (const auto failure = wire::check_header(frame, expected, encoded_size(out.size()))) return failure;
    const std::byte* records = frame.data() + wire::header_size;
    if (const auto failure = self().check_records(records, out.size())) return failure;
    self().decode_records(records, out, accumulate);
    return {};
  }

  std::error_code decode_on_device(execution::device_stream where, std::span<const std::byte> frame, std::span<T> out,
                                   bool accumulate) const {
    const auto& device = execution::device_runtime(Derived::name);
    execution::require_space(Derived::name, execution::memory_space::device, {{"the frame", frame}, {"out", out}});
    std::uint32_t* status = execution::status_word();
    execution::check_device(device, queue_decode(device, where.stream, frame, out, accumulate, status), Derived::name);
    std::uint32_t verdict = 0;
    execution::check_device(device, device.copy(&verdict, status, sizeof verdict, where.stream), Derived::name);
    execution::check_device(device, device.synchronize(where.stream), Derived::name);
    if (verdict == 0) return {};
    return make_error_code(static_cast<errc>(verdict));
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
