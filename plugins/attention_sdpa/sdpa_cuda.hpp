// The CUDA implementation of the "sdpa" operation (operations.h). Compiled only when the
// build has CUDA (POLYPROBE_SDPA_CUDA); the plugin then links the shared CUDA runtime.
#pragma once

#include <polyprobe/plugin/abi.h>

namespace polyprobe::attention_sdpa {

// The largest head_dim and v_dim the kernel serves (a thread keeps its row in registers).
constexpr int64_t kCudaMaxDim = 128;

// Queues `args` (device pointers) on args.stream. Throws std::invalid_argument on arguments
// check_args rejects or head sizes above 128, std::runtime_error on a CUDA error.
void run_cuda(const pp_sdpa_args& args);

}  // namespace polyprobe::attention_sdpa
