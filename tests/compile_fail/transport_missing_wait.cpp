// Must not compile: a communicator over a transport that cannot wait.
#include <qcoll/communicator.hpp>

struct transport_without_wait {
  struct request {
    const qcoll::transports::message_header& header() const { return h; }
    std::size_t transferred() const { return 0; }
    bool header_arrived() const { return false; }
    qcoll::transports::message_header h;
  };
  qcoll::rank_t rank() const { return 0; }
  qcoll::rank_t size() const { return 1; }
  void post_send(request&, qcoll::rank_t, qcoll::transports::tag_t, const qcoll::transports::message_header&,
                 std::span<const std::byte>) {}
  void post_recv(request&, qcoll::rank_t, qcoll::transports::tag_t, std::span<std::byte>) {}
  bool test(request&) { return true; }
  void abort(std::error_code, std::string_view) {}
  qcoll::transports::failure failure() const { return {}; }
};

qcoll::communicator<transport_without_wait>* unusable = nullptr;
