// The optimizer's side of a transport solved by the backend (Evaluator::solves_transport,
// StepEngine::finish_on): an evaluator that keeps its losses and solves the transport itself,
// written here from the documented formulas with the core's public solvers, must give the
// trajectory of the same evaluator with the host solving it (OptimizerConfig::
// device_transport = false). This runs everywhere; the cuda plugin's kernels have their own
// test against the host (tests/cuda).
#include <polyprobe/evaluator.hpp>
#include <polyprobe/geometry.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/radius_model.hpp>
#include <polyprobe/transport.hpp>

#include <catch2/catch.hpp>

#include "optimizer_fixtures.hpp"

#include <cmath>
#include <limits>

using namespace polyprobe;
using polyprobe::testing::random_batch;
using polyprobe::testing::small_mlp;

namespace {

// The reference evaluator's losses; the transport half of a step on "its device" (here).
class SolvingEvaluator final : public DecoratingEvaluator {
 public:
  SolvingEvaluator(const Model& model, const Loss& loss)
      : DecoratingEvaluator(make_reference_evaluator(model, loss, nullptr, {DType::f64}),
                            "SolvingEvaluator") {}
  std::string name() const override { return "solving"; }
  bool solves_transport() const override { return true; }
  // Draws the rotations of particles of d = 2 itself, as a device backend would (here with
  // the core's draw_rotations, so the bits are the host's by construction).
  bool draws_rotations(int32_t d) const override { return draws && d == 2; }
  bool draws = false;
  int solved = 0, drawn = 0;

