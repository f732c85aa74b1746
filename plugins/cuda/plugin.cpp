// The cuda plugin: candidate evaluation on an NVIDIA GPU through API 2 evaluator sessions.
// This file is only the ABI glue: the session table comes from pp::make_session_api and
// every other function handed to the host goes through pp::guard, so no exception crosses
// the boundary. Loading it does no CUDA work; probe()
// asks the runtime for a device, and on a machine without a driver or a GPU it returns 0
// with the runtime's reason, so the registry records the plugin as unavailable.
#include "accumulator.hpp"
#include "cheri_bench.hpp"
#include "model_plan.hpp"
#include "session.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <cuda_runtime.h>

#include <string>
#include <string_view>

namespace {

// Why a forced path cannot serve; empty when it can.
std::string path_reason(const char* path, const pp_session_options& options) {
  if (path == nullptr) return "";
  const std::string_view p(path);
  if (p == "auto") return "";
  const bool subspace = options.subspace != nullptr;
  if (p == "sparse")
    return subspace ? "path 'sparse' moves raw parameters; with a subspace use 'subspace-delta'"
                    : "";
  if (p == "subspace-delta")
    return subspace ? "" : "path 'subspace-delta' needs a subspace; in full space use 'sparse'";
  const bool autocast =
      PP_HAS_FIELD(&options, pp_session_options, candidate_dtype) && options.candidate_dtype != 0;
  if (autocast && (p == "dense" || p == "materialised"))
    return "path '" + std::string(p) +
           "' materialises every candidate's weights in float32; candidate_autocast runs on "
           "the layered delta path (auto, layered, sparse or subspace-delta)";
  if (p == "layered" || p == "dense" || p == "materialised") return "";
  return "unknown path '" + std::string(p) + "' (paths: " + polyprobe::cuda::kPathNames + ")";
}

std::string session_reason(const char* path, const pp_model_view& model, const pp_loss_view& loss,
                           const pp_session_options& options) {
  std::string reason = path_reason(path, options);
  if (reason.empty()) reason = polyprobe::cuda::unsupported_reason(model, loss, options);
  return reason;
}

int supports(const char* path, const pp_model_view* model, const pp_loss_view* loss,
             const pp_session_options* options, pp_error* why) {
  return pp::answer_supports(why, [&] { return session_reason(path, *model, *loss, *options); });
}

int create(const pp_model_view* model, const pp_loss_view* loss, const pp_session_options* options,
           void** self, const pp_session_api** api, pp_error* err) {
  return pp::guard(err, [&] {
    const char* path = PP_HAS_FIELD(options, pp_session_options, path) ? options->path : nullptr;
    const std::string reason = session_reason(path, *model, *loss, *options);
    if (!reason.empty()) throw std::invalid_argument(reason);
    pp::hand_over_session(polyprobe::cuda::make_session(*model, *loss, *options), self, api);
  });
}

int bench(const char* suite, const char* options, const char** result, pp_error* err) {
  return pp::guard(err, [&] {
    static std::string text;  // valid until the next call (abi.h)
    text = polyprobe::cuda::run_bench(suite != nullptr ? suite : "",
                                      options != nullptr ? options : "");
    *result = text.c_str();
  });
}

// --- The accumulator component.
polyprobe::cuda::Accumulator* as_accumulator(void* self) {
  return static_cast<polyprobe::cuda::Accumulator*>(self);
}
int accumulate(void* self, int64_t n, const int64_t* keys, const pp_tensor* values, int64_t n_keys,
               pp_tensor* out, pp_error* err) {
  return pp::guard(err, [&] { as_accumulator(self)->accumulate(n, keys, *values, n_keys, *out); });
}
void destroy_accumulator(void* self) { delete as_accumulator(self); }
const char* last_strategy(void* self) { return as_accumulator(self)->last_strategy(); }
int device_benchmark(void* self, const pp_accumulate_benchmark* spec, const char** json,
                     pp_error* err) {
  return pp::guard(err, [&] { *json = as_accumulator(self)->device_benchmark(*spec); });
}

const pp_accumulator_api kAccumulatorApi = [] {
  pp_accumulator_api a{};
  a.struct_size = sizeof(pp_accumulator_api);
  a.accumulate = &accumulate;
  a.destroy = &destroy_accumulator;
  a.last_strategy = &last_strategy;
  a.device_benchmark = &device_benchmark;
  return a;
}();

int create_accumulator(const char* strategy, int32_t dtype, void** self,
                       const pp_accumulator_api** api, pp_error* err) {
  return pp::guard(err, [&] {
    *self = polyprobe::cuda::make_accumulator(strategy, dtype).release();
    *api = &kAccumulatorApi;
  });
}

int32_t probe(pp_error* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    pp::set_error(why, std::string("no CUDA device: ") + cudaGetErrorString(status));
    return 0;
  }
  if (count <= 0) {
    pp::set_error(why, "no CUDA device: the runtime reports none");
    return 0;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    pp::set_error(why, "no CUDA device: cannot read the properties of device 0");
    return 0;
  }
  if (prop.major < 9) {
    pp::set_error(why, std::string("device 0 (") + prop.name + ") has compute capability " +
                           std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                           "; this build targets sm_90");
    return 0;
  }
  // Above any CPU backend's score: on a machine with a GPU, --device cuda is the policy
  // that selects it, and the score only breaks ties among GPU backends.
  return 1000 + prop.multiProcessorCount;
}

