// metric = bfgs: the BFGS update and the unit-determinant factor exactly, and the learned
// metric inside the optimizer (same first step, long valleys solved, every API serves it).
#include <catch2/catch.hpp>

#include "optimizer/metric.hpp"

#include <polyprobe/ask_tell.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/minimize.hpp>
#include <polyprobe/optimizer.hpp>

#include <Eigen/Cholesky>
#include <Eigen/LU>
#include <Eigen/QR>

#include <cmath>
#include <random>
#include <span>
#include <sstream>
#include <vector>

using namespace polyprobe;
using polyprobe::detail::bfgs_update;
using polyprobe::detail::unit_determinant_factor;

namespace {

Matrix<double> random_matrix(int d, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  Matrix<double> m(d, d);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

// A random symmetric positive definite matrix with eigenvalues in [1, condition].
Matrix<double> random_spd(int d, double condition, std::mt19937_64& rng) {
  const Eigen::HouseholderQR<Matrix<double>> qr(random_matrix(d, rng));
  const Matrix<double> q = qr.householderQ();
  Vector<double> eigen(d);
  for (int i = 0; i < d; ++i) eigen(i) = std::pow(condition, d > 1 ? double(i) / (d - 1) : 0.0);
  return q * eigen.asDiagonal() * q.transpose();
}

double relative(const Matrix<double>& a, const Matrix<double>& b) {
  return (a - b).norm() / b.norm();
}

std::span<const double> span_of(const Vector<double>& v) {
  return {v.data(), static_cast<std::size_t>(v.size())};
}

// A rotated quadratic valley, condition 1e4: f = (x - 1)' A (x - 1) / 2.
struct Valley {
  Matrix<double> a;
  double operator()(std::span<const double> x) const {
    const Vector<double> e =
        Eigen::Map<const Vector<double>>(x.data(), static_cast<Eigen::Index>(x.size())).array() -
        1.0;
    return 0.5 * e.dot(a * e);
  }
};

// The recommended configuration for minimize() with d coordinates per particle, its metric
// switched as asked.
OptimizerConfig trust_region_config(int d, MetricKind metric) {
  OptimizerConfig c = recommended_minimize_config(d);
  c.metric = metric;
  c.seed = 3;
  return c;
}

}  // namespace

TEST_CASE("bfgs_update meets the secant equation and stays positive definite",
          "[optimizer][metric]") {
  std::mt19937_64 rng(11);
  for (int d : {1, 2, 5, 12}) {
    for (bool first : {true, false}) {
      Matrix<double> h = random_spd(d, 100, rng);
      const Matrix<double> a = random_spd(d, 1e3, rng);
      Vector<double> s = random_matrix(d, rng).col(0);
      const Vector<double> y = a * s;  // s'y = s'As > 0
      REQUIRE(bfgs_update(h, span_of(s), span_of(y), first));
      REQUIRE((h * y - s).norm() <= 1e-10 * s.norm());
      REQUIRE(relative(h, h.transpose()) < 1e-14);
      REQUIRE(Eigen::LLT<Matrix<double>>(h).info() == Eigen::Success);
    }
  }
}

TEST_CASE("bfgs_update refuses pairs without positive curvature", "[optimizer][metric]") {
  std::mt19937_64 rng(12);
  Matrix<double> h = random_spd(4, 10, rng);
  const Matrix<double> before = h;
  const Vector<double> s = random_matrix(4, rng).col(0);
  const Vector<double> zero = Vector<double>::Zero(4);
  REQUIRE_FALSE(bfgs_update(h, span_of(s), span_of(Vector<double>(-s)), true));  // s'y < 0
  REQUIRE_FALSE(bfgs_update(h, span_of(s), span_of(zero), false));               // s'y = 0
  Vector<double> nan = s;
  nan(2) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_FALSE(bfgs_update(h, span_of(s), span_of(nan), false));
  REQUIRE(h == before);
}

TEST_CASE("bfgs along conjugate directions recovers the inverse Hessian", "[optimizer][metric]") {
  // The hereditary property: with d A-conjugate steps and exact gradient changes y = A s,
  // BFGS ends at A^-1 whatever it started from.
  std::mt19937_64 rng(13);
  for (int d : {2, 3, 8}) {
    const Matrix<double> a = random_spd(d, 1e3, rng);
    Matrix<double> steps = random_matrix(d, rng);
    for (int k = 0; k < d; ++k)  // Gram-Schmidt in the A inner product
      for (int j = 0; j < k; ++j)
        steps.col(k) -= (steps.col(j).dot(a * steps.col(k)) / steps.col(j).dot(a * steps.col(j))) *
                        steps.col(j);
    Matrix<double> h = Matrix<double>::Identity(d, d);
    for (int k = 0; k < d; ++k) {
      const Vector<double> s = steps.col(k);
      const Vector<double> y = a * s;
      REQUIRE(bfgs_update(h, span_of(s), span_of(y), k == 0));
    }
    REQUIRE(relative(h, a.inverse()) < 1e-8);
  }
}

TEST_CASE("unit_determinant_factor is a scaled Cholesky factor of determinant one",
          "[optimizer][metric]") {
  std::mt19937_64 rng(14);
  for (int d : {1, 3, 10}) {
    const Matrix<double> h = 7.5 * random_spd(d, 1e4, rng);
    Matrix<double> l(d, d);
    REQUIRE(unit_determinant_factor(h, l));
    REQUIRE(l.isLowerTriangular(0));
    REQUIRE(std::abs(l.diagonal().array().log().sum()) < 1e-12);
    const double c = std::pow(h.determinant(), -1.0 / d);
    REQUIRE(relative(l * l.transpose(), c * h) < 1e-12);
  }
}

TEST_CASE("unit_determinant_factor falls back to the identity", "[optimizer][metric]") {
  Matrix<double> l(2, 2);
  Matrix<double> indefinite(2, 2);
  indefinite << 1, 2, 2, 1;
  REQUIRE_FALSE(unit_determinant_factor(indefinite, l));
  REQUIRE(l == Matrix<double>::Identity(2, 2));
  Matrix<double> degenerate(2, 2);
  degenerate << 1, 0, 0, 1e-14;  // factor diagonal ratio 1e7: beyond what probes resolve
  REQUIRE_FALSE(unit_determinant_factor(degenerate, l));
  REQUIRE(l == Matrix<double>::Identity(2, 2));
  Matrix<double> nan = Matrix<double>::Identity(2, 2);
  nan(1, 1) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_FALSE(unit_determinant_factor(nan, l));
  REQUIRE(l == Matrix<double>::Identity(2, 2));
}

TEST_CASE("the learned metric starts as the template and then solves a long valley",
          "[optimizer][metric]") {
  const int n = 10;
  std::mt19937_64 rng(15);
  const Valley f{random_spd(n, 1e4, rng)};
  const std::vector<double> x0(n, 0.0);

  // Before any update the metric is the identity: one step is the same with or without it.
  const int64_t one_step = n + 2;  // n + 1 vertices and the incumbent
  const MinimizeResult plain_first =
      minimize(f, x0, one_step + 1, trust_region_config(n, MetricKind::identity));
  const MinimizeResult bfgs_first =
      minimize(f, x0, one_step + 1, trust_region_config(n, MetricKind::bfgs));
  REQUIRE(bfgs_first.x == plain_first.x);

  // 200 simplex gradients: the template alone crawls along the valley, the metric does not.
  const int64_t budget = 200 * (n + 1);
  const MinimizeResult plain =
      minimize(f, x0, budget, trust_region_config(n, MetricKind::identity));
  const MinimizeResult bfgs = minimize(f, x0, budget, trust_region_config(n, MetricKind::bfgs));
  const double start = f(x0);
  CAPTURE(start, plain.f, bfgs.f);
  REQUIRE(bfgs.evaluations <= budget);
  REQUIRE(bfgs.f < 1e-8 * start);
  REQUIRE(bfgs.f < 1e-3 * plain.f);
}

TEST_CASE("ask/tell with a learned metric resumes bit-identically", "[optimizer][metric]") {
  // A swarm of 4 points in a 3-d valley of condition 1e3; each particle learns its metric.
  const int d = 3;
  std::mt19937_64 rng(16);
  const Valley f{random_spd(d, 1e3, rng)};
  auto score = [&](const Matrix<double>& rows) {
    std::vector<double> losses(static_cast<std::size_t>(rows.rows()));
    for (Eigen::Index c = 0; c < rows.rows(); ++c)
      losses[static_cast<std::size_t>(c)] = f({rows.row(c).data(), static_cast<std::size_t>(d)});
    return losses;
  };
  const OptimizerConfig config = trust_region_config(d, MetricKind::bfgs);
  const Matrix<double> start = Matrix<double>::Zero(4, d);
  AskTellOptimizer straight(start, config);
  for (int s = 0; s < 60; ++s) straight.tell(score(straight.ask()));

  AskTellOptimizer first(start, config);
  for (int s = 0; s < 25; ++s) first.tell(score(first.ask()));
  const Matrix<double> pending = first.ask();
  std::stringstream state;
  first.save_state(state);
  AskTellOptimizer second(start, config);
  second.load_state(state);
  REQUIRE(second.ask() == pending);
  for (int s = 25; s < 60; ++s) second.tell(score(second.ask()));
  REQUIRE(second.particles() == straight.particles());
  REQUIRE(straight.best_loss() < 1e-6 * f({start.row(0).data(), static_cast<std::size_t>(d)}));
}
