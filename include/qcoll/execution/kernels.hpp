#pragma once
/// @file
/// The kernels the exact collectives and the plans run between their steps —
/// reduce, the average's division, the 16-bit conversions, copies — for each memory space:
/// the host forms on the CPU backend, the device_stream forms on the active device runtime
/// (dispatch.hpp). Algorithms call these, never a backend by name.

#include <qcoll/core/half.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/kernels/cpu/convert.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>

#include <cstddef>
#include <cstring>
#include <span>

namespace qcoll::execution {

/// out[i] = a[i] ⊕ b[i] (avg as sum); `out` may be `a` or `b`. Host memory.
template <arithmetic_element T>
void reduce(reduce_op op, std::span<const T> a, std::span<const T> b, std::span<T> out) noexcept {
  kernels::cpu::reduce<T>(op, a, b, out);
}

/// out[i] = a[i] ⊕ float(b[i]): a float partial and 16-bit values. Host memory.
template <half_element Half>
void reduce_widened(reduce_op op, std::span<const float> a, std::span<const Half> b, std::span<float> out) noexcept {
  kernels::cpu::reduce_widened(op, a, b, out);
}

/// values[i] /= contributions, turning a sum into an average. Host memory.
template <arithmetic_element T>
void finish_avg(std::span<T> values, std::size_t contributions) noexcept {
  kernels::cpu::finish_avg(values, contributions);
}

/// 16-bit values to float (exact) and float to 16 bits (nearest even). Host memory.
template <half_element Half>
void widen(std::span<const Half> in, std::span<float> out) noexcept {
  kernels::cpu::widen(in, out);
}
template <half_element Half>
void narrow(std::span<const float> in, std::span<Half> out) noexcept {
  kernels::cpu::narrow(in, out);
}

/// into = from, both `into.size()` bytes (a step's read of a peer's mapped block, or
/// its staging). Host memory.
inline void copy(std::span<std::byte> into, std::span<const std::byte> from) noexcept {
  if (!into.empty()) std::memcpy(into.data(), from.data(), into.size());
}

/// The same on device memory, queued on `where`'s stream, for buffers a call already
/// checked at its door (a collective over a transport that moves device memory runs
/// them per step, where a check per buffer would cost a runtime query each time).
/// @throws qcoll::error: invalid_argument without a device runtime; device_error when
/// the runtime refuses the launch.
template <arithmetic_element T>
void queue_reduce(device_stream where, reduce_op op, std::span<const T> a, std::span<const T> b, std::span<T> out) {
  const auto& device = device_runtime("reduce");
  check_device(device, device.reduce(op, dtype_of<T>::value, a.data(), b.data(), out.data(), out.size(), where.stream),
               "reduce");
}
template <arithmetic_element T>
void queue_finish_avg(device_stream where, std::span<T> values, std::size_t contributions) {
  const auto& device = device_runtime("finish_avg");
  check_device(device, device.divide(dtype_of<T>::value, values.data(), values.size(), contributions, where.stream),
               "finish_avg");
}
template <half_element Half>
void queue_widen(device_stream where, std::span<const Half> in, std::span<float> out) {
  const auto& device = device_runtime("widen");
  check_device(device, device.widen(dtype_of<Half>::value, in.data(), out.data(), in.size(), where.stream), "widen");
}
/// The reproducible sum's grid conversions on device memory (kernels/cpu/grid.hpp's
/// forms): f32, bf16, f16 or f64 values (f64: two carrier planes, `sums` 2n long, and
/// `low` for the round); exponents one per block of grid_detail::block values.
template <element T>
void queue_grid_cover(device_stream where, std::span<const T> values, std::span<double> exponents) {
  const auto& device = device_runtime("grid_cover");
  check_device(device, device.grid_cover(dtype_of<T>::value, values.data(), values.size(), exponents.data(), where.stream),
               "grid_cover");
}
template <element T>
void queue_grid_add(device_stream where, std::span<const T> values, std::span<const double> exponents,
                    std::span<double> sums, bool first) {
  const auto& device = device_runtime("grid_add");
  check_device(device,
               device.grid_add(dtype_of<T>::value, values.data(), values.size(), exponents.data(), sums.data(), first,
                               where.stream),
               "grid_add");
}
template <element T>
void queue_grid_round(device_stream where, std::span<const double> sums, std::span<const double> low,
                      std::span<const double> exponents, double divide, std::span<T> out, std::size_t first_index) {
  const auto& device = device_runtime("grid_round");
  check_device(device,
               device.grid_round(dtype_of<T>::value, sums.data(), low.data(), out.size(),
                                 exponents.data(), first_index, divide, out.data(), where.stream),
               "grid_round");
}

template <half_element Half>
void queue_narrow(device_stream where, std::span<const float> in, std::span<Half> out) {
  const auto& device = device_runtime("narrow");
  check_device(device, device.narrow(dtype_of<Half>::value, in.data(), out.data(), in.size(), where.stream), "narrow");
}
inline void queue_copy(device_stream where, std::span<std::byte> into, std::span<const std::byte> from) {
  if (into.empty()) return;
  const auto& device = device_runtime("copy");
  check_device(device, device.copy(into.data(), from.data(), into.size(), where.stream), "copy");
}

/// The same, checking first that every buffer is device memory.
/// @throws qcoll::error: also invalid_argument for a buffer in host memory.
template <arithmetic_element T>
void reduce(device_stream where, reduce_op op, std::span<const T> a, std::span<const T> b, std::span<T> out) {
  require_space("reduce", memory_space::device, {{"a", a}, {"b", b}, {"out", out}});
  queue_reduce(where, op, a, b, out);
}
template <arithmetic_element T>
void finish_avg(device_stream where, std::span<T> values, std::size_t contributions) {
  require_space("finish_avg", memory_space::device, {{"values", values}});
  queue_finish_avg(where, values, contributions);
}
template <half_element Half>
void widen(device_stream where, std::span<const Half> in, std::span<float> out) {
  require_space("widen", memory_space::device, {{"in", in}, {"out", out}});
  queue_widen(where, in, out);
}
template <half_element Half>
void narrow(device_stream where, std::span<const float> in, std::span<Half> out) {
  require_space("narrow", memory_space::device, {{"in", in}, {"out", out}});
  queue_narrow(where, in, out);
}

}  // namespace qcoll::execution
