#pragma once
/// @file
/// The emulated device's kernels: what the CUDA kernels compute, run on a stream's
/// worker by the CPU. Encodes and decodes are the CPU backend's kernels (so a frame
/// and a residual are the host call's, bit for bit); a decode checks the frame first
/// with the device's own checks (wire::header_verdict and kernels/simt's
/// records_valid, the code the CUDA check kernel runs) into its status word and
/// touches `out` only if that is 0. 16-bit inputs are widened as the CUDA kernels widen
/// them as they read. Each function here runs on the worker; kernel_entries.hpp queues them.

#include <qcoll/core/half.hpp>
#include <qcoll/core/quantizer_options.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/core/wire.hpp>
#include <qcoll/kernels/cpu/convert.hpp>
#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/kernels/cpu/grid.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/kernels/simt/bfp.hpp>
#include <qcoll/kernels/simt/k_level.hpp>
#include <qcoll/kernels/simt/one_bit.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace qcoll::device::emulated_detail {

/// `n` values of type `type` at `x` as float: the values themselves, or (16-bit) widened into `scratch`.
inline std::span<const float> as_float(dtype type, const void* x, std::size_t n, std::vector<float>& scratch) {
  if (type == dtype::f32) return {static_cast<const float*>(x), n};
  scratch.resize(n);
  if (type == dtype::bf16) kernels::cpu::widen(std::span(static_cast<const bfloat16*>(x), n), std::span(scratch));
  else kernels::cpu::widen(std::span(static_cast<const float16*>(x), n), std::span(scratch));
  return scratch;
}

/// A residual argument as a span: empty where the kernel got none (null).
template <class T>
std::span<T> optional_span(T* values, std::size_t n) noexcept {
  return values ? std::span<T>(values, n) : std::span<T>();
}

/// The check a decode kernel makes before it writes: the header, then the records
/// by the quantizer's device rules (kernels/simt). 0 or an errc.
template <class ValueValid, class GroupValid>
std::uint32_t frame_verdict(const quantizers::wire::frame_header& expected,
                            const quantizers::wire::record_layout& layout, const std::byte* frame,
                            std::size_t frame_bytes, std::size_t n, const ValueValid& value_valid,
                            const GroupValid& group_valid) {
  if (const int verdict = quantizers::wire::header_verdict(frame, frame_bytes, expected, layout.frame_bytes(n)))
    return static_cast<std::uint32_t>(verdict);
  if (!kernels::simt::records_valid(0, 1, layout, frame + quantizers::wire::header_size, n, value_valid, group_valid))
    return static_cast<std::uint32_t>(errc::protocol_error);
  return 0;
}

struct kernel_work {
  static void one_bit_encode(const quantizers::one_bit_options& options, const quantizers::wire::frame_header& header,
                             dtype type, const void* x, std::size_t n, const float* residual_in, float* residual_out,
                             const float* memory_in, float* memory_out, std::byte* frame) {
    std::vector<float> widened;
    const std::size_t memory = memory_in ? (n + options.group_size - 1) / options.group_size * quantizers::one_bit_memory_per_group : 0;
    quantizers::wire::write_header(header, frame);
    kernels::cpu::active_kernels().one_bit_encode(
        options, as_float(type, x, n, widened), optional_span(residual_in, n), optional_span(residual_out, n),
        optional_span(memory_in, memory), optional_span(memory_out, memory), frame + quantizers::wire::header_size);
  }

  static void k_level_encode(const quantizers::k_level_options& options, const quantizers::wire::frame_header& header,
                             quantizers::encode_position position, dtype type, const void* x, std::size_t n,
                             const float* residual_in, float* residual_out, std::byte* frame) {
    std::vector<float> widened;
    quantizers::wire::write_header(header, frame);
    kernels::cpu::active_kernels().k_level_encode(options, as_float(type, x, n, widened),
                                                  optional_span(residual_in, n), optional_span(residual_out, n),
                                                  position, frame + quantizers::wire::header_size);
  }

  static void bfp_encode(const quantizers::bfp_options& options, const quantizers::wire::frame_header& header,
                         dtype type, const void* x, std::size_t n, const float* residual_in, float* residual_out,
                         std::byte* frame) {
    std::vector<float> widened;
    quantizers::wire::write_header(header, frame);
    kernels::cpu::active_kernels().bfp_encode(options, as_float(type, x, n, widened), optional_span(residual_in, n),
                                              optional_span(residual_out, n), frame + quantizers::wire::header_size);
  }

  /// identity: the frame's records are the values in the frame's type (f32 from 16-bit input too).
  static void identity_encode(const quantizers::wire::frame_header& header, dtype type, const void* x, std::size_t n,
                              std::byte* frame) {
    quantizers::wire::write_header(header, frame);
    std::byte* records = frame + quantizers::wire::header_size;
    if (header.type == dtype::f64) {
      if (n != 0) std::memcpy(records, x, n * sizeof(double));
      return;
    }
    std::vector<float> widened;
    const std::span<const float> values = as_float(type, x, n, widened);
    if (n != 0) std::memcpy(records, values.data(), n * sizeof(float));
  }

