// Reduce-by-key on the CPU: out[keys[i], :] += values[i, :], three strategies.
//
//   scatter - threads add straight into `out` with atomic adds (std::atomic_ref): no extra
//             memory, but the order of additions, and so the last bits, vary from run to run;
//   segment - owner computes: a stable counting sort groups the contributions by key
//             (fixed chunking, so the order never depends on threads), then each key's sum is
//             formed in input order by one thread and added once; deterministic;
//   auto    - chooses from measurement (`polyprobe bench accumulate`, docs/benchmarks.md):
//             segment, which was never slower than scatter (choose_strategy).
#pragma once

#include <polyprobe/plugin/abi.h>

namespace polyprobe::cpu_tbb {

// Creates an accumulator of `strategy` for `dtype` (F32 or F64); throws std::invalid_argument.
void create_accumulator(const char* strategy, int32_t dtype, void** self,
                        const pp_accumulator_api** api);

}  // namespace polyprobe::cpu_tbb
