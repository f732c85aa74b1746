// The cuda plugin's accumulator component (accumulator.hpp).
#include "accumulate.cuh"
#include "accumulator.hpp"
#include "common.cuh"
#include "device.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace polyprobe::cuda {
namespace {

// A counter-based hash (splitmix64): the benchmark's data from the seed and the index.
__device__ uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <class S>
__global__ void generate_kernel(uint64_t seed, int64_t n, int64_t width, int64_t n_keys,
                                int64_t* keys, S* values) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * width;
       i += stride) {
    if (i < n)
      keys[i] = static_cast<int64_t>(mix(seed ^ (2 * static_cast<uint64_t>(i))) %
                                     static_cast<uint64_t>(n_keys));
    const uint64_t bits = mix(seed ^ (2 * static_cast<uint64_t>(i) + 1)) >> 11;  // 53 bits
    values[i] = static_cast<S>(static_cast<double>(bits) * 0x1.0p-52 - 1.0);
  }
}

__global__ void key_range_kernel(int64_t n, const int64_t* keys, int64_t n_keys,
                                 unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (keys[i] < 0 || keys[i] >= n_keys) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

template <class S>
__global__ void difference_kernel(int64_t n, const S* a, const S* b, double* worst,
                                  double* largest) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double w = 0, l = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    w = fmax(w, fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    l = fmax(l, fabs(static_cast<double>(b[i])));
  }
  // Non-negative doubles order as their bit patterns.
  atomicMax(reinterpret_cast<unsigned long long*>(worst), __double_as_longlong(w));
  atomicMax(reinterpret_cast<unsigned long long*>(largest), __double_as_longlong(l));
}

