#pragma once
/// @file
/// communicator<Transport>: a rank's handle on a group of ranks, and the exact
/// (uncompressed) collectives over it. The topology is runtime data
/// (topologies::graph): any ring topology converts to one.
///
/// @par Errors
/// Every collective has a throwing form (qcoll::error) and a form that reports
/// through `std::error_code&`. Any failure during a collective — a bad argument on
/// one rank, ranks that disagree about the call, a timeout, a lost peer — aborts the
/// communicator: every rank's pending call fails with the same code, and the
/// message says which rank saw what. An aborted communicator stays aborted; make a
/// new one (and a new transport) to go on.
///
/// @par Thread safety
/// One thread per communicator at a time. Different communicators are independent.
/// Calls started without waiting (start_allreduce) run on the communicator's one
/// progress thread, in the order they were started; any other call first waits
/// until they have run, so every rank still runs its collectives in program order.

#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/ring.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/progress_thread.hpp>
#include <qcoll/kernels/cpu/convert.hpp>
#include <qcoll/plan.hpp>
#include <qcoll/topologies/fully_connected.hpp>
#include <qcoll/topologies/graph.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/detail/describe.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <span>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll {

struct communicator_options {
  /// How long any one step of a collective may wait for a peer before the call
  /// fails with errc::timeout. Finite by default, so nothing hangs forever.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

/// The default topology links every pair of ranks, as the in-process, shm and TCP
/// transports do: exact collectives run their ring in rank order over it, and
/// compressed ones send each stripe straight to its owner.
template <transport Transport>
class communicator {
 public:
  using transport_type = Transport;

  /// Over `topology`: any ring topology (topologies::ring, fully_connected, a user's
  /// model of ring_topology) converts to the graph kept here.
  communicator(Transport transport, topologies::graph topology, communicator_options options = {})
      : transport_(std::move(transport)), topology_(std::move(topology)), options_(options) {
    validate();
  }

  /// Over the default topology: fully connected, of the transport's size.
  explicit communicator(Transport transport, communicator_options options = {})
      // Members initialise in declaration order, so transport_ is ready here.
      : transport_(std::move(transport)), topology_(topologies::fully_connected(transport_.size())), options_(options) {
    validate();
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  /// Lets calls started without waiting finish first (they use the transport).
  ~communicator() { progress_.wait_idle(); }

  rank_t rank() const noexcept { return transport_.rank(); }
  rank_t size() const noexcept { return transport_.size(); }
  const topologies::graph& topology() const noexcept { return topology_; }
  Transport& transport() noexcept { return transport_; }
  const communicator_options& options() const noexcept { return options_; }

  /// True once any rank aborted; every later collective fails at once.
  bool aborted() const { return static_cast<bool>(transport_.failure().code); }

  /// Fails every rank's pending and future collectives with errc::aborted.
  /// Calls in flight on the progress thread are waited for first.
  void abort(std::string_view reason) {
    quiesce();
    transport_.abort(make_error_code(errc::aborted),
                     fmt::format("rank {} aborted the communicator: {}", rank(), reason));
  }

  /// out = in₀ ⊕ in₁ ⊕ … on every rank, bit-identical everywhere.
  /// `in` and `out` have the same size on every rank and are the same range or disjoint.
  /// @par Complexity
  /// 2(n − 1) steps; each rank sends and receives 2(n − 1)/n · count elements
  /// (ring reduce-scatter, then ring all-gather).
  template <element T>
  void allreduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    auto step = begin(collective::allreduce, dtype_of<T>::value, op, in.size(), 0);
    if (in.size() != out.size())
      step.fail(errc::invalid_argument, "input has {} elements but output has {}", in.size(), out.size());
    if (!detail::same_range(in, out) && detail::overlaps(in, out))
      step.fail(errc::invalid_argument, "input and output overlap without being the same range");

    const algorithms::ring_view ring(topology_.ring_order(), rank());
    if constexpr (half_element<T>) {
      // Reduce in float, round this rank's block once, then gather the rounded blocks.
      // The input is read only before this rank's block of `out` is written. One rank
      // copies the bits, as reduce_scatter does (no rounding: nothing was added).
      if (size() == 1) {
        if (!detail::same_range(in, out)) std::copy(in.begin(), in.end(), out.begin());
        return;
      }
      const block_range mine = block_of(in.size(), size(), rank());
      kernels::cpu::narrow(reduce_scatter_in_float(step, ring, in, op), mine.of(out));
      algorithms::ring_all_gather<Transport, T>(step, ring, out);
    } else {
      if (!detail::same_range(in, out)) std::copy(in.begin(), in.end(), out.begin());
      struct in_place {
        std::span<T> data;
        std::span<T> incoming_block;
        std::span<const T> own(block_range b) const { return b.of(data); }
        std::span<T> incoming(std::size_t, block_range b) const { return incoming_block.first(b.size); }
        std::span<T> partial(std::size_t, block_range b) const { return b.of(data); }
      } buffers{out, scratch<T>(0, largest_block(out.size()))};
      algorithms::ring_reduce_scatter<Transport, T>(step, ring, out.size(), op, buffers);
      algorithms::ring_all_gather<Transport, T>(step, ring, out);
    }
  }

