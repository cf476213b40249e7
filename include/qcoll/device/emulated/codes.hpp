#pragma once
/// @file
/// The emulated device's error codes: CUDA's numbers for the same conditions, so a
/// message reads the same on either runtime, and its words for them.

namespace qcoll::device::emulated_detail {

enum code : int {
  success = 0,
  invalid_value = 1,       ///< cudaErrorInvalidValue: a bad argument (a host pointer where device memory is due)
  out_of_memory = 2,       ///< cudaErrorMemoryAllocation
  invalid_device = 101,    ///< cudaErrorInvalidDevice
  invalid_handle = 400,    ///< cudaErrorInvalidResourceHandle: an unknown stream or event, a stale IPC handle
  not_ready = 600,         ///< cudaErrorNotReady
  illegal_address = 700,   ///< cudaErrorIllegalAddress: work that reaches past an allocation
  injected = 999,          ///< a failure injected by a test (device::emulated_faults)
};

inline const char* words(int value) noexcept {
  switch (value) {
    case success: return "no error";
    case invalid_value: return "invalid argument (emulated device)";
    case out_of_memory: return "out of memory (emulated device)";
    case invalid_device: return "invalid device ordinal (emulated device)";
    case invalid_handle: return "invalid resource handle: unknown, destroyed or stale (emulated device)";
    case not_ready: return "device not ready (emulated device)";
    case illegal_address: return "an illegal memory access was encountered (emulated device)";
    case injected: return "a failure injected by a test (emulated device)";
    default: return "unknown error (emulated device)";
  }
}

}  // namespace qcoll::device::emulated_detail
