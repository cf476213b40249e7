#pragma once
/// @file
/// Archetypes: types that model a concept with nothing more than its declarations,
/// so a template can be checked against the concept alone (a plan's static_assert
/// names no real transport). Never defined, never run.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/types.hpp>

#include <cstddef>
#include <span>
#include <string_view>
#include <system_error>

namespace qcoll::archetypes {

class transport {
 public:
  class request {
   public:
    const transports::message_header& header() const noexcept;
    std::size_t transferred() const noexcept;
    bool header_arrived() const noexcept;
  };

  rank_t rank() const noexcept;
  rank_t size() const noexcept;
  void post_send(request&, rank_t, transports::tag_t, const transports::message_header&, std::span<const std::byte>);
  void post_recv(request&, rank_t, transports::tag_t, std::span<std::byte>);
  bool test(request&);
  std::error_code wait(request&, deadline);
  void abort(std::error_code, std::string_view);
  transports::failure failure() const;
};
static_assert(qcoll::transport<transport>);

}  // namespace qcoll::archetypes
