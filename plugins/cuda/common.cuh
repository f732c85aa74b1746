// What every kernel file of the plugin shares: the error check (device.hpp), the launch
// geometry of its grid-stride kernels, and the properties of the device, probed once per
// device, that launches and shared-memory budgets read (nothing here assumes one GPU model).
#pragma once

#include "device.hpp"

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace polyprobe::cuda {

// Threads per block of the plugin's grid-stride kernels (a kernel with its own reason for
// another size names it beside the kernel).
inline constexpr int kThreads = 256;

namespace launch {

// Blocks of `threads` covering `n` items: at least 1, at most 2^31 - 1.
inline unsigned blocks(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b));
}

// After a launch: its configuration error, if any, as the exception check() throws.
inline void check_last(const char* what) { check(cudaGetLastError(), what); }

#ifdef __CUDACC__
__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
#endif

}  // namespace launch

// What the plugin reads of a device. Probed once per device (device_properties()).
struct DeviceProperties {
  int multiprocessors = 0;
  bool cooperative_launch = false;         // cudaLaunchCooperativeKernel is supported
  std::size_t shared_per_block = 0;        // without opting in (cudaFuncSetAttribute)
  std::size_t shared_per_block_optin = 0;  // the most a kernel may opt in to
  std::size_t shared_per_multiprocessor = 0;
};

// The current device's properties; the first call per device probes them (thread-safe).
inline const DeviceProperties& device_properties() {
  constexpr int kMaxDevices = 64;
  static std::array<DeviceProperties, kMaxDevices> probed;
  static std::array<std::once_flag, kMaxDevices> once;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device < 0 || device >= kMaxDevices)
    throw std::runtime_error("CUDA: device index out of range");
  const auto at = static_cast<std::size_t>(device);
  std::call_once(once[at], [&] {
    const auto attribute = [&](cudaDeviceAttr a) {
      int value = 0;
      check(cudaDeviceGetAttribute(&value, a, device), "cudaDeviceGetAttribute");
      return value;
    };
    DeviceProperties& p = probed[at];
    p.multiprocessors = attribute(cudaDevAttrMultiProcessorCount);
    p.cooperative_launch = attribute(cudaDevAttrCooperativeLaunch) != 0;
    p.shared_per_block = static_cast<std::size_t>(attribute(cudaDevAttrMaxSharedMemoryPerBlock));
    p.shared_per_block_optin =
        static_cast<std::size_t>(attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
    p.shared_per_multiprocessor =
        static_cast<std::size_t>(attribute(cudaDevAttrMaxSharedMemoryPerMultiprocessor));
  });
  return probed[at];
}

}  // namespace polyprobe::cuda
