// Compress a gradient with each quantizer, with error feedback, and see what
// reaches the other side: the frame size, the error of one step, and the error of
// the running sum over many steps (which error feedback keeps from growing).
//
//   quantize_gradients [values] [steps]

#include <qcoll/kernels/cpu/dispatch.hpp>
#include <qcoll/quantizers/bfp.hpp>
#include <qcoll/quantizers/k_level.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

template <class Quantizer>
void report(const char* label, const Quantizer& quantizer, std::size_t n, int steps) {
  std::mt19937 generator(42);
  std::normal_distribution<float> gradient(0.001f, 0.01f);
  std::vector<float> x(n), residual(n, 0.0f), decoded(n);
  std::vector<double> sum_x(n, 0.0), sum_decoded(n, 0.0);
  std::vector<std::byte> frame(quantizer.encoded_size(n));  // allocated once, reused every step
  double first_step_error = 0;
  for (int step = 0; step < steps; ++step) {
    for (float& v : x) v = gradient(generator);
    quantizer.encode(x, residual, frame, {.sequence = static_cast<std::uint64_t>(step)});
    if (const auto failure = quantizer.decode(frame, decoded)) {
      fmt::print("{}: decode failed: {}\n", label, failure.message());
      std::exit(1);
    }
    for (std::size_t i = 0; i < n; ++i) {
      sum_x[i] += x[i];
      sum_decoded[i] += decoded[i];
      if (step == 0) first_step_error = std::max(first_step_error, double(std::abs(decoded[i] - x[i])));
    }
  }
  double drift = 0;
  for (std::size_t i = 0; i < n; ++i) drift = std::max(drift, std::abs(sum_decoded[i] - sum_x[i]));
  fmt::print("{:<28} {:>10} bytes {:>6.1f}x smaller   one step: max error {:.2e}   after {} steps: {:.2e}\n", label,
             frame.size(), double(n * sizeof(float)) / double(frame.size()), first_step_error, steps, drift);
}

int main(int argc, char** argv) {
  const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1 << 20;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
  using namespace qcoll::quantizers;
  fmt::print("{} float32 gradient values ({} bytes), kernels: {}\n", n, n * sizeof(float),
             qcoll::kernels::cpu::active_kernels().name);
  report("one_bit (G = 2048)", one_bit(), n, steps);
  report("one_bit, mean threshold", one_bit({.threshold = threshold::group_mean}), n, steps);
  report("k_level, 4 bits", k_level(k_level_options::with_bits(4)), n, steps);
  k_level_options stochastic = k_level_options::with_bits(2);
  stochastic.rounding = rounding::stochastic;
  stochastic.seed = 7;
  report("k_level, 2 bits, stochastic", k_level(stochastic), n, steps);
  report("bfp, 8-bit, blocks of 32", bfp(), n, steps);
  report("bfp, 4-bit, blocks of 32", bfp({.mantissa_bits = 4}), n, steps);
  fmt::print("the accumulated error stays the size of one step's: error feedback returns what each step lost\n");
}
