// Data-parallel training of a small MLP classifier, done twice from the same start on
// the same data: once averaging the gradients with the exact allreduce, once with the
// 1-bit compressed allreduce (error feedback). The compressed run has one plan per
// layer and starts each layer's exchange as soon as backprop has produced its gradient,
// so the exchanges of the last layers overlap the backward pass of the first ones.
// Rank 0 prints both learning curves and how far the 1-bit run's test accuracy falls
// short of the exact run's.
//
//   qcoll-run -n 4 data_parallel_training                          # shared memory
//   qcoll-run -n 4 --transport tcp -- data_parallel_training --epochs 5 --seed 2
//
// Options: --epochs N, --seed S, --samples N (training set), --test-samples N,
// --hidden N (units in each of the two hidden layers), --batch N (global, split over
// the ranks), --lr X (peak learning rate), --reconstruction current|previous (where
// the 1-bit reconstruction values come from: this step's values, qcoll's default, or
// the previous step's, as the 1-bit SGD patent's eqs. 13–15 say).
// Exit status: 0 when the 1-bit run's test accuracy is at most 0.5 percentage points
// below the exact run's, 1 when it is further below, 2 on errors.

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <fmt/format.h>

#include "data_parallel.hpp"
#include "launched_main.hpp"
#include "mlp_classifier.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace {

using qcoll_examples::mlp;
using qcoll_examples::settings;

/// The exact exchange: one allreduce of the whole gradient once backprop is done.
template <class Communicator>
class exact_exchange {
 public:
  static constexpr std::string_view name = "exact allreduce";

  exact_exchange(Communicator& comm, mlp& model, const settings&) : comm_(comm), model_(model) {}
  void layer_done(std::size_t) {}
  void finish() { comm_.allreduce(model_.gradients(), qcoll::reduce_op::avg); }
  /// The ring's reduce-scatter and all-gather each send (n − 1)/n of the buffer.
  std::size_t bytes_sent_per_step() const {
    const std::size_t n = comm_.size();
    return 2 * (n - 1) * sizeof(float) * model_.gradients().size() / n;
  }

 private:
  Communicator& comm_;
  mlp& model_;
};

/// The 1-bit exchange: a plan per layer (its residuals belong to that gradient), each
/// started the moment its layer's gradient is final; they run on the communicator's
/// progress thread in start order while backprop goes on.
template <class Communicator>
class one_bit_exchange {
 public:
  static constexpr std::string_view name = "1-bit compressed allreduce";
  using plan = qcoll::compressed_allreduce_plan<qcoll::quantizers::one_bit>;

  one_bit_exchange(Communicator& comm, mlp& model, const settings& s) : comm_(comm), model_(model) {
    for (std::size_t l = 0; l < model.layers(); ++l)
      plans_.emplace_back(comm, model.layer_gradients(l).size(),
                          qcoll::quantizers::one_bit({.reconstruction_from = s.reconstruction_from}));
  }
  void layer_done(std::size_t l) { comm_.start_allreduce(plans_[l], model_.layer_gradients(l), qcoll::reduce_op::avg); }
  void finish() {
    for (plan& p : plans_) p.wait();
  }
  /// As counted by the last calls.
  std::size_t bytes_sent_per_step() const {
    std::size_t total = 0;
    for (const plan& p : plans_) total += p.last_call().bytes_sent;
    return total;
  }

 private:
  Communicator& comm_;
  mlp& model_;
  std::vector<plan> plans_;  // one per layer
};

}  // namespace

int main(int argc, char** argv) {
  return qcoll_examples::launched_main(
      "data_parallel_training", argc, argv, qcoll_examples::parse, [](auto& comm, const settings& s, std::string_view transport) {
        return qcoll_examples::train_and_compare<exact_exchange, one_bit_exchange>(
            comm, s, transport, [&](const std::string& layer_sizes, const std::string& layer_groups, std::size_t group) {
              return fmt::format("1-bit: one plan per layer ({} values: {} groups of {}), each started as soon as "
                                 "backprop has produced its layer's gradient; reconstruction values from the {} step's "
                                 "values",
                                 layer_sizes, layer_groups, group,
                                 s.reconstruction_from == qcoll::quantizers::reconstruction_source::previous
                                     ? "previous"
                                     : "current");
            });
      });
}
