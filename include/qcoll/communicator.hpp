#pragma once
/// @file
/// communicator<Transport>: a rank's handle on a group of ranks, and the exact
/// (uncompressed) collectives over it. The topology is runtime data
/// (topologies::graph): any ring topology converts to one.
///
/// Over 500 lines: the one class a user calls, each collective's host and device forms
/// documented in place (about 200 of its lines are those comments). Its split is along
/// memory spaces — one form per call over a memory type instead of a host and a device
/// overload — which is the device-collectives work's (issue 52) and changes these
/// calls' shape; splitting it before that would mean splitting it twice (issue 53).
///
/// @par Errors
/// Every collective has a throwing form (qcoll::error) and a form that reports
/// through `std::error_code&` (error_code_forms.hpp). Any failure during a
/// collective — a bad argument on one rank, ranks that disagree about the call, a
/// timeout, a lost peer — aborts the communicator: every rank's pending call fails
/// with the same code, and the message says which rank saw what. An aborted
/// communicator stays aborted; make a new one (and a new transport) to go on.
///
/// @par Sub-communicators
/// split(color, key) makes a communicator over some of the ranks, as MPI_Comm_split
/// does; it shares the transport's connections, numbers its own collectives and sends
/// in tags of its own, so its messages and the parent's never match each other.
/// Collectives on communicators that share ranks must be called in the same relative
/// order on those ranks (as in MPI), since they share the connections.
///
/// @par Thread safety
/// One thread at a time per communicator and the communicators split from it (they
/// share one transport); unrelated communicators are independent. Calls started
/// without waiting (start_allreduce, start_all_gather, …: started_calls.hpp) run on
/// one progress thread that a communicator shares with those split from it, in the
/// order they were started; any other call first waits until they have run, so every
/// rank still runs its collectives in program order.

#include <qcoll/algorithms/binomial_tree.hpp>
#include <qcoll/algorithms/device_staging.hpp>
#include <qcoll/algorithms/dissemination.hpp>
#include <qcoll/algorithms/halving_doubling.hpp>
#include <qcoll/algorithms/primitives.hpp>
#include <qcoll/algorithms/recursive_doubling.hpp>
#include <qcoll/algorithms/ring.hpp>
#include <qcoll/algorithms/workspace.hpp>
#include <qcoll/buffer.hpp>
#include <qcoll/collective_handle.hpp>
#include <qcoll/core/concepts.hpp>
#include <qcoll/core/error.hpp>
#include <qcoll/core/message.hpp>
#include <qcoll/core/partition.hpp>
#include <qcoll/core/types.hpp>
#include <qcoll/detail/check.hpp>
#include <qcoll/detail/describe.hpp>
#include <qcoll/detail/format.hpp>
#include <qcoll/detail/log.hpp>
#include <qcoll/detail/shared_connection.hpp>
#include <qcoll/detail/split.hpp>
#include <qcoll/error_code_forms.hpp>
#include <qcoll/execution/dispatch.hpp>
#include <qcoll/execution/memory.hpp>
#include <qcoll/plan_base.hpp>
#include <qcoll/started_calls.hpp>
#include <qcoll/topologies/fully_connected.hpp>
#include <qcoll/topologies/graph.hpp>
#include <qcoll/transports/subgroup.hpp>
#include <qcoll/tuning/choose.hpp>
#include <qcoll/tuning/copy_path.hpp>
#include <qcoll/tuning/table.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace qcoll {

/// The color of a rank that takes no part in a split (MPI_UNDEFINED, NCCL_SPLIT_NOCOLOR).
inline constexpr std::int64_t no_color = -1;

struct communicator_options {
  /// How long any one step of a collective may wait for a peer before the call
  /// fails with errc::timeout. Finite by default, so nothing hangs forever. A
  /// communicator made without options over a transport joined from a job (shm, TCP:
  /// launch::join, join_from_environment) takes the job's timeout instead
  /// (QCOLL_TIMEOUT_MS, qcoll-run --timeout-ms): one setting for the whole job.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

/// The options of a communicator made over `t` without any: the job's timeout where
/// the transport knows it (job_timeout()), else communicator_options' defaults.
template <class Transport>
communicator_options default_options(const Transport& t) {
  communicator_options options;
  if constexpr (requires {
                  { t.job_timeout() } -> std::convertible_to<std::chrono::milliseconds>;
                })
    options.timeout = t.job_timeout();
  return options;
}

/// The default topology links every pair of ranks, as the in-process, shm and TCP
/// transports do: exact collectives run their ring in rank order over it, and
/// compressed ones send each stripe straight to its owner.
template <transport Transport>
class communicator : public started_calls<Transport>, public error_code_forms<Transport> {
  using started = started_calls<Transport>;   // the forms that start a call and return at once
  using forms = error_code_forms<Transport>;  // the std::error_code forms of the calls below
  friend started;

 public:
  using transport_type = Transport;
  /// What the collectives send through: this communicator's ranks of the transport.
  using channel_type = transports::subgroup<Transport>;

  /// Over `topology`: any ring topology (topologies::ring, fully_connected, a user's
  /// model of ring_topology) converts to the graph kept here.
  communicator(Transport transport, topologies::graph topology, communicator_options options)
      : shared_(std::move(transport)), channel_(shared_->transport), topology_(std::move(topology)), options_(options) {
    validate();
  }
  /// ... with default_options(transport): the job's timeout where it has one.
  communicator(Transport transport, topologies::graph topology)
      : communicator(std::move(transport), std::move(topology), communicator_options{}) {
    options_ = default_options(shared_->transport);
    validate();
  }

