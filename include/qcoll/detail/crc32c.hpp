#pragma once
/// @file
/// CRC-32C (Castagnoli, the iSCSI and SCTP checksum: RFC 3720, appendix B.4), which the
/// stream transports can put on every data record (transports/stream/records.hpp) so
/// that bytes corrupted in transit are an error, not a wrong sum. Castagnoli's
/// polynomial because CPUs compute it in hardware (SSE4.2's `crc32`) and it detects more
/// error patterns at these lengths than the Ethernet one.
///
/// `extend(crc, bytes)` continues a checksum: extend(crc(A), B) == crc(A ‖ B), and
/// crc of nothing is 0. The reference (`extend_reference`) reads 8 bytes per step
/// through 8 tables ("slicing by 8"); on x86-64 with SSE4.2 `extend` uses the `crc32`
/// instruction over three independent streams of `stride` bytes (the instruction's
/// latency is three times its throughput), joined by multiplying the first two by
/// x^(8·stride) modulo the polynomial. Both give the same bits for every input
/// (tests/core_tests.cpp); other CPUs get the reference.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define QCOLL_CRC32C_SSE42 1
#endif

namespace qcoll::detail::crc32c {

/// The polynomial 0x1EDC6F41, bit-reflected: bit 31 is x^0, bit 0 is x^31.
inline constexpr std::uint32_t polynomial = 0x82F63B78u;

namespace impl {

using table = std::array<std::uint32_t, 256>;

constexpr std::array<table, 8> make_slices() {
  std::array<table, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ polynomial : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  return t;
}
inline constexpr std::array<table, 8> slices = make_slices();

/// a·b modulo the polynomial, both reflected (bit 31 is x^0).
constexpr std::uint32_t multiply(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = b & 1 ? (b >> 1) ^ polynomial : b >> 1;  // b·x
  }
  return product;
}

/// x^(8·bytes) modulo the polynomial: what appending `bytes` zero bytes multiplies a raw state by.
constexpr std::uint32_t shift_for(std::size_t bytes) {
  std::uint32_t power = 1u << 31;  // x^0
  std::uint32_t x_to_the_8 = 1u << 23;
  for (std::size_t n = bytes; n != 0; n >>= 1) {
    if (n & 1) power = multiply(power, x_to_the_8);
    x_to_the_8 = multiply(x_to_the_8, x_to_the_8);
  }
  return power;
}

/// Tables that multiply a raw state by x^(8·bytes), a byte of the state each.
constexpr std::array<table, 4> make_shift(std::size_t bytes) {
  const std::uint32_t factor = shift_for(bytes);
  std::array<table, 4> t{};
  for (std::size_t k = 0; k < 4; ++k)
    for (std::uint32_t i = 0; i < 256; ++i) t[k][i] = multiply(factor, i << (8 * k));
  return t;
}

inline std::uint64_t load_le64(const std::byte* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

}  // namespace impl

/// The bytes each of the hardware path's three streams covers per step.
inline constexpr std::size_t stride = 4096;

/// The scalar reference: slicing by 8.
inline std::uint32_t extend_reference(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  const auto& t = impl::slices;
  std::uint32_t state = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 8; p += 8, n -= 8) {
    const std::uint64_t w = impl::load_le64(p) ^ state;
    state = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
            t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
  }
  for (; n > 0; ++p, --n) state = t[0][(state ^ std::to_integer<std::uint32_t>(*p)) & 0xff] ^ (state >> 8);
  return ~state;
}

#ifdef QCOLL_CRC32C_SSE42
namespace impl {
inline constexpr std::array<table, 4> shift_stride = make_shift(stride);

inline std::uint32_t shifted(std::uint32_t state) noexcept {
  const auto& t = shift_stride;
  return t[0][state & 0xff] ^ t[1][(state >> 8) & 0xff] ^ t[2][(state >> 16) & 0xff] ^ t[3][state >> 24];
}

__attribute__((target("sse4.2"))) inline std::uint32_t extend_sse42(std::uint32_t crc,
                                                                    std::span<const std::byte> bytes) noexcept {
  std::uint64_t state = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 3 * stride; p += 3 * stride, n -= 3 * stride) {
    std::uint64_t a = state & 0xffffffffu, b = 0, c = 0;
    for (std::size_t i = 0; i < stride; i += 8) {
      a = _mm_crc32_u64(a, load_le64(p + i));
      b = _mm_crc32_u64(b, load_le64(p + stride + i));
      c = _mm_crc32_u64(c, load_le64(p + 2 * stride + i));
    }
    // A·x^(8·2·stride) ^ B·x^(8·stride) ^ C: the three streams as one.
    state = shifted(shifted(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b)) ^ static_cast<std::uint32_t>(c);
  }
  for (; n >= 8; p += 8, n -= 8) state = _mm_crc32_u64(state, load_le64(p));
  auto narrow = static_cast<std::uint32_t>(state);
  for (; n > 0; ++p, --n) narrow = _mm_crc32_u8(narrow, std::to_integer<std::uint8_t>(*p));
  return ~narrow;
}
}  // namespace impl
#endif

/// Whether extend() uses the crc32 instruction on this CPU (asked once).
inline bool hardware() noexcept {
#ifdef QCOLL_CRC32C_SSE42
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  return has_sse42;
#else
  return false;
#endif
}

/// Which implementation extend() uses on this CPU: "sse4.2" or "reference".
inline const char* implementation() noexcept { return hardware() ? "sse4.2" : "reference"; }

/// crc(A ‖ bytes) from crc = crc(A); crc(nothing) = 0.
inline std::uint32_t extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
#ifdef QCOLL_CRC32C_SSE42
  if (hardware()) return impl::extend_sse42(crc, bytes);
#endif
  return extend_reference(crc, bytes);
}

inline std::uint32_t of(std::span<const std::byte> bytes) noexcept { return extend(0, bytes); }

}  // namespace qcoll::detail::crc32c
