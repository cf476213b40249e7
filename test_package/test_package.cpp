// A real collective (4 ranks as threads, allreduce) and one quantizer round trip
// through the kernels the package compiles in this build and picks at run time.
#include <qcoll/qcoll.hpp>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main() {
  // Rank r contributes (r + 1)·(i + 1): every sum is an integer, so exact in float.
  constexpr qcoll::rank_t ranks = 4;
  constexpr std::size_t count = 1000;
  qcoll::transports::inproc::world world(ranks);
  std::vector<std::vector<float>> results(ranks, std::vector<float>(count));
  {
    std::vector<std::jthread> threads;
    for (qcoll::rank_t r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        qcoll::communicator comm(world.endpoint(r));
        for (std::size_t i = 0; i < count; ++i) results[r][i] = float((r + 1) * (i + 1));
        comm.allreduce(std::span<float>(results[r]), qcoll::reduce_op::sum);
      });
  }
  bool allreduce_ok = true;
  for (const auto& result : results)
    for (std::size_t i = 0; i < count; ++i) allreduce_ok = allreduce_ok && result[i] == float(10 * (i + 1));

  // Two values per group, one on each side of the threshold: one_bit reconstructs them
  // exactly (each bin's mean is its value) and leaves a zero residual.
  const qcoll::quantizers::one_bit quantizer;
  std::vector<float> gradient(4096), residual(4096, 0.0f), decoded(4096);
  for (std::size_t i = 0; i < gradient.size(); ++i) gradient[i] = i % 3 == 0 ? -0.25f : 1.5f;
  std::vector<std::byte> frame(quantizer.encoded_size(gradient.size()));
  quantizer.encode(gradient, residual, frame);
  bool one_bit_ok = !quantizer.decode(frame, decoded);
  for (std::size_t i = 0; i < gradient.size(); ++i) one_bit_ok = one_bit_ok && decoded[i] == gradient[i] && residual[i] == 0.0f;

  std::string built, runs;
  for (const auto& backend : qcoll::kernels::cpu::compiled_backends()) {
    built += std::string(built.empty() ? "" : " ") + backend.kernels->name;
    if (backend.runs_here) runs += std::string(runs.empty() ? "" : " ") + backend.kernels->name;
  }
#if defined(QCOLL_KERNELS_COMPILED)
  const char* kernels = "run-time dispatch";
#else
  const char* kernels = "headers only";
#endif
  std::printf("qcoll %d.%d.%d test_package: allreduce of %zu floats over %zu ranks: %s; one_bit encode/decode: %s on %s "
              "(%s; built %s, this CPU runs %s)\n",
              qcoll::version_major, qcoll::version_minor, qcoll::version_patch, count, std::size_t(ranks),
              allreduce_ok ? "ok" : "WRONG", one_bit_ok ? "ok" : "WRONG", qcoll::kernels::cpu::active_kernels().name,
              kernels, built.c_str(), runs.c_str());
  return allreduce_ok && one_bit_ok ? 0 : 1;
}