  /// Over the default topology: fully connected, of the transport's size.
  communicator(Transport transport, communicator_options options)
      // Members initialise in declaration order, so channel_ is ready here.
      : shared_(std::move(transport)), channel_(shared_->transport),
        topology_(topologies::fully_connected(channel_.size())), options_(options) {
    validate();
  }
  /// ... with default_options(transport): the job's timeout where it has one.
  explicit communicator(Transport transport) : communicator(std::move(transport), communicator_options{}) {
    options_ = default_options(shared_->transport);
    validate();
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  /// Lets calls started without waiting finish first (they use this communicator).
  ~communicator() { quiesce(); }

  rank_t rank() const noexcept { return channel_.rank(); }
  rank_t size() const noexcept { return channel_.size(); }
  const topologies::graph& topology() const noexcept { return topology_; }
  /// The transport the messages travel on: shared with the communicator this one was
  /// split from and those split from it, so its ranks are the whole job's
  /// (channel().base_rank(r) is rank r's there).
  Transport& transport() noexcept { return shared_->transport; }
  const channel_type& channel() const noexcept { return channel_; }
  const communicator_options& options() const noexcept { return options_; }
  /// How the exact collectives choose their algorithms: the tuning table with the
  /// environment's overrides, read when the communicator is made (tuning/table.hpp,
  /// docs/algorithms.md). Communicators split from this one start with its tuning.
  const qcoll::tuning& tuning() const noexcept { return tuning_; }
  /// Replaces it. Every rank must pass the same values before its next collective:
  /// ranks that then choose different algorithms fail that call with operation_mismatch.
  void set_tuning(const qcoll::tuning& values) {
    quiesce();
    tuning_ = values;
  }

  /// `count` zero-filled elements for a collective's data. Where the transport lets
  /// peers map memory (shm, with single copy on) they map this, and large ring steps
  /// read it in place instead of copying it through the kernel — the fastest memory
  /// for big buckets; elsewhere it is ordinary memory. Any rank may pass it or any
  /// other span: ranks need not agree. Not collective; any thread; the buffer may
  /// outlive the communicator. docs/transports.md, "Shared buffers".
  /// @par Errors
  /// qcoll::error invalid_argument when the size overflows or the system refuses the
  /// memory (named); std::bad_alloc for ordinary memory.
  template <element T>
  buffer<T> allocate(std::size_t count) {
    const std::size_t bytes = buffer<T>::checked_bytes(count);
    if constexpr (shared_memory_transport<Transport>) {
      auto memory = std::make_shared<decltype(shared_->transport.allocate_shared(bytes))>(
          shared_->transport.allocate_shared(bytes));
      const std::span<std::byte> region = memory->bytes();
      return buffer<T>({reinterpret_cast<T*>(region.data()), count}, std::move(memory));
    } else {
      (void)bytes;
      return buffer<T>::on_heap(count);
    }
  }

  /// True once any rank aborted; every later collective fails at once. A
  /// communicator and those split from it share the transport, so they abort together.
  bool aborted() const { return static_cast<bool>(channel_.failure().code); }

  /// Fails every rank's pending and future collectives with errc::aborted — on this
  /// communicator and on every one sharing its transport (the parent, sub-communicators).
  /// Calls in flight on the progress thread are waited for first.
  void abort(std::string_view reason) {
    quiesce();
    channel_.abort(make_error_code(errc::aborted), qcoll::detail::format("rank {} aborted the communicator: {}", rank(), reason));
  }

  /// A communicator over the ranks that pass the same `color`, ranked by `key` (ties
  /// by rank here), as MPI_Comm_split and ncclCommSplit: collective over this
  /// communicator. A rank passing `no_color` takes no part and gets nullopt. The new
  /// communicator shares this one's transport and progress thread, has this one's
  /// options, its own collective numbering and its own tags, and a fully connected
  /// topology (every qcoll transport links every pair).
  /// @par Errors
  /// invalid_argument on every rank, this communicator still usable, when any rank
  /// passes a color below 0 other than no_color, or when the transport has no
  /// context left; as any collective (aborting) when the ranks disagree about the call.
  std::optional<communicator> split(std::int64_t color, std::int64_t key) {
    using detail::split_record;
    auto step = begin(collective::split, dtype::f64, reduce_op::sum, split_record::fields * size(), 0);
    // Each rank's record, gathered in rank order; integers travel bit-cast in doubles.
    std::vector<double> records(split_record::fields * size());
    const split_record mine{color, key, shared_->next_context};
    mine.store(block_of(records.size(), size(), rank()).of(std::span<double>(records)));
    algorithms::ring_all_gather<channel_type, double>(step, ring(), std::span<double>(records));

    detail::split_group together = detail::split_group_of(records, color, no_color, rank());  // checks every color
    if (color == no_color) return std::nullopt;
    if (together.context >= transports::max_contexts)
      detail::throw_error(errc::invalid_argument, "qcoll split on rank {} of {}: the transport's {} contexts are used up",
                          rank(), size(), transports::max_contexts);
    shared_->next_context = together.context + 1;
    for (rank_t& m : together.members) m = channel_.base_rank(m);
    channel_type channel(shared_->transport, std::move(together.members), static_cast<std::uint32_t>(together.context));
    const rank_t child_size = channel.size();
    communicator child(shared_, std::move(channel), topologies::fully_connected(child_size), options_);
    child.tuning_ = tuning_;  // as this one has it, which every member has
    return child;
  }

  /// out = in₀ ⊕ in₁ ⊕ … on every rank, bit-identical everywhere.
  /// `in` and `out` have the same size on every rank and are the same range or disjoint.
  /// @par Complexity
  /// 2(n − 1) steps; each rank sends and receives 2(n − 1)/n · count elements
  /// (ring reduce-scatter, then ring all-gather).
  template <element T>
  void allreduce(std::span<const T> in, std::span<T> out, reduce_op op) {
    const choose::choice way = allreduce_choice<T>(in.size());
    auto step = begin(collective::allreduce, dtype_of<T>::value, op, in.size(), 0, way);
    detail::check_same_or_disjoint(step, in, out);
    require_host(step, {{"the input", in}, {"the output", out}});
    run_allreduce(step, way, in, out, op);
  }

  /// In-place allreduce.
  template <element T>
  void allreduce(std::span<T> data, reduce_op op) {
    allreduce(std::span<const T>(data), data, op);
  }

  /// allreduce on device memory (docs/gpu.md): `in` and `out` live on the device of
  /// `where`'s stream. As NCCL's calls, it runs after the work queued on that stream
  /// before it, and work queued there after it sees the result; it returns once the
  /// result is in place. The same algorithm as the host call of the same size, so the
  /// same bits. Over a transport that moves host memory, the input is staged through
  /// pinned host memory in chunks that pipeline with the transfer
  /// (algorithms/device_staging.hpp).
  /// @par Errors
  /// As the host call, and invalid_argument (on every rank) for a buffer in host memory
  /// or on another device than the stream's, or without a device runtime;
  /// device_error when the device fails a copy.
  template <element T>
  void allreduce(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op) {
    allreduce_on_device({where}, in, out, op);
  }
  template <element T>
  void allreduce(execution::device_stream where, std::span<T> data, reduce_op op) {
    allreduce_on_device({where}, std::span<const T>(data), data, op);
  }

  /// Rank r receives block r of the reduced `in` (block_of(in.size(), size(), r)).
  /// `out` has exactly that block's size; it may be exactly that block of `in`, or disjoint from `in`.
  /// @par Complexity
  /// n − 1 steps; each rank sends and receives (n − 1)/n · count elements.
  template <element T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    auto step = begin_reduce_scatter(in, out, op);
    require_host(step, {{"the input", in}, {"the output", out}});
    workspace_.reduce_scatter_by_ring(step, ring(), in, out, op);
  }