  static void one_bit_decode(const quantizers::one_bit_options& options, const quantizers::wire::frame_header& expected,
                             const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out,
                             bool accumulate, std::uint32_t* status) {
    const quantizers::wire::record_layout layout = kernels::one_bit_detail::layout(options.group_size);
    *status = frame_verdict(expected, layout, frame, frame_bytes, n, kernels::simt::always_valid{},
                            kernels::simt::always_valid{});
    if (*status == 0)
      kernels::cpu::active_kernels().one_bit_decode(options, frame + quantizers::wire::header_size,
                                                    optional_span(out, n), accumulate);
  }

  static void k_level_decode(const quantizers::k_level_options& options, const quantizers::wire::frame_header& expected,
                             const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out,
                             bool accumulate, std::uint32_t* status) {
    const quantizers::wire::record_layout layout = kernels::k_level_detail::layout(options);
    *status = frame_verdict(expected, layout, frame, frame_bytes, n,
                            kernels::simt::k_level_code_valid{layout, options.levels}, kernels::simt::always_valid{});
    if (*status == 0)
      kernels::cpu::active_kernels().k_level_decode(options, frame + quantizers::wire::header_size,
                                                    optional_span(out, n), accumulate);
  }

  static void bfp_decode(const quantizers::bfp_options& options, const quantizers::wire::frame_header& expected,
                         const std::byte* frame, std::size_t frame_bytes, std::size_t n, float* out, bool accumulate,
                         std::uint32_t* status) {
    const quantizers::wire::record_layout layout =
        kernels::bfp_detail::layout(kernels::bfp_detail::block_values(options, n), options.mantissa_bits);
    *status = frame_verdict(expected, layout, frame, frame_bytes, n, kernels::simt::bfp_mantissa_valid{layout},
                            kernels::simt::bfp_exponent_valid{layout});
    if (*status == 0)
      kernels::cpu::active_kernels().bfp_decode(options, frame + quantizers::wire::header_size, optional_span(out, n),
                                                accumulate);
  }

  /// identity keeps its element type; adds as the host decode adds.
  template <class T>
  static void identity_decode(const quantizers::wire::frame_header& expected, const std::byte* frame,
                              std::size_t frame_bytes, std::size_t n, T* out, bool accumulate, std::uint32_t* status) {
    const quantizers::wire::record_layout layout{.group = 1, .table_bytes = 0, .code_bits = 8 * sizeof(T)};
    *status = frame_verdict(expected, layout, frame, frame_bytes, n, kernels::simt::always_valid{},
                            kernels::simt::always_valid{});
    if (*status != 0 || n == 0) return;
    const std::byte* records = frame + quantizers::wire::header_size;
    if (!accumulate) {
      std::memcpy(out, records, n * sizeof(T));
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      T value;
      std::memcpy(&value, records + i * sizeof(T), sizeof(T));
      out[i] += value;
    }
  }

  template <class T>
  static void reduce(reduce_op op, const void* a, const void* b, void* out, std::size_t n) {
    kernels::cpu::reduce<T>(op, std::span(static_cast<const T*>(a), n), std::span(static_cast<const T*>(b), n),
                            std::span(static_cast<T*>(out), n));
  }

  template <class T>
  static void divide(void* values, std::size_t n, std::size_t divisor) {
    kernels::cpu::finish_avg(std::span(static_cast<T*>(values), n), divisor);
  }

  template <half_element Half>
  static void widen(const void* in, float* out, std::size_t n) {
    kernels::cpu::widen(std::span(static_cast<const Half*>(in), n), std::span(out, n));
  }
  template <half_element Half>
  static void narrow(const float* in, void* out, std::size_t n) {
    kernels::cpu::narrow(std::span(in, n), std::span(static_cast<Half*>(out), n));
  }

  /// The grid conversions for values of `type` (f32, bf16, f16, f64), as the CPU's.
  template <class Work>
  static void with_type(dtype type, Work&& work) {
    if (type == dtype::f32) work(float{});
    else if (type == dtype::bf16) work(bfloat16{});
    else if (type == dtype::f16) work(float16{});
    else work(double{});
  }
  static void grid_cover(dtype in, const void* x, std::size_t n, double* exponents) {
    with_type(in, [&](auto tag) {
      using T = decltype(tag);
      const std::size_t blocks = (n + kernels::grid_detail::block - 1) / kernels::grid_detail::block;
      kernels::cpu::grid_cover(std::span(static_cast<const T*>(x), n), std::span(exponents, blocks));
    });
  }
  static void grid_add(dtype in, const void* x, std::size_t n, const double* exponents, double* sums, bool first) {
    with_type(in, [&](auto tag) {
      using T = decltype(tag);
      const std::size_t blocks = (n + kernels::grid_detail::block - 1) / kernels::grid_detail::block;
      const std::size_t carriers = std::is_same_v<T, double> ? 2 : 1;
      kernels::cpu::grid_add(std::span(static_cast<const T*>(x), n), std::span(exponents, blocks),
                             std::span(sums, carriers * n), first);
    });
  }
  static void grid_round(dtype out_type, const double* sums, const double* low, std::size_t n,
                         const double* exponents, std::size_t first_index, double divide, void* out) {
    with_type(out_type, [&](auto tag) {
      using T = decltype(tag);
      const std::size_t blocks = (first_index + n + kernels::grid_detail::block - 1) / kernels::grid_detail::block;
      kernels::cpu::grid_round(std::span(sums, n), std::span(low, low ? n : 0), std::span(exponents, blocks), divide,
                               std::span(static_cast<T*>(out), n), first_index);
    });
  }
};

}  // namespace qcoll::device::emulated_detail
