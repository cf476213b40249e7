#pragma once
/// @file
/// The transfers the MPI transport withdrew while MPI still held them: a payload
/// already moving between two live ranks cannot be cancelled, so its MPI request is
/// kept, and tested with every progress step, until MPI finishes it; and the sinks a
/// receiver posts in place of a payload receive it cancelled after clearing the sender.

#include <qcoll/core/types.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/transports/mpi/c_api.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace qcoll::transports::mpi::detail {

/// A transfer withdrawn while MPI still held it.
struct orphan {
  MPI_Request request;
  rank_t peer;
  const char* what;
  std::unique_ptr<std::byte[]> sink;  // a sink receive's own buffer
};

/// The orphans of a transport. Called under the transport's mutex.
class orphan_list {
 public:
  void add(orphan o) { orphans_.push_back(std::move(o)); }

  bool empty() const noexcept { return orphans_.empty(); }
  std::size_t size() const noexcept { return orphans_.size(); }

  /// Forgets those MPI has finished.
  void test() {
    for (auto it = orphans_.begin(); it != orphans_.end();) {
      int done = 0;
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
      it = done ? orphans_.erase(it) : it + 1;
    }
  }

  /// Whether one still moves bytes into or out of the caller's buffers; with
  /// `counting_sinks`, whether any is left at all.
  bool hold_buffers(bool counting_sinks) const {
    return std::any_of(orphans_.begin(), orphans_.end(),
                       [&](const orphan& o) { return !o.sink || counting_sinks; });
  }

  /// Cancels every sink (destruction): a payload the sender never sent leaves it unmatched.
  void cancel_sinks() {
    for (orphan& o : orphans_)
      if (o.sink) MPI_Cancel(&o.request);
  }

  /// "a payload to peer 2, …", for the warning at destruction.
  std::string describe() const {
    std::string which;
    for (const orphan& o : orphans_)
      which += qcoll::detail::format("{}{} peer {}", which.empty() ? "" : ", ", o.what, o.peer);
    return which;
  }

  /// Leaves them to MPI, sinks included (destruction).
  void leave_to_mpi() {
    for (orphan& o : orphans_) {
      MPI_Request_free(&o.request);
      (void)o.sink.release();  // MPI may still write into it
    }
  }

 private:
  std::vector<orphan> orphans_;
};

}  // namespace qcoll::transports::mpi::detail