  /// In-place allreduce.
  template <element T>
  void allreduce(std::span<T> data, reduce_op op) {
    allreduce(std::span<const T>(data), data, op);
  }

  /// Rank r receives block r of the reduced `in` (block_of(in.size(), size(), r)).
  /// `out` has exactly that block's size; it may be exactly that block of `in`, or disjoint from `in`.
  /// @par Complexity
  /// n − 1 steps; each rank sends and receives (n − 1)/n · count elements.
  template <element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    auto step = begin(collective::reduce_scatter, dtype_of<T>::value, op, in.size(), 0);
    const block_range mine = block_of(in.size(), size(), rank());
    if (out.size() != mine.size)
      step.fail(errc::invalid_argument, "output has {} elements but block {} of {} has {}", out.size(), rank(),
                in.size(), mine.size);
    if (detail::overlaps(in, out) && !detail::same_range(mine.of(in), out))
      step.fail(errc::invalid_argument, "output overlaps the input other than as exactly block {}", rank());

    if (size() == 1) {  // the whole input is this rank's block, already checked to fit `out`
      if (!detail::same_range(in, out)) std::copy_n(in.begin(), out.size(), out.begin());
      return;
    }
    const algorithms::ring_view ring(topology_.ring_order(), rank());
    if constexpr (half_element<T>) {
      kernels::cpu::narrow(reduce_scatter_in_float(step, ring, in, op), out);
    } else {
      // Partials alternate between two scratch blocks: step s sends one while receiving
      // into the other. The last step writes the result straight into `out`.
      const std::size_t last_step = size() - 2;
      struct out_of_place {
        std::span<const T> input;
        std::span<T> out;
        std::span<T> scratch[2];
        std::size_t last_step;
        std::span<const T> own(block_range b) const { return b.of(input); }
        std::span<T> incoming(std::size_t s, block_range b) const { return scratch[s % 2].first(b.size); }
        std::span<T> partial(std::size_t s, block_range b) const {
          return s == last_step ? out : scratch[s % 2].first(b.size);
        }
      } buffers{in, out, {scratch<T>(0, largest_block(in.size())), scratch<T>(1, largest_block(in.size()))},
                last_step};
      algorithms::ring_reduce_scatter<Transport, T>(step, ring, in.size(), op, buffers);
    }
  }

