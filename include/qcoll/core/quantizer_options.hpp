#pragma once
/// @file
/// The settings of each quantizer, shared by the quantizer classes (which validate
/// them and write them into every encoded frame) and the kernels (which obey them).

#include <qcoll/core/encode_position.hpp>

#include <cstddef>
#include <cstdint>

namespace qcoll::quantizers {

/// one_bit: which values go to bin 1.
enum class threshold : std::uint8_t {
  zero = 0,        ///< v >= 0 (the spec's experiments)
  group_mean = 1,  ///< v >= the mean of the group
};

/// one_bit: what each bin decodes to.
enum class reconstruction : std::uint8_t {
  bin_means = 0,  ///< the mean of the values in the bin (least squared error for the bits)
  min_max = 1,    ///< the group's minimum for bin 0, its maximum for bin 1
};

/// one_bit: whose statistics the reconstruction values are taken from.
enum class reconstruction_source : std::uint8_t {
  current = 0,   ///< the values being encoded (qcoll's default: least error for these bits)
  previous = 1,  ///< the same group's values at the previous encode (the seed's "previous minibatch")
};

/// one_bit with reconstruction_source::previous: values of memory per group (its
/// table at the last encode).
inline constexpr std::size_t one_bit_memory_per_group = 2;

struct one_bit_options {
  /// Values per group ("column"); a multiple of 8 (whole bytes of bits), at most 2^24.
  std::size_t group_size = 2048;
  quantizers::threshold threshold = threshold::zero;
  quantizers::reconstruction reconstruction = reconstruction::bin_means;
  /// `previous` needs a memory of two values per group kept between encodes (a plan
  /// keeps it with the residuals); the first encode, and one after a non-finite
  /// group, use the current values. Frames do not record it: decoding is the same.
  quantizers::reconstruction_source reconstruction_from = reconstruction_source::current;
};

enum class rounding : std::uint8_t {
  nearest = 0,     ///< deterministic; ties go to the upper level
  stochastic = 1,  ///< unbiased (QSGD): up with probability equal to the fraction
};

struct k_level_options {
  /// Levels, evenly spaced over each group's [min, max]: 2…256. Codes take
  /// ceil(log2(levels)) bits. `with_bits(b)` gives 2^b levels.
  unsigned levels = 16;
  std::size_t group_size = 2048;  ///< a multiple of 8, at most 2^24
  quantizers::rounding rounding = rounding::nearest;
  /// Keys stochastic rounding. Not written into frames and not used to decode, so it
  /// is the one setting that may differ between ranks, and should: a seed per rank
  /// keeps their rounding errors independent. Every other setting must match.
  std::uint64_t seed = 0;

  static constexpr k_level_options with_bits(unsigned bits) noexcept {
    k_level_options options;
    options.levels = bits >= 1 && bits <= 8 ? 1u << bits : 0u;  // 0 is rejected by k_level
    return options;
  }
};

struct bfp_options {
  /// Mantissa width including the sign: 2…16, or 32.
  unsigned mantissa_bits = 8;
  /// Values sharing one exponent: a multiple of 8 (32 as in OCP MX formats), or
  /// `whole_tensor` for one exponent per encoded buffer (as in the spec).
  std::size_t block_size = 32;
  static constexpr std::size_t whole_tensor = 0;
};

}  // namespace qcoll::quantizers
