// minimize(): the polytope optimizer on a plain function of a vector.
//
// The vector x (dimension n) is cut into particles of config.particle_dim coordinates exactly
// as a model's parameters are; a candidate is x with one particle moved. Evaluations are
// counted as in polystep (one call of the objective is one evaluation) and the budget is never
// exceeded: a step that would not fit is not started. The result is the best point evaluated.
#pragma once

#include <polyprobe/optimizer.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace polyprobe {

using Objective = std::function<double(std::span<const double>)>;

struct MinimizeResult {
  std::vector<double> x;  // best point evaluated
  double f = 0;           // its value
  int64_t evaluations = 0;
  int64_t steps = 0;
};

MinimizeResult minimize(const Objective& objective, std::span<const double> x0, int64_t budget,
                        const OptimizerConfig& config = {});

// The configuration documented as best for minimize() on a smooth function of n variables
// (docs/optimizer.md, "Recommended configurations"; `polyprobe-tr-dn-bfgs` in `polyprobe bench
// dfo`): one particle holding the whole vector, the softmax rule at temperature 0.5 on
// min-max scaled costs, a trust region whose probe radius follows it, and the learned metric.
// The defaults of OptimizerConfig are polystep's, tuned for training networks instead.
OptimizerConfig recommended_minimize_config(int n);

}  // namespace polyprobe
