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
/// x^(8·stride) modulo the polynomial. Where the CPU has AVX-512 and VPCLMULQDQ,
/// inputs of 256 bytes and more are folded instead, 256 bytes per step (carry-less
/// multiplications by x^k modulo the polynomial, as in Intel's "Fast CRC Computation
/// for Generic Polynomials Using PCLMULQDQ"), and the last 128 bits handed to the
/// `crc32` instruction, which reduces them — no Barrett step. All give the same bits
/// for every input (tests/core_tests.cpp); other CPUs get the reference.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
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

/// x^e modulo the polynomial, reflected (bit 31 is x^0).
constexpr std::uint32_t x_to_the(std::size_t e) {
  std::uint32_t power = 1u << 31;
  for (; e > 0; --e) power = power & 1 ? (power >> 1) ^ polynomial : power >> 1;
  return power;
}

/// A quadword of a lane, read reflected (its first bit is its highest power), carried
/// `bits` on: it is multiplied by x^bits. The carry-less product of two reflected
/// quadwords is their product times x, hence x^(bits − 1); a residue has 32 terms, the
/// quadword's upper half.
constexpr std::uint64_t carry(std::size_t bits) { return std::uint64_t{x_to_the(bits - 1)} << 32; }

/// The multipliers that fold a 128-bit lane `bits` on: its first quadword (powers
/// 127…64 of the lane) by x^(bits + 64), its second (63…0) by x^bits.
struct fold_multipliers {
  std::uint64_t first, second;
};
constexpr fold_multipliers fold_by(std::size_t bits) { return {carry(bits + 64), carry(bits)}; }

inline constexpr fold_multipliers by_256_bytes = fold_by(8 * 256), by_64_bytes = fold_by(8 * 64), by_16_bytes = fold_by(8 * 16);

/// The bytes below which folding does not pay: one step of four 64-byte lanes.
inline constexpr std::size_t fold_minimum = 256;

#define QCOLL_CRC32C_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

QCOLL_CRC32C_FOLD_TARGET inline __m512i multipliers_512(fold_multipliers m) {
  const auto first = static_cast<long long>(m.first), second = static_cast<long long>(m.second);
  return _mm512_set_epi64(second, first, second, first, second, first, second, first);
}

QCOLL_CRC32C_FOLD_TARGET inline __m512i load(const std::byte* at) { return _mm512_loadu_si512(at); }

/// Every lane of `x` carried on by `m`, plus `next`.
QCOLL_CRC32C_FOLD_TARGET inline __m512i fold(__m512i x, __m512i m, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, m, 0x00), _mm512_clmulepi64_epi128(x, m, 0x11), next,
                                   0x96);  // a ^ b ^ c
}
QCOLL_CRC32C_FOLD_TARGET inline __m128i fold(__m128i x, __m128i m, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, m, 0x00), _mm_clmulepi64_si128(x, m, 0x11)), next);
}

QCOLL_CRC32C_FOLD_TARGET inline std::uint32_t extend_folding(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  if (n < fold_minimum) return extend_sse42(crc, bytes);
  // The state enters as the first 32 bits of the message, the crc32 instruction's way.
  __m512i x0 = _mm512_xor_si512(load(p), _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                           static_cast<int>(~crc)));
  __m512i x1 = load(p + 64), x2 = load(p + 128), x3 = load(p + 192);
  p += 256;
  n -= 256;
  const __m512i step = multipliers_512(by_256_bytes);
  for (; n >= 256; p += 256, n -= 256) {
    x0 = fold(x0, step, load(p));
    x1 = fold(x1, step, load(p + 64));
    x2 = fold(x2, step, load(p + 128));
    x3 = fold(x3, step, load(p + 192));
  }
  // Four registers into one, 64 bytes apart; then whole 64-byte blocks.
  const __m512i quarter = multipliers_512(by_64_bytes);
  x3 = fold(fold(fold(x0, quarter, x1), quarter, x2), quarter, x3);
  for (; n >= 64; p += 64, n -= 64) x3 = fold(x3, quarter, load(p));
  // Its four lanes into one, 16 bytes apart; then whole 16-byte blocks.
  const __m128i lane_step = _mm_set_epi64x(static_cast<long long>(by_16_bytes.second), static_cast<long long>(by_16_bytes.first));
  alignas(64) __m128i lanes[4];  // stored, not extracted: GCC 12 warns on the extract's undefined source
  _mm512_store_si512(lanes, x3);
  __m128i v = fold(fold(fold(lanes[0], lane_step, lanes[1]), lane_step, lanes[2]), lane_step, lanes[3]);
  for (; n >= 16; p += 16, n -= 16) v = fold(v, lane_step, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  // v ≡ the message so far (modulo the polynomial): crc32 over its 16 bytes from a
  // zero state multiplies it by x^32 and reduces it — the state after those bytes.
  std::uint64_t state = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(v)));
  state = _mm_crc32_u64(state, static_cast<std::uint64_t>(_mm_extract_epi64(v, 1)));
  for (; n >= 8; p += 8, n -= 8) state = _mm_crc32_u64(state, load_le64(p));
  auto narrow = static_cast<std::uint32_t>(state);
  for (; n > 0; ++p, --n) narrow = _mm_crc32_u8(narrow, std::to_integer<std::uint8_t>(*p));
  return ~narrow;
}
#undef QCOLL_CRC32C_FOLD_TARGET
}  // namespace impl
#endif

