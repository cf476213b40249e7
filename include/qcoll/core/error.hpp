#pragma once
/// @file
/// One error category, one exception type.
///
/// Policy (as in gloo's docs/errors.md): a *transport failure* (timeout, lost peer,
/// malformed frame) is recoverable by recreating the communicator; a *contract
/// violation* (ranks disagree on the call, a bad argument) is a bug in the caller.
/// Compare a code with `qcoll::condition` to tell them apart. Any failure inside a
/// collective aborts the communicator, so every rank gets an error, never a hang.

#include <string>
#include <system_error>
#include <type_traits>

namespace qcoll {

enum class errc {
  invalid_argument = 1,  ///< a bad argument on the calling rank (size, rank, overlap)
  count_mismatch,        ///< ranks passed different element counts to one collective
  type_mismatch,         ///< ranks passed different element types to one collective
  operation_mismatch,    ///< ranks called different collectives, ops or roots
  timeout,               ///< a wait passed its deadline
  peer_lost,             ///< a peer left or its connection dropped
  protocol_error,        ///< a malformed, oversize or unexpected message
  aborted,               ///< the communicator was aborted by a call to abort()
  device_error,          ///< the GPU or its runtime failed a call (the message quotes CUDA's words)
};

/// Portable groups of codes: `ec == qcoll::condition::transport_failure`.
enum class condition {
  contract_violation = 1,
  transport_failure,
};

namespace detail {

class error_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "qcoll"; }

  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::invalid_argument: return "invalid argument";
      case errc::count_mismatch: return "element counts differ across ranks";
      case errc::type_mismatch: return "element types differ across ranks";
      case errc::operation_mismatch: return "ranks called different collectives";
      case errc::timeout: return "timed out";
      case errc::peer_lost: return "peer lost";
      case errc::protocol_error: return "protocol error";
      case errc::aborted: return "communicator aborted";
      case errc::device_error: return "device error";
    }
    return "unknown qcoll error";
  }

  std::error_condition default_error_condition(int value) const noexcept override;
};

class condition_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "qcoll.condition"; }

  std::string message(int value) const override {
    switch (static_cast<condition>(value)) {
      case condition::contract_violation: return "contract violation";
      case condition::transport_failure: return "transport failure";
    }
    return "unknown qcoll condition";
  }
};

}  // namespace detail

inline const std::error_category& error_category() noexcept {
  static const detail::error_category instance;
  return instance;
}

inline const std::error_category& condition_category() noexcept {
  static const detail::condition_category instance;
  return instance;
}

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

inline std::error_condition make_error_condition(condition c) noexcept {
  return {static_cast<int>(c), condition_category()};
}

inline std::error_condition detail::error_category::default_error_condition(int value) const noexcept {
  switch (static_cast<errc>(value)) {
    case errc::invalid_argument:
    case errc::count_mismatch:
    case errc::type_mismatch:
    case errc::operation_mismatch: return make_error_condition(condition::contract_violation);
    case errc::timeout:
    case errc::peer_lost:
    case errc::protocol_error:
    case errc::aborted: return make_error_condition(condition::transport_failure);
    case errc::device_error: break;  // neither: the GPU, not the caller or a peer
  }
  return {value, *this};
}

/// The one exception type. what() names the operation, the rank, the peer and the sizes.
class error : public std::system_error {
 public:
  error(std::error_code code, const std::string& what) : std::system_error(code, what) {}
};

}  // namespace qcoll

template <>
struct std::is_error_code_enum<qcoll::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<qcoll::condition> : std::true_type {};
