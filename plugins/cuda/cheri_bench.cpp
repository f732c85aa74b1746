// `polyprobe bench cheri` inside the cuda plugin: the Cheri block forward (cheri_block.hpp)
// at each batch size and input type, timed with CUDA events on one stream (cold call with the
// weight cast, then warm-up, then timed calls; median and interquartile range), its largest
// difference from the float32 FMA path on the same input, and the two ceilings its floors
// come from: a cuBLAS bf16 GEMM (8192^3, float32 accumulation) and a device-to-device copy.
#include "cheri_bench.hpp"

#include "cheri_block.hpp"
#include "device.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace polyprobe::cuda {
namespace {

using nlohmann::json;

std::size_t sz(int64_t n) { return static_cast<std::size_t>(n); }

class EventPair {
 public:
  EventPair() {
    check(cudaEventCreate(&start_), "cudaEventCreate");
    check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventPair() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  // Milliseconds of device time `work` enqueues on `stream`.
  double time(const std::function<void()>& work, cudaStream_t stream) {
    check(cudaEventRecord(start_, stream), "cudaEventRecord");
    work();
    check(cudaEventRecord(stop_, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

// The first call (cold), warm-up calls for at least `warmup_ms` of wall time, then `repeats`
// timed calls, as the host's bench records hold them.
json timing(const std::function<void()>& work, cudaStream_t stream, int repeats, double warmup_ms) {
  EventPair events;
  json r;
  r["cold_ms"] = events.time(work, stream);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0;
       i < 3 ||
       std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() <
           warmup_ms;
       ++i)
    events.time(work, stream);
  std::vector<double> times;
  times.reserve(sz(repeats));
  for (int i = 0; i < repeats; ++i) times.push_back(events.time(work, stream));
  r["median_ms"] = percentile(times, 0.5);
  r["iqr_ms"] = percentile(times, 0.75) - percentile(times, 0.25);
  r["min_ms"] = *std::min_element(times.begin(), times.end());
  r["max_ms"] = *std::max_element(times.begin(), times.end());
  r["reps"] = repeats;
  r["times_ms"] = times;
  return r;
}

// Uniform values of variance 1 from a 64-bit LCG: fast enough for 10^8 inputs.
void fill_random(std::vector<double>& v, uint64_t seed, double scale = 1.0) {
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (double& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    const double u = static_cast<double>(s >> 11) * 0x1.0p-53;  // [0, 1)
    x = scale * std::sqrt(3.0) * (2.0 * u - 1.0);
  }
}

// TFLOP/s of a cuBLAS bf16 GEMM, m = n = k = 8192, float32 accumulation, on random data.
json measure_tensor_peak(cudaStream_t stream, int repeats) {
  const int64_t m = 8192;
  std::vector<double> host(sz(m * m));
  fill_random(host, 7);
  DeviceBuffer<double> wide;
  wide.upload(host.data(), host.size(), stream);
  DeviceBuffer<uint16_t> a(host.size()), b(host.size()), c(host.size());
  convert_from_f64(wide.data(), CheriInput::bf16, a.data(), m * m, stream);
  convert_from_f64(wide.data(), CheriInput::bf16, b.data(), m * m, stream);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  wide.resize(0);
  Blas blas(stream);
  const float one = 1.0f, zero = 0.0f;
  const int n = static_cast<int>(m);
  json r = timing(
      [&] {
        check(cublasGemmEx(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a.data(),
                           CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n, &zero, c.data(), CUDA_R_16BF,
                           n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      },
      stream, repeats, 300.0);
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(m) * static_cast<double>(m);
  r["workload"] = "bf16 GEMM 8192^3 (cuBLAS, float32 accumulation)";
  r["path"] = "tensor peak";
  r["dtype"] = "bf16";
  r["flops"] = flops;
  r["tflops"] = flops / (r["median_ms"].get<double>() * 1e9);
  return r;
}

// GB/s of a 1 GiB device-to-device copy, counting bytes read plus bytes written.
json measure_copy_bandwidth(cudaStream_t stream, int repeats) {
  const std::size_t bytes = std::size_t{1} << 30;
  DeviceBuffer<uint8_t> from(bytes), to(bytes);
  check(cudaMemsetAsync(from.data(), 1, bytes, stream), "cudaMemsetAsync");
  json r = timing(
      [&] {
        check(cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync");
      },
      stream, repeats, 200.0);
  r["workload"] = "device copy 1 GiB";
  r["path"] = "copy bandwidth";
  r["dtype"] = "bytes";
  r["gbps"] = 2.0 * static_cast<double>(bytes) / (r["median_ms"].get<double>() * 1e6);
  return r;
}

CheriInput parse_input(const std::string& name) {
  if (name == "float32") return CheriInput::f32;
  if (name == "bf16") return CheriInput::bf16;
  if (name == "fp16") return CheriInput::f16;
  throw std::invalid_argument("bench cheri: unknown dtype '" + name +
                              "' (dtypes: float32, bf16, fp16)");
}

// The tensor-core operand type for an input type: its own for bf16 and fp16, bf16 for float32.
CheriMlp fast_mlp(CheriInput t) { return t == CheriInput::f16 ? CheriMlp::f16 : CheriMlp::bf16; }

json run_cheri(const json& options) {
  for (const auto& [key, value] : options.items())
    if (key != "batches" && key != "dtypes" && key != "repeats" && key != "length" &&
        key != "channels" && key != "dilation" && key != "expansion")
      throw std::invalid_argument("bench cheri: unknown option '" + key + "'");
  const std::vector<int64_t> batches = options.value("batches", std::vector<int64_t>{16, 64, 512});
  const std::vector<std::string> dtypes =
      options.value("dtypes", std::vector<std::string>{"float32", "bf16", "fp16"});
  const int repeats = options.value("repeats", 50);
  CheriShape shape;
  shape.length = options.value("length", int64_t{1024});
  shape.channels = options.value("channels", int64_t{128});
  shape.dilation = options.value("dilation", int64_t{4});
  shape.hidden = options.value("expansion", int64_t{2}) * shape.channels;
  if (repeats < 1) throw std::invalid_argument("bench cheri: repeats must be at least 1");
  for (const int64_t n : batches)
    if (n < 1) throw std::invalid_argument("bench cheri: batch sizes must be positive");

  Stream stream(nullptr);
  cudaStream_t s = stream.get();
  json records = json::array();
  records.push_back(measure_tensor_peak(s, repeats));
  records.push_back(measure_copy_bandwidth(s, repeats));

  const int64_t C = shape.channels, H = shape.hidden, L = shape.length;
  std::vector<double> params(sz(3 * C + 2 * H * C));
  fill_random(params, 3, 1.0 / std::sqrt(static_cast<double>(C)));
  const std::string workload = "cheri L=" + std::to_string(L) + " C=" + std::to_string(C) +
                               " d=" + std::to_string(shape.dilation) +
                               " e=" + std::to_string(H / C);
  for (const int64_t n : batches) {
    const int64_t count = n * L * C;
    std::vector<double> host(sz(count));
    fill_random(host, 11 + static_cast<uint64_t>(n));
    DeviceBuffer<double> wide;
    wide.upload(host.data(), host.size(), s);
    for (const std::string& name : dtypes) {
      const CheriInput input = parse_input(name);
      DeviceBuffer<uint8_t> x(sz(count) * element_bytes(input)), y(x.size()), ref(x.size());
      convert_from_f64(wide.data(), input, x.data(), count, s);
      // Each path gets a kernel object of its own, so its cold call includes its weight cast.
      const auto record = [&](CheriMlp mlp, DeviceBuffer<uint8_t>& out, int teams) {
        CheriBlockKernel kernel(shape);
        kernel.set_max_teams(teams);
        kernel.set_weights(params.data(), s);
        json r = timing([&] { kernel.forward(input, mlp, x.data(), out.data(), n, s); }, s,
                        mlp == CheriMlp::f32 ? std::min(repeats, 10) : repeats, 100.0);
        r["workload"] = workload;
        r["path"] = kernel.path(mlp);
        r["mlp"] = to_string(mlp);
        r["dtype"] = name;
        r["batch"] = n;
        r["flops"] = 4.0 * static_cast<double>(n * L) * static_cast<double>(C * H);
        // x read by the statistics pass and by the fused pass, y written once.
        r["bytes"] = 3.0 * static_cast<double>(count * static_cast<int64_t>(element_bytes(input)));
        return r;
      };
      json exact = record(CheriMlp::f32, ref, 0);
      // One team per block: what the second team's overlap gains. Each tile's arithmetic is
      // the same whichever team runs it, so the outputs must agree bit for bit.
      json fast = record(fast_mlp(input), y, 0);
      DeviceBuffer<uint8_t> y1(x.size());
      json one_team = record(fast_mlp(input), y1, 1);
      {
        std::vector<uint8_t> p(x.size()), q(x.size());
        check(cudaMemcpy(p.data(), y1.data(), p.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        check(cudaMemcpy(q.data(), y.data(), q.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
        one_team["identical_to_auto_teams"] = p == q;
      }
      // The largest difference of the tensor-core output from the float32 path's.
      std::vector<double> a(sz(count)), b(sz(count));
      convert_to_f64(y.data(), input, wide.data(), count, s);
      check(cudaMemcpyAsync(a.data(), wide.data(), sz(count) * sizeof(double),
                            cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync");
      convert_to_f64(ref.data(), input, wide.data(), count, s);
      check(cudaMemcpyAsync(b.data(), wide.data(), sz(count) * sizeof(double),
                            cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync");
      stream.synchronize();
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::isfinite(a[i]) ? std::max(worst, std::abs(a[i] - b[i])) : INFINITY;
        scale = std::max(scale, std::abs(b[i]));
      }
      fast["max_abs_diff"] = worst;
      fast["max_rel_diff"] = worst / std::max(scale, 1e-30);
      fast["against"] = "the float32 FMA path on the same input";
      exact["max_abs_diff"] = 0.0;
      exact["against"] = "itself (checked against the core's forward in tests/cuda)";
      records.push_back(fast);
      records.push_back(one_team);
      records.push_back(exact);
      wide.upload(host.data(), host.size(), s);  // the comparison reused it
    }
  }
  return json{{"records", records}};
}

}  // namespace

std::string run_bench(const std::string& suite, const std::string& options_json) {
  const json options = options_json.empty() ? json::object() : json::parse(options_json);
  if (!options.is_object()) throw std::invalid_argument("bench options must be a JSON object");
  if (suite == "cheri") return run_cheri(options).dump();
  throw std::invalid_argument("the cuda plugin has no benchmark '" + suite +
                              "' (benchmarks: cheri)");
}

}  // namespace polyprobe::cuda
