// The attention_sdpa plugin's CUDA "sdpa" operation against the float64 reference, on random
// shapes, masks, layouts and argmax ties. Without a usable CUDA device (the plugin then
// offers no CUDA operation) each case exits with 77, which ctest reports as skipped.
#include "attention_sdpa/sdpa_reference.hpp"

#include <polyprobe/operations.hpp>
#include <polyprobe/registry.hpp>

#include <cuda_runtime.h>
#include <catch2/catch.hpp>

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
  const OperationTable::Entry* e = registry->operations().find("sdpa", PP_DEVICE_CUDA, dtype);
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

}  // namespace
}  // namespace polyprobe::test