  /// reduce_scatter on device memory, as allreduce's device form.
  template <element T>
  void reduce_scatter(execution::device_stream where, std::span<const T> in, std::span<T> out, reduce_op op) {
    reduce_scatter_on_device({where}, in, out, op);
  }

  /// Every rank contributes block r of `out` (`in`, of block_of(out.size(), size(), r)'s size)
  /// and receives all blocks. `in` may be exactly that block of `out`, or disjoint from it.
  /// @par Complexity
  /// n − 1 steps; each rank sends and receives (n − 1)/n · out.size() elements.
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    auto step = begin_all_gather(in, out);
    require_host(step, {{"the input", in}, {"the output", out}});
    const block_range mine = block_of(out.size(), size(), rank());
    if (!detail::same_range(in, mine.of(out))) std::copy(in.begin(), in.end(), mine.of(out).begin());
    algorithms::ring_all_gather<channel_type, T>(step, ring(), out);
  }

  /// all_gather on device memory, as allreduce's device form.
  template <element T>
  void all_gather(execution::device_stream where, std::span<const T> in, std::span<T> out) {
    all_gather_on_device({where}, in, out);
  }

  /// Copies root's `data` into every rank's `data` (same size on every rank).
  /// @par Complexity
  /// Small buffers (tuning::broadcast_small_bytes): ⌈log₂ n⌉ rounds of a binomial tree,
  /// each rank receiving count elements once. Larger ones: 2(n − 1) steps (ring
  /// scatter, then ring all-gather); root sends (n − 1)/n · count elements in the
  /// scatter, and every rank sends (n − 1)/n · count in the all-gather.
  template <element T>
  void broadcast(std::span<T> data, rank_t root) {
    const choose::choice way = choose::broadcast(tuning_, world(), data.size_bytes());
    auto step = begin(collective::broadcast, dtype_of<T>::value, reduce_op::sum, data.size(), root, way);
    if (root >= size()) step.fail(errc::invalid_argument, "root {} is out of range", root);
    require_host(step, {{"the data", data}});
    run_broadcast(step, way, data, root);
  }

  /// broadcast on device memory, as allreduce's device form.
  template <element T>
  void broadcast(execution::device_stream where, std::span<T> data, rank_t root) {
    broadcast_on_device({where}, data, root);
  }

  /// Returns once every rank has entered the barrier.
  /// @par Complexity
  /// n − 1 steps of header-only messages (an all-gather of nothing).
  void barrier() {
    const choose::choice way = choose::barrier(tuning_, world());
    auto step = begin(collective::barrier, dtype::f32, reduce_op::sum, 0, 0, way);
    run_barrier(step, way);
  }

  /// A barrier that also waits for the device: no rank returns before every rank's
  /// work queued on its stream before the call has run.
  void barrier(execution::device_stream where) {
    const choose::choice way = choose::barrier(tuning_, world());
    auto step = begin(collective::barrier, dtype::f32, reduce_op::sum, 0, 0, way);
    run_on_device(step, {where}, {}, 0, [&](algorithms::device_staging& stage) {
      if (const int failed = stage.wait_for_caller()) fail_device(step, stage, failed, "waiting for the stream's work");
      run_barrier(step, way);
    });
  }

