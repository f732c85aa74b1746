// The factored_subspace plugin: the subspace kind "factored" (factored_subspace.hpp). This
// file is only the ABI glue; every function handed to the host goes through pp::guard.
#include "factored_subspace.hpp"

#include <polyprobe/plugin/plugin.hpp>

namespace {

using polyprobe::factored::FactoredSubspace;

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
  p.summary = "the factored subspace (dW = A B, B fixed): --subspace factored";
  p.subspaces = kSubspaces;
  p.n_subspaces = static_cast<int32_t>(std::size(kSubspaces));
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
