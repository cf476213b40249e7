#pragma once
/// @file
/// The stream engine's request: what request_base records, plus the engine that holds
/// it and where it stands. Its own header so that each peer's streams (incoming.hpp,
/// outgoing.hpp) can queue and complete requests below the engine; its destructor,
/// which withdraws a pending request from its engine, is defined in engine.hpp.

#include <qcoll/core/message.hpp>

#include <system_error>

namespace qcoll::transports::stream {

class engine;
class incoming;
class outgoing;

/// A posted send or receive; must not outlive its transport. Destroying a posted
/// request cancels it.
class request : public request_base {
 public:
  request() = default;
  inline ~request();

 private:
  friend class engine;
  friend class incoming;
  friend class outgoing;
  enum class state : unsigned char { idle, queued, active, done };

  void complete(std::error_code result) noexcept {
    state_ = state::done;
    result_ = result;
  }

  engine* engine_ = nullptr;
  state state_ = state::idle;
};

}  // namespace qcoll::transports::stream
