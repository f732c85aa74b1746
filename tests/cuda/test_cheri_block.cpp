// The cuda plugin's Cheri block kernels (plugins/cuda/cheri_block.hpp) against the core's
// forward (core/layers/cheri.cpp) in float64, on random inputs and weights, at the seed's
// tolerances (max-abs: about 1e-5 with a float32 MLP, 3e-2 with bf16 operands, 4e-3 with
// fp16), every output element checked (outputs are poisoned with NaN first). The reference
// runs on the input as rounded to the input type, so a difference is the kernel's own (and
// the rounding of y to the input type: half an ulp of |y| ~ 4 is 8e-3 in bf16, 1e-3 in fp16,
// which is why a float32 MLP on bf16 / fp16 inputs gets those types' tolerances). Needs
// a CUDA device; without one each case says why and exits with 77 (ctest: skipped).
#include "cheri_block.hpp"

#include <polyprobe/model.hpp>

#include <cuda_runtime.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace polyprobe;
using cuda::CheriInput;
using cuda::CheriMlp;

namespace {

void require_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major >= 9) return;
    std::fprintf(stderr, "SKIPPED: device 0 (%s) is not sm_90 or newer\n", prop.name);
  } else {
    (void)cudaGetLastError();
    std::fprintf(stderr, "SKIPPED: no usable CUDA device: %s\n",
                 status == cudaSuccess ? "the runtime reports none" : cudaGetErrorString(status));
  }
  std::fflush(stderr);
  std::exit(77);
}

struct Problem {
  int64_t length, channels, expansion, dilation, examples;
};

struct Result {
  double max_abs = 0;
  bool all_finite = true;
};

// One forward of `p` in `input` with `mlp`, against the core's float64 forward on the same
// (rounded) input.
Result compare(const Problem& p, CheriInput input, CheriMlp mlp, uint64_t seed) {
  const auto factory = LayerFactory::with_builtins();
  const auto layer = factory.create(
      "cheri_block", nlohmann::json{{"dilation", p.dilation}, {"expansion", p.expansion}},
      Shape{{p.length, p.channels}});
  std::mt19937_64 rng(seed);
  std::vector<double> params(static_cast<std::size_t>(layer->parameter_count()));
  layer->initialize(params, rng);
  const int64_t per = p.length * p.channels, n = p.examples * per;
  std::normal_distribution<double> normal;
  std::vector<double> x(static_cast<std::size_t>(n));
  for (double& v : x) v = normal(rng);

  cuda::CheriBlockKernel kernel({p.length, p.channels, p.expansion * p.channels, p.dilation});
  cuda::DeviceBuffer<double> wide(static_cast<std::size_t>(n));
  cuda::DeviceBuffer<uint8_t> xd(static_cast<std::size_t>(n) * cuda::element_bytes(input));
  cuda::DeviceBuffer<uint8_t> yd(xd.size());
  wide.upload(x.data(), x.size(), nullptr);
  cuda::convert_from_f64(wide.data(), input, xd.data(), n, nullptr);
  cuda::convert_to_f64(xd.data(), input, wide.data(), n, nullptr);
  cuda::check(cudaMemcpy(x.data(), wide.data(), x.size() * sizeof(double), cudaMemcpyDeviceToHost),
              "cudaMemcpy");
  cuda::check(cudaMemset(yd.data(), 0xff, yd.size()), "cudaMemset");  // NaN in every type
  kernel.set_weights(params.data(), nullptr);
  kernel.forward(input, mlp, xd.data(), yd.data(), p.examples, nullptr);
  cuda::convert_to_f64(yd.data(), input, wide.data(), n, nullptr);
  std::vector<double> got(x.size());
  cuda::check(
      cudaMemcpy(got.data(), wide.data(), got.size() * sizeof(double), cudaMemcpyDeviceToHost),
      "cudaMemcpy");

  Matrix<double> in = Eigen::Map<const Matrix<double>>(x.data(), p.examples, per);
  Matrix<double> want(p.examples, per);
  layer->forward(in, std::span<const double>(params), want);
  Result r;
  for (int64_t e = 0; e < p.examples; ++e)
    for (int64_t i = 0; i < per; ++i) {
      const double g = got[static_cast<std::size_t>(e * per + i)];
      if (!std::isfinite(g)) r.all_finite = false;
      r.max_abs = std::max(r.max_abs, std::abs(g - want(e, i)));
    }
  return r;
}

