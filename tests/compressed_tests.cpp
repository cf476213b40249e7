// The compressed allreduce over the in-process transport: identity reproduces the
// exact sums; every lossy quantizer matches a sequential model of the documented
// algorithm bit for bit, on every rank, on both routes, for world sizes 1–8 and
// counts that divide by neither the world size nor the group size; error feedback
// keeps the running sum on track; the bytes sent are the documented formula; a
// failed call leaves the residuals as they were; calls can be started and waited
// for; a call allocates nothing.

#define BOOST_TEST_MODULE qcoll compressed allreduce
#include <boost/test/unit_test.hpp>

#include <qcoll/qcoll.hpp>

#include "support/allocation_counter.hpp"
#include "support/counting_transport.hpp"
#include "support/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace qcoll;

namespace {

enum class route_kind { direct, ring, shuffled_ring };
constexpr route_kind all_routes[] = {route_kind::direct, route_kind::ring, route_kind::shuffled_ring};

const char* name_of(route_kind r) {
  return r == route_kind::direct ? "direct" : r == route_kind::ring ? "ring" : "shuffled ring";
}

std::vector<rank_t> ring_order(route_kind route, std::size_t n) {
  std::vector<rank_t> order(n);
  std::iota(order.begin(), order.end(), rank_t{0});
  if (route == route_kind::shuffled_ring) std::shuffle(order.begin(), order.end(), std::mt19937(unsigned(n) * 31u));
  return order;
}

/// What one rank saw over a sequence of calls.
template <class T>
struct rank_record {
  std::vector<std::vector<T>> outputs;  // per call
  std::vector<T> worker_residual;       // after the last call
  std::vector<T> server_residual;
  std::vector<std::size_t> counted_bytes;  // by the transport, per call
  std::vector<std::size_t> plan_bytes;     // plan.last_call().bytes_sent, per call
  std::size_t formula_bytes = 0;
  block_range stripe{};
  stripe_route route = stripe_route::direct;  // a ring of 3 or fewer is fully connected: direct
};

struct run_settings {
  route_kind route = route_kind::direct;
  reduce_op op = reduce_op::sum;
  std::size_t chunk_values = compressed_allreduce_options::host_chunk_values;
  bool in_place = true;
  bool started = false;  // start_allreduce + wait instead of the blocking call
  std::vector<std::size_t> tensors{};  // a fused plan over these sizes, called with separate tensors
  bool momentum = false;               // the owner applies optimizers::momentum{0.9}
  bool reproducible = false;           // the owners sum on the shared grid
};

constexpr float model_momentum = 0.9f;

/// Runs inputs[call][rank] through one plan per rank; make_quantizer(rank) gives each
/// rank's quantizer (stochastic ones differ by seed). Throws the first rank's error.
template <class Q, class MakeQuantizer>
std::vector<rank_record<typename Q::value_type>> run_calls(
    const std::vector<std::vector<std::vector<typename Q::value_type>>>& inputs, MakeQuantizer make_quantizer,
    run_settings settings) {
  using T = typename Q::value_type;
  const std::size_t n = inputs.at(0).size();
  const std::size_t count = inputs[0][0].size();
  std::vector<rank_record<T>> records(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    auto body = [&](auto& comm) {
      const rank_t r = comm.rank();
      const bool fused = !settings.tensors.empty();
      const std::vector<std::size_t> sizes = fused ? settings.tensors : std::vector<std::size_t>{count};
      owner_update<T> update;
      if (settings.momentum) update = optimizers::momentum{.momentum = model_momentum};
      compressed_allreduce_plan<Q> plan(comm, std::span<const std::size_t>(sizes), make_quantizer(r),
                                        {.chunk_values = settings.chunk_values, .reproducible = settings.reproducible},
                                        update);
      rank_record<T>& record = records[r];
      record.formula_bytes = plan.bytes_sent_per_call();
      record.stripe = plan.stripe(r);
      record.route = plan.route();
      for (const auto& call : inputs) {
        std::vector<T> data = call[r];
        std::vector<T> out(settings.in_place ? 0 : count);
        std::span<T> result = settings.in_place ? std::span<T>(data) : std::span<T>(out);
        // A fused call: each tensor in memory of its own, in place.
        std::vector<std::vector<T>> tensors;
        std::vector<std::span<T>> listed;
        for (std::size_t k = 0, at = 0; fused && k < sizes.size(); at += sizes[k++])
          tensors.emplace_back(data.begin() + static_cast<std::ptrdiff_t>(at),
                               data.begin() + static_cast<std::ptrdiff_t>(at + sizes[k]));
        for (auto& t : tensors) listed.emplace_back(t);
        const std::span<const std::span<T>> list(listed);
        const std::size_t before = comm.transport().bytes_sent();
        if (settings.started) {
          if (fused)
            comm.start_allreduce(plan, list, settings.op);
          else
            comm.start_allreduce(plan, std::span<const T>(data), result, settings.op);
          plan.wait();
        } else if (fused) {
          comm.allreduce(plan, list, settings.op);
        } else {
          comm.allreduce(plan, std::span<const T>(data), result, settings.op);
        }
        record.counted_bytes.push_back(comm.transport().bytes_sent() - before);
        record.plan_bytes.push_back(plan.last_call().bytes_sent);
        if (fused) {
          result = std::span<T>(data);
          for (std::size_t k = 0, at = 0; k < sizes.size(); at += sizes[k++])
            std::copy(tensors[k].begin(), tensors[k].end(), data.begin() + static_cast<std::ptrdiff_t>(at));
        }
        record.outputs.emplace_back(result.begin(), result.end());
      }
      record.worker_residual.assign(plan.worker_residual().begin(), plan.worker_residual().end());
      record.server_residual.assign(plan.server_residual().begin(), plan.server_residual().end());
    };
    test::counting_transport counted(std::move(endpoint));
    if (settings.route == route_kind::direct) {
      communicator<test::counting_transport> comm(std::move(counted));
      body(comm);
    } else {
      communicator<test::counting_transport> comm(std::move(counted),
                                                                    topologies::ring(ring_order(settings.route, n)));
      body(comm);
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return records;
}

/// The documented algorithm, written sequentially and independently of the library:
/// stripe j is block j of the groups; every chunk of chunk_values (whole groups) is a
/// message, cut where a tensor ends (a fused plan) into frames; the owner's sum starts
/// with its own decoded contribution and adds those of the ranks 1, 2, … places
/// before it in `order` (rank order on the direct route, the topology's ring on the
/// ring route); avg divides; with momentum the owner's velocity v ← 0.9·v + sum
/// replaces the sum; the owner re-encodes with its server residual; everybody gets
/// the decoded bits. On the grid (reproducible): chunks are whole grid blocks too, and
/// the owner sums every rank's decoded contribution with a reproducible_accumulator, a
/// block at a time from its stripe's start (a block also ends where a piece does).
template <class Q>
struct sequential_model {
  using T = typename Q::value_type;
  std::vector<Q> quantizers;  // per rank
  std::size_t count;
  std::size_t chunk_values;
  std::vector<std::vector<T>> worker;  // per rank
  std::vector<std::vector<T>> server;  // per owner, over its stripe
  std::vector<block_range> stripes;
  std::vector<rank_t> order;
  std::vector<std::size_t> tensor_ends;  // where each tensor ends
  bool momentum = false;
  bool on_grid = false;
  std::vector<std::vector<T>> velocity;  // per owner, over its stripe
  // Quantizers that remember between encodes: per rank, per encode (by its first value).
  std::vector<std::map<std::size_t, std::vector<T>>> worker_memory, server_memory;
  std::uint64_t calls = 0;

  /// Encodes as the plan's encode site (rank, first value) does, with its memory if Q keeps one.
  void encode(std::map<std::size_t, std::vector<T>>& memories, const Q& q, std::span<const T> in, std::span<T> residual,
              std::span<std::byte> frame, quantizers::encode_position position) {
    if constexpr (algorithms::remembers_between_encodes<Q>) {
      if (const std::size_t size = q.memory_size(in.size()); size != 0) {
        auto [where, fresh] = memories.try_emplace(position.offset, size, std::numeric_limits<T>::quiet_NaN());
        return q.encode(in, residual, residual, where->second, where->second, frame, position);
      }
    }
    q.encode(in, residual, frame, position);
  }

  sequential_model(std::vector<Q> q, std::size_t count_, std::size_t requested_chunk, std::vector<rank_t> order_,
                   const std::vector<std::size_t>& tensors = {}, bool momentum_ = false, bool on_grid_ = false)
      : quantizers(std::move(q)), count(count_), order(std::move(order_)), momentum(momentum_), on_grid(on_grid_) {
    for (const std::size_t size : tensors) tensor_ends.push_back((tensor_ends.empty() ? 0 : tensor_ends.back()) + size);
    if (tensor_ends.empty()) tensor_ends.push_back(count);
    const std::size_t n = quantizers.size();
    const std::size_t g = quantizers[0].group_size() == 0 ? 1 : quantizers[0].group_size();
    const std::size_t unit = on_grid ? std::lcm(g, reproducible_block) : g;
    chunk_values = std::max<std::size_t>(1, (requested_chunk + unit - 1) / unit) * unit;
    const std::size_t groups = (count + g - 1) / g;
    for (std::size_t j = 0; j < n; ++j) {
      const block_range b = block_of(groups, n, j);
      const std::size_t begin = std::min(count, b.offset * g), end = std::min(count, (b.offset + b.size) * g);
      stripes.push_back({begin, end - begin});
    }
    const bool residual = Q::keeps_residual;
    worker.assign(n, std::vector<T>(residual ? count : 0));
    for (std::size_t j = 0; j < n; ++j) server.emplace_back(residual ? stripes[j].size : 0);
    for (std::size_t j = 0; j < n; ++j) velocity.emplace_back(stripes[j].size);
    worker_memory.resize(n);
    server_memory.resize(n);
  }

  std::vector<T> call(const std::vector<std::vector<T>>& in, reduce_op op) {
    const std::size_t n = quantizers.size();
    std::vector<T> out(count);
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t chunk = 0; chunk < stripes[j].size; chunk += chunk_values)
        for (std::size_t at = stripes[j].offset + chunk,
                         end = stripes[j].offset + std::min(stripes[j].size, chunk + chunk_values);
             at < end;) {
        const std::size_t piece_end = std::min(end, *std::upper_bound(tensor_ends.begin(), tensor_ends.end(), at));
        const block_range values{at, piece_end - at};
        const std::size_t begin = at - stripes[j].offset;
        at = piece_end;
        std::vector<std::vector<std::byte>> frames(n);
        for (std::size_t r = 0; r < n; ++r) {
          frames[r].resize(quantizers[r].encoded_size(values.size));
          std::span<T> residual = Q::keeps_residual ? values.of(std::span(worker[r])) : std::span<T>();
          encode(worker_memory[r], quantizers[r], values.of(std::span(in[r])), residual, frames[r],
                 {2 * calls, values.offset});
        }
        std::vector<T> sum(values.size);
        if (on_grid) {
          sum_on_grid(quantizers[j], frames, begin, sum);
        } else {
          check(quantizers[j].decode(frames[j], sum));
          const std::size_t position = std::find(order.begin(), order.end(), j) - order.begin();
          for (std::size_t k = 1; k < n; ++k)
            check(quantizers[j].decode_accumulate(frames[order[(position + n - k) % n]], sum));
        }
        if (op == reduce_op::avg)
          for (T& v : sum) v /= static_cast<T>(n);
        for (std::size_t i = 0; momentum && i < sum.size(); ++i) {
          T& v = velocity[j][begin + i];
          v = model_momentum * v + sum[i];
          sum[i] = v;
        }
        std::vector<std::byte> aggregate(quantizers[j].encoded_size(values.size));
        std::span<T> residual =
            Q::keeps_residual ? std::span(server[j]).subspan(begin, values.size) : std::span<T>();
        encode(server_memory[j], quantizers[j], sum, residual, aggregate, {2 * calls + 1, values.offset});
        check(quantizers[j].decode(aggregate, values.of(std::span(out))));
      }
    }
    ++calls;
    return out;
  }

  /// sum = the decoded frames' sum on the grid; sum[0] is value `begin` of the stripe.
  static void sum_on_grid(const Q& q, const std::vector<std::vector<std::byte>>& frames, std::size_t begin,
                          std::span<T> sum) {
    std::vector<std::vector<T>> decoded(frames.size(), std::vector<T>(sum.size()));
    for (std::size_t r = 0; r < frames.size(); ++r) check(q.decode(frames[r], decoded[r]));
    for (std::size_t at = 0; at < sum.size();) {  // a block (stripe-relative) at a time
      const std::size_t end = std::min(sum.size(), (begin + at) / reproducible_block * reproducible_block +
                                                       reproducible_block - begin);
      reproducible_accumulator<T> blocks(end - at);
      for (const auto& d : decoded) blocks.add(std::span(d).subspan(at, end - at));
      blocks.sum(sum.subspan(at, end - at));
      at = end;
    }
  }

  static void check(std::error_code e) {
    if (e) throw std::runtime_error("model: " + e.message());
  }
};

template <class T>
std::vector<std::vector<std::vector<T>>> random_calls(std::size_t calls, std::size_t n, std::size_t count,
                                                      std::uint64_t seed) {
  std::vector<std::vector<std::vector<T>>> inputs(calls);
  std::mt19937_64 gen(seed);
  std::normal_distribution<T> normal(0, 1);
  for (auto& call : inputs)
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<T> v(count);
      for (T& x : v) x = normal(gen) * T(0.01);
      call.push_back(std::move(v));
    }
  return inputs;
}

bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

