// Reduce-by-key on the device (accumulate.cuh).
#include "accumulate.cuh"
#include "common.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <stdexcept>

namespace polyprobe::cuda {
namespace {

using launch::thread_index;
using launch::thread_stride;

// Narrow rows: a lane per row. Lanes of a warp whose rows share a key are peers; the lowest
// adds the peers' rows (in lane order) and issues one atomic per column.
template <class S>
__global__ void scatter_narrow_kernel(int64_t n, const int64_t* keys, const S* values,
                                      int64_t width, S* out) {
  const int64_t stride = thread_stride();
  for (int64_t base = thread_index() - threadIdx.x % 32; base < n; base += stride) {
    const int64_t i = base + threadIdx.x % 32;
    const bool mine = i < n;
    const unsigned active = __ballot_sync(0xffffffffu, mine);
    if (!mine) continue;
    const int64_t key = keys[i];
    const unsigned peers = __match_any_sync(active, key);
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (__ffs(peers) - 1 != lane) continue;
    for (int64_t j = 0; j < width; ++j) {
      S sum = 0;
      for (unsigned p = peers; p != 0; p &= p - 1) {
        const int64_t row = base + (__ffs(p) - 1);
        sum += values[row * width + j];
      }
      atomicAdd(out + key * width + j, sum);
    }
  }
}

// Wide rows: a warp per run of rows, a lane per column; consecutive rows of one key are
// added before their atomics (sorted or clustered keys make fewer atomics).
template <class S>
__global__ void scatter_wide_kernel(int64_t n, const int64_t* keys, const S* values, int64_t width,
                                    S* out) {
  constexpr int64_t kRun = 8;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t first = (thread_index() / 32) * kRun; first < n; first += warps * kRun) {
    const int64_t last = first + kRun < n ? first + kRun : n;
    int64_t r = first;
    while (r < last) {
      const int64_t key = keys[r];
      int64_t end = r + 1;
      while (end < last && keys[end] == key) ++end;
      S* o = out + key * width;
      const bool vec4 = sizeof(S) == 4 && width % 4 == 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      if constexpr (sizeof(S) == 4) {
        if (vec4) {
          for (int64_t j = 4 * lane; j < width; j += 128) {
            float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
            for (int64_t q = r; q < end; ++q) {
              const float4 v = *reinterpret_cast<const float4*>(values + q * width + j);
              sum.x += v.x;
              sum.y += v.y;
              sum.z += v.z;
              sum.w += v.w;
            }
            atomicAdd(reinterpret_cast<float4*>(o + j), sum);
          }
          r = end;
          continue;
        }
      }
#endif
      (void)vec4;
      for (int64_t j = lane; j < width; j += 32) {
        S sum = 0;
        for (int64_t q = r; q < end; ++q) sum += values[q * width + j];
        atomicAdd(o + j, sum);
      }
      r = end;
    }
  }
}

__global__ void narrow_keys_kernel(int64_t n, const int64_t* keys, uint32_t* keys32,
                                   uint32_t* order) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    keys32[i] = static_cast<uint32_t>(keys[i]);
    order[i] = static_cast<uint32_t>(i);
  }
}

// offsets[k] = the first sorted position of key k (keys sorted): a binary search per key.
__global__ void segment_offsets_kernel(int64_t n, const uint32_t* sorted, int64_t n_keys,
                                       int64_t* offsets) {
  for (int64_t k = thread_index(); k <= n_keys; k += thread_stride()) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<int64_t>(sorted[mid]) < k)
        lo = mid + 1;
      else
        hi = mid;
    }
    offsets[k] = lo;
  }
}

// One thread per (key, column): the key's rows in input order, added to what out holds.
template <class S>
__global__ void segment_owner_kernel(const int64_t* offsets, const uint32_t* order, const S* values,
                                     int64_t width, int64_t n_keys, S* out) {
  const int64_t total = n_keys * width;
  for (int64_t t = thread_index(); t < total; t += thread_stride()) {
    const int64_t k = t / width, j = t % width;
    S sum = out[t];
    for (int64_t q = offsets[k]; q < offsets[k + 1]; ++q)
      sum += values[static_cast<int64_t>(order[q]) * width + j];
    out[t] = sum;
  }
}

int key_bits(int64_t n_keys) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < n_keys) ++bits;
  return bits;
}

