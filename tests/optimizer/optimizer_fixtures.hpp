// Shared test fixtures: a small MLP on a random classification batch.
#pragma once

#include <polyprobe/batch.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/radius_model.hpp>

#include <nlohmann/json.hpp>

#include <random>
#include <vector>

namespace polyprobe::testing {

inline Model small_mlp(uint64_t seed = 0, int64_t inputs = 4, int64_t hidden = 8,
                       int64_t classes = 3) {
  const LayerFactory f = LayerFactory::with_builtins();
  Model m(Shape{{inputs}}, DType::f64);
  m.add(f.create("linear", {{"out_features", hidden}}, m.output_shape()));
  m.add(f.create("tanh", nlohmann::json::object(), m.output_shape()));
  m.add(f.create("linear", {{"out_features", classes}}, m.output_shape()));
  m.initialize(seed);
  return m;
}

inline Batch random_batch(uint64_t seed, int64_t rows = 24, int64_t inputs = 4,
                          int64_t classes = 3) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n;
  Batch b;
  b.inputs.resize(rows, inputs);
  for (Eigen::Index i = 0; i < b.inputs.size(); ++i) b.inputs.data()[i] = n(rng);
  // Labels from a fixed linear rule, so there is something to learn.
  for (int64_t r = 0; r < rows; ++r) {
    const double s = b.inputs(r, 0) + 0.5 * b.inputs(r, 1) - b.inputs(r, 2);
    b.targets.labels.push_back(s < -0.5 ? 0 : (s < 0.5 ? 1 : 2));
  }
  (void)classes;
  return b;
}

// The settings an alternative finish of a step (a backend's transport, the sharded finish
// under mpirun) is checked across: every solver, every cost scaling, both block strategies and
// the radius models with and without an incumbent.
struct TransportSetting {
  TransportSolver solver;
  CostScaling scaling;
  RadiusModelKind radius;
  BlockStrategy blocks;
  void apply(OptimizerConfig& config) const {
    config.solver = solver;
    config.cost_scaling = scaling;
    config.radius.kind = radius;
    config.blocks = blocks;
  }
};
inline std::vector<TransportSetting> transport_settings() {
  return {{TransportSolver::sinkhorn, CostScaling::none, RadiusModelKind::quadratic,
           BlockStrategy::monolithic},
          {TransportSolver::sinkhorn, CostScaling::mean, RadiusModelKind::fixed,
           BlockStrategy::per_layer},
          {TransportSolver::softmax, CostScaling::min_max, RadiusModelKind::quadratic,
           BlockStrategy::per_layer},
          {TransportSolver::top_k, CostScaling::max_cost, RadiusModelKind::adaptive,
           BlockStrategy::monolithic}};
}

}  // namespace polyprobe::testing