/// Checks every rank against the model, bit for bit, call by call; and the bytes.
template <class Q, class MakeQuantizer>
void check_against_model(std::size_t n, std::size_t count, std::size_t calls, MakeQuantizer make_quantizer,
                         run_settings settings) {
  BOOST_TEST_CONTEXT(Q::name << " n=" << n << " count=" << count << " route=" << name_of(settings.route)
                             << " op=" << to_string(settings.op) << " chunk=" << settings.chunk_values
                             << " in_place=" << settings.in_place << " started=" << settings.started
                             << " tensors=" << settings.tensors.size() << " momentum=" << settings.momentum
                             << " reproducible=" << settings.reproducible) {
    auto inputs = random_calls<float>(calls, n, count, n * 7919 + count);
    if (settings.reproducible)  // magnitudes 2^0 … 2^-40 apart within a grid block: the grid rounds
      for (auto& call : inputs)
        for (auto& rank : call)
          for (std::size_t i = 0; i < count; ++i) rank[i] = std::ldexp(rank[i], -static_cast<int>(i / 37 * 7 % 41));
    const auto records = run_calls<Q>(inputs, make_quantizer, settings);
    std::vector<Q> quantizers;
    for (std::size_t r = 0; r < n; ++r) quantizers.push_back(make_quantizer(r));
    const bool direct = records[0].route == stripe_route::direct;
    sequential_model<Q> model(quantizers, count, settings.chunk_values,
                              ring_order(direct ? route_kind::direct : settings.route, n), settings.tensors,
                              settings.momentum, settings.reproducible);
    for (std::size_t c = 0; c < calls; ++c) {
      const std::vector<float> expected = model.call(inputs[c], settings.op);
      for (std::size_t r = 0; r < n; ++r) {
        BOOST_TEST_INFO("call " << c << " rank " << r);
        BOOST_TEST(bitwise_equal(records[r].outputs[c], expected));
        BOOST_TEST(records[r].counted_bytes[c] == records[r].formula_bytes);
        BOOST_TEST(records[r].plan_bytes[c] == records[r].formula_bytes);
      }
    }
    for (std::size_t r = 0; r < n; ++r) {
      BOOST_TEST(bitwise_equal(records[r].worker_residual, model.worker[r]));
      BOOST_TEST(bitwise_equal(records[r].server_residual, model.server[r]));
    }
  }
}

quantizers::one_bit one_bit_with(std::size_t group) { return quantizers::one_bit({.group_size = group}); }

}  // namespace

BOOST_AUTO_TEST_SUITE(compressed_exact)

// Integer-valued inputs sum exactly in any order, so identity must give the exact
// result on every route, for every world size and chunking.
BOOST_AUTO_TEST_CASE(identity_reproduces_the_exact_allreduce) {
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : {0, 1, 2, 3, 7, 100, 1001, 4097})
      for (route_kind route : all_routes)
        for (reduce_op op : {reduce_op::sum, reduce_op::avg}) {
          BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " route=" << name_of(route) << " op=" << to_string(op)) {
            std::vector<std::vector<std::vector<float>>> inputs(2, std::vector<std::vector<float>>(n));
            for (std::size_t c = 0; c < 2; ++c)
              for (std::size_t r = 0; r < n; ++r)
                for (std::size_t i = 0; i < count; ++i)
                  inputs[c][r].push_back(static_cast<float>(int((i * 31 + r * 7 + c) % 61) - 30));
            const auto records = run_calls<quantizers::identity<float>>(
                inputs, [](rank_t) { return quantizers::identity<float>{}; },
                {.route = route, .op = op, .chunk_values = 13, .in_place = count % 2 == 0});
            for (std::size_t c = 0; c < 2; ++c) {
              // The same numbers the exact allreduce gives: its sum is exact too.
              const auto expected = test::reference_reduce(inputs[c], ring_order(route_kind::direct, n), op);
              for (std::size_t r = 0; r < n; ++r) BOOST_TEST(bitwise_equal(records[r].outputs[c], expected));
            }
          }
        }
}

BOOST_AUTO_TEST_CASE(identity_in_double) {
  const std::size_t n = 3, count = 1000;
  std::vector<std::vector<std::vector<double>>> inputs(1, std::vector<std::vector<double>>(n));
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) inputs[0][r].push_back(static_cast<double>(i) * 0.5 + double(r));
  const auto records = run_calls<quantizers::identity<double>>(
      inputs, [](rank_t) { return quantizers::identity<double>{}; }, {.chunk_values = 64});
  for (std::size_t i = 0; i < count; ++i) BOOST_TEST(records[2].outputs[0][i] == 1.5 * double(i) + 3.0);
}

// A quantizer with nothing but the concept's operations (no split-residual encode,
// no framing helpers): the values as float32 bytes, each rounded to a multiple of
// 1/4 with error feedback. Both plans must run it; on quarter-valued inputs with
// zero residuals the sums are exact.
struct quarters {
  using value_type = float;
  static constexpr bool keeps_residual = true;
  static constexpr const char* name = "quarters";
  double bits_per_value() const { return 32.0; }
  std::size_t group_size() const { return 0; }
  std::size_t encoded_size(std::size_t n) const { return n * sizeof(float); }
  void encode(std::span<const float> in, std::span<float> residual, std::span<std::byte> encoded,
              quantizers::encode_position) const {
    for (std::size_t i = 0; i < in.size(); ++i) {
      const float wanted = in[i] + (residual.empty() ? 0.0f : residual[i]);
      const float sent = std::round(wanted * 4.0f) / 4.0f;
      if (!residual.empty()) residual[i] = wanted - sent;
      std::memcpy(encoded.data() + i * sizeof(float), &sent, sizeof(float));
    }
  }
  std::error_code decode(std::span<const std::byte> frame, std::span<float> out) const {
    if (frame.size() != encoded_size(out.size())) return make_error_code(errc::protocol_error);
    std::memcpy(out.data(), frame.data(), frame.size());
    return {};
  }
  std::error_code decode_accumulate(std::span<const std::byte> frame, std::span<float> out) const {
    if (frame.size() != encoded_size(out.size())) return make_error_code(errc::protocol_error);
    for (std::size_t i = 0; i < out.size(); ++i) {
      float v;
      std::memcpy(&v, frame.data() + i * sizeof(float), sizeof(float));
      out[i] += v;
    }
    return {};
  }
};
static_assert(quantizer<quarters>);

BOOST_AUTO_TEST_CASE(a_quantizer_with_only_the_concepts_operations_runs_in_both_plans) {
  constexpr std::size_t n = 4, count = 1001;
  auto input = [](rank_t r, std::size_t i) { return static_cast<float>((r + 1) * (i % 17)) / 4.0f; };
  std::vector<std::vector<float>> results(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i) data[i] = input(r, i);
    compressed_allreduce_plan<quarters> striped(comm, count, quarters{}, {.chunk_values = 100});
    comm.allreduce(striped, std::span(data), reduce_op::sum);
    const topologies::grid_routing routing = topologies::route_grid(topologies::torus({2, 2}));
    grid_allreduce_plan<quarters> grid(comm, routing, count, quarters{});
    comm.allreduce(grid, std::span(data), reduce_op::avg);  // the sum's average over 4 ranks: the sum again
    results[r] = data;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) {
      float sum = 0.0f;
      for (rank_t q = 0; q < n; ++q) sum += input(q, i);
      BOOST_TEST_REQUIRE(results[r][i] == sum, "rank " << r << " value " << i);
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_lossy)

// World sizes 1–8; counts that divide by neither the world size nor the group; more
// ranks than groups (empty stripes); several calls so the residuals matter.
BOOST_AUTO_TEST_CASE(one_bit_matches_the_model_on_every_rank) {
  for (std::size_t n = 1; n <= 8; ++n)
    for (std::size_t count : {0, 5, 64, 200, 1001, 3333})
      check_against_model<quantizers::one_bit>(n, count, 3, [](rank_t) { return one_bit_with(64); },
                                               {.route = all_routes[(n + count) % 3], .chunk_values = 128});
}

BOOST_AUTO_TEST_CASE(one_bit_variants_routes_ops_and_forms) {
  const quantizers::one_bit_options variants[] = {
      {.group_size = 2048},
      {.group_size = 16, .threshold = quantizers::threshold::group_mean},
      {.group_size = 24, .reconstruction = quantizers::reconstruction::min_max}};
  for (const auto& options : variants)
    for (route_kind route : all_routes)
      for (reduce_op op : {reduce_op::sum, reduce_op::avg})
        check_against_model<quantizers::one_bit>(5, 10007, 2, [&](rank_t) { return quantizers::one_bit(options); },
                                                 {.route = route, .op = op, .chunk_values = 1000,
                                                  .in_place = op == reduce_op::sum, .started = route == route_kind::ring});
}

BOOST_AUTO_TEST_CASE(k_level_nearest_and_stochastic) {
  for (std::size_t n : {2, 3, 4, 7})
    for (unsigned bits : {2u, 4u, 8u}) {
      auto nearest = [&](rank_t) {
        auto o = quantizers::k_level_options::with_bits(bits);
        o.group_size = 32;
        return quantizers::k_level(o);
      };
      check_against_model<quantizers::k_level>(n, 1000 + n, 2, nearest,
                                               {.route = all_routes[bits % 3], .chunk_values = 100});
      auto stochastic = [&](rank_t r) {
        auto o = quantizers::k_level_options::with_bits(bits);
        o.group_size = 32;
        o.rounding = quantizers::rounding::stochastic;
        o.seed = 1000 + r;  // a different seed on each rank, as documented
        return quantizers::k_level(o);
      };
      check_against_model<quantizers::k_level>(n, 999 + n, 2, stochastic,
                                               {.route = all_routes[(bits + 1) % 3], .op = reduce_op::avg, .chunk_values = 64});
    }
}

BOOST_AUTO_TEST_CASE(bfp_blocks_and_whole_chunks) {
  for (std::size_t n : {2, 3, 6, 8}) {
    check_against_model<quantizers::bfp>(n, 777 + n, 2, [](rank_t) { return quantizers::bfp({.mantissa_bits = 8}); },
                                         {.route = all_routes[n % 3], .chunk_values = 96});
    // One exponent per frame: with whole_tensor every chunk is a tensor of its own.
    check_against_model<quantizers::bfp>(
        n, 501, 2, [](rank_t) { return quantizers::bfp({.mantissa_bits = 4, .block_size = quantizers::bfp_options::whole_tensor}); },
        {.route = all_routes[(n + 1) % 3], .op = reduce_op::avg, .chunk_values = 50});
  }
}

// Groups are never cut, so for per-group quantizers the bits cannot depend on the
// chunk size, nor on the route when the ring is in rank order: every rank decodes
// the same frames in the same order. (A ring in another order sums in that order.)
// The seed's reconstruction values (taken from the previous call's statistics): every
// encode site — each rank's contribution, each owner's re-encode — keeps its own
// memory, and every rank matches the model bit for bit.
BOOST_AUTO_TEST_CASE(one_bit_reconstruction_from_the_previous_call) {
  for (auto rule : {quantizers::reconstruction::bin_means, quantizers::reconstruction::min_max})
    for (std::size_t n : {1, 2, 3, 5})
      for (route_kind route : {route_kind::direct, route_kind::shuffled_ring}) {
        const auto make = [rule](rank_t) {
          return quantizers::one_bit({.group_size = 64, .reconstruction = rule,
                                      .reconstruction_from = quantizers::reconstruction_source::previous});
        };
        check_against_model<quantizers::one_bit>(n, 1500, 4, make, {.route = route, .op = reduce_op::avg, .chunk_values = 256});
        check_against_model<quantizers::one_bit>(
            n, 1500, 3, make, {.route = route, .chunk_values = 256, .tensors = {700, 3, 797}, .momentum = true});
      }
}

BOOST_AUTO_TEST_CASE(results_do_not_depend_on_chunks_or_route) {
  const std::size_t n = 4, count = 50000;
  const auto inputs = random_calls<float>(2, n, count, 99);
  auto q = [](rank_t) { return quantizers::one_bit{}; };
  const auto reference = run_calls<quantizers::one_bit>(inputs, q, {.chunk_values = std::size_t{1} << 30});
  for (std::size_t chunk : {2048, 4096, 20000})
    for (route_kind route : {route_kind::direct, route_kind::ring}) {
      BOOST_TEST_CONTEXT("chunk=" << chunk << " route=" << name_of(route)) {
        const auto records = run_calls<quantizers::one_bit>(inputs, q, {.route = route, .chunk_values = chunk});
        for (std::size_t r = 0; r < n; ++r)
          for (std::size_t c = 0; c < 2; ++c) BOOST_TEST(bitwise_equal(records[r].outputs[c], reference[0].outputs[c]));
      }
    }
}

BOOST_AUTO_TEST_CASE(compression_ratio_of_one_bit) {
  // At G = 2048 a rank sends ≈ 2(n − 1)/n of the count at ~1.03 bits per value.
  const std::size_t n = 4, count = std::size_t{1} << 20;
  const auto inputs = random_calls<float>(1, n, count, 5);
  const auto records = run_calls<quantizers::one_bit>(inputs, [](rank_t) { return quantizers::one_bit{}; }, {});
  const double exact_bytes = 2.0 * (n - 1) / n * count * sizeof(float);
  for (std::size_t r = 0; r < n; ++r) {
    const double ratio = exact_bytes / static_cast<double>(records[r].counted_bytes[0]);
    BOOST_TEST(ratio > 30.5);
    BOOST_TEST(ratio < 31.1);
  }
}

