#pragma once
/// @file
/// Core vocabulary: ranks, element types, reduce operations and collective kinds.

#include <qcoll/core/half.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace qcoll {

/// A rank is a position in the communicator, 0 … size − 1.
using rank_t = std::size_t;

/// Element types as they are named on the wire.
enum class dtype : std::uint8_t { f32 = 1, f64 = 2, bf16 = 3, f16 = 4 };

/// Maps a C++ element type to its dtype. Specialise only for types the kernels support.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <>
struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <>
struct dtype_of<bfloat16> : std::integral_constant<dtype, dtype::bf16> {};
template <>
struct dtype_of<float16> : std::integral_constant<dtype, dtype::f16> {};

/// An element type the collectives take: one with a dtype_of specialisation.
template <class T>
concept element = requires { dtype_of<T>::value; };

/// An element type the kernels compute in (float, double).
template <class T>
concept arithmetic_element = element<T> && std::is_floating_point_v<T>;

/// A 16-bit storage type (bfloat16, float16): reduced in float and rounded once.
template <class T>
concept half_element = element<T> && !std::is_floating_point_v<T>;

/// Reduce operations. Semantics, identical in every kernel:
/// - sum: IEEE addition in the documented fixed order (see docs/algorithms.md).
/// - avg: the sum divided by the number of ranks, once, by the rank that owns the block.
/// - min/max: `a < b` (`a > b`) picks a, else b; a NaN in either operand propagates.
enum class reduce_op : std::uint8_t { sum = 1, avg = 2, min = 3, max = 4, product = 5 };

/// The collective a message belongs to; part of every message header so that
/// ranks calling different collectives are detected instead of exchanging garbage.
enum class collective : std::uint8_t {
  allreduce = 1,
  reduce_scatter = 2,
  all_gather = 3,
  broadcast = 4,
  barrier = 5,
  compressed_allreduce = 6,  ///< allreduce through a quantizer (compressed_allreduce_plan)
  grid_allreduce = 7,        ///< allreduce over a mesh or torus plan (grid_allreduce_plan)
  split = 8,                 ///< communicator::split's exchange of colors and keys
  point_to_point = 9,        ///< send, recv, send_recv (numbered per pair of ranks)
};

/// How an exact collective moves its data (docs/algorithms.md). Every message carries
/// it, so ranks that chose differently (a tuning variable set on some ranks only) fail
/// with operation_mismatch instead of exchanging the wrong messages. `unspecified`:
/// calls with one way only (plans, split, point to point).
enum class algorithm : std::uint8_t {
  unspecified = 0,
  ring = 1,                ///< ring reduce-scatter + all-gather, scatter + all-gather, all-gather of nothing
  ring_single_copy = 2,    ///< the ring, each step read straight from the peer's memory (shm)
  recursive_doubling = 3,  ///< allreduce of small buffers in ⌈log₂ n⌉ (+2) exchanges
  binomial_tree = 4,       ///< broadcast of small buffers in ⌈log₂ n⌉ rounds
  dissemination = 5,       ///< barrier in ⌈log₂ n⌉ rounds
  halving_doubling = 6,    ///< allreduce: reduce-scatter by recursive halving, all-gather by doubling
};

constexpr const char* to_string(dtype type) noexcept {
  switch (type) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
  }
  return "dtype?";
}

constexpr const char* to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::product: return "product";
  }
  return "reduce_op?";
}

constexpr const char* to_string(collective kind) noexcept {
  switch (kind) {
    case collective::allreduce: return "allreduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::barrier: return "barrier";
    case collective::compressed_allreduce: return "compressed_allreduce";
    case collective::grid_allreduce: return "grid_allreduce";
    case collective::split: return "split";
    case collective::point_to_point: return "point_to_point";
  }
  return "collective?";
}

constexpr const char* to_string(algorithm way) noexcept {
  switch (way) {
    case algorithm::unspecified: return "unspecified";
    case algorithm::ring: return "ring";
    case algorithm::ring_single_copy: return "ring_single_copy";
    case algorithm::recursive_doubling: return "recursive_doubling";
    case algorithm::binomial_tree: return "binomial_tree";
    case algorithm::dissemination: return "dissemination";
    case algorithm::halving_doubling: return "halving_doubling";
  }
  return "algorithm?";
}

namespace detail {
/// The largest value of a wire enum that to_string names. A value added to the enum
/// without its name fails -Wswitch in to_string; with it, the bound below follows, so
/// a decoder never refuses a value this build sends.
template <class Enum>
constexpr std::uint8_t largest_named(const char* unnamed) noexcept {
  const auto same = [](const char* a, const char* b) {  // (no <string_view> in this header)
    while (*a != 0 && *a == *b) ++a, ++b;
    return *a == *b;
  };
  std::uint8_t largest = 0;
  for (int value = 0; value < 256; ++value)
    if (!same(to_string(static_cast<Enum>(value)), unnamed)) largest = static_cast<std::uint8_t>(value);
  return largest;
}
}  // namespace detail

/// The largest value of each wire enum, for decoders that check what a peer sent
/// (every enum starts at 1, algorithm at 0, and none has gaps).
inline constexpr std::uint8_t max_dtype = detail::largest_named<dtype>("dtype?");
inline constexpr std::uint8_t max_reduce_op = detail::largest_named<reduce_op>("reduce_op?");
inline constexpr std::uint8_t max_collective = detail::largest_named<collective>("collective?");
inline constexpr std::uint8_t max_algorithm = detail::largest_named<algorithm>("algorithm?");
static_assert(max_dtype == 4 && max_reduce_op == 5 && max_collective == 9 && max_algorithm == 6,
              "a wire enum changed: docs/wire-format.md lists their values");

constexpr std::size_t size_of(dtype type) noexcept {
  switch (type) {
    case dtype::f32: return 4;
    case dtype::f64: return 8;
    case dtype::bf16:
    case dtype::f16: return 2;
  }
  return 0;
}

}  // namespace qcoll