constexpr uint32_t kFloats = PP_DTYPE_BIT(PP_DTYPE_F32) | PP_DTYPE_BIT(PP_DTYPE_F64);
constexpr uint32_t kAutocast = PP_EVALUATOR_AUTOCAST_BF16 | PP_EVALUATOR_AUTOCAST_F16;
// One evaluator capability per path a session runs, so `polyprobe plugins` shows them all;
// "auto" chooses among them per particle group (docs/evaluation.md, the GPU section).
const pp_capability kCaps[] = {
    {PP_COMPONENT_EVALUATOR, "sparse", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, kAutocast,
     "full space: a particle's change corrects its layer's output sparsely; a fused tail (one "
     "thread per candidate and sample to the loss) where it applies, else layered"},
    {PP_COMPONENT_EVALUATOR, "subspace-delta", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats,
     kAutocast,
     "rank-one subspace coordinates (hybrid, factored): the rows and columns they move "
     "correct the layer's output, the rest one cuBLAS GEMM over the chunk"},
    {PP_COMPONENT_EVALUATOR, "layered", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, kAutocast,
     "the delta paths without the fused tail: the changed layer's output corrected, then one "
     "cuBLAS GEMM per later layer over a chunk of candidates"},
    {PP_COMPONENT_EVALUATOR, "site-local", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "a particle in one conv, self_attention, cheri_block or linear op recomputes only what "
     "it owns there (channels, a head, hidden units), batched over candidate and sample"},
    {PP_COMPONENT_EVALUATOR, "dense", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "each candidate's changed ops with its materialised parameters (layer norm, MoE, LIF, "
     "the Cheri block's products, particles across ops), later ops one launch over the chunk"},
    {PP_COMPONENT_EVALUATOR, "materialised", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "every op of every candidate from the inputs, nothing reused: the check path"},
    {PP_COMPONENT_ACCUMULATOR, "scatter", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "atomic adds pre-aggregated within a warp (4-wide float atomics for wide rows); the bits "
     "may change run to run"},
    {PP_COMPONENT_ACCUMULATOR, "segment", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "owner-computes: a stable radix sort groups rows by key, each key's owner adds them in "
     "input order (the reference's bits)"},
    {PP_COMPONENT_ACCUMULATOR, "auto", PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "the strategy measured faster for the shape (bench accumulate --bench-device cuda)"},
};

const pp_plugin kPlugin = [] {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "cuda";
  p.version = "0.1.0";
  p.vendor = "polyprobe";
  p.summary =
      "GPU candidate evaluation (CUDA, cuBLAS): device-resident sessions for linear, "
      "activation, layer norm, conv, pooling, attention, MoE, LIF and Cheri-block models; "
      "sparse (fused tail), subspace-delta, layered, site-local, dense and materialised "
      "paths; the step's transport on the device; accumulators; the Cheri block's kernels";
  p.probe = &probe;
  p.caps = kCaps;
  p.n_caps = static_cast<int32_t>(std::size(kCaps));
  p.session_supports = &supports;
  p.session_create = &create;
  p.accumulator_create = &create_accumulator;
  p.bench = &bench;
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
