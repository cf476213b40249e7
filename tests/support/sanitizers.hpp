#pragma once
// Which sanitizer this test program is built with: g++ says it with __SANITIZE_*__,
// clang with __has_feature. Tests use it to leave out what a sanitizer cannot judge
// (resident memory, a race a test demonstrates on purpose) and to run fewer sizes of
// the same code where a sanitizer makes each one slow.

namespace qcoll::test {

#if defined(__has_feature)
#define QCOLL_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define QCOLL_TEST_HAS_FEATURE(x) 0
#endif

#if defined(__SANITIZE_THREAD__) || QCOLL_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool thread_sanitized = true;
#else
inline constexpr bool thread_sanitized = false;
#endif

#if defined(__SANITIZE_ADDRESS__) || QCOLL_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool address_sanitized = true;
#else
inline constexpr bool address_sanitized = false;
#endif

#undef QCOLL_TEST_HAS_FEATURE

inline constexpr bool sanitized = thread_sanitized || address_sanitized;

}  // namespace qcoll::test
