#pragma once
/// @file
/// A call's outcome as a std::error_code instead of an exception: capture() for the
/// std::error_code forms of the blocking calls, report() for the progress thread, which
/// keeps the words of the failure for the handle's wait() to throw.

#include <qcoll/core/error.hpp>

#include <exception>
#include <new>
#include <string>
#include <system_error>

namespace qcoll::detail {

/// Runs `call`: no error, or the code of what it threw (invalid_argument for an
/// exception that carries none, not_enough_memory for std::bad_alloc).
template <class Call>
std::error_code capture(Call&& call) noexcept {
  try {
    call();
    return {};
  } catch (const std::system_error& e) {
    return e.code();
  } catch (const std::bad_alloc&) {
    return std::make_error_code(std::errc::not_enough_memory);
  } catch (...) {
    return make_error_code(errc::invalid_argument);
  }
}

/// Runs a started call's body: its outcome, and on failure the words that say why.
template <class Body>
std::error_code report(std::string& message, Body&& body) noexcept {
  try {
    body();
    return {};
  } catch (const std::system_error& e) {
    message = e.what();
    return e.code();
  } catch (const std::bad_alloc&) {
    message = "out of memory";
    return std::make_error_code(std::errc::not_enough_memory);
  } catch (const std::exception& e) {
    message = e.what();
    return make_error_code(errc::invalid_argument);
  }
}

}  // namespace qcoll::detail
