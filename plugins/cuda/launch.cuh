// Launch geometry of the plugin's grid-stride kernels: one 1-D grid of at most 2^31 - 1
// blocks, each thread striding over the items past it.
#pragma once

#include <cstdint>

namespace polyprobe::cuda::launch {

// Blocks of `threads` covering `n` items: at least 1, at most 2^31 - 1.
inline unsigned blocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647 ? 2147483647 : b));
}

#ifdef __CUDACC__
__device__ inline int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
#endif

}  // namespace polyprobe::cuda::launch
