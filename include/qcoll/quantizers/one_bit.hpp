#pragma once
/// @file
/// The 1-bit threshold quantizer with error feedback (spec one-bit-exchange.md §3–5).
///
/// Values are cut into groups of G (default 2048). Within a group every value v
/// (input + residual) becomes one bit: 1 when v >= τ (τ = 0, or the group mean).
/// Two reconstruction values per group travel with the bits: the mean of the values
/// in each bin (default; an empty bin gives 0) or the group's min and max. At
/// G = 2048 a group takes 2048 bits + 64 bits, 31.0× smaller than float32.
///
/// @par Reconstruction from the previous encode
/// With reconstruction_from = previous (the seed's eqs. 13–15 take the statistics of
/// "the previous minibatch"), a group is sent with the table its own values had at
/// the previous encode of the same group, so the encode needs a memory of
/// memory_size(n) values kept between calls (encode with memory_in, memory_out; a
/// plan keeps it). Without a memory (the encodes without one), or on the first
/// encode (memory of NaN), or after a non-finite group, the current table is used.
///
/// @par Record of a group of g values
/// [bin 0 value: f32][bin 1 value: f32][ceil(g/8) bytes, value i at bit i%8 of byte i/8]
///
/// @par Thread safety
/// const and stateless: one object may encode and decode from many threads, each
/// with its own residual.

#include <qcoll/core/concepts.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/device/runtime.hpp>
#include <qcoll/quantizers/framed.hpp>
#include <qcoll/quantizers/spec.hpp>

#include <cstddef>
#include <span>
#include <system_error>

namespace qcoll::quantizers {

class one_bit : public detail::framed<one_bit, float> {
 public:
  static constexpr const char* name = "one_bit";
  static constexpr bool keeps_residual = true;

  /// @throws qcoll::error (invalid_argument) for a group size that is not a multiple of 8 in [8, 2^24].
  explicit one_bit(one_bit_options options = {}) : options_(options) {
    detail::check_group_size(name, options.group_size);
  }

  /// From a spec written "one_bit[/group]" (quantizers/by_name.hpp).
  static constexpr spec_reads reads{.bits = false, .group = true};
  static one_bit from_spec(const quantizer_spec& spec) {
    detail::refuse_unread(name, reads, spec);
    one_bit_options options;
    if (spec.group) options.group_size = *spec.group;
    return one_bit(options);
  }

  constexpr double bits_per_value() const noexcept { return 1.0; }

  /// Values of reconstruction memory an encode of n values keeps between calls: two
  /// per group with reconstruction_from = previous, else 0. A fresh memory is NaN.
  std::size_t memory_size(std::size_t n) const noexcept {
    if (options_.reconstruction_from != reconstruction_source::previous) return 0;
    return (n + options_.group_size - 1) / options_.group_size * one_bit_memory_per_group;
  }

  /// The encode with error feedback (as framed::encode) that also reads the groups'
  /// previous tables from memory_in and writes this encode's to memory_out (both
  /// memory_size(in.size()) values, or both empty: the current tables; the same range
  /// or disjoint).
  /// @par Errors
  /// qcoll::error (invalid_argument) for wrong sizes, as the encode without memory.
  void encode(std::span<const float> in, std::span<const float> residual_in, std::span<float> residual_out,
              std::span<const float> memory_in, std::span<float> memory_out, std::span<std::byte> encoded,
              encode_position = {}) const {
    check_memory(in.size(), memory_in, memory_out);
    std::byte* records = start_frame(in, residual_in, residual_out, encoded);
    execution::require_space(name, execution::memory_space::host, {{"memory_in", memory_in}, {"memory_out", memory_out}});
    execution::cpu_kernels().one_bit_encode(options_, in, residual_in, residual_out, memory_in, memory_out, records);
  }

