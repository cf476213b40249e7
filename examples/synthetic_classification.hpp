#pragma once
/// @file
/// A seeded, synthetic classification problem for the training examples
/// (data_parallel_training, torus_fault_training): a portable random stream, a data
/// set, and Gaussian clusters to learn.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <vector>

namespace qcoll_examples {

/// splitmix64: the same numbers from every standard library, which
/// std::normal_distribution does not promise.
class random_stream {
 public:
  /// Different `purpose`s give unrelated streams from one seed.
  random_stream(std::uint64_t seed, std::uint64_t purpose) : state_(seed * 0x9e3779b97f4a7c15u ^ purpose) {}

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  }
  double uniform() noexcept { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::size_t below(std::size_t n) noexcept { return std::size_t(next() % n); }
  double normal() noexcept {  // Box–Muller; 1 − u keeps the logarithm finite
    // Two statements: the operands of one product would draw in an unspecified order.
    const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform()));
    return radius * std::cos(2.0 * std::numbers::pi * uniform());
  }

 private:
  std::uint64_t state_;
};

/// Labelled samples of `features` values each.
struct dataset {
  std::size_t features = 0;
  std::vector<float> inputs;  // sample i at [i · features, (i + 1) · features)
  std::vector<std::uint8_t> labels;

  std::size_t size() const noexcept { return labels.size(); }
  const float* input(std::size_t i) const noexcept { return inputs.data() + i * features; }
};

/// The parameters of make_cluster_problem().
struct cluster_problem_shape {
  std::size_t features;
  std::size_t classes;  // at most 256: labels are bytes
  std::size_t clusters_per_class;
  double center_spread;  // standard deviation of the centres' coordinates; the noise's is 1
};

struct cluster_problem {
  std::vector<float> centers;  // cluster c of class k at (k · clusters_per_class + c) · features
  dataset train, test;
};

/// Gaussian clusters: each class owns a few centres scattered over the space (so no
/// linear classifier separates the classes); a sample is one of its class's centres
/// plus unit noise. The same seed and purpose give the same problem on every rank.
inline cluster_problem make_cluster_problem(const cluster_problem_shape& shape, std::uint64_t seed,
                                            std::uint64_t purpose, std::size_t train_samples,
                                            std::size_t test_samples) {
  cluster_problem p;
  random_stream random(seed, purpose);
  p.centers.resize(shape.classes * shape.clusters_per_class * shape.features);
  for (float& c : p.centers) c = float(shape.center_spread * random.normal());
  auto draw = [&](std::size_t samples) {
    dataset d;
    d.features = shape.features;
    d.inputs.resize(samples * shape.features);
    d.labels.resize(samples);
    for (std::size_t i = 0; i < samples; ++i) {
      const std::size_t label = random.below(shape.classes);
      const std::size_t cluster = label * shape.clusters_per_class + random.below(shape.clusters_per_class);
      for (std::size_t f = 0; f < shape.features; ++f)
        d.inputs[i * shape.features + f] = p.centers[cluster * shape.features + f] + float(random.normal());
      d.labels[i] = std::uint8_t(label);
    }
    return d;
  };
  p.train = draw(train_samples);
  p.test = draw(test_samples);
  return p;
}

}  // namespace qcoll_examples