  void solve_transport(const TransportStepRequest& r,
                       std::span<TransportBlockResult> blocks) override {
    REQUIRE(kept_);
    kept_ = false;
    const int64_t V = bound_polytope().rows(), K = bound_probes();
    const int32_t d = bound_particles().d;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      const int64_t first = r.block_first[b], rows = r.block_count[b];
      Matrix<double> cost(rows, V), weights(rows, V);
      TransportBlockResult& out = blocks[b];
      out.best_cost = std::numeric_limits<double>::infinity();
      double worst = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t v = 0; v < V; ++v) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += losses_[static_cast<std::size_t>(((first + i) * V + v) * K + k)];
          cost(i, v) = s / static_cast<double>(K);
          if (std::isfinite(cost(i, v))) {
            out.cost_sum += cost(i, v);
            ++out.finite;
            out.best_cost = std::min(out.best_cost, cost(i, v));
            worst = std::max(worst, cost(i, v));
          }
        }
      if (out.finite == 0) {
        weights.setConstant(1.0 / static_cast<double>(V));
      } else {
        const double penalty = worst + r.nonfinite_margin * (1 + std::abs(worst));
        for (Eigen::Index c = 0; c < cost.size(); ++c)
          if (!std::isfinite(cost.data()[c])) cost.data()[c] = penalty;
        scale_cost(r.cost_scaling, cost);
        if (r.solver == TransportSolver::sinkhorn && rows > 1) {
          const TransportResult t =
              solve_sinkhorn(cost, r.temperature, r.sinkhorn, (*r.duals)[b], weights);
          out.iterations = t.iterations;
          out.converged = t.converged;
        } else if (r.solver == TransportSolver::greedy || r.solver == TransportSolver::top_k) {
          solve_top_k(cost, r.solver == TransportSolver::greedy ? 1 : r.top_k, weights);
        } else {
          solve_softmax(cost, r.temperature, weights);
        }
      }
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t p = first + i;
        Eigen::Map<const Matrix<double>> dir(directions_.data() + p * V * d, V, d);
        Vector<double> move = r.step_radius * (dir.transpose() * weights.row(i).transpose());
        for (int32_t j = 0; j < d; ++j) r.moves[static_cast<std::size_t>(p * d + j)] = move(j);
        if (r.incumbents.empty()) continue;
        std::vector<double> outer(static_cast<std::size_t>(V)),
            gradient(static_cast<std::size_t>(d));
        for (int64_t v = 0; v < V; ++v)
          outer[static_cast<std::size_t>(v)] =
              losses_[static_cast<std::size_t>((p * V + v) * K + K - 1)];
        const double f =
            r.incumbents.size() == 1 ? r.incumbents[0] : r.incumbents[static_cast<std::size_t>(p)];
        const double curvature = fit_particle_quadratic(outer, f, dir, r.scaled_radius, gradient);
        double slope = 0;
        for (int32_t j = 0; j < d; ++j) slope += gradient[static_cast<std::size_t>(j)] * move(j);
        if (std::isfinite(slope) && std::isfinite(curvature)) {
          out.slope += slope;
          out.curvature += curvature * move.squaredNorm();
        }
      }
    }
    ++solved;
  }

 protected:
  void session_score(const PolytopeProbe& probe, std::span<double> losses,
                     double* incumbent_loss) override {
    if (!losses.empty()) {
      REQUIRE(probe.stream == nullptr);  // rotations are left only to a step solved here
      Evaluator::session_score(probe, losses, incumbent_loss);
      return;
    }
    // Asked to keep them: score into our own buffer, for the solve that follows.
    const int64_t P = bound_particles().count(), V = bound_polytope().rows();
    const int32_t d = bound_particles().d;
    const int64_t n = P * V * bound_probes();
    losses_.assign(static_cast<std::size_t>(n), 0.0);
    if (probe.stream != nullptr) {
      REQUIRE(draws_rotations(d));
      CHECK(probe.directions.empty());
      std::vector<double> rotations(static_cast<std::size_t>(P * d * d));
      draw_rotations(*probe.stream, 0, P, d, RotationMethod::automatic, rotations);
      directions_.resize(static_cast<std::size_t>(P * V * d));
      for (int64_t i = 0; i < P; ++i) {
        Eigen::Map<const Matrix<double>> rot(rotations.data() + i * d * d, d, d);
        Eigen::Map<Matrix<double>> dir(directions_.data() + i * V * d, V, d);
        dir.noalias() = bound_polytope() * rot.transpose();
      }
      PolytopeProbe drawn_probe = probe;
      drawn_probe.directions = directions_;
      drawn_probe.stream = nullptr;
      ++drawn;
      Evaluator::session_score(drawn_probe, losses_, incumbent_loss);
    } else {
      directions_.assign(probe.directions.begin(), probe.directions.end());
      Evaluator::session_score(probe, losses_, incumbent_loss);
    }
    kept_ = true;
  }

 private:
  std::vector<double> losses_, directions_;
  bool kept_ = false;
};

}  // namespace

TEST_CASE("a transport solved by the backend gives the host's trajectory", "[optimizer]") {
  const Batch batch = random_batch(8);
  const auto loss = make_loss("cross_entropy", 1e-3);
  const std::vector<polyprobe::testing::TransportSetting> settings =
      polyprobe::testing::transport_settings();
  for (std::size_t k = 0; k < settings.size(); ++k) {
    const auto& set = settings[k];
    OptimizerConfig config;
    set.apply(config);
    config.num_probe = k % 2 == 0 ? 1 : 2;
    config.particle_dim = 3;
    config.seed = 5;
    std::vector<std::vector<double>> finals;
    std::vector<std::vector<StepInfo>> infos(2);
    for (const bool on_backend : {false, true}) {
      Model model = small_mlp(3);
      SolvingEvaluator evaluator(model, *loss);
      config.device_transport = on_backend;
      PolytopeOptimizer opt(model, config);
      opt.register_evaluator(evaluator, batch);
      for (int step = 0; step < 6; ++step) infos[on_backend ? 1 : 0].push_back(opt.step());
      CHECK(evaluator.solved == (on_backend ? 6 : 0));
      finals.emplace_back(model.parameters().begin(), model.parameters().end());
    }
    for (std::size_t s = 0; s < infos[0].size(); ++s) {
      INFO("step " << s);
      // The same formulas, summed in another order (the move as sum_v w_v R t_v): equal to
      // rounding, step after step.
      CHECK(infos[1][s].mean_cost == Approx(infos[0][s].mean_cost).epsilon(1e-12));
      CHECK(infos[1][s].best_cost == Approx(infos[0][s].best_cost).epsilon(1e-12));
      CHECK(std::abs(infos[1][s].transport_iterations - infos[0][s].transport_iterations) <= 1);
      CHECK(infos[1][s].move_norm == Approx(infos[0][s].move_norm).epsilon(1e-12));
      if (set.radius == RadiusModelKind::quadratic)
        CHECK(infos[1][s].predicted_change ==
              Approx(infos[0][s].predicted_change).epsilon(1e-9).margin(1e-15));
    }
    for (std::size_t i = 0; i < finals[0].size(); ++i)
      CHECK(finals[1][i] == Approx(finals[0][i]).epsilon(1e-12).margin(1e-14));
  }
}

