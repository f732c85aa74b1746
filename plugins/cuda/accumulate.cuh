// Reduce-by-key on the device: out[keys[i], :] += values[i, :] (the core's Accumulator
// contract, accumulator.hpp), for the cuda plugin's accumulator component and its own
// reductions. All pointers are device memory; work is queued on `stream`.
//
// Strategies:
// - scatter: atomic adds, pre-aggregated within a warp (lanes whose rows share a key add
//   them first; wide rows go a warp per row, a lane per column, 4-wide float atomics on
//   sm_90). The order of the adds depends on scheduling, so the bits may change run to run.
// - segment: owner-computes. A stable radix sort groups the row indices by key; one thread
//   owns each (key, column) and adds that key's rows in input order: deterministic, and bit
//   for bit the core reference's sum.
// - auto: the one measured faster for the shape (docs/benchmarks.md, `bench accumulate`):
//   segment for rows of 16 values or more, scatter for narrower ones.
#pragma once

#include "device.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace polyprobe::cuda {

enum class AccumulateStrategy { scatter, segment, automatic };

// Parses "scatter", "segment" or "auto"; throws std::invalid_argument naming the others.
AccumulateStrategy parse_accumulate_strategy(const std::string& name);
const char* to_string(AccumulateStrategy strategy);

// What `auto` runs for n rows of `width` values over n_keys keys.
AccumulateStrategy resolve_strategy(AccumulateStrategy strategy, int64_t n, int64_t width,
                                    int64_t n_keys, bool single_precision);

// Scratch memory the segment strategy keeps between calls (grows only).
struct AccumulateScratch {
  DeviceBuffer<uint32_t> keys_in, keys_out, order_in, order_out;
  DeviceBuffer<int64_t> offsets;
  DeviceBuffer<unsigned char> temp;
};

// Keys must lie in [0, n_keys) (checked on the host by the caller). Returns the strategy
// that ran.
template <class S>
AccumulateStrategy accumulate_on_device(AccumulateStrategy strategy, int64_t n, const int64_t* keys,
                                        const S* values, int64_t width, int64_t n_keys, S* out,
                                        AccumulateScratch& scratch, cudaStream_t stream);

// The owner of one contiguous segment: a warp sums v[0..n) lane-strided, then a fixed
// shuffle tree, in double. The order is fixed, so the result does not depend on scheduling:
// the session's per-candidate loss sums (a segment reduction whose segments are contiguous)
// use it.
#ifdef __CUDACC__
template <class S>
__device__ inline double owner_warp_sum(const S* v, int64_t n, int lane) {
  double sum = 0.0;
  for (int64_t b = lane; b < n; b += 32) sum += static_cast<double>(v[b]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  return sum;
}
#endif

}  // namespace polyprobe::cuda
