// Gradients in bfloat16, as mixed-precision training keeps them, summed across
// processes: exactly (reduced in float, rounded to bfloat16 once) and through the
// 1-bit quantizer with error feedback (residuals stay float).
//
//   qcoll-run -n 4 bf16_gradients                  # shared memory
//   qcoll-run -n 4 --transport tcp bf16_gradients  # TCP over loopback
//
// A PyTorch bf16 tensor's storage is a buffer of qcoll::bfloat16 (the same 16 bits):
//   std::span(reinterpret_cast<qcoll::bfloat16*>(t.data_ptr()), t.numel())

#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/launch/join.hpp>
#include <qcoll/qcoll.hpp>

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() try {
  return qcoll::launch::join_from_environment([](auto transport) {
    qcoll::communicator comm(std::move(transport));
    const qcoll::rank_t n = comm.size(), r = comm.rank();
    constexpr std::size_t count = 1 << 20;

    // Exact: rank r contributes (r + 1) / 8; the sum is exact in float and in bfloat16.
    std::vector<qcoll::bfloat16> gradient(count, qcoll::bfloat16(float(r + 1) / 8));
    comm.allreduce(std::span(gradient), qcoll::reduce_op::sum);
    const float exact_sum = float(n * (n + 1)) / 16;
    const bool exact_ok = float(gradient.front()) == exact_sum && float(gradient.back()) == exact_sum;

    // Compressed: the same bf16 gradient every step, averaged through 1 bit per value.
    // Error feedback makes the mean of the results converge to the true average.
    qcoll::compressed_allreduce_plan<qcoll::quantizers::one_bit, qcoll::bfloat16> plan(comm, count);
    std::vector<qcoll::bfloat16> mine(count);
    for (std::size_t i = 0; i < count; ++i) mine[i] = qcoll::bfloat16(std::sin(0.001f * float(i) + float(r)));
    std::vector<double> truth(count, 0.0), running(count, 0.0);
    for (std::size_t i = 0; i < count; ++i)
      for (qcoll::rank_t k = 0; k < n; ++k) truth[i] += double(float(qcoll::bfloat16(std::sin(0.001f * float(i) + float(k))))) / double(n);
    auto relative_error = [&](double steps) {
      double error = 0, norm = 0;
      for (std::size_t i = 0; i < count; ++i) {
        error += std::pow(running[i] / steps - truth[i], 2);
        norm += truth[i] * truth[i];
      }
      return std::sqrt(error / norm);
    };
    constexpr int steps = 20;
    double first = 0;
    for (int step = 1; step <= steps; ++step) {
      std::vector<qcoll::bfloat16> out(count);
      comm.allreduce(plan, std::span<const qcoll::bfloat16>(mine), std::span(out), qcoll::reduce_op::avg);
      for (std::size_t i = 0; i < count; ++i) running[i] += double(float(out[i]));
      if (step == 1) first = relative_error(1);
    }
    const double last = relative_error(steps);
    const bool compressed_ok = last < first / 4;

    fmt::print("rank {} of {}: exact bf16 sum = {} ({}), 1-bit bf16 average: error {:.1f}% after 1 step, "
               "{:.1f}% over {} steps: {}\n",
               r, n, float(gradient.front()), exact_ok ? "exact" : "WRONG", 100 * first, 100 * last, steps,
               exact_ok && compressed_ok ? "correct" : "WRONG");
    return exact_ok && compressed_ok ? 0 : 1;
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "bf16_gradients: %s\n", e.what());
  return 1;
}