// A plan made on a sub-communicator (7 ranks split 4 + 3) gives, started or not, what
// the same plan gives on a world of the sub-communicator's size, bit for bit; the
// parent's collectives in between are not disturbed.
BOOST_AUTO_TEST_CASE(a_plan_on_a_sub_communicator_equals_a_world_of_its_size) {
  const std::size_t n = 7, count = 5001;
  const auto inputs = random_calls<float>(2, n, count, 123);  // [call][parent rank]
  auto group_of = [](rank_t r) { return r < 4 ? 0 : 1; };
  std::vector<std::vector<std::vector<float>>> on_sub(n);
  std::vector<char> parent_correct(n);
  auto run_sub = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    auto group = comm.split(group_of(r), 0);
    compressed_allreduce_plan<quantizers::one_bit> plan(*group, count);
    bool correct = true;
    for (std::size_t call = 0; call < 2; ++call) {
      std::vector<float> out(count);
      if (call == 0) {
        group->allreduce(plan, std::span(inputs[call][r]), std::span(out), reduce_op::avg);
      } else {
        group->start_allreduce(plan, std::span(inputs[call][r]), std::span(out), reduce_op::avg);
        plan.wait();
      }
      on_sub[r].push_back(std::move(out));
      double one = 1.0;
      comm.allreduce(std::span(&one, 1), reduce_op::sum);
      correct = correct && one == double(n);
    }
    parent_correct[r] = correct;
  });
  for (auto& e : run_sub)
    if (e) std::rethrow_exception(e);
  for (rank_t first : {rank_t{0}, rank_t{4}}) {
    const std::size_t k = first == 0 ? 4 : 3;
    std::vector<std::vector<std::vector<float>>> alone(k);
    auto run_alone = transports::inproc::run_ranks(k, [&](transports::inproc::transport endpoint) {
      communicator comm(std::move(endpoint));
      const rank_t h = comm.rank();
      compressed_allreduce_plan<quantizers::one_bit> plan(comm, count);
      for (std::size_t call = 0; call < 2; ++call) {
        std::vector<float> out(count);
        comm.allreduce(plan, std::span(inputs[call][first + h]), std::span(out), reduce_op::avg);
        alone[h].push_back(std::move(out));
      }
    });
    for (auto& e : run_alone)
      if (e) std::rethrow_exception(e);
    for (rank_t h = 0; h < k; ++h) {
      BOOST_TEST(static_cast<bool>(parent_correct[first + h]));
      for (std::size_t call = 0; call < 2; ++call)
        BOOST_TEST(test::bitwise_equal<float>(on_sub[first + h][call], alone[h][call]),
                   "parent rank " << first + h << ", call " << call);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_reproducible)

// On the grid every quantizer matches the model, whose owners sum the decoded
// contributions with a reproducible_accumulator a block at a time: groups that do not
// divide the grid's blocks (stripes start mid-block), chunks rounded to whole blocks,
// fused tensors that cut blocks, avg and momentum, 1–8 ranks, every route.
BOOST_AUTO_TEST_CASE(owners_sum_on_the_grid_as_the_model_does) {
  using namespace quantizers;
  for (std::size_t n : {1, 2, 3, 5, 8})
    for (route_kind route : all_routes) {
      check_against_model<one_bit>(n, 5001, 2, [](rank_t) { return one_bit_with(64); },
                                   {.route = route, .op = reduce_op::avg, .chunk_values = 300, .reproducible = true});
      check_against_model<k_level>(
          n, 3001, 2,
          [](rank_t r) {
            return k_level({.levels = 16, .group_size = 104, .rounding = rounding::stochastic, .seed = 5 + r});
          },
          {.route = route, .chunk_values = 1000, .reproducible = true});
      check_against_model<bfp>(n, 2000, 2, [](rank_t) { return bfp{}; },
                               {.route = route, .tensors = {700, 3, 1297}, .momentum = true, .reproducible = true});
    }
}

// The bits depend on neither the route (direct, the ring, a shuffled ring), nor the
// chunk size, nor which rank holds which inputs — over three calls, so the residuals
// follow their inputs. Without the grid the shuffled ring's sums differ (the control).
BOOST_AUTO_TEST_CASE(the_bits_depend_on_neither_route_nor_chunks_nor_rank_order) {
  const std::size_t n = 6, count = 40000, calls = 3;
  auto inputs = random_calls<float>(calls, n, count, 4242);
  for (auto& call : inputs)  // ranks' magnitudes 2^-8 … 2^7 apart: their sums round
    for (std::size_t r = 0; r < n; ++r)
      for (float& v : call[r]) v = std::ldexp(v, static_cast<int>(3 * r) - 8);
  const std::size_t permutation[n] = {3, 0, 5, 1, 4, 2};
  auto permuted = inputs;
  for (std::size_t c = 0; c < calls; ++c)
    for (std::size_t r = 0; r < n; ++r) permuted[c][r] = inputs[c][permutation[r]];
  const auto q = [](rank_t) { return quantizers::one_bit{}; };
  const auto reference = run_calls<quantizers::one_bit>(
      inputs, q, {.op = reduce_op::avg, .chunk_values = std::size_t{1} << 30, .reproducible = true});
  const struct {
    route_kind route;
    std::size_t chunk;
    bool permute;
  } cases[] = {{route_kind::shuffled_ring, 2048, false},
               {route_kind::ring, 5000, false},
               {route_kind::direct, 256, true},
               {route_kind::shuffled_ring, 70000, true}};
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("route=" << name_of(c.route) << " chunk=" << c.chunk << " permuted=" << c.permute) {
      const auto records = run_calls<quantizers::one_bit>(
          c.permute ? permuted : inputs, q,
          {.route = c.route, .op = reduce_op::avg, .chunk_values = c.chunk, .reproducible = true});
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t call = 0; call < calls; ++call)
          BOOST_TEST(bitwise_equal(records[r].outputs[call], reference[0].outputs[call]));
    }
  }
  const auto direct = run_calls<quantizers::one_bit>(inputs, q, {.op = reduce_op::avg});
  const auto shuffled = run_calls<quantizers::one_bit>(inputs, q, {.route = route_kind::shuffled_ring, .op = reduce_op::avg});
  BOOST_TEST(!bitwise_equal(direct[0].outputs[0], shuffled[0].outputs[0]));
}

// 16-bit buffers on the grid: the float plan's bits on the widened inputs, rounded once.
BOOST_AUTO_TEST_CASE(sixteen_bit_buffers_give_the_float_plans_bits_rounded_once) {
  const std::size_t n = 3, count = 7001;
  const auto inputs = random_calls<float>(1, n, count, 77)[0];
  std::vector<std::vector<float>> as_float(n);
  std::vector<std::vector<bfloat16>> as_half(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint), topologies::ring(ring_order(route_kind::shuffled_ring, n)));
    const rank_t r = comm.rank();
    const compressed_allreduce_options options{.chunk_values = 1024, .reproducible = true};
    std::vector<bfloat16> half(count);
    for (std::size_t i = 0; i < count; ++i) half[i] = bfloat16(inputs[r][i]);
    as_float[r].resize(count);
    for (std::size_t i = 0; i < count; ++i) as_float[r][i] = static_cast<float>(half[i]);
    compressed_allreduce_plan<quantizers::one_bit> float_plan(comm, count, quantizers::one_bit{}, options);
    compressed_allreduce_plan<quantizers::one_bit, bfloat16> half_plan(comm, count, quantizers::one_bit{}, options);
    comm.allreduce(float_plan, std::span(as_float[r]), reduce_op::sum);
    comm.allreduce(half_plan, std::span(half), reduce_op::sum);
    as_half[r] = half;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t differ = 0;
    for (std::size_t i = 0; i < count; ++i)
      differ += std::bit_cast<std::uint16_t>(as_half[r][i]) != std::bit_cast<std::uint16_t>(bfloat16(as_float[r][i]));
    BOOST_TEST(differ == 0u, "rank " << r << ": " << differ << " values are not the float plan's rounded once");
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(error_feedback)

// With both residuals the running sum telescopes: Σ_t out_t = Σ_t Σ_r x_r,t − Σ_r e_r
// − e_server (each owner's server residual over its stripe). So the running sum's
// error is the residuals' size, which stays bounded, whatever the number of steps.
/// Runs `steps` calls of gradients with a persistent direction plus noise (as in
/// training) and returns, per step, the largest |Σ_t out_t − Σ_t exact_t|; checks the
/// telescoped identity with both residuals on the way.
template <class Q>
std::vector<double> running_sum_error(const Q& quantizer, std::size_t steps) {
  const std::size_t n = 4, count = 4096;
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> mean(count);
  for (float& m : mean) m = normal(gen) * 0.01f;
  std::vector<std::vector<std::vector<float>>> inputs(steps, std::vector<std::vector<float>>(n, std::vector<float>(count)));
  for (auto& step : inputs)
    for (auto& rank : step)
      for (std::size_t i = 0; i < count; ++i) rank[i] = mean[i] + normal(gen) * 0.01f;

  const auto records = run_calls<Q>(inputs, [&](rank_t) { return quantizer; }, {});
  std::vector<double> exact_sum(count, 0.0), compressed_sum(count, 0.0), error_at(steps);
  double largest_exact = 0;
  for (std::size_t t = 0; t < steps; ++t) {
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) {
      for (std::size_t r = 0; r < n; ++r) exact_sum[i] += inputs[t][r][i];
      compressed_sum[i] += records[0].outputs[t][i];
      worst = std::max(worst, std::abs(compressed_sum[i] - exact_sum[i]));
      largest_exact = std::max(largest_exact, std::abs(exact_sum[i]));
    }
    error_at[t] = worst;
  }
  double identity_gap = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double residuals = 0;
    for (std::size_t r = 0; r < n; ++r) {
      residuals += records[r].worker_residual[i];
      const block_range s = records[r].stripe;
      if (i >= s.offset && i < s.offset + s.size) residuals += records[r].server_residual[i - s.offset];
    }
    identity_gap = std::max(identity_gap, std::abs(compressed_sum[i] + residuals - exact_sum[i]));
  }
  BOOST_TEST(identity_gap < 1e-4 * largest_exact);
  return error_at;
}

// With both residuals the running sum telescopes: Σ_t out_t = Σ_t Σ_r x_r,t − Σ_r e_r
// − e_server (each owner's server residual over its stripe), so the running sum's
// error is the residuals' size, which is bounded. For 1-bit the bound grows with
// the group size (an element far from its bin's mean needs a residual of up to
// ~G times the gap before its bin mean catches up), so it is reached sooner with
// small groups; at G = 64 within ~150 steps.
BOOST_AUTO_TEST_CASE(running_sum_error_does_not_grow) {
  const std::size_t steps = 600;
  const auto one_bit = running_sum_error(quantizers::one_bit({.group_size = 64}), steps);
  const auto k_level = running_sum_error(quantizers::k_level({.levels = 4, .group_size = 64}), steps);
  for (const auto* error_at : {&one_bit, &k_level}) {
    const double settled = *std::max_element(error_at->begin() + 200, error_at->begin() + 300);
    const double last = *std::max_element(error_at->end() - 100, error_at->end());
    BOOST_TEST(last <= 1.2 * settled);
  }
  // While the exact sums grew to ~60, the 1-bit running sum stays within ~4 of them
  // (the bound, reached early) and the 2-bit one much closer.
  BOOST_TEST(one_bit.back() < 6.0);
  BOOST_TEST(k_level.back() < 0.5);

  // Without error feedback the same quantizer drifts: its running error grows with
  // the steps (the bias of quantizing a persistent mean the same way every time).
  const quantizers::one_bit q({.group_size = 64});
  std::mt19937_64 gen(7);
  std::normal_distribution<float> normal(0, 1);
  const std::size_t count = 4096;
  std::vector<float> mean(count), x(count), decoded(count);
  for (float& m : mean) m = normal(gen) * 0.01f;
  std::vector<std::byte> frame(q.encoded_size(count));
  std::vector<double> drift(count, 0.0);
  for (std::size_t t = 0; t < steps; ++t)
    for (std::size_t r = 0; r < 4; ++r) {
      for (std::size_t i = 0; i < count; ++i) x[i] = mean[i] + normal(gen) * 0.01f;
      q.encode(std::span<const float>(x), {}, frame);
      BOOST_REQUIRE(!q.decode(frame, decoded));
      for (std::size_t i = 0; i < count; ++i) drift[i] += double(decoded[i]) - double(x[i]);
    }
  double drift_error = 0;
  for (double d : drift) drift_error = std::max(drift_error, std::abs(d));
  BOOST_TEST(drift_error > 5 * one_bit.back());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_bytes)

// The formula written out again here from the quantizer's encoded sizes, so the
// plan's own arithmetic is checked too. E(j) = bytes of stripe j's frames.
BOOST_AUTO_TEST_CASE(bytes_sent_equal_the_documented_formula) {
  for (std::size_t n : {2, 3, 5, 8})
    for (std::size_t count : {1, 4095, 100000})
      for (route_kind route : all_routes) {
        BOOST_TEST_CONTEXT("n=" << n << " count=" << count << " route=" << name_of(route)) {
          BOOST_TEST_INFO("a ring of n ≤ 3 is fully connected, so it goes direct");
          const quantizers::one_bit q({.group_size = 256});
          const std::size_t chunk = 1024;
          const auto inputs = random_calls<float>(1, n, count, 3);
          const auto records = run_calls<quantizers::one_bit>(inputs, [&](rank_t) { return q; },
                                                               {.route = route, .chunk_values = chunk});
          std::vector<std::size_t> stripe_bytes(n);
          const std::size_t groups = (count + 255) / 256;
          for (std::size_t j = 0; j < n; ++j) {
            const block_range b = block_of(groups, n, j);
            const std::size_t begin = std::min(count, b.offset * 256), end = std::min(count, (b.offset + b.size) * 256);
            for (std::size_t v = begin; v < end; v += chunk) stripe_bytes[j] += q.encoded_size(std::min(chunk, end - v));
          }
          const std::size_t all = std::accumulate(stripe_bytes.begin(), stripe_bytes.end(), std::size_t{0});
          const std::vector<rank_t> order = ring_order(route, n);
          for (std::size_t p = 0; p < n; ++p) {
            const rank_t r = order[p];
            std::size_t expected = 0;
            if (records[r].route == stripe_route::direct) {
              expected = all - stripe_bytes[r] + (n - 1) * stripe_bytes[r];
            } else {
              for (std::size_t k = 1; k < n; ++k) expected += (n - k) * stripe_bytes[order[(p + k) % n]];
              expected += all - stripe_bytes[order[(p + 1) % n]];
            }
            BOOST_TEST(records[r].counted_bytes[0] == expected);
            BOOST_TEST(records[r].formula_bytes == expected);
          }
        }
      }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_fused)

