// The cpu_tbb plugin: CPU candidate evaluation on Eigen, parallel with oneTBB.
#include "dense_evaluator.hpp"

#include <polyprobe/plugin.hpp>

#include <tbb/info.h>

namespace {

using polyprobe::cpu_tbb::DenseEvaluator;

int register_batch(void* self, const pp_batch_view* batch, pp_error* err) {
  return pp::guard(err, [&] { static_cast<DenseEvaluator*>(self)->register_batch(*batch); });
}
int evaluate(void* self, const pp_candidates* cands, double* losses, pp_error* err) {
  return pp::guard(err, [&] { static_cast<DenseEvaluator*>(self)->evaluate(*cands, losses); });
}
const char* explain(void* self) {
  try {
    return static_cast<DenseEvaluator*>(self)->explain();
  } catch (...) {
    return nullptr;
  }
}
void destroy(void* self) { delete static_cast<DenseEvaluator*>(self); }

const pp_evaluator_api kEvaluatorApi = {sizeof(pp_evaluator_api), &register_batch, &evaluate,
                                        &explain, &destroy};

int supports(const char* path, const pp_model_view* model, const pp_loss_view* loss,
             const pp_eval_options* options, pp_error* why) {
  if (path != nullptr && std::string_view(path) != "dense") {
    pp::set_error(why, std::string("unknown path '") + path + "' (this plugin has: dense)");
    return 0;
  }
  const std::string reason = polyprobe::cpu_tbb::dense_unsupported_reason(*model, *loss, *options);
  if (reason.empty()) return 1;
  pp::set_error(why, reason);
  return 0;
}

int create(const char* path, const pp_model_view* model, const pp_loss_view* loss,
           const pp_eval_options* options, void** self, const pp_evaluator_api** api,
           pp_error* err) {
  return pp::guard(err, [&] {
    if (path != nullptr && std::string_view(path) != "dense")
      throw std::invalid_argument(std::string("unknown path '") + path + "'");
    *self = polyprobe::cpu_tbb::make_dense_evaluator(*model, *loss, *options).release();
    *api = &kEvaluatorApi;
  });
}

int32_t probe(pp_error*) {
  // Usable on any CPU; the score grows with the cores oneTBB can use, so that a faster
  // CPU backend would still need to out-score it honestly.
  return 10 + tbb::info::default_concurrency();
}

constexpr uint32_t kFloats = PP_DTYPE_BIT(PP_DTYPE_F32) | PP_DTYPE_BIT(PP_DTYPE_F64);
const pp_capability kCaps[] = {
    {PP_COMPONENT_EVALUATOR, "dense", PP_DEVICE_CPU, kFloats, 0,
     "every candidate's forward from its first changed layer; shared later layers as one "
     "GEMM per particle; parallel over particles"},
};

const pp_plugin kPlugin = [] {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "cpu_tbb";
  p.version = "0.1.0";
  p.vendor = "polyprobe";
  p.summary = "CPU candidate evaluation on Eigen, parallel with oneTBB";
  p.probe = &probe;
  p.caps = kCaps;
  p.n_caps = static_cast<int32_t>(std::size(kCaps));
  p.evaluator_supports = &supports;
  p.evaluator_create = &create;
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