/// The implementations, fastest last.
enum class implementation_kind { reference, sse42, folding };

inline constexpr const char* name_of(implementation_kind kind) noexcept {
  switch (kind) {
    case implementation_kind::folding: return "avx512-vpclmulqdq";
    case implementation_kind::sse42: return "sse4.2";
    case implementation_kind::reference: break;
  }
  return "reference";
}

/// Whether this CPU has SSE4.2's crc32 instruction (asked once).
inline bool cpu_has_crc32_instruction() noexcept {
#ifdef QCOLL_CRC32C_SSE42
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

/// What extend() uses on this CPU, chosen once: the fastest the CPU runs, or the one
/// QCOLL_CRC32C names (avx512-vpclmulqdq, sse4.2, reference: to measure one against
/// another in the same run) where this CPU runs it.
inline implementation_kind implementation_in_use() noexcept {
  static const implementation_kind kind = [] {
    auto fastest = implementation_kind::reference;
#ifdef QCOLL_CRC32C_SSE42
    if (cpu_has_crc32_instruction()) fastest = implementation_kind::sse42;
    if (fastest == implementation_kind::sse42 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq"))
      fastest = implementation_kind::folding;
#endif
    if (const char* requested = std::getenv("QCOLL_CRC32C"); requested && *requested) {
      for (auto kind = implementation_kind::reference; kind <= fastest;
           kind = static_cast<implementation_kind>(static_cast<int>(kind) + 1))
        if (std::string_view(requested) == name_of(kind)) return kind;
      std::fprintf(stderr, "qcoll: QCOLL_CRC32C=%s is not avx512-vpclmulqdq, sse4.2 or reference as this CPU runs them; ignored\n",
                   requested);
    }
    return fastest;
  }();
  return kind;
}

/// Which implementation extend() uses on this CPU: "avx512-vpclmulqdq", "sse4.2" or "reference".
inline const char* implementation() noexcept { return name_of(implementation_in_use()); }

/// The crc32 instruction's three streams, without folding (the fallback of CPUs without
/// AVX-512 and VPCLMULQDQ); the reference where there is no crc32 instruction.
inline std::uint32_t extend_sse42(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
#ifdef QCOLL_CRC32C_SSE42
  if (cpu_has_crc32_instruction()) return impl::extend_sse42(crc, bytes);
#endif
  return extend_reference(crc, bytes);
}

/// crc(A ‖ bytes) from crc = crc(A); crc(nothing) = 0.
inline std::uint32_t extend(std::uint32_t crc, std::span<const std::byte> bytes) noexcept {
#ifdef QCOLL_CRC32C_SSE42
  switch (implementation_in_use()) {
    case implementation_kind::folding: return impl::extend_folding(crc, bytes);
    case implementation_kind::sse42: return impl::extend_sse42(crc, bytes);
    case implementation_kind::reference: break;
  }
#endif
  return extend_reference(crc, bytes);
}

inline std::uint32_t of(std::span<const std::byte> bytes) noexcept { return extend(0, bytes); }

}  // namespace qcoll::detail::crc32c
