// The CUDA kernels against the scalar reference, bit for bit: the reduce kernel (NaN
// payloads aside: the GPU canonicalises them) and the 16-bit conversions (NaNs
// included: both run core/half.hpp's rule). Without a CUDA device it reports itself
// skipped (exit 77, which ctest shows as skipped).

#include <qcoll/core/half.hpp>
#include <qcoll/kernels/cpu/reduce.hpp>
#include <qcoll/kernels/cuda/convert.cuh>
#include <qcoll/kernels/cuda/reduce.cuh>

#include "support/half_inputs.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

int passed = 0, failed = 0;

void check(bool ok, const char* what, std::size_t n, qcoll::reduce_op op) {
  ++(ok ? passed : failed);
  if (!ok) std::printf("FAILED: %s (n=%zu, op=%s)\n", what, n, qcoll::to_string(op));
}

template <class T>
bool same_bits_or_both_nan(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return false;
  }
  return true;
}

template <class T>
void compare_with_reference(std::size_t n, qcoll::reduce_op op) {
  std::mt19937_64 gen(n * 31 + static_cast<unsigned>(op));
  std::uniform_real_distribution<T> value(-1e3, 1e3);
  std::vector<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = value(gen);
    b[i] = value(gen);
  }
  // Edge cases the operators must agree on: NaN either side, infinities, ±0 ties, denormals.
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(), T(0), T(-0.0), std::numeric_limits<T>::denorm_min()};
  for (std::size_t i = 0; i < n && i < 36; ++i) {
    a[i] = specials[i % 6];
    b[i] = specials[(i / 6) % 6];
  }
  std::vector<T> expected(n), got(n);
  qcoll::kernels::cpu::reduce<T>(op, a, b, expected);

  T *da = nullptr, *db = nullptr;
  bool ok = cudaMalloc(&da, n * sizeof(T) + 1) == cudaSuccess && cudaMalloc(&db, n * sizeof(T) + 1) == cudaSuccess;
  ok = ok && cudaMemcpy(da, a.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
  ok = ok && cudaMemcpy(db, b.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
  ok = ok && qcoll::kernels::cuda::reduce<T>(op, da, db, da, n) == cudaSuccess;  // in place, as the ring does
  ok = ok && cudaMemcpy(got.data(), da, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(da);
  cudaFree(db);
  check(ok && same_bits_or_both_nan(got, expected), sizeof(T) == 4 ? "float" : "double", n, op);
}

/// Copies `in` to the device, runs `convert` there and returns the result.
template <class Out, class In, class Convert>
bool on_device(const std::vector<In>& in, std::vector<Out>& out, Convert convert) {
  In* device_in = nullptr;
  Out* device_out = nullptr;
  out.assign(in.size(), Out{});
  bool ok = cudaMalloc(&device_in, in.size() * sizeof(In) + 1) == cudaSuccess &&
            cudaMalloc(&device_out, in.size() * sizeof(Out) + 1) == cudaSuccess;
  ok = ok && cudaMemcpy(device_in, in.data(), in.size() * sizeof(In), cudaMemcpyHostToDevice) == cudaSuccess;
  ok = ok && convert(device_in, device_out, in.size()) == cudaSuccess;
  ok = ok && cudaMemcpy(out.data(), device_out, in.size() * sizeof(Out), cudaMemcpyDeviceToHost) == cudaSuccess;
  cudaFree(device_in);
  cudaFree(device_out);
  return ok;
}

template <class Half>
void conversions_match_the_cpu(const char* name) {
  namespace cuda = qcoll::kernels::cuda;
  const std::vector<float> floats = test::narrowing_inputs();
  std::vector<Half> narrowed;
  bool ok = on_device(floats, narrowed, [](const float* in, Half* out, std::size_t n) { return cuda::narrow(in, out, n); });
  for (std::size_t i = 0; ok && i < floats.size(); ++i) ok = narrowed[i].bits == Half(floats[i]).bits;
  check(ok, name, floats.size(), qcoll::reduce_op::sum);

  std::vector<Half> every(0x10000);
  for (std::uint32_t h = 0; h < 0x10000; ++h) every[h] = Half::from_bits(static_cast<std::uint16_t>(h));
  std::vector<float> widened;
  ok = on_device(every, widened, [](const Half* in, float* out, std::size_t n) { return cuda::widen(in, out, n); });
  for (std::size_t i = 0; ok && i < every.size(); ++i) {
    const float expected = float(every[i]);
    ok = std::memcmp(&widened[i], &expected, sizeof expected) == 0;
  }
  check(ok, name, every.size(), qcoll::reduce_op::sum);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("cuda_tests: no CUDA device here, skipped\n");
    return 77;
  }
  for (std::size_t n : {0ul, 1ul, 37ul, 1000ul, (1ul << 20) + 3})
    for (auto op : {qcoll::reduce_op::sum, qcoll::reduce_op::avg, qcoll::reduce_op::min, qcoll::reduce_op::max}) {
      compare_with_reference<float>(n, op);
      compare_with_reference<double>(n, op);
    }
  conversions_match_the_cpu<qcoll::bfloat16>("bfloat16 conversions");
  conversions_match_the_cpu<qcoll::float16>("float16 conversions");
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