// Events around queued work: elapsed milliseconds on the device.
class EventTimer {
 public:
  EventTimer() {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventTimer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(cudaStream_t s) { check(cudaEventRecord(start_, s), "cudaEventRecord"); }
  double stop(cudaStream_t s) {
    check(cudaEventRecord(stop_, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t start_{}, stop_{};
};

template <class S>
class DeviceAccumulator final : public Accumulator {
 public:
  explicit DeviceAccumulator(AccumulateStrategy strategy)
      : strategy_(strategy), last_(strategy), stream_(nullptr) {}

  void accumulate(int64_t n, const int64_t* keys, const pp_tensor& values, int64_t n_keys,
                  pp_tensor& out) override {
    const int32_t dtype = sizeof(S) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
    if (values.dtype != dtype || out.dtype != dtype)
      throw std::invalid_argument("accumulate: values and out must have this accumulator's dtype");
    if (values.device != out.device)
      throw std::invalid_argument("accumulate: values and out live on different devices");
    if (values.ndim != 2 || out.ndim != 2 || values.shape[0] != n || out.shape[0] != n_keys ||
        values.shape[1] != out.shape[1])
      throw std::invalid_argument("accumulate: values must be [n, width] and out [n_keys, width]");
    const int64_t width = values.shape[1];
    cudaStream_t s = stream_.get();
    if (values.device == PP_DEVICE_CPU) {
      for (int64_t i = 0; i < n; ++i)
        if (keys[i] < 0 || keys[i] >= n_keys)
          throw std::invalid_argument("accumulate: key " + std::to_string(keys[i]) + " of row " +
                                      std::to_string(i) + " is outside [0, " +
                                      std::to_string(n_keys) + ")");
      keys_d_.upload(keys, static_cast<std::size_t>(n), s);
      values_d_.upload(static_cast<const S*>(values.data), static_cast<std::size_t>(n * width), s);
      out_d_.upload(static_cast<const S*>(out.data), static_cast<std::size_t>(n_keys * width), s);
      last_ = accumulate_on_device<S>(strategy_, n, keys_d_.data(), values_d_.data(), width, n_keys,
                                      out_d_.data(), scratch_, s);
      check(cudaMemcpyAsync(out.data, out_d_.data(), sizeof(S) * n_keys * width,
                            cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync accumulate out to host");
      stream_.synchronize();
      return;
    }
    if (values.device != PP_DEVICE_CUDA)
      throw std::invalid_argument("accumulate: tensors must live on the host or a CUDA device");
    check(cudaSetDevice(values.device_index), "cudaSetDevice");
    check_keys_on_device(n, keys, n_keys);
    last_ = accumulate_on_device<S>(strategy_, n, keys, static_cast<const S*>(values.data), width,
                                    n_keys, static_cast<S*>(out.data), scratch_, s);
    stream_.synchronize();
  }

  const char* last_strategy() const override { return to_string(last_); }

  const char* device_benchmark(const pp_accumulate_benchmark& spec) override {
    if (spec.n_keys <= 0 || spec.n_rows <= 0 || spec.width <= 0 || spec.repeats < 1)
      throw std::invalid_argument("device_benchmark: sizes and repeats must be positive");
    cudaStream_t s = stream_.get();
    const auto rows = static_cast<std::size_t>(spec.n_rows);
    const auto cells = static_cast<std::size_t>(spec.n_rows * spec.width);
    const auto out_cells = static_cast<std::size_t>(spec.n_keys * spec.width);
    DeviceBuffer<int64_t> keys(rows);
    DeviceBuffer<S> values(cells), out(out_cells), reference(out_cells);
    generate_kernel<S><<<launch::blocks(static_cast<int64_t>(cells)), kThreads, 0, s>>>(
        spec.seed, spec.n_rows, spec.width, spec.n_keys, keys.data(), values.data());
    launch::check_last("device_benchmark: generate kernel");
    EventTimer timer;
    auto once = [&](AccumulateStrategy strategy, S* into) {
      check(cudaMemsetAsync(into, 0, out_cells * sizeof(S), s), "cudaMemsetAsync");
      timer.start(s);
      last_ = accumulate_on_device<S>(strategy, spec.n_rows, keys.data(), values.data(), spec.width,
                                      spec.n_keys, into, scratch_, s);
      return timer.stop(s);
    };
    const double cold = once(strategy_, out.data());
    std::vector<double> times, copies;
    for (int32_t r = 0; r < spec.repeats; ++r) times.push_back(once(strategy_, out.data()));
    const AccumulateStrategy used = last_;
    const std::size_t copy_bytes = std::min<std::size_t>(cells * sizeof(S), std::size_t{1} << 32);
    {
      DeviceBuffer<unsigned char> target(copy_bytes);
      for (int32_t r = 0; r < spec.repeats; ++r) {
        timer.start(s);
        check(
            cudaMemcpyAsync(target.data(), values.data(), copy_bytes, cudaMemcpyDeviceToDevice, s),
            "cudaMemcpyAsync device to device");
        copies.push_back(timer.stop(s));
      }
    }
    once(AccumulateStrategy::segment, reference.data());
    last_ = used;
    DeviceBuffer<double> stats(2);
    check(cudaMemsetAsync(stats.data(), 0, 2 * sizeof(double), s), "cudaMemsetAsync");
    difference_kernel<S><<<launch::blocks(static_cast<int64_t>(out_cells)), kThreads, 0, s>>>(
        static_cast<int64_t>(out_cells), out.data(), reference.data(), stats.data(),
        stats.data() + 1);
    launch::check_last("device_benchmark: difference kernel");
    double host_stats[2] = {0, 0};
    check(cudaMemcpyAsync(host_stats, stats.data(), sizeof(host_stats), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync stats");
    stream_.synchronize();
    std::ostringstream j;
    j.precision(9);
    auto list = [&](const std::vector<double>& v) {
      j << "[";
      for (std::size_t i = 0; i < v.size(); ++i) j << (i ? "," : "") << v[i];
      j << "]";
    };
    j << "{\"strategy_used\":\"" << to_string(used) << "\",\"cold_ms\":" << cold
      << ",\"times_ms\":";
    list(times);
    j << ",\"copy_times_ms\":";
    list(copies);
    j << ",\"value_bytes\":" << cells * sizeof(S) << ",\"key_bytes\":" << rows * sizeof(int64_t)
      << ",\"copy_bytes\":" << copy_bytes << ",\"max_abs_diff\":" << host_stats[0]
      << ",\"max_abs_sum\":" << host_stats[1] << "}";
    json_ = j.str();
    return json_.c_str();
  }

 private:
  void check_keys_on_device(int64_t n, const int64_t* keys, int64_t n_keys) {
    cudaStream_t s = stream_.get();
    const unsigned long long none = ~0ULL;
    bad_d_.upload(&none, 1, s);
    key_range_kernel<<<launch::blocks(n), kThreads, 0, s>>>(n, keys, n_keys, bad_d_.data());
    launch::check_last("accumulate: key range kernel");
    unsigned long long bad = none;
    check(cudaMemcpyAsync(&bad, bad_d_.data(), sizeof(bad), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync key check");
    stream_.synchronize();
    if (bad != none)
      throw std::invalid_argument("accumulate: the key of row " + std::to_string(bad) +
                                  " is outside [0, " + std::to_string(n_keys) + ")");
  }

  AccumulateStrategy strategy_, last_;
  Stream stream_;
  DeviceBuffer<int64_t> keys_d_;
  DeviceBuffer<S> values_d_, out_d_;
  DeviceBuffer<unsigned long long> bad_d_;
  AccumulateScratch scratch_;
  std::string json_;
};

}  // namespace

std::unique_ptr<Accumulator> make_accumulator(const std::string& strategy, int32_t dtype) {
  const AccumulateStrategy parsed = parse_accumulate_strategy(strategy);
  if (dtype == PP_DTYPE_F32) return std::make_unique<DeviceAccumulator<float>>(parsed);
  if (dtype == PP_DTYPE_F64) return std::make_unique<DeviceAccumulator<double>>(parsed);
  throw std::invalid_argument("the cuda accumulator takes float32 or float64 values");
}

}  // namespace polyprobe::cuda
