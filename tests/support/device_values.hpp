#pragma once
// Values to and from device memory, for the device tests (device_kernel_tests.cpp,
// device_tests.cpp): through the active device runtime, waiting for each copy.

#include <qcoll/execution/device_memory.hpp>
#include <qcoll/execution/dispatch.hpp>

#include <span>
#include <vector>

namespace qcoll::test {

template <class T>
execution::device_memory<T> on_device(const std::vector<T>& values) {
  execution::device_memory<T> memory(values.size());
  memory.upload(values);
  return memory;
}

template <class T>
std::vector<T> to_host(const execution::device_memory<T>& memory) {
  std::vector<T> values(memory.size());
  memory.download(values);
  return values;
}

/// Any span of device memory (a plan's residual, say), copied on the default stream.
template <class T>
std::vector<T> to_host(std::span<const T> device_values) {
  std::vector<T> values(device_values.size());
  if (values.empty()) return values;
  const device::runtime& runtime = execution::device_runtime("to_host");
  execution::check_device(runtime, runtime.copy(values.data(), device_values.data(), device_values.size_bytes(), nullptr),
                          "to_host");
  execution::check_device(runtime, runtime.synchronize(nullptr), "to_host");
  return values;
}

}  // namespace qcoll::test