template <class S>
void run_segment(int64_t n, const int64_t* keys, const S* values, int64_t width, int64_t n_keys,
                 S* out, AccumulateScratch& s, cudaStream_t stream) {
  if (n > int64_t{0xffffffff})
    throw std::invalid_argument("accumulate: segment takes at most 2^32 - 1 rows per call");
  const auto count = static_cast<std::size_t>(n);
  s.keys_in.reserve(count);
  s.keys_out.reserve(count);
  s.order_in.reserve(count);
  s.order_out.reserve(count);
  s.offsets.reserve(static_cast<std::size_t>(n_keys + 1));
  narrow_keys_kernel<<<launch::blocks(n), kThreads, 0, stream>>>(n, keys, s.keys_in.data(),
                                                                 s.order_in.data());
  launch::check_last("accumulate: key kernel");
  // A stable LSD radix sort over the bits the keys use: equal keys keep input order.
  std::size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, s.keys_in.data(), s.keys_out.data(),
                                        s.order_in.data(), s.order_out.data(), n, 0,
                                        key_bits(n_keys), stream),
        "accumulate: radix sort size");
  s.temp.reserve(temp_bytes);
  check(cub::DeviceRadixSort::SortPairs(s.temp.data(), temp_bytes, s.keys_in.data(),
                                        s.keys_out.data(), s.order_in.data(), s.order_out.data(), n,
                                        0, key_bits(n_keys), stream),
        "accumulate: radix sort");
  segment_offsets_kernel<<<launch::blocks(n_keys + 1), kThreads, 0, stream>>>(
      n, s.keys_out.data(), n_keys, s.offsets.data());
  launch::check_last("accumulate: offsets kernel");
  segment_owner_kernel<S><<<launch::blocks(n_keys * width), kThreads, 0, stream>>>(
      s.offsets.data(), s.order_out.data(), values, width, n_keys, out);
  launch::check_last("accumulate: owner kernel");
}

}  // namespace

AccumulateStrategy parse_accumulate_strategy(const std::string& name) {
  if (name == "scatter") return AccumulateStrategy::scatter;
  if (name == "segment") return AccumulateStrategy::segment;
  if (name == "auto") return AccumulateStrategy::automatic;
  throw std::invalid_argument("the cuda plugin has no accumulator strategy '" + name +
                              "' (strategies: scatter, segment, auto)");
}

const char* to_string(AccumulateStrategy strategy) {
  switch (strategy) {
    case AccumulateStrategy::scatter:
      return "scatter";
    case AccumulateStrategy::segment:
      return "segment";
    case AccumulateStrategy::automatic:
      return "auto";
  }
  return "?";
}

AccumulateStrategy resolve_strategy(AccumulateStrategy strategy, int64_t n, int64_t width,
                                    int64_t n_keys, bool single_precision) {
  if (strategy != AccumulateStrategy::automatic) return strategy;
  // From `bench accumulate --bench-device cuda` on the H200 (docs/benchmarks.md), 1e5 keys,
  // 62 and 900 rows per key: for rows of 64 values sort-then-own is 1.6x-2.1x faster than
  // the atomics (which contend per element) and deterministic; for rows of 3 the sort costs
  // more than the adds it spreads, and the warp-aggregated scatter is 1.7x-1.9x faster.
  (void)n;
  (void)n_keys;
  (void)single_precision;
  return width >= 16 ? AccumulateStrategy::segment : AccumulateStrategy::scatter;
}

template <class S>
AccumulateStrategy accumulate_on_device(AccumulateStrategy strategy, int64_t n, const int64_t* keys,
                                        const S* values, int64_t width, int64_t n_keys, S* out,
                                        AccumulateScratch& scratch, cudaStream_t stream) {
  const AccumulateStrategy run = resolve_strategy(strategy, n, width, n_keys, sizeof(S) == 4);
  if (n <= 0 || width <= 0) return run;
  if (run == AccumulateStrategy::segment) {
    run_segment<S>(n, keys, values, width, n_keys, out, scratch, stream);
  } else if (width >= 16) {
    const int64_t warps = (n + 7) / 8;
    scatter_wide_kernel<S>
        <<<launch::blocks(warps * 32), kThreads, 0, stream>>>(n, keys, values, width, out);
    launch::check_last("accumulate: scatter kernel");
  } else {
    scatter_narrow_kernel<S>
        <<<launch::blocks(n), kThreads, 0, stream>>>(n, keys, values, width, out);
    launch::check_last("accumulate: scatter kernel");
  }
  return run;
}

template AccumulateStrategy accumulate_on_device<float>(AccumulateStrategy, int64_t, const int64_t*,
                                                        const float*, int64_t, int64_t, float*,
                                                        AccumulateScratch&, cudaStream_t);
template AccumulateStrategy accumulate_on_device<double>(AccumulateStrategy, int64_t,
                                                         const int64_t*, const double*, int64_t,
                                                         int64_t, double*, AccumulateScratch&,
                                                         cudaStream_t);

}  // namespace polyprobe::cuda
