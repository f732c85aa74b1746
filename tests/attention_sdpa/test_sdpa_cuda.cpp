// The attention_sdpa plugin's CUDA "sdpa" operation against the float64 reference, on random
// shapes, masks, layouts and argmax ties. Without a usable CUDA device (the plugin then
// offers no CUDA operation) each case exits with 77, which ctest reports as skipped.
#include "attention_sdpa/sdpa_reference.hpp"

#include <polyprobe/operations.hpp>
#include <polyprobe/registry.hpp>

#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>

namespace polyprobe::test {
namespace {

const pp_sdpa_table& cuda_sdpa(int32_t dtype) {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();
    r->load_directories({PluginRegistry::executable_plugin_dir()});
    return r;
  }();
  const PluginInfo* info = registry->find("attention_sdpa");
  if (info == nullptr || !info->available)
    FAIL("the attention_sdpa plugin is not available (build the attention_sdpa target)");
  const OperationTable::Entry* e = registry->operations().find("sdpa", PP_DEVICE_NAME_CUDA, dtype);
  if (e == nullptr) {
    std::cerr << "skipped: attention_sdpa offers no CUDA sdpa here (" << info->reason << ")\n";
    std::exit(77);
  }
  return *static_cast<const pp_sdpa_table*>(e->op->table);
}

template <class S>
struct DeviceCopy {
  explicit DeviceCopy(const std::vector<S>& host) : n(host.size()) {
    REQUIRE(cudaMalloc(&data, n * sizeof(S)) == cudaSuccess);
    REQUIRE(cudaMemcpy(data, host.data(), n * sizeof(S), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(data); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  std::vector<S> read() const {
    std::vector<S> host(n);
    REQUIRE(cudaMemcpy(host.data(), data, n * sizeof(S), cudaMemcpyDeviceToHost) == cudaSuccess);
    return host;
  }
  std::size_t n;
  S* data = nullptr;
};

template <class S>
void check_cuda(double tolerance) {
  const pp_sdpa_table& op = cuda_sdpa(sizeof(S) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64);
  std::mt19937_64 rng(sizeof(S) * 77);
  for (int trial = 0; trial < 120; ++trial) {
    SdpaProblem<S> p = random_problem<S>(rng, trial < 110 ? 40 : 1024);
    INFO("trial " << trial << ": q_len " << p.args.q_len << " kv_len " << p.args.kv_len
                  << " head_dim " << p.args.head_dim << " causal " << p.args.causal
                  << (p.args.weighting == PP_SDPA_ARGMAX ? " argmax" : " softmax"));
    const std::vector<double> want = reference_sdpa<S>(p.args);
    DeviceCopy<S> q(p.q), k(p.k), v(p.v), out(p.out);
    pp_sdpa_args a = p.args;
    a.q = q.data, a.k = k.data, a.v = v.data, a.out = out.data;
    pp_error err{};
    REQUIRE(op.run(&a, &err) == PP_OK);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<S> got = out.read();
    double worst = 0;
    for (std::size_t e = 0; e < got.size(); ++e) {
      if (static_cast<int64_t>(e) % a.out_strides[3] >= a.v_dim) {
        CHECK(got[e] == S(-7));
        continue;
      }
      worst = std::max(worst, std::abs(got[e] - want[e]) / std::max(1.0, std::abs(want[e])));
    }
    CHECK(worst < tolerance);
  }
}

TEST_CASE("sdpa cuda: float64 matches the reference", "[attention_sdpa][cuda]") {
  check_cuda<double>(1e-12);
}

TEST_CASE("sdpa cuda: float32 matches the float64 reference to 1e-5", "[attention_sdpa][cuda]") {
  check_cuda<float>(1e-5);
}

// Not a test: the timing `polyprobe bench attention` cannot take (the host app does not link
// the CUDA runtime), run by name on the GPU machine:
//   build/bin/test_attention_sdpa_cuda "[.bench]"
// 16 candidates x batch 16, E = 64, 4 heads, float32, L = 6, 64, 128, 1024: the median of 20
// calls after 5 warm-up calls, by CUDA events; bench/torch_sdpa.py --device cuda is its
// PyTorch counterpart.
TEST_CASE("sdpa cuda: timing at the bench attention shapes", "[.bench]") {
  const pp_sdpa_table& op = cuda_sdpa(PP_DTYPE_F32);
  const int64_t problems = 256, heads = 4, hd = 16;
  for (const int64_t len : {int64_t{6}, int64_t{64}, int64_t{128}, int64_t{1024}}) {
    const auto n = static_cast<std::size_t>(problems * heads * len * hd);
    std::vector<float> host(n);
    std::mt19937_64 rng(static_cast<uint64_t>(len));
    std::normal_distribution<float> gauss;
    for (float& x : host) x = gauss(rng);
    DeviceCopy<float> q(host), k(host), v(host), out(host);
    pp_sdpa_args a{};
    a.struct_size = sizeof(a);
    a.dtype = PP_DTYPE_F32;
    a.weighting = PP_SDPA_SOFTMAX;
    a.b0 = 16, a.b1 = 16, a.heads = heads;
    a.q_len = a.kv_len = len, a.head_dim = a.v_dim = hd;
    a.scale = 0.25;
    const int64_t st[4] = {16 * heads * len * hd, heads * len * hd, len * hd, hd};
    for (int i = 0; i < 4; ++i)
      a.q_strides[i] = a.k_strides[i] = a.v_strides[i] = a.out_strides[i] = st[i];
    a.q = q.data, a.k = k.data, a.v = v.data, a.out = out.data;
    pp_error err{};
    cudaEvent_t start = nullptr, stop = nullptr;
    REQUIRE(cudaEventCreate(&start) == cudaSuccess);
    REQUIRE(cudaEventCreate(&stop) == cudaSuccess);
    std::vector<float> ms;
    for (int rep = 0; rep < 25; ++rep) {
      REQUIRE(cudaEventRecord(start) == cudaSuccess);
      REQUIRE(op.run(&a, &err) == PP_OK);
      REQUIRE(cudaEventRecord(stop) == cudaSuccess);
      REQUIRE(cudaEventSynchronize(stop) == cudaSuccess);
      float t = 0;
      REQUIRE(cudaEventElapsedTime(&t, start, stop) == cudaSuccess);
      if (rep >= 5) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::cout << "sdpa cuda float32 softmax L=" << len << " E=64 heads=4, 256 problems: median "
              << ms[ms.size() / 2] << " ms (min " << ms.front() << ", max " << ms.back() << ")\n";
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
}

}  // namespace
}  // namespace polyprobe::test