// Tensor lists whose ends fall inside groups, chunks and stripes, with empty ones and
// ones smaller than a group: every rank matches the model (a frame per piece) bit
// for bit, on both routes, blocking and started, and the bytes are the formula.
BOOST_AUTO_TEST_CASE(fused_tensors_match_the_model) {
  const std::vector<std::vector<std::size_t>> lists = {
      {1000}, {0, 300, 0, 17, 683}, {5, 5, 5, 5, 980}, {333, 333, 334}, {1, 999}};
  for (std::size_t n : {1, 2, 3, 5})
    for (const auto& sizes : lists)
      for (route_kind route : {route_kind::direct, route_kind::shuffled_ring}) {
        const run_settings settings{.route = route, .op = reduce_op::avg, .chunk_values = 128,
                                    .started = sizes.size() == 3, .tensors = sizes};
        check_against_model<quantizers::one_bit>(n, 1000, 3, [](rank_t) { return one_bit_with(64); }, settings);
        check_against_model<quantizers::k_level>(
            n, 1000, 2, [](rank_t r) { return quantizers::k_level({.levels = 4, .group_size = 96, .seed = r + 1u}); },
            settings);
        check_against_model<quantizers::bfp>(n, 1000, 2, [](rank_t) { return quantizers::bfp({.block_size = 32}); },
                                             settings);
      }
}

// 50 layers of different sizes in one call give the flat call's bits on their
// concatenation through the same plan, and identity gives the exact sums.
BOOST_AUTO_TEST_CASE(a_fused_call_equals_the_flat_call_on_the_concatenation) {
  const std::size_t n = 4;
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0; k < 50; ++k) sizes.push_back(37 + (k * 131) % 700);
  const std::size_t count = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  std::vector<std::vector<float>> fused(n), flat(n), exact(n);
  std::vector<std::pair<std::size_t, std::size_t>> shape(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    std::vector<float> input(count);
    for (std::size_t i = 0; i < count; ++i) input[i] = float(int((i * 7 + r * 13) % 29) - 14);
    std::vector<std::vector<float>> layers;
    std::vector<std::span<float>> spans;
    for (std::size_t k = 0, at = 0; k < sizes.size(); at += sizes[k++])
      layers.emplace_back(input.begin() + std::ptrdiff_t(at), input.begin() + std::ptrdiff_t(at + sizes[k]));
    for (auto& l : layers) spans.emplace_back(l);
    compressed_allreduce_plan a(comm, sizes, quantizers::one_bit({.group_size = 256}));
    compressed_allreduce_plan b(comm, sizes, quantizers::one_bit({.group_size = 256}));
    comm.allreduce(a, std::span<const std::span<float>>(spans), reduce_op::sum);
    flat[r] = input;
    comm.allreduce(b, std::span(flat[r]), reduce_op::sum);
    for (auto& l : layers) fused[r].insert(fused[r].end(), l.begin(), l.end());
    shape[r] = {a.count(), a.tensor_sizes().size()};  // checked outside: Boost.Test is not thread-safe

    compressed_allreduce_plan<quantizers::identity<float>> same(comm, std::span<const std::size_t>(sizes),
                                                                quantizers::identity<float>{});
    std::vector<std::vector<float>> again;
    for (std::size_t k = 0, at = 0; k < sizes.size(); at += sizes[k++])
      again.emplace_back(input.begin() + std::ptrdiff_t(at), input.begin() + std::ptrdiff_t(at + sizes[k]));
    spans.clear();
    for (auto& l : again) spans.emplace_back(l);
    comm.allreduce(same, std::span<const std::span<float>>(spans), reduce_op::sum);
    for (auto& l : again) exact[r].insert(exact[r].end(), l.begin(), l.end());
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(shape[r].first == count);
    BOOST_TEST(shape[r].second == sizes.size());
    BOOST_TEST(bitwise_equal(fused[r], flat[r]));
    BOOST_TEST(bitwise_equal(fused[r], fused[0]));
    for (std::size_t i = 0; i < exact[r].size(); ++i) {
      float want = 0;
      for (rank_t q = 0; q < n; ++q) want += float(int((i * 7 + q * 13) % 29) - 14);
      if (exact[r][i] != want) {
        BOOST_TEST(exact[r][i] == want, "value " << i);
        break;
      }
    }
  }
}

// Wrong tensors fail the call on every rank, with invalid_argument, within the
// timeout: a list of another length, a tensor of another size, two that overlap; and
// ranks whose lists differ (the same total) fail instead of mixing up frames.
BOOST_AUTO_TEST_CASE(wrong_tensors_fail_on_every_rank) {
  struct bad_case {
    const char* what;
    std::function<std::vector<std::span<float>>(std::vector<float>&, rank_t)> tensors;
    errc code;
  };
  const std::vector<std::size_t> sizes{100, 200, 300};
  const std::vector<bad_case> cases = {
      {"two tensors", [](std::vector<float>& d, rank_t r) {
         std::vector<std::span<float>> t{std::span(d).first(100), std::span(d).subspan(100, 200)};
         if (r != 1) t.push_back(std::span(d).subspan(300, 300));
         return t;
       }, errc::invalid_argument},
      {"a tensor of another size", [](std::vector<float>& d, rank_t r) {
         return std::vector<std::span<float>>{std::span(d).first(100), std::span(d).subspan(100, r == 0 ? 199 : 200),
                                              std::span(d).subspan(300, 300)};
       }, errc::invalid_argument},
      {"overlapping tensors", [](std::vector<float>& d, rank_t r) {
         return std::vector<std::span<float>>{std::span(d).first(100), std::span(d).subspan(r == 2 ? 50 : 100, 200),
                                              std::span(d).subspan(300, 300)};
       }, errc::invalid_argument},
  };
  for (const bad_case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      std::vector<std::error_code> codes(3);
      std::vector<std::string> messages(3);
      auto errors = transports::inproc::run_ranks(3, [&](transports::inproc::transport endpoint) {
        communicator comm(std::move(endpoint), {.timeout = std::chrono::seconds(5)});
        const rank_t r = comm.rank();
        compressed_allreduce_plan plan(comm, sizes, quantizers::one_bit{});
        std::vector<float> data(600, 1.0f);
        const auto tensors = c.tensors(data, r);
        try {
          comm.allreduce(plan, std::span<const std::span<float>>(tensors), reduce_op::sum);
        } catch (const error& e) {
          codes[r] = e.code();
          messages[r] = e.what();
        }
      });
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      for (rank_t r = 0; r < 3; ++r) {
        BOOST_TEST_INFO("rank " << r << ": " << messages[r]);
        BOOST_TEST(codes[r] == c.code);
      }
    }
  }
  // Plans for different lists of the same total: the pieces, and so the messages,
  // differ; every rank fails (no rank decodes another layout's frames as its own).
  std::vector<std::error_code> codes(2);
  auto errors = transports::inproc::run_ranks(2, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint), {.timeout = std::chrono::seconds(5)});
    const rank_t r = comm.rank();
    const std::vector<std::size_t> mine = r == 0 ? std::vector<std::size_t>{1000, 3000} : std::vector<std::size_t>{3000, 1000};
    compressed_allreduce_plan plan(comm, mine, quantizers::one_bit({.group_size = 128}));
    std::vector<float> data(4000, 1.0f);
    comm.allreduce(plan, std::span(data), reduce_op::sum, codes[r]);
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < 2; ++r) {
    BOOST_TEST_INFO("rank " << r << ": " << codes[r].message());
    BOOST_TEST((codes[r] == errc::protocol_error));
  }
}

// bfloat16 layers, fused: the float plan's bits on the widened layers, rounded once.
BOOST_AUTO_TEST_CASE(fused_16_bit_tensors) {
  const std::size_t n = 3;
  const std::vector<std::size_t> sizes{70, 0, 513, 9};
  std::vector<std::vector<bfloat16>> fused(n);
  std::vector<std::vector<float>> reference(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    std::vector<std::vector<bfloat16>> layers;
    std::vector<float> widened;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      layers.emplace_back();
      for (std::size_t i = 0; i < sizes[k]; ++i) {
        layers.back().push_back(bfloat16(float(int((i * 5 + k + r) % 13) - 6) * 0.125f));
        widened.push_back(float(layers.back().back()));
      }
    }
    std::vector<std::span<bfloat16>> spans(layers.begin(), layers.end());
    compressed_allreduce_plan<quantizers::one_bit, bfloat16> plan(comm, std::span<const std::size_t>(sizes),
                                                                  quantizers::one_bit({.group_size = 64}));
    compressed_allreduce_plan<quantizers::one_bit> float_plan(comm, std::span<const std::size_t>(sizes),
                                                              quantizers::one_bit({.group_size = 64}));
    comm.allreduce(plan, std::span<const std::span<bfloat16>>(spans), reduce_op::avg);
    comm.allreduce(float_plan, std::span(widened), reduce_op::avg);
    for (auto& l : layers) fused[r].insert(fused[r].end(), l.begin(), l.end());
    reference[r] = widened;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < fused[r].size(); ++i)
      if (std::memcmp(&fused[r][i], &fused[0][i], sizeof(bfloat16)) != 0 ||
          float(fused[r][i]) != float(bfloat16(reference[r][i]))) {
        BOOST_TEST(false, "rank " << r << " value " << i);
        break;
      }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(owner_updates)

// Momentum at the owner matches the model (the velocity re-encoded with the server
// residual) bit for bit, on both routes, fused or not.
BOOST_AUTO_TEST_CASE(momentum_at_the_owner_matches_the_model) {
  for (std::size_t n : {1, 2, 4, 5})
    for (route_kind route : {route_kind::direct, route_kind::ring})
      for (reduce_op op : {reduce_op::sum, reduce_op::avg}) {
        check_against_model<quantizers::one_bit>(
            n, 3001, 4, [](rank_t) { return one_bit_with(128); },
            {.route = route, .op = op, .chunk_values = 512, .momentum = true});
        check_against_model<quantizers::k_level>(
            n, 3001, 3, [](rank_t) { return quantizers::k_level({.levels = 16, .group_size = 256}); },
            {.route = route, .op = op, .chunk_values = 512, .tensors = {1000, 1, 2000}, .momentum = true});
      }
}

/// Runs `calls` averaged calls of `rule` at the owner (identity quantizer) and of
/// the plain plan followed by `every_rank(state, decoded)` on every rank; returns
/// each rank's outputs of both, call by call, and the owners' state sizes.
template <class Rule, class EveryRank>
void check_owner_equals_every_rank(Rule rule, EveryRank every_rank) {
  const std::size_t n = 4, count = 2503, calls = 5;
  const auto inputs = random_calls<float>(calls, n, count, 99);
  std::vector<std::vector<std::vector<float>>> at_owner(n), by_all(n);
  std::vector<std::size_t> state_sizes(n), stripe_sizes(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    using plan_type = compressed_allreduce_plan<quantizers::identity<float>>;
    plan_type owner(comm, count, quantizers::identity<float>{}, {.chunk_values = 300}, rule);
    plan_type plain(comm, count, quantizers::identity<float>{}, {.chunk_values = 300});
    std::vector<float> state(count);
    for (std::size_t c = 0; c < calls; ++c) {
      std::vector<float> a = inputs[c][r], b = inputs[c][r];
      comm.allreduce(owner, std::span(a), reduce_op::avg);
      comm.allreduce(plain, std::span(b), reduce_op::avg);
      every_rank(state, b);
      at_owner[r].push_back(a);
      by_all[r].push_back(b);
    }
    state_sizes[r] = owner.owner_state().size();
    stripe_sizes[r] = owner.stripe(r).size;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(state_sizes[r] == stripe_sizes[r]);  // sharded: the owner keeps its stripe's state only
    for (std::size_t c = 0; c < calls; ++c) {
      BOOST_TEST_INFO("rank " << r << " call " << c);
      BOOST_TEST(bitwise_equal(at_owner[r][c], by_all[r][c]));
    }
  }
}

// Where the quantizer is exact (identity), an update at the owner gives every rank
// the bits of the same update applied by every rank to the decoded result.
BOOST_AUTO_TEST_CASE(at_the_owner_equals_by_every_rank_where_the_arithmetic_allows) {
  check_owner_equals_every_rank(optimizers::momentum{.momentum = 0.9}, [](std::vector<float>& v, std::vector<float>& g) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = v[i] = 0.9f * v[i] + g[i];
  });
  check_owner_equals_every_rank(optimizers::adagrad{}, [](std::vector<float>& s, std::vector<float>& g) {
    for (std::size_t i = 0; i < g.size(); ++i) {
      s[i] += g[i] * g[i];
      g[i] = g[i] / (std::sqrt(s[i]) + 1e-8f);
    }
  });
}

