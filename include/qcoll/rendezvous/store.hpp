#pragma once
/// @file
/// The job's key-value store as a concept: the few operations the transports' setup
/// needs to publish what they created (a segment name, a listening address) and to meet
/// at barriers. The transports depend on this concept only; launch/join.hpp picks the
/// model, today store_client of tcp_store.hpp (rank 0 serves it over TCP).

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/types.hpp>

#include <concepts>
#include <string>
#include <string_view>

namespace qcoll::rendezvous {

/// A key-value store shared by every rank of a job.
///
/// - `s.set(key, value)` stores (overwrites) `value` under `key` and returns once every
///   later `get` by any rank sees it.
/// - `s.get(key, until)` returns the value of `key`, waiting until some rank has set it.
/// - `s.wait_all(prefix, n, until)` waits until the keys prefix+"0" … prefix+(n−1) all
///   exist: a barrier when each rank first sets prefix+its rank.
///
/// Keys of up to 256 bytes and values of up to 64 KiB must be accepted. Every call is
/// bounded (set by the store's own timeout, get and wait_all by `until`) and reports
/// failure by throwing qcoll::error (errc::timeout naming the key, errc::peer_lost when
/// the store went away). One object is used by one thread at a time.
template <class S>
concept store = requires(S& s, std::string_view key, std::string_view value, rank_t n, deadline until) {
  s.set(key, value);
  { s.get(key, until) } -> std::convertible_to<std::string>;
  s.wait_all(key, n, until);
};

}  // namespace qcoll::rendezvous
