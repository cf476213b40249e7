// qcoll._qcoll_torch: the Python bindings of the backend and the hook's communicator.
// Built with the pybind11 PyTorch itself bundles, so the objects handed to and from
// PyTorch (stores, backends, works) are PyTorch's own Python types.

#include "backend.hpp"

#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <string>

namespace py = pybind11;

namespace {

qcoll_torch::group_settings settings_of(const std::string& transport, std::chrono::milliseconds timeout,
                                       bool reproducible = false) {
  qcoll_torch::group_settings settings;
  settings.timeout = timeout;
  settings.reproducible = reproducible;
  if (transport.empty() || transport == "env") settings.transport = qcoll_torch::transport_from_environment();
  else if (const auto kind = qcoll::rendezvous::parse_transport(transport)) settings.transport = *kind;
  else throw std::invalid_argument("qcoll: transport '" + transport + "' is not one of env, " +
                                   qcoll::rendezvous::transport_names());
  return settings;
}

}  // namespace

PYBIND11_MODULE(_qcoll_torch, m) {
  py::module_::import("torch.distributed");  // PyTorch's Store, Backend and Work types
  m.doc() = "qcoll's torch.distributed backend and the DDP hook's communicator (use qcoll.torch)";
  m.attr("torch_version") = QCOLL_TORCH_VERSION;
  m.attr("cuda_built") = qcoll_torch::cuda_built();
  m.def("cuda_refusal", &qcoll_torch::cuda_refusal,
        "Why the backend and the hook cannot take CUDA tensors in this process, or None when they can");
  m.def("_stop_workers", &qcoll_torch::worker::stop_all, py::call_guard<py::gil_scoped_release>(),
        "Runs the queued calls and stops every worker thread (qcoll.torch calls it at exit)");

  py::class_<qcoll_torch::backend, c10d::Backend, c10::intrusive_ptr<qcoll_torch::backend>>(m, "Backend")
      .def_property_readonly("transport", &qcoll_torch::backend::transport_name)
      .def("bytes_sent", &qcoll_torch::backend::bytes_sent,
           "Bytes this rank has sent through its transport, measured where they leave");

  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
         const std::string& transport, bool reproducible) {
        const qcoll_torch::group_settings settings = settings_of(transport, timeout, reproducible);
        py::gil_scoped_release unlocked;  // the join waits for the other ranks
        return c10::make_intrusive<qcoll_torch::backend>(store, rank, size, settings);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("transport") = "env",
      py::arg("reproducible") = false);

  m.def(
      "reproducible_sum",
      [](const std::vector<at::Tensor>& addends, bool average) {
        return qcoll_torch::reproducible_sum(addends, average ? qcoll::reduce_op::avg : qcoll::reduce_op::sum);
      },
      py::arg("addends"), py::arg("average") = false,
      "The reproducible sum (or mean) of CPU tensors on this process: what a reproducible group's all_reduce "
      "gives when its ranks hold them");

  py::class_<qcoll_torch::compression>(m, "Compression")
      .def(py::init<>())
      .def_readwrite("quantizer", &qcoll_torch::compression::quantizer)
      .def_readwrite("group_size", &qcoll_torch::compression::group_size)
      .def_readwrite("bits", &qcoll_torch::compression::bits)
      .def_readwrite("error_feedback", &qcoll_torch::compression::error_feedback)
      .def_readwrite("reproducible", &qcoll_torch::compression::reproducible);

  m.def(
      "check_compression",
      [](const qcoll_torch::compression& settings) {
        try {
          qcoll_torch::check(settings);
        } catch (const qcoll::error& e) {
          if (e.code() == qcoll::errc::invalid_argument) throw py::value_error(e.what());
          throw;
        }
      },
      py::arg("compression"), "Raises ValueError, naming the value, for settings the quantizer refuses");

  py::class_<qcoll_torch::compressed_communicator>(m, "CompressedCommunicator")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& transport, bool reproducible) {
             const qcoll_torch::group_settings settings = settings_of(transport, timeout, reproducible);
             py::gil_scoped_release unlocked;
             return std::make_unique<qcoll_torch::compressed_communicator>(store, rank, size, settings);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("transport") = "env",
           py::arg("reproducible") = false)
      .def("allreduce", &qcoll_torch::compressed_communicator::allreduce, py::arg("key"), py::arg("tensor"),
           py::arg("compression"), py::call_guard<py::gil_scoped_release>())
      .def("average", &qcoll_torch::compressed_communicator::average, py::arg("tensor"),
           py::call_guard<py::gil_scoped_release>(),
           "The exact average of the tensor in place (reproducible when joined with reproducible=True)")
      .def_property_readonly("rank", &qcoll_torch::compressed_communicator::rank)
      .def_property_readonly("size", &qcoll_torch::compressed_communicator::size)
      .def_property_readonly("transport", &qcoll_torch::compressed_communicator::transport_name)
      .def("bytes_sent", &qcoll_torch::compressed_communicator::bytes_sent);
}