void check_case(const Problem& p, CheriInput input, CheriMlp mlp, double tolerance, uint64_t seed) {
  const Result r = compare(p, input, mlp, seed);
  INFO("L " << p.length << " C " << p.channels << " e " << p.expansion << " dilation " << p.dilation
            << " N " << p.examples << " input " << cuda::to_string(input) << " mlp "
            << cuda::to_string(mlp) << ": max-abs " << r.max_abs);
  CHECK(r.all_finite);
  CHECK(r.max_abs <= tolerance);
}

}  // namespace

TEST_CASE("cuda cheri: the benchmark shape at the seed's tolerances", "[cuda][cheri]") {
  require_device();
  const Problem p{1024, 128, 2, 4, 5};
  check_case(p, CheriInput::f32, CheriMlp::f32, 1e-5, 1);
  check_case(p, CheriInput::f32, CheriMlp::bf16, 3e-2, 2);
  check_case(p, CheriInput::bf16, CheriMlp::bf16, 3e-2, 3);
  check_case(p, CheriInput::f16, CheriMlp::f16, 4e-3, 4);
  check_case(p, CheriInput::bf16, CheriMlp::f32, 3e-2, 5);
  check_case(p, CheriInput::f16, CheriMlp::f32, 4e-3, 6);
}

TEST_CASE("cuda cheri: partial tiles, other widths and dilations", "[cuda][cheri]") {
  require_device();
  // L not a multiple of the 64-row tile, a dilation past a tile, e = 1 and e = 3, C = 192 (one
  // team per block).
  for (const Problem& p :
       {Problem{100, 64, 2, 7, 3}, Problem{200, 64, 1, 70, 2}, Problem{130, 64, 3, 1, 2},
        Problem{64, 128, 1, 2, 1}, Problem{70, 192, 1, 3, 2}}) {
    check_case(p, CheriInput::f32, CheriMlp::f32, 1e-5, 11);
    check_case(p, CheriInput::bf16, CheriMlp::bf16, 3e-2, 12);
    check_case(p, CheriInput::f16, CheriMlp::f16, 4e-3, 13);
  }
}

TEST_CASE("cuda cheri: shapes off the tensor-core grid take the float32 path, or are declined",
          "[cuda][cheri]") {
  require_device();
  // C a multiple of 8 (16-byte loads) and not; a dilation longer than the sequence.
  for (const Problem& p : {Problem{37, 24, 3, 3, 3}, Problem{20, 5, 2, 30, 4}}) {
    check_case(p, CheriInput::f32, CheriMlp::f32, 1e-5, 21);
    check_case(p, CheriInput::f16, CheriMlp::f32, 4e-3, 22);
    cuda::CheriBlockKernel kernel({p.length, p.channels, p.expansion * p.channels, p.dilation});
    const int64_t count = p.channels * (3 + 2 * p.expansion * p.channels);
    std::vector<double> params(static_cast<std::size_t>(count), 0.1);
    kernel.set_weights(params.data(), nullptr);
    cuda::DeviceBuffer<float> x(static_cast<std::size_t>(p.length * p.channels)), y(x.size());
    try {
      kernel.forward(CheriInput::f32, CheriMlp::bf16, x.data(), y.data(), 1, nullptr);
      FAIL("the tensor-core path accepted C = " << p.channels);
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("multiples of 64") != std::string::npos);
    }
  }
}

TEST_CASE("cuda cheri: a shape whose weights overflow shared memory is declined with the sizes",
          "[cuda][cheri]") {
  require_device();
  const cuda::CheriShape shape{256, 128, 384, 2};  // e = 3: 196,608 bytes of weights
  CHECK(cuda::cheri_tensor_core_reason(shape).find("bytes exceed") != std::string::npos);
  cuda::CheriBlockKernel kernel(shape);
  CHECK(kernel.path(CheriMlp::bf16).find("unavailable") != std::string::npos);
  check_case({256, 128, 3, 2, 2}, CheriInput::f32, CheriMlp::f32, 1e-5, 31);
}