TEST_CASE("steps the backend cannot solve stay on the host", "[optimizer]") {
  // Adaptive probes keep cost rows on the host: the backend is not asked.
  const Batch batch = random_batch(9);
  const auto loss = make_loss("cross_entropy", 0);
  Model model = small_mlp(4);
  SolvingEvaluator evaluator(model, *loss);
  OptimizerConfig config;
  config.adaptive_probes = true;
  PolytopeOptimizer opt(model, config);
  opt.register_evaluator(evaluator, batch);
  for (int step = 0; step < 3; ++step) opt.step();
  CHECK(evaluator.solved == 0);
}

TEST_CASE("rotations drawn by the backend give the host's trajectory, bit for bit", "[optimizer]") {
  const Batch batch = random_batch(8);
  const auto loss = make_loss("cross_entropy", 1e-3);
  const std::vector<polyprobe::testing::TransportSetting> settings =
      polyprobe::testing::transport_settings();
  for (std::size_t k = 0; k < settings.size(); ++k) {
    OptimizerConfig config;
    settings[k].apply(config);
    config.num_probe = k % 2 == 0 ? 1 : 2;
    config.particle_dim = 2;
    config.seed = 9;
    std::vector<std::vector<double>> finals;
    for (const bool on_backend : {false, true}) {
      Model model = small_mlp(3);
      SolvingEvaluator evaluator(model, *loss);
      evaluator.draws = true;
      config.device_rotations = on_backend;
      PolytopeOptimizer opt(model, config);
      opt.register_evaluator(evaluator, batch);
      for (int step = 0; step < 6; ++step) opt.step();
      CHECK(evaluator.solved == 6);
      CHECK(evaluator.drawn == (on_backend ? 6 : 0));
      finals.emplace_back(model.parameters().begin(), model.parameters().end());
    }
    INFO("setting " << k);
    CHECK(finals[1] == finals[0]);
  }
}

TEST_CASE("rotations stay on the host where the step needs them there", "[optimizer]") {
  const Batch batch = random_batch(9);
  const auto loss = make_loss("cross_entropy", 0);
  OptimizerConfig base;
  base.particle_dim = 2;
  base.device_rotations = true;
  // Each needs the host's rotations (or the host's transport): the evaluator draws none.
  std::vector<std::pair<std::string, OptimizerConfig>> cases;
  cases.emplace_back("d = 3", base);
  cases.back().second.particle_dim = 3;
  cases.emplace_back("biased rotations", base);
  cases.back().second.biased_rotation = true;
  cases.emplace_back("transport on the host", base);
  cases.back().second.device_transport = false;
  cases.emplace_back("adaptive probes", base);
  cases.back().second.adaptive_probes = true;
  for (const auto& [what, config] : cases) {
    INFO(what);
    Model model = small_mlp(4);
    SolvingEvaluator evaluator(model, *loss);
    evaluator.draws = true;
    PolytopeOptimizer opt(model, config);
    opt.register_evaluator(evaluator, batch);
    for (int step = 0; step < 3; ++step) opt.step();
    CHECK(evaluator.drawn == 0);
  }
}
