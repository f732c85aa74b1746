// Transport solvers: Sinkhorn meets its marginals and agrees with a dense reference; the
// closed-form rules; the barycentric move equals the explicit weighted sum of step points.
#include <catch2/catch.hpp>

#include "optimizer/step_engine.hpp"

#include <polyprobe/transport.hpp>

#include <cmath>
#include <random>

using namespace polyprobe;

namespace {

Matrix<double> random_cost(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Matrix<double> c(rows, cols);
  for (Eigen::Index i = 0; i < c.size(); ++i) c.data()[i] = u(rng);
  return c;
}

// Plain (not log-domain) Sinkhorn-Knopp scaling with many iterations: the dense reference.
Matrix<double> dense_sinkhorn(const Matrix<double>& cost, double eps) {
  const auto P = cost.rows(), V = cost.cols();
  Matrix<double> kernel = (-cost / eps).array().exp();
  Eigen::VectorXd u = Eigen::VectorXd::Ones(P), v = Eigen::VectorXd::Ones(V);
  for (int it = 0; it < 20000; ++it) {
    u = (Eigen::VectorXd::Constant(P, 1.0 / static_cast<double>(P))).cwiseQuotient(kernel * v);
    v = (Eigen::VectorXd::Constant(V, 1.0 / static_cast<double>(V)))
            .cwiseQuotient(kernel.transpose() * u);
  }
  return u.asDiagonal() * kernel * v.asDiagonal();
}

}  // namespace

TEST_CASE("sinkhorn meets uniform marginals and matches a dense reference",
          "[optimizer][transport]") {
  for (auto [P, V, eps] : {std::tuple{7, 3, 0.2}, std::tuple{20, 4, 0.1}, std::tuple{5, 9, 0.5}}) {
    const Matrix<double> cost = random_cost(P, V, static_cast<uint64_t>(P * 31 + V));
    SinkhornDuals duals;
    Matrix<double> weights(P, V);
    const TransportResult r = solve_sinkhorn(cost, eps, {5000, 1e-12}, duals, weights);
    REQUIRE(r.converged);
    const Matrix<double> plan = sinkhorn_plan(cost, eps, duals);
    REQUIRE((plan.rowwise().sum().array() - 1.0 / P).abs().maxCoeff() < 1e-12);
    REQUIRE((plan.colwise().sum().array() - 1.0 / V).abs().maxCoeff() < 1e-11);
    const Matrix<double> reference = dense_sinkhorn(cost, eps);
    REQUIRE((plan - reference).cwiseAbs().maxCoeff() < 1e-10);
    // Move weights are the plan's rows normalised.
    for (int i = 0; i < P; ++i)
      REQUIRE((weights.row(i) - plan.row(i) / plan.row(i).sum()).cwiseAbs().maxCoeff() < 1e-12);
    // A warm start from the solution converges at once.
    const TransportResult again = solve_sinkhorn(cost, eps, {5000, 1e-9}, duals, weights);
    REQUIRE(again.iterations <= 1);
  }
}

TEST_CASE("log-domain sinkhorn stays finite at tiny epsilon", "[optimizer][transport]") {
  const Matrix<double> cost = random_cost(10, 3, 5) * 100.0;
  SinkhornDuals duals;
  Matrix<double> weights(10, 3);
  solve_sinkhorn(cost, 1e-3, {200, 1e-6}, duals, weights);
  REQUIRE(weights.allFinite());
  REQUIRE((weights.rowwise().sum().array() - 1).abs().maxCoeff() < 1e-12);
}

TEST_CASE("sinkhorn refuses weights that share the cost's memory", "[optimizer][transport]") {
  // Each row update writes the plan while later passes still read the cost.
  Matrix<double> cost = random_cost(6, 3, 7);
  SinkhornDuals duals;
  REQUIRE_THROWS_WITH(solve_sinkhorn(cost, 0.5, {100, 1e-9}, duals, cost),
                      Catch::Contains("must not share the cost's memory"));
}

TEST_CASE("softmax, greedy and top-k rules", "[optimizer][transport]") {
  const Matrix<double> cost = random_cost(6, 5, 9);
  Matrix<double> w(6, 5);
  solve_softmax(cost, 0.3, w);
  for (int i = 0; i < 6; ++i) {
    const Eigen::RowVectorXd e = (-cost.row(i) / 0.3).array().exp();
    REQUIRE((w.row(i) - e / e.sum()).cwiseAbs().maxCoeff() < 1e-14);
  }
  solve_greedy(cost, w);
  for (int i = 0; i < 6; ++i) {
    Eigen::Index best;
    cost.row(i).minCoeff(&best);
    REQUIRE(w(i, best) == 1.0);
    REQUIRE(w.row(i).sum() == 1.0);
  }
  solve_top_k(cost, 2, w);
  for (int i = 0; i < 6; ++i) {
    REQUIRE(w.row(i).sum() == Approx(1.0));
    REQUIRE((w.row(i).array() > 0).count() == 2);
    double kept_max = 0, dropped_min = 1e9;
    for (int v = 0; v < 5; ++v)
      (w(i, v) > 0 ? kept_max : dropped_min) =
          w(i, v) > 0 ? std::max(kept_max, cost(i, v)) : std::min(dropped_min, cost(i, v));
    REQUIRE(kept_max <= dropped_min);
  }
}

TEST_CASE("the barycentric move equals the explicit weighted sum of step points",
          "[optimizer][transport]") {
  for (PolytopeKind kind : {PolytopeKind::simplex, PolytopeKind::orthoplex}) {
    OptimizerConfig config;
    config.polytope = kind;
    config.particle_dim = 3;
    config.num_probe = 2;
    config.seed = 42;
    const int64_t P = 6;
    detail::StepEngine engine(config, 3, P, {{0, 2}, {2, 4}}, TransportSolver::sinkhorn);
    engine.plan(1);
    const int64_t V = engine.vertex_count();
    std::vector<double> losses(static_cast<std::size_t>(engine.candidates_per_step()));
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<double> u;
    for (double& l : losses) l = u(rng);
    std::vector<double> moves(P * 3);
    const StepInfo info = engine.finish(losses, {}, moves);
    const Matrix<double>& t = engine.polytope();
    for (int64_t i = 0; i < P; ++i) {
      Eigen::Map<const Matrix<double>> rot(engine.rotations().data() + i * 9, 3, 3);
      Eigen::Vector3d explicit_sum = Eigen::Vector3d::Zero();
      for (int64_t v = 0; v < V; ++v)  // Y_iv - X_i = step_r R_i t_v
        explicit_sum += engine.weights()(i, v) * info.step_radius * (rot * t.row(v).transpose());
      for (int j = 0; j < 3; ++j)
        REQUIRE(std::abs(moves[static_cast<std::size_t>(i * 3 + j)] - explicit_sum(j)) < 1e-14);
      REQUIRE(std::abs(engine.weights().row(i).sum() - 1) < 1e-12);
    }
  }
}