// A rule of the user's: clipping to ±limit with no state, and a running maximum of
// |g| with one value of state; its arguments name the right offsets and calls.
struct clip_and_track {
  float limit = 0.5f;
  std::size_t state_per_value() const { return 2; }
  void operator()(const owner_update_args<float>& a) const {
    for (std::size_t i = 0; i < a.values.size(); ++i) {
      a.next_state[2 * i] = std::max(a.state[2 * i], std::abs(a.values[i]));
      a.next_state[2 * i + 1] = static_cast<float>(a.offset + i) + static_cast<float>(a.call) * 1e6f;
      a.values[i] = std::clamp(a.values[i], -limit, limit);
    }
  }
};
static_assert(owner_update_rule<clip_and_track, float>);

BOOST_AUTO_TEST_CASE(a_users_rule_with_state) {
  const std::size_t n = 3, count = 1000;
  std::vector<std::vector<float>> outputs(n), states(n);
  std::vector<block_range> stripes(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    compressed_allreduce_plan<quantizers::identity<float>> plan(comm, count, quantizers::identity<float>{},
                                                                {.chunk_values = 128}, clip_and_track{});
    for (int call = 0; call < 2; ++call) {
      std::vector<float> data(count);
      for (std::size_t i = 0; i < count; ++i) data[i] = float(i % 7) * (call == 0 ? 0.25f : 0.1f) - 0.3f;
      comm.allreduce(plan, std::span(data), reduce_op::sum);
      outputs[r] = data;
    }
    states[r].assign(plan.owner_state().begin(), plan.owner_state().end());
    stripes[r] = plan.stripe(r);
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(bitwise_equal(outputs[r], outputs[0]));
    BOOST_TEST(states[r].size() == 2 * stripes[r].size);
    for (std::size_t i = 0; i < stripes[r].size; ++i) {
      const std::size_t at = stripes[r].offset + i;
      const float first = std::abs(3 * (float(at % 7) * 0.25f - 0.3f)), second = std::abs(3 * (float(at % 7) * 0.1f - 0.3f));
      BOOST_TEST(states[r][2 * i] == std::max(first, second), "value " << at);
      BOOST_TEST(states[r][2 * i + 1] == float(at) + 1e6f);  // offset in the buffer; the second call is call 1
    }
    for (std::size_t i = 0; i < count; ++i) BOOST_TEST(std::abs(outputs[r][i]) <= 0.5f);
  }
}

// A failed call leaves the owner's state as it was; roll_back_last_call takes it
// back with the residuals; a retry gives the bits of a run that never failed.
BOOST_AUTO_TEST_CASE(a_failed_call_leaves_the_owners_state_as_it_was) {
  const std::size_t n = 3, count = 3000;
  const auto inputs = random_calls<float>(2, n, count, 5);
  using plan_type = compressed_allreduce_plan<quantizers::one_bit>;
  const topologies::fully_connected topology(n);
  auto make = [&] {
    std::vector<std::unique_ptr<plan_type>> plans;
    for (rank_t r = 0; r < n; ++r)
      plans.push_back(std::make_unique<plan_type>(r, topology, count, quantizers::one_bit({.group_size = 128}),
                                                  compressed_allreduce_options{.chunk_values = 256},
                                                  optimizers::momentum{}));
    return plans;
  };
  auto call = [&](std::vector<std::unique_ptr<plan_type>>& plans, const std::vector<std::vector<float>>& in,
                  rank_t victim) {
    std::vector<std::error_code> codes(n);
    std::vector<std::vector<float>> out(n);
    auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
      const rank_t r = endpoint.rank();
      communicator<test::counting_transport> comm(test::counting_transport(std::move(endpoint)), topology,
                                                  {.timeout = std::chrono::seconds(10)});
      if (r == victim) comm.transport().fail_after_sends(0);
      out[r] = in[r];
      comm.allreduce(*plans[r], std::span(out[r]), reduce_op::avg, codes[r]);
    });
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return std::pair(codes, out);
  };
  auto clean = make(), plans = make();
  call(clean, inputs[0], ~rank_t{0});
  const auto reference = call(clean, inputs[1], ~rank_t{0});
  call(plans, inputs[0], ~rank_t{0});
  std::vector<std::vector<float>> states;
  for (auto& p : plans) states.emplace_back(p->owner_state().begin(), p->owner_state().end());
  const auto failed = call(plans, inputs[1], 0);
  for (rank_t r = 0; r < n; ++r) {
    if (!failed.first[r]) plans[r]->roll_back_last_call();
    BOOST_TEST(bitwise_equal(plans[r]->owner_state(), states[r]));
  }
  const auto retried = call(plans, inputs[1], ~rank_t{0});
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(!retried.first[r]);
    BOOST_TEST(bitwise_equal(retried.second[r], reference.second[r]));
    BOOST_TEST(bitwise_equal(plans[r]->owner_state(), clean[r]->owner_state()));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(adaptive)

/// Runs `calls` calls of an adaptive_allreduce over one_bit on n ranks (inputs from
/// random_calls, scaled to small integers); returns per rank its outputs, what it
/// decided and its mass at the end.
struct adaptive_run {
  std::vector<std::vector<std::vector<float>>> outputs;  // [rank][call]
  std::vector<char> decided, compressed;
  std::vector<std::size_t> chunks;
  std::vector<std::string> explanations;
  std::vector<std::vector<float>> mass;
  std::vector<std::vector<std::vector<float>>> inputs;  // [call][rank]
};

adaptive_run run_adaptive(std::size_t n, std::size_t count, std::size_t calls, adaptive_allreduce_options options) {
  adaptive_run run{std::vector<std::vector<std::vector<float>>>(n), std::vector<char>(n), std::vector<char>(n),
                   std::vector<std::size_t>(n), std::vector<std::string>(n), std::vector<std::vector<float>>(n),
                   random_calls<float>(calls, n, count, 3)};
  for (auto& call : run.inputs)
    for (auto& v : call)
      for (float& x : v) x = std::round(x * 400.0f);  // small integers: sums are exact in float
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    adaptive_allreduce bucket(comm, count, quantizers::one_bit({.group_size = 64}), options);
    for (std::size_t c = 0; c < calls; ++c) {
      std::vector<float> data = run.inputs[c][r];
      bucket.allreduce(std::span(data), reduce_op::sum);
      run.outputs[r].push_back(data);
    }
    run.decided[r] = bucket.decided();
    run.compressed[r] = bucket.compressed();
    run.chunks[r] = bucket.chunk_values();
    run.explanations[r] = bucket.explanation();
    run.mass[r].assign(count, 0.0f);
    bucket.add_residual_mass(std::span(run.mass[r]));
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return run;
}

// Automatic: undecided during the probes (candidates × rounds calls), then decided,
// alike on every rank, with an explanation naming every candidate's time; every call's
// result is bitwise identical across ranks; and no gradient mass is lost to the
// probing: Σ outputs + Σ ranks' mass = Σ inputs, value by value.
BOOST_AUTO_TEST_CASE(automatic_probes_then_every_rank_keeps_the_same_choice) {
  const std::size_t n = 3, count = 5000;
  const adaptive_allreduce_options options{.probe_rounds = 2, .chunk_candidates = {256, 1024}};
  const adaptive_run undecided = run_adaptive(n, count, 5, options);  // 3 candidates × 2 rounds = 6 probes
  for (rank_t r = 0; r < n; ++r) BOOST_TEST(!undecided.decided[r]);
  // required_speedup decides the outcome whatever the timings: 1e-9, compressed (and one
  // compressed candidate's residual is carried); 1e9, exact (both are).
  for (double speedup : {1e-9, 1.2, 1e9}) {
    BOOST_TEST_CONTEXT("required speedup " << speedup) {
      const std::size_t calls = 9;
      adaptive_allreduce_options settings = options;
      settings.required_speedup = speedup;
      const adaptive_run run = run_adaptive(n, count, calls, settings);
      for (rank_t r = 0; r < n; ++r) {
        BOOST_TEST_INFO("rank " << r << ": " << run.explanations[r]);
        BOOST_TEST(bool(run.decided[r]));
        if (speedup != 1.2) BOOST_TEST(bool(run.compressed[r]) == (speedup < 1));
        BOOST_TEST(run.compressed[r] == run.compressed[0]);
        BOOST_TEST(run.chunks[r] == run.chunks[0]);
        BOOST_TEST(run.explanations[r] == run.explanations[0]);
        BOOST_TEST(run.explanations[r].find("20000 bytes: ") == 0u);
        for (const char* named : {"exact", "chunk 256", "chunk 1024", "best of 2 timed calls"})
          BOOST_TEST(run.explanations[r].find(named) != std::string::npos, named);
        for (std::size_t c = 0; c < calls; ++c) BOOST_TEST(bitwise_equal(run.outputs[r][c], run.outputs[0][c]));
      }
      for (std::size_t i = 0; i < count; ++i) {
        double inputs = 0, kept = 0;
        for (std::size_t c = 0; c < calls; ++c)
          for (rank_t r = 0; r < n; ++r) inputs += run.inputs[c][r][i];
        for (std::size_t c = 0; c < calls; ++c) kept += run.outputs[0][c][i];
        for (rank_t r = 0; r < n; ++r) kept += run.mass[r][i];
        if (std::abs(kept - inputs) > 1e-3 * (1.0 + std::abs(inputs))) {
          BOOST_TEST(kept == inputs, "value " << i << " lost mass");
          break;
        }
      }
    }
  }
}

// Started calls (start_allreduce + wait) give the blocking calls' bits, whichever way
// the choice went, the probes' carried mass included.
BOOST_AUTO_TEST_CASE(started_calls_give_the_blocking_results) {
  const std::size_t n = 3, count = 4000, calls = 7;
  const auto inputs = random_calls<float>(calls, n, count, 21);
  const std::vector<adaptive_allreduce_options> settings = {
      {.choice = compression_choice::exact},
      {.choice = compression_choice::compressed},
      {.probe_rounds = 1, .required_speedup = 1e-9},  // decides compressed after 2 probes
      {.probe_rounds = 1, .required_speedup = 1e9}};  // decides exact, carrying the probe's mass
  for (const adaptive_allreduce_options& options : settings) {
    BOOST_TEST_CONTEXT("choice " << int(options.choice) << ", speedup " << options.required_speedup) {
      std::vector<std::vector<std::vector<float>>> blocking(n), started(n);
      auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
        communicator comm(std::move(endpoint));
        const rank_t r = comm.rank();
        adaptive_allreduce a(comm, count, quantizers::one_bit({.group_size = 64}), options);
        adaptive_allreduce b(comm, count, quantizers::one_bit({.group_size = 64}), options);
        for (std::size_t c = 0; c < calls; ++c) {
          std::vector<float> x = inputs[c][r], y = inputs[c][r];
          a.allreduce(std::span(x), reduce_op::avg);
          b.start_allreduce(std::span(y), reduce_op::avg);
          b.wait();
          blocking[r].push_back(x);
          started[r].push_back(y);
        }
      });
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
      for (rank_t r = 0; r < n; ++r)
        for (std::size_t c = 0; c < calls; ++c) BOOST_TEST(bitwise_equal(started[r][c], blocking[r][c]), "call " << c);
    }
  }
}

// A call in flight refuses a second one (started or blocking) at once: rank 0 starts,
// and its peers start only after rank 0 has been refused, so its call cannot finish.
BOOST_AUTO_TEST_CASE(a_call_in_flight_refuses_another) {
  for (compression_choice choice : {compression_choice::exact, compression_choice::compressed}) {
    std::atomic<bool> tried{false};
    std::vector<int> refusals(2);
    auto errors = transports::inproc::run_ranks(2, [&](transports::inproc::transport endpoint) {
      communicator comm(std::move(endpoint));
      const rank_t r = comm.rank();
      adaptive_allreduce bucket(comm, 1000, quantizers::one_bit{}, {.choice = choice});
      std::vector<float> data(1000, 1.0f), other(1000, 1.0f);
      if (r == 1)
        while (!tried.load()) std::this_thread::yield();
      bucket.start_allreduce(std::span(data), reduce_op::sum);
      if (r == 0) {
        for (auto attempt : {0, 1}) try {
            if (attempt == 0) bucket.start_allreduce(std::span(other), reduce_op::sum);
            else bucket.allreduce(std::span(other), reduce_op::sum);
          } catch (const qcoll::error& e) {
            refusals[0] += e.code() == errc::invalid_argument;
          }
        tried = true;
      }
      bucket.wait();
    });
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    BOOST_TEST(refusals[0] == 2, "choice " << int(choice));
  }
}

// Forced, by the options or by QCOLL_COMPRESSION (which wins): decided from the first
// call, and the results are the exact allreduce's or the compressed plan's bits.
BOOST_AUTO_TEST_CASE(the_choice_can_be_forced) {
  const std::size_t n = 2, count = 3000, calls = 3;
  const adaptive_run exact = run_adaptive(n, count, calls, {.choice = compression_choice::exact});
  const adaptive_run compressed = run_adaptive(n, count, calls, {.choice = compression_choice::compressed});
  BOOST_TEST(exact.explanations[0] == "12000 bytes: exact (set by the options)");
  BOOST_TEST(compressed.explanations[0] == "12000 bytes: compressed (one_bit, chunk 262144) (set by the options)");
  const auto plain = run_calls<quantizers::one_bit>(compressed.inputs, [](rank_t) { return one_bit_with(64); }, {});
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(!exact.compressed[r]);
    BOOST_TEST(bool(compressed.compressed[r]));
    for (std::size_t c = 0; c < calls; ++c) {
      std::vector<float> sum(count);
      for (rank_t q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i) sum[i] += exact.inputs[c][q][i];
      BOOST_TEST(exact.outputs[r][c] == sum);  // by value: a sum of -0s may be -0 or +0
      BOOST_TEST(bitwise_equal(compressed.outputs[r][c], plain[r].outputs[c]));
    }
  }
  ::setenv("QCOLL_COMPRESSION", "exact", 1);
  const adaptive_run by_environment = run_adaptive(n, count, 1, {.choice = compression_choice::compressed});
  ::setenv("QCOLL_COMPRESSION", "sometimes", 1);
  BOOST_CHECK_EXCEPTION(compression_choice_from_environment(), qcoll::error, [](const qcoll::error& e) {
    return e.code() == errc::invalid_argument && std::string(e.what()).find("QCOLL_COMPRESSION") != std::string::npos;
  });
  ::unsetenv("QCOLL_COMPRESSION");
  BOOST_TEST(by_environment.explanations[0] == "12000 bytes: exact (set by QCOLL_COMPRESSION)");
  BOOST_TEST(!by_environment.compressed[0]);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_failures)

