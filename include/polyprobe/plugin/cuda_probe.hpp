// For plugins with CUDA parts: whether this machine has a usable CUDA device, for a plugin's or
// an operation's probe (a CPU operation of the same plugin stays usable when it has none).
// Include it only from sources compiled with the CUDA toolkit's headers; the rest of the SDK
// needs no CUDA.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace pp {

// Empty when the CUDA runtime sees at least one device, else why not ("no CUDA device: " and
// the runtime's reason, e.g. a driver older than the runtime).
inline std::string cuda_unusable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device";
  return {};
}

}  // namespace pp
