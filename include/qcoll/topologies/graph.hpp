#pragma once
/// @file
/// A topology as runtime data: what a communicator keeps of the topology it was made
/// with. Any model of ring_topology (ring, fully_connected, a user's) converts to a
/// graph, so a communicator is `communicator<Transport>` whatever its topology, and
/// code that makes communicators (a sub-communicator, a re-formed group) hands it a
/// graph instead of naming a type. The model is shared, not copied, between graphs.

#include <qcoll/core/concepts.hpp>
#include <qcoll/core/types.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace qcoll::topologies {

class graph {
 public:
  static constexpr std::size_t max_fan_out = std::dynamic_extent;

  /// The graph of `topology`; implicit, so any ring topology can be passed where a
  /// graph is expected.
  template <ring_topology Topology>
    requires(!std::same_as<std::remove_cvref_t<Topology>, graph>)
  graph(Topology topology)  // NOLINT(google-explicit-constructor)
      : model_(std::make_shared<const Topology>(std::move(topology))),
        linked_([](const void* model, rank_t a, rank_t b) { return static_cast<const Topology*>(model)->linked(a, b); }),
        ring_order_(static_cast<const Topology*>(model_.get())->ring_order()),
        size_(static_cast<const Topology*>(model_.get())->size()) {}

  rank_t size() const noexcept { return size_; }
  /// ring_order()[p] is the rank at position p; consecutive positions are linked.
  std::span<const rank_t> ring_order() const noexcept { return ring_order_; }
  bool linked(rank_t a, rank_t b) const { return linked_(model_.get(), a, b); }

  /// Whether every pair of ranks is linked. O(n²) calls of linked().
  bool fully_linked() const {
    for (rank_t a = 0; a < size_; ++a)
      for (rank_t b = 0; b < size_; ++b)
        if (a != b && !linked(a, b)) return false;
    return true;
  }

 private:
  std::shared_ptr<const void> model_;
  bool (*linked_)(const void*, rank_t, rank_t);
  std::span<const rank_t> ring_order_;  // into *model_, which never moves
  rank_t size_;
};

static_assert(ring_topology<graph>);

}  // namespace qcoll::topologies
