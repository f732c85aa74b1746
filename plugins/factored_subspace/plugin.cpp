// The factored_subspace plugin: the subspace kind "factored" (factored_subspace.hpp) and the
// "factored_correction" operation (correction.hpp), the x B^T every candidate of a factored
// layer shares, which evaluators obtain from the host by name and use for their subspace
// directions. This file is only the ABI glue; every function handed to the host goes through
// pp::guard.
#include "correction.hpp"
#include "factored_subspace.hpp"

#ifdef POLYPROBE_FACTORED_CUDA
#include <polyprobe/plugin/cuda_probe.hpp>
#endif

#include <polyprobe/plugin/plugin.hpp>

namespace {

using polyprobe::factored::FactoredSubspace;
namespace factored = polyprobe::factored;

int create(const pp_model_view* model, const pp_param_entry* entries, int32_t n_entries,
           const pp_subspace_options* options, void** self, pp_error* err) {
  try {
    *self = new FactoredSubspace(
        *model, std::span<const pp_param_entry>(entries, static_cast<std::size_t>(n_entries)),
        *options);
    return PP_OK;
  } catch (const std::invalid_argument& e) {
    pp::set_error(err, e.what());  // a model it cannot span: a refusal, not a failure
    return PP_UNSUPPORTED;
  } catch (const std::exception& e) {
    pp::set_error(err, e.what());
    return PP_FAILED;
  }
}

void destroy(void* self) { delete static_cast<FactoredSubspace*>(self); }

int describe(const void* self, pp_subspace_view* view, pp_error* err) {
  return pp::guard(err, [&] {
    const uint32_t size = view->struct_size;
    *view = static_cast<const FactoredSubspace*>(self)->view();
    view->struct_size = size;
  });
}

// The operation's entry points: arguments checked here, computed by correction_*.
template <void (*Compute)(const pp_factored_project_args&)>
int project(const pp_factored_project_args* args, pp_error* err) {
  return pp::guard(err, [&] {
    if (args == nullptr) throw std::invalid_argument("factored_correction: no arguments");
    if (std::string why = factored::project_args_error(*args); !why.empty())
      throw std::invalid_argument("factored_correction: " + why);
    Compute(*args);
  });
}

template <std::string (*Reason)()>
int32_t probe(pp_error* why) {
  const std::string reason = Reason();
  if (reason.empty()) return 1;
  pp::set_error(why, reason);
  return 0;
}

const pp_factored_correction_table kCpuTable{sizeof(pp_factored_correction_table),
                                             &project<&factored::project_cpu>};
#ifdef POLYPROBE_FACTORED_CUDA
const pp_factored_correction_table kCudaTable{sizeof(pp_factored_correction_table),
                                              &project<&factored::project_cuda>};
#endif

constexpr uint32_t kFloats = PP_DTYPE_BIT(PP_DTYPE_F32) | PP_DTYPE_BIT(PP_DTYPE_F64);

const pp_operation kOperations[] = {
    {sizeof(pp_operation), PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU,
     kFloats, 10,
     "x B^T for all of a layer's subspace directions: one GEMM per 64 samples (oneTBB)",
     &probe<&factored::cpu_unusable_reason>, &kCpuTable},
#ifdef POLYPROBE_FACTORED_CUDA
    {sizeof(pp_operation), PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_TYPE_GPU,
     PP_DEVICE_NAME_CUDA, kFloats, 10,
     "x B^T for all of a layer's subspace directions: one cuBLAS GEMM on the session's stream",
     &probe<&pp::cuda_unusable_reason>, &kCudaTable},
#endif
};

const pp_capability kCaps[] = {
    {PP_COMPONENT_OPERATION, PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_TYPE_CPU,
     PP_DEVICE_NAME_CPU, kFloats, 0,
     "the shared factor x B^T of a factored layer's candidates, for evaluators"},
#ifdef POLYPROBE_FACTORED_CUDA
    {PP_COMPONENT_OPERATION, PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_TYPE_GPU,
     PP_DEVICE_NAME_CUDA, kFloats, 0,
     "the shared factor x B^T of a factored layer's candidates on the GPU"},
#endif
};

const pp_subspace_kind kSubspaces[] = {
    {sizeof(pp_subspace_kind), "factored",
     "dW = A B with B fixed orthonormal rows; the entries of A (and raw biases) are the "
     "coordinates; linear layers compute x W^T + (x B^T) A^T",
     &create, &destroy, &describe},
};

const pp_plugin kPlugin = [] {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "factored_subspace";
  p.version = "1.0.0";
  p.vendor = "polyprobe";
  p.summary =
      "the factored subspace (dW = A B, B fixed): --subspace factored; and its shared factor "
      "x B^T for evaluators (the \"factored_correction\" operation)";
  p.caps = kCaps;
  p.n_caps = static_cast<int32_t>(std::size(kCaps));
  p.operations = kOperations;
  p.n_operations = static_cast<int32_t>(std::size(kOperations));
  p.subspaces = kSubspaces;
  p.n_subspaces = static_cast<int32_t>(std::size(kSubspaces));
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
