// Data-parallel training with the gradients on the GPU, in bfloat16, done twice from the
// same start on the same data: once averaging them with the exact allreduce on device
// memory, once with the 1-bit compressed allreduce through a plan on device memory (its
// residuals and frames on the GPU; the GPU encodes and decodes, and only the frames,
// 32x smaller than the values, cross to the host and the network). Rank 0 prints both
// learning curves and how far the 1-bit run's test accuracy falls short of the exact
// run's, as data_parallel_training does on host memory (data_parallel.hpp).
//
// The model itself runs on the CPU (this example has no GPU kernels of its own): after
// each backward pass a rank copies its float gradient to device memory and rounds it to
// bfloat16 there, which is where a GPU framework keeps it; the exchange works on that
// device buffer, on the rank's own stream; the averaged gradient is widened back to
// float on the device and copied to the optimizer.
//
//   qcoll-run -n 2 gpu_data_parallel                                     # on a GPU (qcoll::cuda)
//   QCOLL_DEVICE=emulated qcoll-run -n 2 gpu_data_parallel --epochs 3    # without one: the emulated device
//
// Options: data_parallel_training's (--epochs, --seed, --samples, --test-samples,
// --hidden, --batch, --lr, --reconstruction). Exit status: 0 when the 1-bit run's test
// accuracy is at most 0.5 percentage points below the exact run's, 1 when it is
// further below, 2 on errors.

#include <qcoll/communicator.hpp>
#include <qcoll/compressed_allreduce.hpp>
// The emulated device, a CPU test double of the CUDA runtime: with it, QCOLL_DEVICE=emulated
// runs this example where there is no GPU (as CI does). A program for GPUs only leaves it out.
#include <qcoll/device/emulated/runtime.hpp>
#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/kernels.hpp>
#include <qcoll/launch/join_devices.hpp>
#include <qcoll/quantizers/one_bit.hpp>

#include <fmt/format.h>

#include "data_parallel.hpp"
#include "launched_main.hpp"
#include "mlp_classifier.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace {

using qcoll::bfloat16;
using qcoll::execution::device_stream;
using qcoll_examples::mlp;
using qcoll_examples::settings;

/// A rank's gradient on the device: a float copy, the bfloat16 buffer the exchange
/// reduces, and the stream every call is ordered on.
class device_gradient {
 public:
  explicit device_gradient(std::size_t count)
      : stream_("gpu_data_parallel"), wide_(count), narrow_(count) {}

  device_stream where() const noexcept { return {stream_.get()}; }
  std::span<bfloat16> values() const noexcept { return narrow_.span(); }

  /// The host's float gradient to the device, rounded to bfloat16 there.
  void from_host(std::span<const float> gradient) {
    wide_.upload(gradient);
    qcoll::execution::narrow<bfloat16>(where(), std::span<const float>(wide_.span()), narrow_.span());
  }
  /// The averaged bfloat16 gradient back to the host as float (exactly: widening).
  void to_host(std::span<float> gradient) {
    qcoll::execution::widen<bfloat16>(where(), std::span<const bfloat16>(narrow_.span()), wide_.span());
    const auto& runtime = qcoll::execution::device_runtime("gpu_data_parallel");
    qcoll::execution::check_device(runtime, runtime.synchronize(stream_.get()), "gpu_data_parallel");
    wide_.download(gradient);
  }

 private:
  qcoll::execution::device_stream_owner stream_;
  qcoll::execution::device_memory<float> wide_;
  qcoll::execution::device_memory<bfloat16> narrow_;
};

/// The exact exchange: one allreduce of the whole bfloat16 gradient on the device
/// (reduced in float, rounded once), once backprop is done.
template <class Communicator>
class exact_on_device {
 public:
  static constexpr std::string_view name = "exact allreduce (device)";

  exact_on_device(Communicator& comm, mlp& model, const settings&)
      : comm_(comm), model_(model), gradient_(model.gradients().size()) {}
  void layer_done(std::size_t) {}
  void finish() {
    gradient_.from_host(model_.gradients());
    comm_.allreduce(gradient_.where(), gradient_.values(), qcoll::reduce_op::avg);
    gradient_.to_host(model_.gradients());
  }
  /// The ring's reduce-scatter and all-gather each send (n − 1)/n of the buffer.
  std::size_t bytes_sent_per_step() const {
    const std::size_t n = comm_.size();
    return 2 * (n - 1) * sizeof(bfloat16) * model_.gradients().size() / n;
  }

 private:
  Communicator& comm_;
  mlp& model_;
  device_gradient gradient_;
};

/// The 1-bit exchange: one plan on device memory for the whole bfloat16 gradient.
template <class Communicator>
class one_bit_on_device {
 public:
  static constexpr std::string_view name = "1-bit compressed (device)";
  using plan = qcoll::compressed_allreduce_plan<qcoll::quantizers::one_bit, bfloat16, qcoll::execution::device_space>;

  one_bit_on_device(Communicator& comm, mlp& model, const settings& s)
      : comm_(comm), model_(model), gradient_(model.gradients().size()),
        plan_(gradient_.where(), comm, model.gradients().size(),
              qcoll::quantizers::one_bit({.reconstruction_from = s.reconstruction_from})) {}
  void layer_done(std::size_t) {}
  void finish() {
    gradient_.from_host(model_.gradients());
    comm_.allreduce(gradient_.where(), plan_, gradient_.values(), qcoll::reduce_op::avg);
    gradient_.to_host(model_.gradients());
  }
  std::size_t bytes_sent_per_step() const { return plan_.last_call().bytes_sent; }

 private:
  Communicator& comm_;
  mlp& model_;
  device_gradient gradient_;
  plan plan_;
};

/// How this program joins: launch::join_devices, so it also takes the CUDA peer transport.
struct joining_with_devices {
  template <class Fn>
  decltype(auto) operator()(Fn&& fn) const {
    return qcoll::launch::join_devices_from_environment(std::forward<Fn>(fn));
  }
};

}  // namespace

int main(int argc, char** argv) {
  // It also runs over the CUDA peer transport (qcoll-run --transport cuda_peer), GPU to
  // GPU; over shm or tcp its device calls are staged through host memory.
  return qcoll_examples::launched_main<joining_with_devices>(
      "gpu_data_parallel", argc, argv, qcoll_examples::parse, [](auto& comm, const settings& s, std::string_view transport) {
        if (comm.rank() == 0)
          fmt::print("gradients in bfloat16 on the {} device (QCOLL_DEVICE: cuda, or emulated without a GPU)\n",
                     qcoll::execution::device_runtime("gpu_data_parallel").name);
        return qcoll_examples::train_and_compare<exact_on_device, one_bit_on_device>(
            comm, s, transport, [&](const std::string&, const std::string& layer_groups, std::size_t group) {
              return fmt::format("1-bit: one plan on device memory for the whole gradient ({} groups of {} per "
                                 "layer), reconstruction values from the {} step's values",
                                 layer_groups, group,
                                 s.reconstruction_from == qcoll::quantizers::reconstruction_source::previous
                                     ? "previous"
                                     : "current");
            });
      });
}
