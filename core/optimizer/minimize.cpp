// minimize(): the optimizer on a plain function, through an Evaluator adapter.
#include "vector_search.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/minimize.hpp>

#include <cmath>
#include <limits>
#include <string>

namespace polyprobe {

namespace {

// Scores candidates by calling the objective on the materialised vector, one at a time,
// and remembers the best point it has seen.
class FunctionEvaluator final : public Evaluator {
 public:
  explicit FunctionEvaluator(const Objective& objective) : objective_(objective) {}
  std::string name() const override { return "function"; }
  void register_batch(const Batch&) override {}

  double evaluate_base(std::span<const double> base) override {
    point_.assign(base.begin(), base.end());
    return record(objective_(point_));
  }

  void evaluate(std::span<const double> base, const CandidateSet& set,
                std::span<double> losses) override {
    point_.assign(base.begin(), base.end());
    const auto d = static_cast<std::size_t>(set.particles->d);
    for (std::size_t c = 0; c < set.particle.size(); ++c) {
      const auto coords = set.particles->particle(set.particle[c]);
      // Move, score, move back: O(d) per candidate instead of a copy of the vector.
      for (std::size_t j = 0; j < d; ++j)
        if (coords[j] >= 0)
          point_[static_cast<std::size_t>(coords[j])] += set.displacement[c * d + j];
      losses[c] = record(objective_(point_));
      for (std::size_t j = 0; j < d; ++j)
        if (coords[j] >= 0)
          point_[static_cast<std::size_t>(coords[j])] = base[static_cast<std::size_t>(coords[j])];
    }
  }

  const std::vector<double>& best_point() const { return best_point_; }
  double best_value() const { return best_value_; }

 private:
  double record(double value) {
    if (value < best_value_ || best_point_.empty()) {
      best_value_ = value;
      best_point_ = point_;
    }
    return value;
  }

  const Objective& objective_;
  std::vector<double> point_;
  std::vector<double> best_point_;
  double best_value_ = std::numeric_limits<double>::infinity();
};

}  // namespace

OptimizerConfig recommended_minimize_config(int n) {
  if (n < 1)
    throw Error("recommended_minimize_config: n must be at least 1, got " + std::to_string(n));
  OptimizerConfig c;
  c.particle_dim = n;
  c.solver = TransportSolver::softmax;
  c.ent_epsilon = 0.5;
  c.cost_scaling = CostScaling::min_max;
  c.metric = MetricKind::bfgs;
  c.radius.kind = RadiusModelKind::trust_region;
  c.radius.trust_scales_probe = true;
  c.radius.trust_min = 1e-9;
  c.radius.trust_max = 100;
  c.radius.quadratic_max_scale = 50;
  return c;
}

MinimizeResult minimize(const Objective& objective, std::span<const double> x0, int64_t budget,
                        const OptimizerConfig& config) {
  config.validate();
  if (!objective) throw Error("minimize: the objective is empty");
  if (x0.empty()) throw Error("minimize: x0 is empty");
  if (budget < 1) throw Error("minimize: the budget must be at least one evaluation");
  if (config.subspace_rotation_interval != 0)
    throw Error(
        "minimize: subspace_rotation_interval rotates a model's subspace; minimize() has none "
        "(set it to 0)");
  if (config.multifidelity_screen)
    throw Error(
        "minimize: multifidelity_screen needs a batch to screen on; a plain function has "
        "none, so turn it off");
  ParticleMap map = ParticleMap::contiguous(static_cast<int64_t>(x0.size()), config.particle_dim);
  const int64_t particles = map.count();
  detail::VectorSearch search(config, std::move(map), {{0, particles}}, nullptr);
  FunctionEvaluator evaluator(objective);
  std::vector<double> x(x0.begin(), x0.end());
  MinimizeResult result;
  for (;;) {
    const int64_t cost = search.next_step_cost();
    if (search.evaluations() + cost > budget) break;
    search.step(x, evaluator, nullptr, 0);
    ++result.steps;
  }
  // The last move lands on a point nobody has scored yet; it is usually the best one.
  if (search.evaluations() < budget) {
    evaluator.evaluate_base(x);
    result.evaluations = search.evaluations() + 1;
  } else {
    result.evaluations = search.evaluations();
  }
  result.x = evaluator.best_point();
  result.f = evaluator.best_value();
  return result;
}

}  // namespace polyprobe