using plan_type = compressed_allreduce_plan<quantizers::one_bit>;

/// Plans made on the main thread, so they outlive the worlds the calls run in.
template <class Topology>
std::vector<std::unique_ptr<plan_type>> make_plans(std::size_t n, std::size_t count, const Topology& topology,
                                                   quantizers::reconstruction_source from) {
  std::vector<std::unique_ptr<plan_type>> plans;
  for (rank_t r = 0; r < n; ++r)
    plans.push_back(std::make_unique<plan_type>(
        r, topology, count, quantizers::one_bit({.group_size = 128, .reconstruction_from = from}),
        compressed_allreduce_options{.chunk_values = 256}));
  return plans;
}

/// What a world of n ranks did with one call each: outputs and error codes.
struct world_outcome {
  std::vector<std::vector<float>> outputs;
  std::vector<std::error_code> codes;
  std::vector<std::size_t> sends;
};

/// One call on every rank with plans[r]; rank `victim`'s transport fails its
/// `fail_at`-th send of the call (none when victim ≥ n).
template <class Topology>
world_outcome call_once(std::vector<std::unique_ptr<plan_type>>& plans, const Topology& topology,
                        const std::vector<std::vector<float>>& inputs, rank_t victim = ~rank_t{0},
                        std::size_t fail_at = 0) {
  const std::size_t n = plans.size();
  world_outcome outcome{std::vector<std::vector<float>>(n), std::vector<std::error_code>(n),
                        std::vector<std::size_t>(n)};
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    const rank_t r = endpoint.rank();
    communicator<test::counting_transport> comm(test::counting_transport(std::move(endpoint)), topology,
                                                          {.timeout = std::chrono::seconds(10)});
    if (r == victim) comm.transport().fail_after_sends(fail_at);
    outcome.outputs[r].resize(inputs[r].size());
    comm.allreduce(*plans[r], std::span(inputs[r]), std::span(outcome.outputs[r]), reduce_op::sum, outcome.codes[r]);
    outcome.sends[r] = comm.transport().sends();
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return outcome;
}

std::vector<float> worker_of(const plan_type& p) { return {p.worker_residual().begin(), p.worker_residual().end()}; }
std::vector<float> server_of(const plan_type& p) { return {p.server_residual().begin(), p.server_residual().end()}; }

// A link fails at a chosen send of the second call, on either route: every rank
// fails with peer_lost, every plan's residuals are exactly as after the first call,
// and repeating the call on a new world gives the bits of a run that never failed —
// also with reconstruction values from the previous call, whose memory must roll
// back with the residuals.
template <class Topology>
void check_failure_atomicity(const Topology& topology, quantizers::reconstruction_source from) {
  const std::size_t n = topology.size(), count = 3000;
  const auto inputs = random_calls<float>(2, n, count, 17);

  auto clean = make_plans(n, count, topology, from);
  call_once(clean, topology, inputs[0]);
  const world_outcome reference = call_once(clean, topology, inputs[1]);

  for (rank_t victim : {rank_t{0}, static_cast<rank_t>(n - 1)}) {
    const std::size_t sends = reference.sends[victim];
    for (std::size_t fail_at : {std::size_t{0}, sends / 2, sends - 1}) {
      BOOST_TEST_CONTEXT("victim " << victim << " fails send " << fail_at << " of " << sends) {
        auto plans = make_plans(n, count, topology, from);
        call_once(plans, topology, inputs[0]);
        std::vector<std::vector<float>> worker, server;
        for (auto& p : plans) {
          worker.push_back(worker_of(*p));
          server.push_back(server_of(*p));
        }
        const world_outcome failed = call_once(plans, topology, inputs[1], victim, fail_at);
        BOOST_TEST(failed.codes[victim] == errc::peer_lost);
        for (rank_t r = 0; r < n; ++r) {
          BOOST_TEST_INFO("rank " << r << ": " << failed.codes[r].message());
          if (failed.codes[r]) {
            BOOST_TEST(failed.codes[r] == errc::peer_lost);
          } else {
            // It had every frame it needed before the link failed: a correct result,
            // committed residuals, which it rolls back to join the retry.
            BOOST_TEST(bitwise_equal(failed.outputs[r], reference.outputs[r]));
            BOOST_TEST(bitwise_equal(plans[r]->worker_residual(), worker_of(*clean[r])));
            plans[r]->roll_back_last_call();
          }
          BOOST_TEST(bitwise_equal(plans[r]->worker_residual(), worker[r]));
          BOOST_TEST(bitwise_equal(plans[r]->server_residual(), server[r]));
        }
        const world_outcome retried = call_once(plans, topology, inputs[1]);
        for (rank_t r = 0; r < n; ++r) {
          BOOST_TEST_INFO("rank " << r);
          BOOST_TEST(!retried.codes[r]);
          BOOST_TEST(bitwise_equal(retried.outputs[r], reference.outputs[r]));
          BOOST_TEST(bitwise_equal(plans[r]->worker_residual(), worker_of(*clean[r])));
          BOOST_TEST(bitwise_equal(plans[r]->server_residual(), server_of(*clean[r])));
        }
      }
    }
  }
}

template <class Topology>
void check_failure_atomicity(const Topology& topology) {
  for (auto from : {quantizers::reconstruction_source::current, quantizers::reconstruction_source::previous})
    BOOST_TEST_CONTEXT("reconstruction from " << int(from)) { check_failure_atomicity(topology, from); }
}

BOOST_AUTO_TEST_CASE(a_failed_call_leaves_the_residuals_as_they_were_direct) {
  check_failure_atomicity(topologies::fully_connected(4));
}

BOOST_AUTO_TEST_CASE(a_failed_call_leaves_the_residuals_as_they_were_ring) {
  check_failure_atomicity(topologies::ring(std::vector<rank_t>{2, 0, 3, 1, 4}));
}

// A rank that never makes the call: the others fail within the timeout, residuals intact.
BOOST_AUTO_TEST_CASE(a_missing_rank_times_out_and_changes_nothing) {
  const std::size_t n = 3, count = 5000;
  std::vector<std::error_code> codes(n);
  std::vector<char> unchanged(n, false);  // not vector<bool>: ranks write their elements from their own threads
  const auto started = clock::now();
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint), {.timeout = std::chrono::milliseconds(300)});
    compressed_allreduce_plan plan(comm, count, quantizers::one_bit{});
    std::vector<float> data(count, 1.0f + float(comm.rank()));
    comm.allreduce(plan, std::span(data), reduce_op::sum);
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // absent from the second call
      return;
    }
    const std::vector<float> worker = worker_of(plan);
    comm.allreduce(plan, std::span(data), reduce_op::sum, codes[comm.rank()]);
    unchanged[comm.rank()] = bitwise_equal(plan.worker_residual(), worker);
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  BOOST_TEST((clock::now() - started < std::chrono::seconds(5)));
  for (rank_t r = 0; r < 2; ++r) {
    BOOST_TEST((codes[r] == condition::transport_failure));
    BOOST_TEST(bool(unchanged[r]));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_non_blocking)

// Three buckets started back to back (one per layer, say), with exact collectives
// issued in between: every result equals the blocking calls', bit for bit.
BOOST_AUTO_TEST_CASE(several_plans_in_flight_give_the_blocking_results) {
  const std::size_t n = 4;
  const std::size_t counts[] = {70000, 3, 20000};
  std::vector<std::vector<std::vector<float>>> started(n), blocking(n);
  std::vector<float> exact_sums(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    auto fresh = [&] {  // one plan per bucket, in a vector: plans move while idle
      std::vector<compressed_allreduce_plan<quantizers::one_bit>> plans;
      for (std::size_t count : counts) plans.emplace_back(comm, count);
      return plans;
    };
    auto inputs = [&](std::size_t b) { return random_calls<float>(1, n, counts[b], 40 + b)[0][r]; };
    auto plans = fresh();
    std::vector<std::vector<float>> buffers;
    for (std::size_t b = 0; b < 3; ++b) buffers.push_back(inputs(b));
    for (std::size_t b = 0; b < 3; ++b) comm.start_allreduce(plans[b], std::span(buffers[b]), reduce_op::avg);
    // An exact collective waits for the started ones: program order on every rank.
    float one = 1.0f;
    comm.allreduce(std::span(&one, 1), reduce_op::sum);
    exact_sums[r] = one;
    for (auto& p : plans) p.wait();
    started[r] = buffers;

    auto again = fresh();
    for (std::size_t b = 0; b < 3; ++b) {
      buffers[b] = inputs(b);
      comm.allreduce(again[b], std::span(buffers[b]), reduce_op::avg);
    }
    blocking[r] = buffers;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(exact_sums[r] == float(n));
    for (std::size_t b = 0; b < 3; ++b) {
      BOOST_TEST(bitwise_equal(started[r][b], blocking[r][b]));
      BOOST_TEST(bitwise_equal(started[r][b], started[0][b]));
    }
  }
}

BOOST_AUTO_TEST_CASE(starting_a_plan_in_flight_is_refused_and_errors_come_from_wait) {
  const std::size_t n = 2;
  std::vector<std::error_code> waited(n);
  std::vector<std::string> messages(n);
  std::error_code refused, move_refused;
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint), {.timeout = std::chrono::seconds(5)});
    const rank_t r = comm.rank();
    // The ranks disagree about the count: the plan's wait reports it, on both ranks.
    const std::size_t count = r == 0 ? 4096 : 4097;
    compressed_allreduce_plan plan(comm, count, quantizers::one_bit{});
    std::vector<float> data(count, 1.0f);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // keeps rank 0's call in flight
    comm.start_allreduce(plan, std::span(data), reduce_op::sum);
    if (r == 0) {
      comm.start_allreduce(plan, std::span(data), reduce_op::sum, refused);
      try {
        auto moved = std::move(plan);  // in flight: the progress thread is using it
      } catch (const error& e) {
        move_refused = e.code();
      }
    }
    plan.wait(waited[r]);
    try {
      plan.wait();
    } catch (const error& e) {
      messages[r] = e.what();
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  BOOST_TEST(refused == errc::invalid_argument);
  BOOST_TEST(move_refused == errc::invalid_argument);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST_INFO("rank " << r << ": " << messages[r]);
    BOOST_TEST(waited[r] == errc::count_mismatch);
    BOOST_TEST(messages[r].find("compressed_allreduce") != std::string::npos);
  }
}

// Destroying a communicator lets what it started finish; the plans hold the results.
BOOST_AUTO_TEST_CASE(a_communicator_drains_before_it_goes) {
  const std::size_t n = 3, count = 100000;
  std::vector<std::vector<float>> results(n);
  std::vector<int> finished(n, 0);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    compressed_allreduce_plan<quantizers::identity<float>> plan(endpoint.rank(), topologies::fully_connected(n), count,
                                                                {});
    std::vector<float> data(count, float(endpoint.rank() + 1));
    {
      communicator comm(std::move(endpoint));
      comm.start_allreduce(plan, std::span(data), reduce_op::sum);
    }
    finished[plan.rank()] = plan.test() ? 1 : 0;
    plan.wait();
    results[plan.rank()] = data;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(finished[r] == 1);
    BOOST_TEST(std::count(results[r].begin(), results[r].end(), 6.0f) == long(count));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_bad_input)

