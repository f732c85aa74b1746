// The CPU implementation of the "sdpa" operation (operations.h): fused scaled-dot-product
// attention with an online softmax, one pass over Q, K and V per (b0, b1, head) problem.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <string>

namespace polyprobe::attention_sdpa {

// Why the CPU operation cannot run `args` as given (bad shapes, strides or pointers), or
// empty when it can. Shared by the CUDA operation, which checks the same things.
std::string check_args(const pp_sdpa_args& args, int32_t device);

// Runs `args` (checked) on the CPU: problems in parallel with oneTBB unless args.threads is
// 1. Throws std::invalid_argument on arguments check_args rejects.
void run_cpu(const pp_sdpa_args& args);

}  // namespace polyprobe::attention_sdpa
