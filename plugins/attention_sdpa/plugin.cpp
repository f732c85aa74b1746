// The attention_sdpa plugin: offers the "sdpa" operation (operations.h), fused
// scaled-dot-product attention with an online softmax, on the CPU (float32, float64) and,
// when built with CUDA, on the GPU. It provides no evaluator and no layer: the host hands
// the operation to its self_attention layers and to evaluator sessions that ask for it, so
// removing this plugin from the plugin path only brings back the explicit attention.
// This file is the ABI glue: every function goes through pp::guard.
#include "sdpa_cpu.hpp"
#ifdef POLYPROBE_SDPA_CUDA
#include "sdpa_cuda.hpp"

#include <polyprobe/plugin/cuda_probe.hpp>
#endif

#include <polyprobe/plugin/plugin.hpp>

namespace {

namespace sdpa = polyprobe::attention_sdpa;

int run_cpu(const pp_sdpa_args* args, pp_error* err) {
  return pp::guard(err, [&] {
    if (args == nullptr) throw std::invalid_argument("sdpa: no arguments");
    sdpa::run_cpu(*args);
  });
}

int32_t probe_cpu(pp_error* why) { return pp::probe_cpu_isa(why) ? 1 : 0; }

const pp_sdpa_table kCpuTable{sizeof(pp_sdpa_table), &run_cpu};

constexpr uint32_t kFloats = PP_DTYPE_BIT(PP_DTYPE_F32) | PP_DTYPE_BIT(PP_DTYPE_F64);

#ifdef POLYPROBE_SDPA_CUDA
int run_cuda(const pp_sdpa_args* args, pp_error* err) {
  if (args != nullptr && (args->head_dim > sdpa::kCudaMaxDim || args->v_dim > sdpa::kCudaMaxDim)) {
    pp::set_error(err, "sdpa (cuda): head_dim and v_dim up to " +
                           std::to_string(sdpa::kCudaMaxDim) + " are served");
    return PP_UNSUPPORTED;
  }
  return pp::guard(err, [&] {
    if (args == nullptr) throw std::invalid_argument("sdpa: no arguments");
    sdpa::run_cuda(*args);
  });
}
int32_t probe_cuda(pp_error* why) {
  const std::string reason = pp::cuda_unusable_reason();
  if (reason.empty()) return 1;
  pp::set_error(why, reason);
  return 0;
}
const pp_sdpa_table kCudaTable{sizeof(pp_sdpa_table), &run_cuda};
#endif

const pp_operation kOperations[] = {
    {sizeof(pp_operation), PP_OPERATION_SDPA, PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 10,
     "fused attention, online softmax (no L x L scores), argmax, causal; vectorised, oneTBB",
     &probe_cpu, &kCpuTable},
#ifdef POLYPROBE_SDPA_CUDA
    {sizeof(pp_operation), PP_OPERATION_SDPA, PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 10,
     "fused attention on the GPU: one block per (problem, query tile), online softmax in "
     "shared memory, argmax, causal",
     &probe_cuda, &kCudaTable},
#endif
};

const pp_capability kCaps[] = {
    {PP_COMPONENT_OPERATION, PP_OPERATION_SDPA, PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "fused scaled-dot-product attention (online softmax, argmax, causal) for the host's "
     "self_attention and for evaluators"},
#ifdef POLYPROBE_SDPA_CUDA
    {PP_COMPONENT_OPERATION, PP_OPERATION_SDPA, PP_DEVICE_TYPE_GPU, PP_DEVICE_NAME_CUDA, kFloats, 0,
     "fused scaled-dot-product attention on the GPU"},
#endif
};

const pp_plugin kPlugin = [] {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "attention_sdpa";
  p.version = "0.1.0";
  p.vendor = "polyprobe";
  p.summary =
      "fused scaled-dot-product attention (the \"sdpa\" operation) for self_attention layers "
      "and evaluators";
  p.caps = kCaps;
  p.n_caps = static_cast<int32_t>(std::size(kCaps));
  p.operations = kOperations;
  p.n_operations = static_cast<int32_t>(std::size(kOperations));
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
