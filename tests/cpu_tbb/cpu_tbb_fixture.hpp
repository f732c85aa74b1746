// Shared by the cpu_tbb tests: the plugin from the build tree, small models, candidate
// sets and the comparison against the core's float64 reference evaluator.
#pragma once

#include <polyprobe/evaluator.hpp>
#include <polyprobe/layer.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/subspace.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace polyprobe::test {

// The registry with the build tree's plugins; fails the test clearly when cpu_tbb is missing.
inline const PluginRegistry& cpu_registry() {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();
    r->load_directories({PluginRegistry::executable_plugin_dir()});
    return r;
  }();
  const PluginInfo* info = registry->find("cpu_tbb");
  if (info == nullptr || !info->available)
    FAIL("the cpu_tbb plugin is not available in "
         << PluginRegistry::executable_plugin_dir().string()
         << (info ? ": " + info->reason : std::string(": not found"))
         << " (build the cpu_tbb target)");
  return *registry;
}

// A model from (kind, attributes) pairs on a per-sample input shape, initialised from `seed`;
// "*" takes the next layer of `extra`.
inline Model make_model(const Shape& input,
                        const std::vector<std::pair<std::string, nlohmann::json>>& layers,
                        uint64_t seed = 1,
                        const std::vector<std::shared_ptr<const Layer>>& extra = {}) {
  const LayerFactory factory = LayerFactory::with_builtins();
  Model model(input);
  std::size_t next_extra = 0;
  for (const auto& [kind, attrs] : layers) {
    if (kind == "*")
      model.add(extra.at(next_extra++));
    else
      model.add(factory.create(kind, attrs, model.output_shape()));
  }
  model.initialize(seed);
  return model;
}
inline Model make_model(int64_t inputs,
                        const std::vector<std::pair<std::string, nlohmann::json>>& layers,
                        uint64_t seed = 1,
                        const std::vector<std::shared_ptr<const Layer>>& extra = {}) {
  return make_model(Shape{{inputs}}, layers, seed, extra);
}

inline Batch make_batch(const Model& model, int64_t rows, uint64_t seed = 2) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss;
  Batch batch;
  batch.inputs.resize(rows, model.input_shape().numel());
  for (int64_t i = 0; i < batch.inputs.size(); ++i) batch.inputs.data()[i] = gauss(rng);
  const int64_t classes = model.output_shape().numel();
  for (int64_t r = 0; r < rows; ++r)
    batch.targets.labels.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(classes)));
  return batch;
}

// Every particle, `per_particle` candidates each, displacements N(0, scale).
struct Candidates {
  ParticleMap particles;
  std::vector<int64_t> particle;
  std::vector<double> displacement;
  CandidateSet set() const { return {&particles, particle, displacement}; }
};
inline Candidates make_candidates(int64_t n, int32_t d, int per_particle, double scale,
                                  uint64_t seed = 3) {
  Candidates c;
  c.particles = ParticleMap::contiguous(n, d);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> gauss(0.0, scale);
  for (int64_t p = 0; p < c.particles.count(); ++p)
    for (int v = 0; v < per_particle; ++v) {
      c.particle.push_back(p);
      for (int32_t k = 0; k < d; ++k) c.displacement.push_back(gauss(rng));
    }
  return c;
}

struct Run {
  std::vector<double> losses;
  nlohmann::json explain;
};

inline Run run_evaluator(const Model& model, const Loss& loss, const Batch& batch,
                         const Candidates& cands, const EvaluatorRequest& request) {
  auto evaluator = request.backend == "reference"
                       ? make_reference_evaluator(model, loss, request.subspace, request.options)
                       : cpu_registry().make_evaluator(model, loss, request);
  evaluator->register_batch(batch);
  Run run;
  run.losses.resize(cands.particle.size());
  evaluator->evaluate(model.parameters(), cands.set(), run.losses);
  run.explain = evaluator->explain();
  return run;
}

inline EvaluatorRequest request(const std::string& backend, DType dtype,
                                const std::string& path = "", const Subspace* subspace = nullptr,
                                int threads = 0, int64_t chunk = 0) {
  EvaluatorRequest r;
  r.backend = backend;
  r.options.dtype = dtype;
  r.options.threads = threads;
  r.options.chunk_size = chunk;
  r.subspace = subspace;
  r.path = path;
  return r;
}

inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1e-300, std::abs(b[i])));
  return worst;
}

// Candidates per path in the last call, from the plugin's explain.
inline int64_t candidates_on(const nlohmann::json& explain, const std::string& path) {
  const auto& counts = explain.at("plugin").at("last_call_candidates_per_path");
  return counts.contains(path) ? counts.at(path).get<int64_t>() : 0;
}

}  // namespace polyprobe::test
