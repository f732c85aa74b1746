// The cpu_tbb plugin: CPU candidate evaluation on Eigen, parallel with oneTBB, and
// reduce-by-key accumulators. This file is only the ABI glue: the session table comes from
// pp::make_session_api and every other function handed to the host goes through pp::guard,
// so no exception crosses the boundary.
#include "accumulator.hpp"
#include "evaluator.hpp"
#include "session.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/info.h>

namespace {

using polyprobe::cpu_tbb::Session;

// The evaluator chooses its path per particle group; a path name here only forces it.
bool known_path(const char* path) {
  if (path == nullptr) return true;
  const std::string_view p(path);
  return p == "auto" || p == "sparse" || p == "subspace-delta" || p == "dense" || p == "inplace" ||
         p == "fallback" || p == "site-local";
}

int supports(const char* path, const pp_model_view* model, const pp_loss_view* loss,
             const pp_session_options* options, pp_error* why) {
  return pp::answer_supports(why, [&] {
    if (!known_path(path))
      return std::string("unknown path '") + path + "' (paths: " + polyprobe::cpu_tbb::kPathNames +
             ")";
    return polyprobe::cpu_tbb::unsupported_reason(*model, *loss, *options);
  });
}

int create(const pp_model_view* model, const pp_loss_view* loss, const pp_session_options* options,
           void** self, const pp_session_api** api, pp_error* err) {
  return pp::guard(err, [&] {
    if (!known_path(options->path))
      throw std::invalid_argument(std::string("unknown path '") + options->path + "'");
    auto evaluator = polyprobe::cpu_tbb::make_candidate_evaluator(*model, *loss, *options);
    pp::hand_over_session(std::make_unique<Session>(std::move(evaluator), model->n_params,
                                                    options->subspace, options->threads),
                          self, api);
  });
}

int create_accumulator(const char* strategy, int32_t dtype, void** self,
                       const pp_accumulator_api** api, pp_error* err) {
  return pp::guard(err,
                   [&] { polyprobe::cpu_tbb::create_accumulator(strategy, dtype, self, api); });
}

int32_t probe(pp_error* why) {
  // The plugin may be built for a newer instruction set than this CPU has.
#if defined(__x86_64__)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) {
    pp::set_error(why, "built for AVX-512 (POLYPROBE_CPU_TBB_ARCH), which this CPU lacks");
    return 0;
  }
#endif
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    pp::set_error(why, "built for AVX2 and FMA (POLYPROBE_CPU_TBB_ARCH), which this CPU lacks");
    return 0;
  }
#endif
#endif
  (void)why;
  // Usable on any CPU; the score grows with the cores oneTBB can use, so that a faster
  // CPU backend would still need to out-score it honestly.
  return 10 + tbb::info::default_concurrency();
}

constexpr uint32_t kFloats = PP_DTYPE_BIT(PP_DTYPE_F32) | PP_DTYPE_BIT(PP_DTYPE_F64);
const pp_capability kCaps[] = {
    {PP_COMPONENT_EVALUATOR, "sparse", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "full space: a particle's change propagates as a delta, sparse through elementwise layers, "
     "dense one affine layer later; ReLU kink tables"},
    {PP_COMPONENT_EVALUATOR, "subspace-delta", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "rank-one subspace coordinates (hybrid, factored) propagate as deltas"},
    {PP_COMPONENT_EVALUATOR, "site-local", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "a particle in one conv1d/conv2d/self_attention layer: only the channels or heads it owns "
     "recomputed, the suffix batched over candidates"},
    {PP_COMPONENT_EVALUATOR, "dense", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "changed layers materialised per candidate; later layers one GEMM per particle"},
    {PP_COMPONENT_EVALUATOR, "inplace", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "apply, score, revert on one shared parameter copy; bounded memory"},
    {PP_COMPONENT_EVALUATOR, "fallback", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "the whole forward of each materialised candidate; relies on no contract"},
    {PP_COMPONENT_ACCUMULATOR, "sequential", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "one pass in input order on the calling thread; the reference's bits"},
    {PP_COMPONENT_ACCUMULATOR, "scatter", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "atomic adds into the output; not deterministic"},
    {PP_COMPONENT_ACCUMULATOR, "segment", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "owner computes over a stable grouping by key; the reference's bits, any thread count"},
    {PP_COMPONENT_ACCUMULATOR, "auto", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "segment from 4 threads for rows of 64 bytes or more, else sequential (measured)"},
};

const pp_plugin kPlugin = [] {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "cpu_tbb";
  p.version = "0.3.0";
  p.vendor = "polyprobe";
  p.summary =
      "CPU candidate evaluation on Eigen, parallel with oneTBB: sparse and subspace "
      "deltas, site-local (conv, attention), dense, in-place and fallback paths; accumulators";
  p.probe = &probe;
  p.caps = kCaps;
  p.n_caps = static_cast<int32_t>(std::size(kCaps));
  p.session_supports = &supports;
  p.session_create = &create;
  p.accumulator_create = &create_accumulator;
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