  /// The same on device memory (framed::encode's device form, with the memories in
  /// device memory too).
  template <class In>
    requires device_input<In>
  void encode(execution::device_stream where, std::span<const In> in, std::span<const float> residual_in,
              std::span<float> residual_out, std::span<const float> memory_in, std::span<float> memory_out,
              std::span<std::byte> encoded, encode_position = {}) const {
    const auto& device = execution::device_runtime(name);
    check_memory(in.size(), memory_in, memory_out);
    checked_encode(in.size(), residual_in, residual_out, encoded);
    execution::require_space(name, execution::memory_space::device,
                             {{"the input", in}, {"residual_in", residual_in}, {"residual_out", residual_out},
                              {"memory_in", memory_in}, {"memory_out", memory_out}, {"the frame", encoded}});
    execution::check_device(
        device, queue_encode(device, where.stream, in, residual_in, residual_out, memory_in, memory_out, encoded), name);
  }

  /// framed::queue_encode with the memories (no checks: a device collective's step).
  template <class In>
    requires device_input<In>
  int queue_encode(const device::runtime& device, device::stream_handle stream, std::span<const In> in,
                   std::span<const float> residual_in, std::span<float> residual_out,
                   std::span<const float> memory_in, std::span<float> memory_out, std::span<std::byte> encoded,
                   encode_position = {}) const {
    wire::frame_header frame_header = header();
    frame_header.count = in.size();
    return device.one_bit_encode(options_, frame_header, dtype_of<In>::value, in.data(), in.size(), residual_in.data(),
                                 residual_out.data(), memory_in.data(), memory_out.data(), encoded.data(), stream);
  }
  using framed::encode;
  using framed::queue_encode;
  std::size_t group_size() const noexcept { return options_.group_size; }
  const one_bit_options& options() const noexcept { return options_; }

 private:
  friend class detail::framed<one_bit, float>;

  wire::frame_header header() const noexcept {
    return {.scheme = wire::scheme::one_bit,
            .type = dtype::f32,
            .parameter_a = static_cast<std::uint8_t>(options_.threshold),
            .parameter_b = static_cast<std::uint8_t>(options_.reconstruction),
            .group_size = static_cast<std::uint32_t>(options_.group_size)};
  }
  wire::record_layout layout(std::size_t) const noexcept {
    return wire::one_bit_layout(options_.group_size);
  }
  void encode_records(std::span<const float> in, std::span<const float> residual_in,
                      std::span<float> residual_out, encode_position, std::byte* records) const noexcept {
    execution::cpu_kernels().one_bit_encode(options_, in, residual_in, residual_out, {}, {}, records);
  }
  int encode_on(const device::runtime& device, const wire::frame_header& header, dtype type, const void* in,
                std::size_t n, const float* residual_in, float* residual_out, encode_position, std::byte* frame,
                void* stream) const {
    return device.one_bit_encode(options_, header, type, in, n, residual_in, residual_out, nullptr, nullptr, frame,
                               stream);
  }
  int decode_on(const device::runtime& device, const wire::frame_header& expected, const std::byte* frame,
                std::size_t frame_bytes, std::size_t n, float* out, bool accumulate, std::uint32_t* status,
                void* stream) const {
    return device.one_bit_decode(options_, expected, frame, frame_bytes, n, out, accumulate, status, stream);
  }
  void check_memory(std::size_t n, std::span<const float> memory_in, std::span<float> memory_out) const {
    if (memory_in.size() != memory_out.size() || (!memory_in.empty() && memory_in.size() != memory_size(n)))
      qcoll::detail::throw_error(errc::invalid_argument, "one_bit::encode: the memories hold {} and {} values for {}",
                                 memory_in.size(), memory_out.size(), memory_size(n));
  }
  /// Any bits and any reconstruction values are a valid group; only the padding
  /// bits after the last value must be zero.
  std::error_code check_records(const std::byte* records, std::size_t n) const noexcept {
    if (n % options_.group_size == 0) return {};
    const wire::record_layout records_layout = layout(n);
    const std::byte* last = records + (n / options_.group_size) * records_layout.full_record_bytes();
    if (!wire::padding_is_zero(last + records_layout.table_bytes, n % options_.group_size, 1))
      return make_error_code(errc::protocol_error);
    return {};
  }
  void decode_records(const std::byte* records, std::span<float> out, bool accumulate) const noexcept {
    execution::cpu_kernels().one_bit_decode(options_, records, out, accumulate);
  }

  one_bit_options options_;
};

static_assert(quantizer<one_bit>);

}  // namespace qcoll::quantizers