  /// out = in₀ + in₁ + … (or their average) through `plan`'s quantizer, with error
  /// feedback. Any model of allreduce_plan (plan_base.hpp) runs here; qcoll's two are
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
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::host)
  void allreduce(Plan& plan, std::span<const typename Plan::value_type> in, std::span<typename Plan::value_type> out,
                 reduce_op op) {
    plan.require_idle("allreduce");
    run_plan(plan, {.in = in, .out = out, .op = op});
  }
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::host)
  void allreduce(Plan& plan, std::span<typename Plan::value_type> data, reduce_op op) {
    allreduce(plan, std::span<const typename Plan::value_type>(data), data, op);
  }
  /// A fused call: `tensors` (one per layer, say), in place, in one call of a plan
  /// made for their sizes (compressed_allreduce_plan's Fused plans). Tensor k must
  /// have plan.tensor_sizes()[k] values, no two may overlap, and the list itself must
  /// stay valid until the call is finished.
  /// @par Errors
  /// As above, and invalid_argument for tensors of other sizes or overlapping ones.
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::host)
  void allreduce(Plan& plan, std::span<const std::span<typename Plan::value_type>> tensors, reduce_op op) {
    plan.require_idle("allreduce");
    run_plan(plan, {.tensors = tensors, .op = op});
  }

  /// allreduce through a plan on device memory (made with a device_stream: its state on
  /// the device of `where`'s stream), as the host call: `in` and `out` (or the fused
  /// call's tensors) live on that device; the call is ordered on `where` as the exact
  /// device calls are, and returns once the result is in place. The GPU encodes and
  /// decodes, and only frames cross to the host (algorithms/device_schedule.hpp). The
  /// result equals the host plan's for the same inputs, bit for bit; a failed call
  /// leaves the output and the plan's residuals (device memory) as they were.
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::device)
  void allreduce(execution::device_stream where, Plan& plan, std::span<const typename Plan::value_type> in,
                 std::span<typename Plan::value_type> out, reduce_op op) {
    plan.require_idle("allreduce");
    run_plan(plan, {.in = in, .out = out, .op = op, .device = {where}});
  }
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::device)
  void allreduce(execution::device_stream where, Plan& plan, std::span<typename Plan::value_type> data, reduce_op op) {
    allreduce(where, plan, std::span<const typename Plan::value_type>(data), data, op);
  }
  template <allreduce_plan<channel_type> Plan>
    requires(plan_memory<Plan> == execution::memory_space::device)
  void allreduce(execution::device_stream where, Plan& plan,
                 std::span<const std::span<typename Plan::value_type>> tensors, reduce_op op) {
    plan.require_idle("allreduce");
    run_plan(plan, {.tensors = tensors, .op = op, .device = {where}});
  }

  /// Point to point: sends `data` to rank `to`, which takes it with a recv (or
  /// send_recv) from this rank of the same size and type. Messages between a pair of
  /// ranks arrive in the order they were sent, and are numbered per pair, so a receive
  /// that meets a message of another size or type, or a collective's, fails (aborting,
  /// as a collective would) instead of taking the wrong bytes. Returns once the
  /// transport has taken the data (the buffer is the caller's again); the receiver may
  /// not have it yet.
  template <element T>
  void send(std::span<const T> data, rank_t to) {
    auto step = begin_point_to_point<T>(sent_to_, to, data.size());
    require_host(step, {{"the data", data}});
    step.send(to, data);
  }

  /// Receives into `data` what rank `from` sends with send (or send_recv) to this rank.
  template <element T>
  void recv(std::span<T> data, rank_t from) {
    auto step = begin_point_to_point<T>(received_from_, from, data.size());
    require_host(step, {{"the data", data}});
    step.recv(from, data);
  }

  /// Sends `outgoing` to `to` while receiving `incoming` from `from`: one exchange,
  /// so neighbours that each send to the other (a pipeline's forward and backward
  /// passes) cannot wait on each other. `to` and `from` may be the same rank.
  template <element T>
  void send_recv(std::span<const T> outgoing, rank_t to, std::span<T> incoming, rank_t from) {
    auto receiving = begin_point_to_point<T>(received_from_, from, incoming.size());
    auto sending = begin_point_to_point<T>(sent_to_, to, outgoing.size());
    require_host(receiving, {{"the outgoing data", outgoing}, {"the incoming buffer", incoming}});
    exchange(receiving, sending, outgoing, to, incoming, from);
  }

  /// Point to point on device memory, as allreduce's device form: send returns once the
  /// transport has taken the data, recv once it is in place on the device.
  template <element T>
  void send(execution::device_stream where, std::span<const T> data, rank_t to) {
    auto step = begin_point_to_point<T>(sent_to_, to, data.size());
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(step, {where}, {{"the data", data}}, 0, [&](algorithms::device_staging&) { step.send(to, data); });
    } else {
      run_on_device(step, {where}, {{"the data", data}}, data.size_bytes(), [&](algorithms::device_staging& stage) {
        const std::span<T> mirror = stage.template mirror_of<T>(data.size());
        download(step, stage, std::as_bytes(data), 0, true);
        step.send(to, std::span<const T>(mirror));
      });
    }
  }
  template <element T>
  void recv(execution::device_stream where, std::span<T> data, rank_t from) {
    auto step = begin_point_to_point<T>(received_from_, from, data.size());
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(step, {where}, {{"the data", data}}, 0, [&](algorithms::device_staging&) { step.recv(from, data); });
    } else {
      run_on_device(step, {where}, {{"the data", data}}, data.size_bytes(), [&](algorithms::device_staging& stage) {
        const std::span<T> mirror = stage.template mirror_of<T>(data.size());
        step.recv(from, mirror);
        upload(step, stage, std::span<const T>(mirror), data);
      });
    }
  }
  template <element T>
  void send_recv(execution::device_stream where, std::span<const T> outgoing, rank_t to, std::span<T> incoming,
                 rank_t from) {
    auto receiving = begin_point_to_point<T>(received_from_, from, incoming.size());
    auto sending = begin_point_to_point<T>(sent_to_, to, outgoing.size());
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(receiving, {where}, {{"the outgoing data", outgoing}, {"the incoming buffer", incoming}}, 0,
                    [&](algorithms::device_staging&) { exchange(receiving, sending, outgoing, to, incoming, from); });
    } else {
      run_on_device(receiving, {where}, {{"the outgoing data", outgoing}, {"the incoming buffer", incoming}},
                    outgoing.size_bytes() + incoming.size_bytes(), [&](algorithms::device_staging& stage) {
        const std::span<T> both = stage.template mirror_of<T>(outgoing.size() + incoming.size());
        const std::span<T> leaving = both.first(outgoing.size()), arriving = both.subspan(outgoing.size());
        download(sending, stage, std::as_bytes(outgoing), 0, true);
        exchange(receiving, sending, std::span<const T>(leaving), to, arriving, from);
        upload(receiving, stage, std::span<const T>(arriving), incoming);
      });
    }
  }

  // Calls started without waiting (started_calls.hpp: start_allreduce, …, wait_all), and
  // the std::error_code forms of every call: the same calls, reporting instead of
  // throwing (error_code_forms.hpp).
  using started::start_allreduce, started::start_reduce_scatter, started::start_all_gather, started::start_broadcast,
      started::start_composed;
  friend class collective_handle;  // runs started device calls (their entry carries the start's event)
  using forms::allreduce, forms::reduce_scatter, forms::all_gather, forms::broadcast, forms::barrier, forms::send,
      forms::recv, forms::send_recv, forms::split, forms::start_allreduce, forms::start_reduce_scatter,
      forms::start_all_gather, forms::start_broadcast;

 private:
  /// A split's product: ranks of `shared`'s transport.
  communicator(const detail::connection_ref<Transport>& shared, channel_type channel, topologies::graph topology,
               communicator_options options)
      : shared_(shared.get()), channel_(std::move(channel)), topology_(std::move(topology)), options_(options) {
    validate();
  }

  algorithms::ring_view ring() const { return algorithms::ring_view(topology_.ring_order(), rank()); }

  // ---- the collectives' scripts, shared by the host and device forms

  template <element T>
  choose::choice allreduce_choice(std::size_t count) {
    return choose::allreduce(tuning_, world(), count * sizeof(T), largest_block(count) * sizeof(T));
  }

  template <element T>
  void run_allreduce(algorithms::primitives<channel_type>& step, const choose::choice& way, std::span<const T> in,
                     std::span<T> out, reduce_op op) {
    if (way.algorithm == algorithm::recursive_doubling)
      return workspace_.allreduce_by_exchanges(step, rank(), size(), in, out, op, [](auto&&... a) {
        algorithms::recursive_doubling_allreduce(a...);
      });
    if (way.algorithm == algorithm::halving_doubling)
      return workspace_.allreduce_by_exchanges(step, rank(), size(), in, out, op, [](auto&&... a) {
        algorithms::halving_doubling_allreduce(a...);
      });
    workspace_.allreduce_by_ring(step, ring(), in, out, op);
  }

  /// Numbers a reduce_scatter and checks its sizes and overlap (either memory space).
  template <element T>
  algorithms::primitives<channel_type> begin_reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    auto step = begin(collective::reduce_scatter, dtype_of<T>::value, op, in.size(), 0,
                      choose::ring(tuning_, largest_block(in.size()) * sizeof(T), reads_peers_memory()));
    const block_range mine = block_of(in.size(), size(), rank());
    if (out.size() != mine.size)
      step.fail(errc::invalid_argument, "output has {} elements but block {} of {} has {}", out.size(), rank(),
                in.size(), mine.size);
    if (detail::overlaps(in, out) && !detail::same_range(mine.of(in), out))
      step.fail(errc::invalid_argument, "output overlaps the input other than as exactly block {}", rank());
    return step;
  }

  /// Numbers an all_gather and checks its sizes and overlap (either memory space).
  template <element T>
  algorithms::primitives<channel_type> begin_all_gather(std::span<const T> in, std::span<T> out) {
    auto step = begin(collective::all_gather, dtype_of<T>::value, reduce_op::sum, out.size(), 0,
                      choose::ring(tuning_, largest_block(out.size()) * sizeof(T), reads_peers_memory()));
    const block_range mine = block_of(out.size(), size(), rank());
    if (in.size() != mine.size)
      step.fail(errc::invalid_argument, "input has {} elements but block {} of {} has {}", in.size(), rank(),
                out.size(), mine.size);
    if (detail::overlaps(in, out) && !detail::same_range(in, mine.of(out)))
      step.fail(errc::invalid_argument, "input overlaps the output other than as exactly block {}", rank());
    return step;
  }

  template <element T>
  void run_broadcast(algorithms::primitives<channel_type>& step, const choose::choice& way, std::span<T> data,
                     rank_t root) {
    if (way.algorithm == algorithm::binomial_tree)
      return algorithms::binomial_tree_broadcast<channel_type, T>(step, rank(), size(), root, data);
    const algorithms::ring_view ring = this->ring();
    algorithms::ring_scatter<channel_type, T>(step, ring, root, data);
    algorithms::ring_all_gather<channel_type, T>(step, ring, data);
  }

  void run_barrier(algorithms::primitives<channel_type>& step, const choose::choice& way) {
    if (way.algorithm == algorithm::dissemination) return algorithms::dissemination_barrier(step, rank(), size());
    algorithms::ring_all_gather<channel_type, float>(step, ring(), std::span<float>());
  }

  /// send_recv's one exchange: the receive posted first, then the send.
  template <element T>
  void exchange(algorithms::primitives<channel_type>& receiving, algorithms::primitives<channel_type>& sending,
                std::span<const T> outgoing, rank_t to, std::span<T> incoming, rank_t from) {
    typename channel_type::request received, sent;
    receiving.post_recv(received, from, 0, incoming);
    sending.post_send(sent, to, 0, outgoing);
    receiving.complete_recv(received, from, incoming.size_bytes());
    sending.complete_send(sent, to, outgoing.size_bytes());
  }

  /// The door of every call on host buffers: they are host memory, and the transport
  /// moves host memory (one that moves device memory takes the device forms only).
  void require_host(algorithms::primitives<channel_type>& step, std::initializer_list<execution::named_buffer> buffers) {
    if constexpr (moves_device_memory<Transport>)
      step.fail(errc::invalid_argument, "this communicator's transport moves device memory: call the form that takes "
                "a device_stream first, with device buffers");
    execution::require_host(step, buffers);
  }

  // ---- calls on device buffers (algorithms/device_staging.hpp)

  template <element T>
  void allreduce_on_device(const execution::device_entry& entry, std::span<const T> in, std::span<T> out, reduce_op op) {
    const choose::choice way = allreduce_choice<T>(in.size());
    auto step = begin(collective::allreduce, dtype_of<T>::value, op, in.size(), 0, way);
    detail::check_same_or_disjoint(step, in, out);
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(step, entry, {{"the input", in}, {"the output", out}}, 0,
                    [&](algorithms::device_staging&) { run_allreduce(step, way, in, out, op); });
    } else {
      run_on_device(step, entry, {{"the input", in}, {"the output", out}}, in.size_bytes(),
                    [&](algorithms::device_staging& stage) {
        const std::span<T> mirror = stage.template mirror_of<T>(in.size());
        download_for(step, stage, way, std::as_bytes(in), sizeof(T));
        run_allreduce(step, way, std::span<const T>(mirror), mirror, op);
        upload(step, stage, std::span<const T>(mirror), out);
      });
    }
  }

  template <element T>
  void reduce_scatter_on_device(const execution::device_entry& entry, std::span<const T> in, std::span<T> out,
                                reduce_op op) {
    auto step = begin_reduce_scatter(in, out, op);
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(step, entry, {{"the input", in}, {"the output", out}}, 0, [&](algorithms::device_staging&) {
        workspace_.reduce_scatter_by_ring(step, ring(), in, out, op);
      });
    } else {
      const choose::choice way{choose::ring(tuning_, largest_block(in.size()) * sizeof(T), reads_peers_memory())};
      run_on_device(step, entry, {{"the input", in}, {"the output", out}}, in.size_bytes(),
                    [&](algorithms::device_staging& stage) {
        const std::span<T> mirror = stage.template mirror_of<T>(in.size());
        download_for(step, stage, way, std::as_bytes(in), sizeof(T));
        const std::span<T> mine = block_of(in.size(), size(), rank()).of(mirror);
        workspace_.reduce_scatter_by_ring(step, ring(), std::span<const T>(mirror), mine, op);
        upload(step, stage, std::span<const T>(mine), out);
      });
    }
  }

  template <element T>
  void all_gather_on_device(const execution::device_entry& entry, std::span<const T> in, std::span<T> out) {
    auto step = begin_all_gather(in, out);
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(step, entry, {{"the input", in}, {"the output", out}}, 0, [&](algorithms::device_staging&) {
        const block_range mine = block_of(out.size(), size(), rank());
        if (!detail::same_range(in, mine.of(out))) step.copy(in, mine.of(out));
        algorithms::ring_all_gather<channel_type, T>(step, ring(), out);
      });
    } else {
      run_on_device(step, entry, {{"the input", in}, {"the output", out}}, out.size_bytes(),
                    [&](algorithms::device_staging& stage) {
        const std::span<T> mirror = stage.template mirror_of<T>(out.size());
        const block_range mine = block_of(out.size(), size(), rank());
        // Only this rank's block comes from the device; the ring sends it first.
        download(step, stage, std::as_bytes(in), mine.offset * sizeof(T), true);
        algorithms::ring_all_gather<channel_type, T>(step, ring(), mirror);
        upload(step, stage, std::span<const T>(mirror), out);
      });
    }
  }

  template <element T>
  void broadcast_on_device(const execution::device_entry& entry, std::span<T> data, rank_t root) {
    const choose::choice way = choose::broadcast(tuning_, world(), data.size_bytes());
    auto step = begin(collective::broadcast, dtype_of<T>::value, reduce_op::sum, data.size(), root, way);
    if (root >= size()) step.fail(errc::invalid_argument, "root {} is out of range", root);
    if constexpr (!algorithms::needs_staging<Transport>) {
      run_on_device(step, entry, {{"the data", data}}, 0,
                    [&](algorithms::device_staging&) { run_broadcast(step, way, data, root); });
    } else {
      run_on_device(step, entry, {{"the data", data}}, data.size_bytes(), [&](algorithms::device_staging& stage) {
        const std::span<T> mirror = stage.template mirror_of<T>(data.size());
        if (rank() == root) download(step, stage, std::as_bytes(std::span<const T>(data)), 0, false);
        run_broadcast(step, way, mirror, root);
        upload(step, stage, std::span<const T>(mirror), data);
      });
    }
  }

  /// The door of every call on device buffers: the device runtime, the stream's device,
  /// the buffers on it (checked once, here), the staging ready and started after the
  /// caller's stream; then `script(stage)`, then the end (the caller's stream waits for
  /// the result, and so does the host). Any failure aborts, so every rank hears of it.
  /// Over a transport that moves device memory nothing is staged: the script runs on
  /// the device buffers themselves, its reductions and copies queued on the transport's
  /// stream (primitives::data_on_device), which is what is ordered after the caller's.
  template <class Script>
  void run_on_device(algorithms::primitives<channel_type>& step, const execution::device_entry& entry,
                     std::initializer_list<execution::named_buffer> buffers, std::size_t bytes, Script&& script) {
    const device::runtime* runtime = execution::active_device();
    if (!runtime) step.fail(errc::invalid_argument, "{}", execution::device_refusal());
    int ordinal = entry.ordinal;
    if (ordinal < 0 && runtime->stream_device(entry.where.stream, &ordinal) != 0)
      step.fail(errc::invalid_argument, "the call's stream is not a stream of the {} device runtime", runtime->name);
    device::stream_handle working = nullptr;
    if constexpr (moves_device_memory<Transport>) {
      if (ordinal != shared_->transport.device())
        step.fail(errc::invalid_argument, "the call's stream is on device {}, but this rank's transport moves memory "
                  "of device {}", ordinal, shared_->transport.device());
      working = shared_->transport.stream();
      step.data_on_device(working);
    }
    execution::require_device(step, *runtime, ordinal, buffers);
    algorithms::device_staging& stage = workspace_.device_stage();
    try {
      if (const int failed = stage.prepare({runtime, ordinal}, bytes, working))
        fail_device(step, stage, failed, "making the device call's stream");
    } catch (const error& refused) {  // the mirror or the stream refused
      step.fail_with(refused.code(), refused.what());
    }
    try {
      const int started = entry.ready ? stage.start_after_event(entry.ready) : stage.start_after(entry.where.stream);
      if (started != 0) fail_device(step, stage, started, "ordering the call after the stream's work");
      script(stage);
      if (const int failed = stage.finish(entry.where.stream, entry.ready == nullptr))
        fail_device(step, stage, failed, "copying the result to device memory");
    } catch (...) {
      stage.abandon();
      throw;
    }
  }

  [[noreturn]] static void fail_device(algorithms::primitives<channel_type>& step,
                                       const algorithms::device_staging& stage, int code, const char* what) {
    step.fail(errc::device_error, "{}: {} error {}: {}", what, stage.runtime().name, code, stage.runtime().error_string(code));
  }

  /// Queues the copy of `from` (device memory) into the mirror at `offset`; `gated`:
  /// the script's reads wait for each chunk (primitives::await_arrivals), else the call
  /// waits for all of it first.
  void download(algorithms::primitives<channel_type>& step, algorithms::device_staging& stage,
                std::span<const std::byte> from, std::size_t offset, bool gated) {
    if (const int failed = stage.download(from.data(), offset, from.size()))
      fail_device(step, stage, failed, "copying the input from device memory");
    await_downloads(step, stage, gated);
  }

  /// The input of a reduction, in the order its script reads it: a ring (whose reads all
  /// go through the primitives) reads block −1, −2, … of its ring first, so those blocks
  /// are copied first and each step waits for its own; other scripts wait for the whole.
  void download_for(algorithms::primitives<channel_type>& step, algorithms::device_staging& stage,
                    const choose::choice& way, std::span<const std::byte> from, std::size_t element_bytes) {
    const bool ring_script = way.algorithm == algorithm::ring || way.algorithm == algorithm::ring_single_copy;
    // 16-bit values are widened from the input outside the primitives: not gated.
    const bool gated = ring_script && element_bytes >= sizeof(float);
    if (!gated) return download(step, stage, from, 0, false);
    const algorithms::ring_view ring = this->ring();
    std::vector<block_range>& order = stage.order();
    const std::size_t count = from.size() / element_bytes;
    for (std::size_t k = 1; k <= ring.size(); ++k) {
      const block_range b = ring.block_at(count, -static_cast<std::ptrdiff_t>(k));
      order.push_back({b.offset * element_bytes, b.size * element_bytes});
    }
    if (const int failed = stage.download(from.data(), 0, order))
      fail_device(step, stage, failed, "copying the input from device memory");
    await_downloads(step, stage, true);
  }

  void await_downloads(algorithms::primitives<channel_type>& step, algorithms::device_staging& stage, bool gated) {
    if (gated) return step.await_arrivals(stage.arrivals());
    if (const char* failure = stage.await_all())
      step.fail(errc::device_error, "copying the input from device memory: {}", failure);
  }

  template <element T>
  void upload(algorithms::primitives<channel_type>& step, algorithms::device_staging& stage, std::span<const T> from,
              std::span<T> to) {
    if (const int failed = stage.upload(std::as_bytes(from), reinterpret_cast<std::byte*>(to.data())))
      fail_device(step, stage, failed, "copying the result to device memory");
  }

  /// Checks what every constructor was given, and places the scratch where the
  /// transport moves memory.
  void validate() {
    if constexpr (moves_device_memory<Transport>) workspace_.scratch_on_device(shared_->transport.device());
    if (topology_.size() != channel_.size())
      detail::throw_error(errc::invalid_argument, "communicator: topology has {} ranks but the transport has {}",
                          topology_.size(), channel_.size());
    if (options_.timeout <= std::chrono::milliseconds::zero())
      detail::throw_error(errc::invalid_argument, "communicator: timeout must be positive");
  }

  /// What the choices (tuning/choose.hpp) know of this communicator. Like begin(), it
  /// first lets started calls finish: they read (and fill in) what those calls use.
  choose::world world() {
    if (!shared_.is_progress_thread()) quiesce();
    return {size(), group().fully_linked, reads_peers_memory()};
  }
  bool reads_peers_memory() const {
    if constexpr (single_copy_transport<channel_type>) return channel_.single_copy();
    else return false;
  }
  /// The transport's ranks where they map and read each other's memory (shm: every one
  /// on this host), else 0: whether the copy path is measured by default depends on them.
  rank_t ranks_reading_each_other() const {
    if constexpr (shared_memory_transport<channel_type>) return reads_peers_memory() ? shared_->transport.size() : 0;
    else return 0;
  }

  /// Starts a collective: numbers it and refuses to run on an aborted communicator.
  /// Called from the caller's thread, it first lets started calls finish.
  algorithms::primitives<channel_type> begin(collective kind, dtype type, reduce_op op, std::size_t count,
                                             rank_t root, choose::choice way = {}) {
    if (!shared_.is_progress_thread()) quiesce();
    auto step = step_for({sequence_++, count, static_cast<std::uint32_t>(root), kind, type, op, way.algorithm});
    if (way.algorithm == algorithm::ring) step.slice_reductions(tuning_.ring_slice_bytes, tuning_table::ring_slices_in_flight);
    bool measured = false;
    if (way.algorithm == algorithm::ring_single_copy)
      workspace_.prepare_single_copy(step, channel_, count, type, tuning_.ring_slice_bytes, [&](std::size_t step_bytes) {
        if (!tuning_.measure_copy_path) return step_bytes < tuning_.single_copy_kernel_bytes;
        measured = true;
        copy_decision_ = copy_paths_.choose(step_bytes);
        step.trace().time_to([](void* self, detail::call_trace::clock::duration took) noexcept {
          auto& comm = *static_cast<communicator*>(self);
          comm.copy_paths_.record(comm.copy_decision_, took);
        }, this);
        return copy_decision_.path == tuning_copy::copy_path::staged;
      });
    if (log_choices_ && way.algorithm != algorithm::unspecified)  // written when the call ends (call_trace.hpp)
      step.trace().arm(detail::format("qcoll: rank {} of {}: {} ({} bytes): {}{}{}", rank(), size(),
                                      detail::describe(step.header()), count * size_of(type), way.rule,
                                      measured ? "; " : "", measured ? copy_paths_.describe(copy_decision_) : ""));
    return step;
  }

  /// The primitives of one message of a point-to-point exchange with `peer`: numbered
  /// per pair and direction (`counters`), so the collectives' numbering is untouched.
  template <element T>
  algorithms::primitives<channel_type> begin_point_to_point(std::vector<std::uint64_t>& counters, rank_t peer,
                                                            std::size_t count) {
    if (!shared_.is_progress_thread()) quiesce();
    if (counters.size() != size()) counters.assign(size(), 0);
    const std::uint64_t number = peer < size() ? counters[peer]++ : 0;
    auto step = step_for({number, count, 0, collective::point_to_point, dtype_of<T>::value, reduce_op::sum, algorithm::unspecified});
    if (peer >= size()) step.fail(errc::invalid_argument, "peer {} is out of range", peer);
    if (peer == rank()) step.fail(errc::invalid_argument, "a rank does not send to or receive from itself");
    return step;
  }

  /// Primitives for a call with `header`; a rank that arrives after an abort gets the
  /// cause's code, like those that were waiting.
  algorithms::primitives<channel_type> step_for(const transports::message_header& header) {
    if (const transports::failure failed = channel_.failure(); failed.code)
      throw error(failed.code, qcoll::detail::format("qcoll {} on rank {} of {}: the communicator was aborted: {}",
                                           qcoll::detail::describe(header), rank(), size(), failed.reason));
    return algorithms::primitives<channel_type>(channel_, header, options_.timeout);
  }

  /// Block 0 is never smaller than any other block.
  std::size_t largest_block(std::size_t count) const noexcept { return block_of(count, size(), 0).size; }

  void quiesce() noexcept { shared_.wait_idle(); }

  /// What a plan is checked against; whether every pair is linked is found once (O(n²)).
  group_view group() {
    if (!fully_linked_) fully_linked_ = topology_.fully_linked();
    return {rank(), size(), topology_.ring_order(), *fully_linked_};
  }

  /// One call of a plan (plan_base.hpp, run_plan_call).
  template <class Plan>
  void run_plan(Plan& plan, const plan_call<typename Plan::value_type>& call) {
    auto step = begin(Plan::collective_kind, dtype_of<typename Plan::value_type>::value, call.op, call.count(),
                      plan.header_root());
    if constexpr (moves_device_memory<Transport> && plan_memory<Plan> == execution::memory_space::host)
      step.fail(errc::invalid_argument, "this communicator's transport moves device memory: make the plan on device "
                "memory (with a device_stream) and call it with device buffers");
    run_plan_call(plan, step, group(), call);
  }

  // Declared first: it is moved (after the started calls have run) before the rest.
  detail::connection_ref<Transport> shared_;
  channel_type channel_;  // into shared_'s transport, which never moves
  topologies::graph topology_;
  communicator_options options_;
  qcoll::tuning tuning_ = qcoll::tuning::from_environment(ranks_reading_each_other());
  bool log_choices_ = detail::debug_info_enabled();  // QCOLL_DEBUG=INFO: a line per exact collective, when it ends
  std::uint64_t sequence_ = 0;
  std::vector<std::uint64_t> sent_to_, received_from_;  // point-to-point messages per peer
  algorithms::workspace workspace_;  // scratch and staging, kept for later calls
  tuning_copy::copy_path_chooser copy_paths_;  // single-copy steps: staged or the kernel's copy, by measurement
  tuning_copy::copy_decision copy_decision_;   // the running call's, recorded when it ends
  std::optional<bool> fully_linked_;  // found by the first call that needs it
};

/// comm.allocate<T>(count), spelled so generic code (a lambda over `auto transport`)
/// needs no `template` keyword.
template <element T, transport Transport>
buffer<T> allocate(communicator<Transport>& comm, std::size_t count) {
  return comm.template allocate<T>(count);
}

}  // namespace qcoll