  /// Every rank contributes block r of `out` (`in`, of block_of(out.size(), size(), r)'s size)
  /// and receives all blocks. `in` may be exactly that block of `out`, or disjoint from it.
  /// @par Complexity
  /// n − 1 steps; each rank sends and receives (n − 1)/n · out.size() elements.
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    auto step = begin(collective::all_gather, dtype_of<T>::value, reduce_op::sum, out.size(), 0);
    const block_range mine = block_of(out.size(), size(), rank());
    if (in.size() != mine.size)
      step.fail(errc::invalid_argument, "input has {} elements but block {} of {} has {}", in.size(), rank(),
                out.size(), mine.size);
    if (detail::overlaps(in, out) && !detail::same_range(in, mine.of(out)))
      step.fail(errc::invalid_argument, "input overlaps the output other than as exactly block {}", rank());
    if (!detail::same_range(in, mine.of(out))) std::copy(in.begin(), in.end(), mine.of(out).begin());
    algorithms::ring_all_gather<Transport, T>(step, algorithms::ring_view(topology_.ring_order(), rank()), out);
  }

  /// Copies root's `data` into every rank's `data` (same size on every rank).
  /// @par Complexity
  /// 2(n − 1) steps (ring scatter, then ring all-gather); root sends (n − 1)/n · count
  /// elements in the scatter, and every rank sends (n − 1)/n · count in the all-gather.
  template <element T>
  void broadcast(std::span<T> data, rank_t root) {
    auto step = begin(collective::broadcast, dtype_of<T>::value, reduce_op::sum, data.size(), root);
    if (root >= size()) step.fail(errc::invalid_argument, "root {} is out of range", root);
    const algorithms::ring_view ring(topology_.ring_order(), rank());
    algorithms::ring_scatter<Transport, T>(step, ring, root, data);
    algorithms::ring_all_gather<Transport, T>(step, ring, data);
  }

  /// Returns once every rank has entered the barrier.
  /// @par Complexity
  /// n − 1 steps of header-only messages (an all-gather of nothing).
  void barrier() {
    auto step = begin(collective::barrier, dtype::f32, reduce_op::sum, 0, 0);
    algorithms::ring_all_gather<Transport, float>(step, algorithms::ring_view(topology_.ring_order(), rank()),
                                                  std::span<float>());
  }

  /// out = in₀ + in₁ + … (or their average) through `plan`'s quantizer, with error
  /// feedback. Any model of allreduce_plan (plan.hpp) runs here; qcoll's two are
  /// these. A compressed_allreduce_plan runs the two-phase striped exchange
  /// (docs/compressed-allreduce.md); a grid_allreduce_plan runs its grid_routing
  /// over a mesh or torus with degraded nodes (docs/grid-allreduce.md: there `in₀ …`
  /// are the included ranks, and avg divides by their number).
  /// The result is bitwise identical on every rank. `in` and `out` have plan.count()
  /// values and are the same range or disjoint. A failed call leaves the plan's
  /// residuals as they were; `in` too, unless it is `out`.
  /// @par Complexity
  /// Direct route (fully connected): 2(n − 1) rounds; a rank sends
  /// plan.bytes_sent_per_call() ≈ 2(n − 1)/n · encoded_size(count) bytes.
  /// Ring route: n − 1 steps per phase, phase 1 forwarding frames without
  /// re-quantizing (≈ (n + 2)(n − 1)/(2n) · encoded_size(count) bytes).
  /// @par Errors
  /// As the exact collectives, and invalid_argument for an op other than sum or avg
  /// or a plan made for another rank, size, topology or count; protocol_error for a
  /// frame this rank's quantizer cannot decode (ranks with different quantizers).
  /// Calling it on a plan in flight throws invalid_argument without aborting.
  template <allreduce_plan<Transport> Plan>
  void allreduce(Plan& plan, std::span<const typename Plan::value_type> in, std::span<typename Plan::value_type> out,
                 reduce_op op) {
    plan.require_idle("allreduce");
    run_plan(plan, in, out, op);
  }
  template <allreduce_plan<Transport> Plan>
  void allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op) {
    allreduce(plan, std::span<const typename Plan::value_type>(data), data, op);
  }

  /// Starts the same call on the communicator's progress thread and returns at once;
  /// plan.test() and plan.wait() finish it. `in` and `out` must stay valid and
  /// untouched until then. Several plans may be in flight; they run one after
  /// another in start order, which must be the same on every rank.
  /// @par Errors
  /// invalid_argument at once for a plan already in flight; everything else is
  /// reported by plan.wait().
  template <allreduce_plan<Transport> Plan>
  void start_allreduce(Plan& plan, std::span<const typename Plan::value_type> in,
                       std::span<typename Plan::value_type> out, reduce_op op) {
    plan.require_idle("start_allreduce");
    progress_.get().submit(plan.queue_call(in, out, op), &run_started<Plan>, this, &plan);
  }
  template <allreduce_plan<Transport> Plan>
  void start_allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op) {
    start_allreduce(plan, std::span<const typename Plan::value_type>(data), data, op);
  }

  /// Blocks until every call started without waiting has run (their outcomes stay
  /// with their plans).
  void wait_all() { quiesce(); }

  // The std::error_code forms: the same calls, reporting instead of throwing.
  template <element T>
  void allreduce(std::span<const T> in, std::span<T> out, reduce_op op, std::error_code& ec) noexcept {
    ec = capture([&] { allreduce(in, out, op); });
  }
  template <element T>
  void allreduce(std::span<T> data, reduce_op op, std::error_code& ec) noexcept {
    ec = capture([&] { allreduce(data, op); });
  }
  template <element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op, std::error_code& ec) noexcept {
    ec = capture([&] { reduce_scatter(in, out, op); });
  }
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out, std::error_code& ec) noexcept {
    ec = capture([&] { all_gather(in, out); });
  }
  template <element T>
  void broadcast(std::span<T> data, rank_t root, std::error_code& ec) noexcept {
    ec = capture([&] { broadcast(data, root); });
  }
  void barrier(std::error_code& ec) noexcept {
    ec = capture([&] { barrier(); });
  }
  template <allreduce_plan<Transport> Plan>
  void allreduce(Plan& plan, std::span<const typename Plan::value_type> in, std::span<typename Plan::value_type> out,
                 reduce_op op, std::error_code& ec) noexcept {
    ec = capture([&] { allreduce(plan, in, out, op); });
  }
  template <allreduce_plan<Transport> Plan>
  void allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op, std::error_code& ec) noexcept {
    ec = capture([&] { allreduce(plan, data, op); });
  }
  template <allreduce_plan<Transport> Plan>
  void start_allreduce(Plan& plan, std::span<const typename Plan::value_type> in,
                       std::span<typename Plan::value_type> out, reduce_op op, std::error_code& ec) noexcept {
    ec = capture([&] { start_allreduce(plan, in, out, op); });
  }
  template <allreduce_plan<Transport> Plan>
  void start_allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op,
                       std::error_code& ec) noexcept {
    ec = capture([&] { start_allreduce(plan, data, op); });
  }

 private:
  void validate() const {
    if (topology_.size() != transport_.size())
      detail::throw_error(errc::invalid_argument, "communicator: topology has {} ranks but the transport has {}",
                          topology_.size(), transport_.size());
    if (options_.timeout <= std::chrono::milliseconds::zero())
      detail::throw_error(errc::invalid_argument, "communicator: timeout must be positive");
  }

  /// Starts a collective: numbers it and refuses to run on an aborted communicator.
  /// Called from the caller's thread, it first lets started calls finish.
  algorithms::primitives<Transport> begin(collective kind, dtype type, reduce_op op, std::size_t count,
                                          rank_t root) {
    if (!progress_.is_current_thread()) quiesce();
    const transports::message_header header{sequence_++, count, static_cast<std::uint32_t>(root), kind, type, op, 0};
    // A rank that arrives after the abort gets the cause's code, like those that were waiting.
    if (const transports::failure failed = transport_.failure(); failed.code)
      throw error(failed.code, fmt::format("qcoll {} on rank {} of {}: the communicator was aborted: {}",
                                           qcoll::detail::describe(header), rank(), size(), failed.reason));
    return algorithms::primitives<Transport>(transport_, header, options_.timeout);
  }

  /// The ring reduce-scatter of 16-bit values, in float: the block sent at step 0 is
  /// widened (exactly) into scratch, every later contribution is widened as it is
  /// added (reduce_widened), partials travel and add as float, so the float result
  /// returned — this rank's block, avg divided — is the float reduction of the widened
  /// inputs, in the documented order, still to be rounded once. Scratch: two float
  /// blocks (8/n bytes per element). n ≥ 2.
  template <half_element T>
  std::span<const float> reduce_scatter_in_float(algorithms::primitives<Transport>& step,
                                                 const algorithms::ring_view& ring, std::span<const T> in,
                                                 reduce_op op) {
    const std::size_t block = largest_block(in.size());
    struct widening {
      std::span<const T> input;
      std::span<float> partials[2];  // step s receives and reduces into partials[s % 2]
      // Asked once, for the block step 0 sends: it goes where partial(−1) would be,
      // which step 0 leaves alone.
      std::span<const float> own(block_range b) const {
        const std::span<float> into = partials[1].first(b.size);
        kernels::cpu::widen(b.of(input), into);
        return into;
      }
      std::span<const T> contribution(block_range b) const { return b.of(input); }
      std::span<float> incoming(std::size_t s, block_range b) const { return partials[s % 2].first(b.size); }
      std::span<float> partial(std::size_t s, block_range b) const { return partials[s % 2].first(b.size); }
    } buffers{in, {scratch<float>(0, block), scratch<float>(1, block)}};
    algorithms::ring_reduce_scatter<Transport, float>(step, ring, in.size(), op, buffers);
    return buffers.partial(size() - 2, ring.block_at(in.size(), 0));
  }

  /// Block 0 is never smaller than any other block.
  std::size_t largest_block(std::size_t count) const noexcept { return block_of(count, size(), 0).size; }

  /// Scratch space for one block, grown once and reused by later calls.
  template <element T>
  std::span<T> scratch(std::size_t slot, std::size_t elements) {
    std::vector<std::byte>& bytes = scratch_[slot];
    const std::size_t needed = elements * sizeof(T) + alignof(T);
    if (bytes.size() < needed) bytes.resize(needed);
    void* start = bytes.data();
    std::size_t space = bytes.size();
    start = std::align(alignof(T), elements * sizeof(T), start, space);
    return {static_cast<T*>(start), elements};
  }

  void quiesce() { progress_.wait_idle(); }

  /// What a plan is checked against; whether every pair is linked is found once (O(n²)).
  group_view group() {
    if (!fully_linked_) fully_linked_ = topology_.fully_linked();
    return {rank(), size(), topology_.ring_order(), *fully_linked_};
  }

  template <class Plan>
  static std::error_code run_started(void* self, void* subject, std::string& message) noexcept {
    auto& plan = *static_cast<Plan*>(subject);
    try {
      const plan_call<typename Plan::value_type> call = plan.queued_call();
      static_cast<communicator*>(self)->run_plan(plan, call.in, call.out, call.op);
      return {};
    } catch (const std::system_error& e) {
      message = e.what();
      return e.code();
    } catch (const std::exception& e) {
      message = e.what();
      return make_error_code(errc::invalid_argument);
    }
  }

  /// One call of a plan: the checks every plan shares, then the plan's own, then the call.
  template <class Plan>
  void run_plan(Plan& plan, std::span<const typename Plan::value_type> in, std::span<typename Plan::value_type> out,
                reduce_op op) {
    using T = typename Plan::value_type;
    auto step = begin(Plan::collective_kind, dtype_of<T>::value, op, in.size(), plan.header_root());
    const group_view facts = group();
    plan.refuse_if_excluded(facts);  // after begin: the rank's later collectives stay numbered like everyone's
    if (in.size() != out.size())
      step.fail(errc::invalid_argument, "input has {} elements but output has {}", in.size(), out.size());
    if (!detail::same_range(in, out) && detail::overlaps(in, out))
      step.fail(errc::invalid_argument, "input and output overlap without being the same range");
    if (op != reduce_op::sum && op != reduce_op::avg)
      step.fail(errc::invalid_argument, "a quantized allreduce sums or averages; {} is not supported", to_string(op));
    if (in.size() != plan.count())
      step.fail(errc::invalid_argument, "the plan was made for {} elements", plan.count());
    plan.check(step, facts);
    plan.run(step, in, out, op);
  }

  template <class Call>
  static std::error_code capture(Call&& call) noexcept {
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


  /// The progress thread, started by the first start_allreduce. Moving a
  /// communicator first lets its started calls finish (they point at it).
  class progress_slot {
   public:
    progress_slot() = default;
    progress_slot(progress_slot&& other) noexcept : thread_((other.wait_idle(), std::move(other.thread_))) {}
    progress_slot& operator=(progress_slot&& other) noexcept {
      wait_idle();
      other.wait_idle();
      thread_ = std::move(other.thread_);
      return *this;
    }
    detail::progress_thread& get() {
      if (!thread_) thread_ = std::make_unique<detail::progress_thread>();
      return *thread_;
    }
    void wait_idle() noexcept {
      if (thread_) thread_->wait_idle();
    }
    bool is_current_thread() const noexcept { return thread_ && thread_->is_current_thread(); }

   private:
    std::unique_ptr<detail::progress_thread> thread_;
  };

  // Declared first: it is moved (after draining) before the transport is.
  progress_slot progress_;
  Transport transport_;
  topologies::graph topology_;
  communicator_options options_;
  std::uint64_t sequence_ = 0;
  std::vector<std::byte> scratch_[2];
  std::optional<bool> fully_linked_;  // found by the first plan call
};

}  // namespace qcoll