/// Every rank runs fn(comm, rank); returns each rank's error code and message.
template <class Fn>
std::vector<std::pair<std::error_code, std::string>> each_rank(std::size_t n, Fn fn) {
  std::vector<std::pair<std::error_code, std::string>> outcome(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    const rank_t r = endpoint.rank();
    communicator comm(std::move(endpoint), {.timeout = std::chrono::seconds(5)});
    try {
      fn(comm, r);
    } catch (const error& e) {
      outcome[r] = {e.code(), e.what()};
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return outcome;
}

BOOST_AUTO_TEST_CASE(unsupported_op_fails_on_every_rank) {
  const auto outcome = each_rank(3, [](auto& comm, rank_t) {
    compressed_allreduce_plan plan(comm, 100, quantizers::one_bit{});
    std::vector<float> data(100);
    comm.allreduce(plan, std::span(data), reduce_op::max);
  });
  for (const auto& [code, message] : outcome) {
    BOOST_TEST(code == errc::invalid_argument);
    BOOST_TEST(message.find("max is not supported") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(wrong_sizes_and_foreign_plans) {
  auto outcome = each_rank(2, [](auto& comm, rank_t r) {
    compressed_allreduce_plan plan(comm, 100, quantizers::one_bit{});
    std::vector<float> data(r == 0 ? 99 : 100);
    comm.allreduce(plan, std::span(data), reduce_op::sum);
  });
  BOOST_TEST(outcome[0].second.find("made for 100 elements") != std::string::npos);
  for (const auto& [code, message] : outcome) BOOST_TEST(code == errc::invalid_argument);  // rank 1 by the abort

  outcome = each_rank(2, [](auto& comm, rank_t r) {
    compressed_allreduce_plan<quantizers::one_bit> plan(1 - r, topologies::fully_connected(2), 100, quantizers::one_bit{});
    std::vector<float> data(100);
    comm.allreduce(plan, std::span(data), reduce_op::sum);
  });
  for (const auto& [code, message] : outcome) {
    BOOST_TEST(code == errc::invalid_argument);
  }
  outcome = each_rank(4, [](auto& comm, rank_t r) {
    compressed_allreduce_plan<quantizers::one_bit> plan(r, topologies::ring(4), 100, quantizers::one_bit{});
    std::vector<float> data(100);
    comm.allreduce(plan, std::span(data), reduce_op::sum);  // a ring plan on a fully connected communicator
  });
  for (const auto& [code, message] : outcome) BOOST_TEST(code == errc::invalid_argument);
}

BOOST_AUTO_TEST_CASE(ranks_that_disagree_are_told_so) {
  // Different counts.
  auto outcome = each_rank(3, [](auto& comm, rank_t r) {
    const std::size_t count = r == 1 ? 5000 : 5001;
    compressed_allreduce_plan plan(comm, count, quantizers::one_bit{});
    std::vector<float> data(count);
    comm.allreduce(plan, std::span(data), reduce_op::sum);
  });
  for (const auto& [code, message] : outcome) BOOST_TEST(code == errc::count_mismatch);

  // One rank calls the exact allreduce, the others the compressed one.
  outcome = each_rank(3, [](auto& comm, rank_t r) {
    std::vector<float> data(3000);
    if (r == 0) return comm.allreduce(std::span(data), reduce_op::sum);
    compressed_allreduce_plan plan(comm, data.size(), quantizers::one_bit{});
    comm.allreduce(plan, std::span(data), reduce_op::sum);
  });
  for (const auto& [code, message] : outcome) {
    BOOST_TEST_INFO(message);
    BOOST_TEST(code == errc::operation_mismatch);
  }

  // Different quantizers: the frames do not decode, and the receiver says whose.
  outcome = each_rank(2, [](auto& comm, rank_t r) {
    std::vector<float> data(4096, 1.0f);
    if (r == 0) {
      compressed_allreduce_plan plan(comm, data.size(), quantizers::one_bit{});
      comm.allreduce(plan, std::span(data), reduce_op::sum);
    } else {
      compressed_allreduce_plan plan(comm, data.size(), quantizers::k_level({.levels = 2}));
      comm.allreduce(plan, std::span(data), reduce_op::sum);
    }
  });
  for (const auto& [code, message] : outcome) {
    BOOST_TEST_INFO(message);
    BOOST_TEST(code == errc::protocol_error);
    BOOST_TEST(message.find("does not decode") != std::string::npos);
  }

  // The same quantizer over bfloat16 buffers on one rank and float on the other:
  // the frames would decode, so the message header's element type must tell.
  outcome = each_rank(2, [](auto& comm, rank_t r) {
    if (r == 0) {
      std::vector<bfloat16> data(4096, bfloat16(1.0f));
      compressed_allreduce_plan<quantizers::one_bit, bfloat16> plan(comm, data.size(), quantizers::one_bit{});
      comm.allreduce(plan, std::span(data), reduce_op::sum);
    } else {
      std::vector<float> data(4096, 1.0f);
      compressed_allreduce_plan plan(comm, data.size(), quantizers::one_bit{});
      comm.allreduce(plan, std::span(data), reduce_op::sum);
    }
  });
  for (const auto& [code, message] : outcome) {
    BOOST_TEST_INFO(message);
    BOOST_TEST(code == errc::type_mismatch);
    BOOST_TEST(message.find("bf16") != std::string::npos);
  }

  // One rank's plan sums on the grid, the others' do not (with chunks that are whole
  // blocks either way, so the frames alone would not tell): every rank is told.
  outcome = each_rank(3, [](auto& comm, rank_t r) {
    std::vector<float> data(5000, 1.0f);
    compressed_allreduce_plan plan(comm, data.size(), quantizers::one_bit{},
                                   {.chunk_values = 2048, .reproducible = r == 2});
    comm.allreduce(plan, std::span(data), reduce_op::sum);
  });
  for (const auto& [code, message] : outcome) {
    BOOST_TEST_INFO(message);
    BOOST_TEST(code == errc::operation_mismatch);
  }
  const auto said = outcome[0].second + outcome[1].second;
  BOOST_TEST(said.find("reproducible") != std::string::npos, said);
}

// A group holding NaN decodes to NaN on every rank (and keeps its residual); the
// other groups are unaffected, and nothing reads out of bounds.
BOOST_AUTO_TEST_CASE(non_finite_values_stay_in_their_group) {
  const std::size_t n = 3, count = 3 * 2048 + 5;
  std::vector<std::vector<std::vector<float>>> inputs = random_calls<float>(1, n, count, 8);
  inputs[0][1][2048 + 7] = std::numeric_limits<float>::quiet_NaN();
  inputs[0][2][count - 1] = std::numeric_limits<float>::infinity();
  const auto records = run_calls<quantizers::one_bit>(inputs, [](rank_t) { return quantizers::one_bit{}; }, {});
  for (rank_t r = 0; r < n; ++r) {
    const auto& out = records[r].outputs[0];
    BOOST_TEST(bitwise_equal(out, records[0].outputs[0]));
    BOOST_TEST(std::all_of(out.begin(), out.begin() + 2048, [](float v) { return std::isfinite(v); }));
    BOOST_TEST(std::all_of(out.begin() + 2048, out.begin() + 4096, [](float v) { return std::isnan(v); }));
    BOOST_TEST(std::all_of(out.begin() + 4096, out.begin() + 6144, [](float v) { return std::isfinite(v); }));
    BOOST_TEST(std::isnan(out.back()));
  }
}

BOOST_AUTO_TEST_SUITE_END()

// A plan over bfloat16 or float16 buffers: every rank gets the float plan's result
// on the widened inputs, rounded once, and keeps the float plan's residuals.
BOOST_AUTO_TEST_SUITE(compressed_half)

namespace {

template <class Half>
std::vector<std::uint16_t> bits_of(std::span<const Half> values) {
  std::vector<std::uint16_t> bits;
  for (Half v : values) bits.push_back(v.bits);
  return bits;
}

template <class Half, class Q>
void check_half_plan(Q quantizer, std::size_t n, std::size_t count, bool ring) {
  BOOST_TEST_CONTEXT(Q::name << " " << to_string(dtype_of<Half>::value) << " n=" << n << " count=" << count
                             << (ring ? " ring" : " direct")) {
    constexpr std::size_t calls = 4;
    std::vector<std::vector<std::uint16_t>> got(n), expected(n), first_rank(n);
    std::vector<std::vector<float>> residual_half(n), residual_float(n);
    auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
      auto body = [&](auto& comm) {
        const rank_t r = comm.rank();
        const compressed_allreduce_options options{.chunk_values = 1000};
        compressed_allreduce_plan<Q> wide(comm, count, quantizer, options);
        compressed_allreduce_plan<Q, Half> half(comm, count, quantizer, options);
        for (std::size_t c = 0; c < calls; ++c) {
          const reduce_op op = c % 2 ? reduce_op::avg : reduce_op::sum;
          const auto values = random_calls<float>(1, n, count, 100 * c + n);
          std::vector<Half> in;
          for (float v : values[0][r]) in.push_back(Half(v));
          std::vector<float> wide_in, wide_out(count);
          for (Half v : in) wide_in.push_back(float(v));
          comm.allreduce(wide, std::span<const float>(wide_in), std::span<float>(wide_out), op);
          for (float v : wide_out) expected[r].push_back(Half(v).bits);
          if (c == 2) {  // started, in place
            comm.start_allreduce(half, std::span<Half>(in), op);
            half.wait();
            const auto bits = bits_of<Half>(in);
            got[r].insert(got[r].end(), bits.begin(), bits.end());
          } else {
            std::vector<Half> out(count);
            comm.allreduce(half, std::span<const Half>(in), std::span<Half>(out), op);
            const auto bits = bits_of<Half>(out);
            got[r].insert(got[r].end(), bits.begin(), bits.end());
          }
        }
        residual_half[r].assign(half.worker_residual().begin(), half.worker_residual().end());
        residual_half[r].insert(residual_half[r].end(), half.server_residual().begin(), half.server_residual().end());
        residual_float[r].assign(wide.worker_residual().begin(), wide.worker_residual().end());
        residual_float[r].insert(residual_float[r].end(), wide.server_residual().begin(), wide.server_residual().end());
      };
      if (ring) {
        communicator comm(std::move(endpoint), topologies::ring(n));
        body(comm);
      } else {
        communicator comm(std::move(endpoint));
        body(comm);
      }
    });
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (rank_t r = 0; r < n; ++r) {
      BOOST_TEST(got[r] == expected[r], "rank " << r << ": results");
      BOOST_TEST(got[r] == got[0], "rank " << r << " differs from rank 0");
      BOOST_TEST(bitwise_equal(residual_half[r], residual_float[r]), "rank " << r << ": residuals");
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_quantizer_gives_the_float_plans_bits_rounded_once) {
  for (std::size_t n : {1u, 2u, 3u, 4u})
    for (std::size_t count : {0u, 1u, 777u, 5000u})
      for (bool ring : {false, true}) {
        check_half_plan<bfloat16>(quantizers::one_bit{{.group_size = 64}}, n, count, ring);
        check_half_plan<float16>(quantizers::k_level{quantizers::k_level_options::with_bits(4)}, n, count, ring);
        check_half_plan<bfloat16>(quantizers::bfp{}, n, count, ring);
        check_half_plan<float16>(quantizers::identity<float>{}, n, count, ring);
      }
}

// A failed 16-bit call leaves the residuals and the output buffer as they were
// (the result is rounded into it only after the float call succeeded).
BOOST_AUTO_TEST_CASE(a_failed_call_changes_neither_residuals_nor_output) {
  const std::size_t n = 3, count = 5000;
  std::vector<std::error_code> codes(n);
  std::vector<char> residual_kept(n, false), output_kept(n, false);  // not vector<bool>: written from rank threads
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint), {.timeout = std::chrono::milliseconds(300)});
    compressed_allreduce_plan<quantizers::one_bit, bfloat16> plan(comm, count, quantizers::one_bit{});
    std::vector<bfloat16> in(count, bfloat16(0.3f + float(comm.rank()))), out(count, bfloat16(-5.0f));
    comm.allreduce(plan, std::span<const bfloat16>(in), std::span<bfloat16>(out), reduce_op::sum);
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::seconds(1));  // absent from the second call
      return;
    }
    const std::vector<float> worker(plan.worker_residual().begin(), plan.worker_residual().end());
    const std::vector<bfloat16> before = out;
    comm.allreduce(plan, std::span<const bfloat16>(in), std::span<bfloat16>(out), reduce_op::sum, codes[comm.rank()]);
    residual_kept[comm.rank()] = bitwise_equal(plan.worker_residual(), worker);
    output_kept[comm.rank()] = bits_of<bfloat16>(out) == bits_of<bfloat16>(before);
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < 2; ++r) {
    BOOST_TEST((codes[r] == condition::transport_failure));
    BOOST_TEST(bool(residual_kept[r]));
    BOOST_TEST(bool(output_kept[r]));
  }
}

// The grid plan shares the 16-bit path (plan_handle): on a 2x2 mesh, the same check.
BOOST_AUTO_TEST_CASE(the_grid_plan_takes_16_bit_buffers_too) {
  const auto routing = topologies::route_grid(topologies::mesh({2, 2}));
  const std::size_t count = 3001;
  std::vector<std::vector<std::uint16_t>> got(4), expected(4);
  auto errors = transports::inproc::run_ranks(4, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    grid_allreduce_plan<quantizers::one_bit> wide(comm, routing, count);
    grid_allreduce_plan<quantizers::one_bit, bfloat16> half(comm, routing, count);
    for (std::size_t c = 0; c < 3; ++c) {
      const auto values = random_calls<float>(1, 4, count, 7 + c);
      std::vector<bfloat16> in;
      for (float v : values[0][r]) in.push_back(bfloat16(v));
      std::vector<float> wide_data;
      for (bfloat16 v : in) wide_data.push_back(float(v));
      comm.allreduce(wide, std::span<float>(wide_data), reduce_op::avg);
      comm.allreduce(half, std::span<bfloat16>(in), reduce_op::avg);
      for (float v : wide_data) expected[r].push_back(bfloat16(v).bits);
      for (bfloat16 v : in) got[r].push_back(v.bits);
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < 4; ++r) BOOST_TEST(got[r] == expected[r], "rank " << r);
}

// The grid plan keeps the quantizer's memory too (one part per encode): with the
// reconstruction values of the previous call, its first call is the current-source
// plan's (a fresh memory), later ones are not; all ranks agree bit for bit, and
// reset_residuals() forgets the memory.
BOOST_AUTO_TEST_CASE(the_grid_plan_keeps_the_quantizers_memory) {
  const auto routing = topologies::route_grid(topologies::torus({2, 2}));
  const std::size_t count = 2001;
  std::vector<std::vector<std::vector<float>>> previous(4), current(4);
  auto errors = transports::inproc::run_ranks(4, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    grid_allreduce_plan<quantizers::one_bit> remembering(
        comm, routing, count,
        quantizers::one_bit({.group_size = 64, .reconstruction_from = quantizers::reconstruction_source::previous}));
    grid_allreduce_plan<quantizers::one_bit> plain(comm, routing, count, quantizers::one_bit({.group_size = 64}));
    for (std::size_t c = 0; c < 4; ++c) {
      if (c == 3) {
        remembering.reset_residuals();
        plain.reset_residuals();
      }
      const auto values = random_calls<float>(1, 4, count, 40 + c);
      std::vector<float> a = values[0][r], b = values[0][r];
      comm.allreduce(remembering, std::span(a), reduce_op::sum);
      comm.allreduce(plain, std::span(b), reduce_op::sum);
      previous[r].push_back(a);
      current[r].push_back(b);
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < 4; ++r) {
    for (std::size_t c = 0; c < 4; ++c) BOOST_TEST(bitwise_equal(previous[r][c], previous[0][c]));
    BOOST_TEST(bitwise_equal(previous[r][0], current[r][0]));
    BOOST_TEST(!bitwise_equal(previous[r][1], current[r][1]));
    BOOST_TEST(!bitwise_equal(previous[r][2], current[r][2]));
    BOOST_TEST(bitwise_equal(previous[r][3], current[r][3]));  // after reset_residuals: fresh again
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(compressed_allocations)

// After the first call (which sizes the communicator's request pool), a call —
// blocking or started — allocates nothing anywhere in the process.
BOOST_AUTO_TEST_CASE(a_call_allocates_nothing) {
  const std::size_t n = 3, count = 100003;
  std::vector<std::size_t> blocking(n), started(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    communicator comm(std::move(endpoint));
    const rank_t r = comm.rank();
    compressed_allreduce_plan plan(comm, count, quantizers::k_level({.levels = 16}));
    std::vector<float> data(count, 0.5f + float(r));
    comm.allreduce(plan, std::span(data), reduce_op::avg);
    comm.start_allreduce(plan, std::span(data), reduce_op::avg);  // starts the progress thread
    plan.wait();
    comm.barrier();
    const std::size_t before = test::allocations_so_far();
    comm.allreduce(plan, std::span(data), reduce_op::avg);
    comm.barrier();
    blocking[r] = test::allocations_so_far() - before;
    comm.barrier();
    const std::size_t before_started = test::allocations_so_far();
    comm.start_allreduce(plan, std::span(data), reduce_op::avg);
    plan.wait();
    comm.barrier();
    started[r] = test::allocations_so_far() - before_started;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST(blocking[r] == 0u);
    BOOST_TEST(started[r] == 0u);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// A plan that is no quantizer plan, built on plan_base as a user's compressor would be
// (issue 53): the communicator runs it, plan_base gives it the started call, the fused
// and 16-bit calls, and a call that commits or leaves the plan as it was.
BOOST_AUTO_TEST_SUITE(plan_base_without_a_quantizer)

/// Every rank rounds its values plus the rounding error it carries to bfloat16 (a
/// compressor with no quantizer and no frames), keeps the new rounding error (error
/// feedback, double-buffered), sends its rounded values to every other rank and sums
/// all of them in rank order: every rank gets the same bits.
template <element T>
class rounded_sum_plan : public plan_base<T, float> {
 public:
  static constexpr collective collective_kind = collective::allreduce;

  rounded_sum_plan(rank_t rank, rank_t size, std::size_t count)
      : plan_base<T, float>("rounded_sum_plan", std::span<const std::size_t>(&count, 1)), rank_(rank), size_(size),
        residual_{std::vector<float>(count), std::vector<float>(count)},
        rounded_(size, std::vector<bfloat16>(count)) {}

  std::size_t count() const noexcept { return residual_[0].size(); }
  std::uint32_t header_root() const noexcept { return 0x726f756eu; }  // ranks running another plan disagree
  void refuse_if_excluded(const group_view&) const noexcept {}
  template <transport Transport>
  void check(algorithms::primitives<Transport>& step, const group_view& group) const {
    if (group.rank != rank_ || group.size != size_ || !group.fully_linked)
      step.fail(errc::invalid_argument, "rounded_sum_plan was made for rank {} of {}", rank_, size_);
  }
  template <transport Transport>
  void run(algorithms::primitives<Transport>& step, const plan_call<T>& call) {
    this->run_call(step, call, {}, [&](algorithms::value_view<const float> in, algorithms::value_view<float> out) {
      const std::span<const float> values = in.of({0, count()});
      for (std::size_t i = 0; i < count(); ++i) {
        const float wanted = values[i] + residual_[committed_][i];
        rounded_[rank_][i] = bfloat16(wanted);
        residual_[1 - committed_][i] = wanted - static_cast<float>(rounded_[rank_][i]);
      }
      for (rank_t k = 1; k < size_; ++k) {
        const rank_t to = (rank_ + k) % size_, from = (rank_ + size_ - k) % size_;
        step.send_recv(to, std::span<const bfloat16>(rounded_[rank_]), from, std::span<bfloat16>(rounded_[from]));
      }
      const std::span<float> result = out.of({0, count()});
      for (std::size_t i = 0; i < count(); ++i) {
        float sum = 0;
        for (rank_t r = 0; r < size_; ++r) sum += static_cast<float>(rounded_[r][i]);
        result[i] = call.op == reduce_op::avg ? sum / static_cast<float>(size_) : sum;
      }
    }, [&] { committed_ = 1 - committed_; });
  }
  void roll_back_last_call() {
    this->roll_back("roll_back_last_call", [&] { committed_ = 1 - committed_; });
  }
  std::span<const float> residual() const noexcept { return residual_[committed_]; }

 private:
  rank_t rank_, size_;
  std::vector<float> residual_[2];
  unsigned committed_ = 0;
  std::vector<std::vector<bfloat16>> rounded_;  // every rank's rounded values
};
static_assert(allreduce_plan<rounded_sum_plan<float>, transports::inproc::transport>);
static_assert(allreduce_plan<rounded_sum_plan<bfloat16>, transports::subgroup<test::counting_transport>>);

/// rounded_sum_plan's arithmetic, sequentially: one call's result from every rank's input.
struct rounded_sum_model {
  std::vector<std::vector<float>> residual;
  std::vector<float> call(const std::vector<std::vector<float>>& inputs, reduce_op op) {
    const std::size_t n = inputs.size(), count = inputs[0].size();
    residual.resize(n, std::vector<float>(count));
    std::vector<float> result(count);
    std::vector<std::vector<bfloat16>> rounded(n, std::vector<bfloat16>(count));
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i) {
        const float wanted = inputs[r][i] + residual[r][i];
        rounded[r][i] = bfloat16(wanted);
        residual[r][i] = wanted - static_cast<float>(rounded[r][i]);
      }
    for (std::size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (std::size_t r = 0; r < n; ++r) sum += static_cast<float>(rounded[r][i]);
      result[i] = op == reduce_op::avg ? sum / static_cast<float>(n) : sum;
    }
    return result;
  }
};

// Three calls — blocking, started and waited for, fused — of float and bfloat16 plans
// over 1, 3 and 4 ranks: every rank's result is the model's, bit for bit, so the base
// widened the 16-bit input exactly, rounded the float result once, and committed the
// residual after each call.
BOOST_AUTO_TEST_CASE(the_communicator_runs_it_blocking_started_and_fused) {
  for (std::size_t n : {1u, 3u, 4u}) {
    const std::size_t count = 1001;
    const auto inputs = random_calls<float>(3, n, count, 90 + n);
    for (reduce_op op : {reduce_op::sum, reduce_op::avg}) {
      BOOST_TEST_CONTEXT(n << " ranks, " << to_string(op)) {
        rounded_sum_model model;
        std::vector<std::vector<float>> expected;
        for (const auto& call : inputs) expected.push_back(model.call(call, op));
        std::vector<std::vector<std::vector<float>>> as_float(n), as_bf16(n);
        auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
          communicator comm(std::move(endpoint));
          const rank_t r = comm.rank();
          rounded_sum_plan<float> plan(r, static_cast<rank_t>(n), count);
          rounded_sum_plan<bfloat16> half_plan(r, static_cast<rank_t>(n), count);
          for (std::size_t c = 0; c < 3; ++c) {
            std::vector<float> values = inputs[c][r];
            std::vector<bfloat16> halves(count);
            for (std::size_t i = 0; i < count; ++i) halves[i] = bfloat16(values[i]);
            if (c == 0) {
              comm.allreduce(plan, std::span(values), op);
              comm.allreduce(half_plan, std::span(halves), op);
            } else if (c == 1) {
              comm.start_allreduce(plan, std::span(values), op);
              comm.start_allreduce(half_plan, std::span(halves), op);
              plan.wait();
              half_plan.wait();
            } else {
              const std::span<float> one[] = {std::span(values)};
              const std::span<bfloat16> half_one[] = {std::span(halves)};
              comm.allreduce(plan, std::span<const std::span<float>>(one), op);
              comm.allreduce(half_plan, std::span<const std::span<bfloat16>>(half_one), op);
            }
            as_float[r].push_back(values);
            std::vector<float> widened(count);
            for (std::size_t i = 0; i < count; ++i) widened[i] = static_cast<float>(halves[i]);
            as_bf16[r].push_back(widened);
          }
        });
        for (auto& e : errors)
          if (e) std::rethrow_exception(e);
        // The bfloat16 plan sees its input rounded to bfloat16, then rounds the float sum once.
        rounded_sum_model half_model;
        for (std::size_t c = 0; c < 3; ++c) {
          std::vector<std::vector<float>> rounded_inputs = inputs[c];
          for (auto& v : rounded_inputs)
            for (float& x : v) x = static_cast<float>(bfloat16(x));
          std::vector<float> half_expected = half_model.call(rounded_inputs, op);
          for (float& x : half_expected) x = static_cast<float>(bfloat16(x));
          for (std::size_t r = 0; r < n; ++r) {
            BOOST_TEST_INFO("call " << c << ", rank " << r);
            BOOST_TEST(bitwise_equal(as_float[r][c], expected[c]));
            BOOST_TEST(bitwise_equal(as_bf16[r][c], half_expected));
          }
        }
      }
    }
  }
}

/// One call of plans[r] on every rank of a world of inproc ranks, rank `victim`'s first
/// send failing (none when victim is past the last rank): each rank's error and output.
template <class T>
std::pair<std::vector<std::error_code>, std::vector<std::vector<T>>> call_rounded_sum(
    std::vector<std::unique_ptr<rounded_sum_plan<T>>>& plans, const std::vector<std::vector<float>>& inputs,
    rank_t victim) {
  const std::size_t n = plans.size();
  std::vector<std::error_code> codes(n);
  std::vector<std::vector<T>> outputs(n);
  auto errors = transports::inproc::run_ranks(n, [&](transports::inproc::transport endpoint) {
    const rank_t r = endpoint.rank();
    communicator<test::counting_transport> comm(test::counting_transport(std::move(endpoint)),
                                                {.timeout = std::chrono::seconds(10)});
    if (r == victim) comm.transport().fail_after_sends(0);
    std::vector<T> in(inputs[r].size()), out(inputs[r].size(), T(-7.0f));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = T(inputs[r][i]);
    comm.allreduce(*plans[r], std::span<const T>(in), std::span(out), reduce_op::sum, codes[r]);
    outputs[r] = out;
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return {codes, outputs};
}

template <class T>
std::vector<std::unique_ptr<rounded_sum_plan<T>>> rounded_sum_plans(std::size_t n, std::size_t count) {
  std::vector<std::unique_ptr<rounded_sum_plan<T>>> plans;
  for (rank_t r = 0; r < n; ++r) plans.push_back(std::make_unique<rounded_sum_plan<T>>(r, n, count));
  return plans;
}

// A call that fails (rank 1's first send fails: no rank can have every other's values)
// leaves every plan as it was — the residual of the last successful call, and a 16-bit
// call's output untouched (the base rounds into it only after success); a successful
// call rolls back once, to the residual before it.
BOOST_AUTO_TEST_CASE(a_failed_call_changes_nothing_and_a_successful_one_rolls_back_once) {
  const std::size_t n = 3, count = 500;
  const rank_t nobody = ~rank_t{0};
  const auto inputs = random_calls<float>(2, n, count, 77);
  auto plans = rounded_sum_plans<float>(n, count);
  const auto residuals = [&] {
    std::vector<std::vector<float>> all;
    for (const auto& p : plans) all.emplace_back(p->residual().begin(), p->residual().end());
    return all;
  };
  BOOST_TEST(!call_rounded_sum(plans, inputs[0], nobody).first[0]);
  const auto after_first = residuals();
  BOOST_TEST(after_first != std::vector<std::vector<float>>(n, std::vector<float>(count)));

  const auto failed = call_rounded_sum(plans, inputs[1], 1).first;
  BOOST_TEST(failed[1] == errc::peer_lost);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST_INFO("rank " << r << ": " << failed[r].message());
    BOOST_TEST(static_cast<bool>(failed[r]));
  }
  BOOST_TEST(residuals() == after_first);

  BOOST_TEST(!call_rounded_sum(plans, inputs[1], nobody).first[0]);
  BOOST_TEST(residuals() != after_first);
  for (auto& p : plans) p->roll_back_last_call();
  BOOST_TEST(residuals() == after_first);
  for (auto& p : plans)
    BOOST_CHECK_EXCEPTION(p->roll_back_last_call(), qcoll::error, [](const qcoll::error& e) {
      return e.code() == errc::invalid_argument &&
             std::string(e.what()).find("no successful call to roll back") != std::string::npos;
    });

  auto half_plans = rounded_sum_plans<bfloat16>(n, count);
  const auto [codes, outputs] = call_rounded_sum(half_plans, inputs[0], 1);
  for (rank_t r = 0; r < n; ++r) {
    BOOST_TEST_INFO("rank " << r << ": " << codes[r].message());
    BOOST_TEST(static_cast<bool>(codes[r]));
    BOOST_TEST(std::all_of(outputs[r].begin(), outputs[r].end(), [](bfloat16 x) { return float(x) == -7.0f; }));
  }
}

BOOST_AUTO_TEST_SUITE_END()
