// The finite-difference identities of the quadratic model and the trust-region rules.
#include <catch2/catch.hpp>

#include <polyprobe/geometry.hpp>
#include <polyprobe/radius_model.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

using namespace polyprobe;

namespace {

struct Quadratic {
  double f0;
  Eigen::VectorXd g;
  Eigen::MatrixXd h;
  double at(const Eigen::VectorXd& x) const { return f0 + g.dot(x) + 0.5 * x.dot(h * x); }
};

Quadratic random_quadratic(int d, std::mt19937_64& rng, double anisotropy = 1.0) {
  std::normal_distribution<double> n;
  Quadratic q{n(rng), Eigen::VectorXd(d), Eigen::MatrixXd(d, d)};
  for (int i = 0; i < d; ++i) q.g(i) = n(rng);
  Eigen::MatrixXd a(d, d);
  for (int i = 0; i < d * d; ++i) a.data()[i] = n(rng);
  q.h = 0.5 * (a + a.transpose());
  for (int i = 0; i < d; ++i) q.h(i, i) *= std::pow(anisotropy, i);
  return q;
}

// Losses of q at s r R t_v for a random rotation, and the rotated directions.
void probe(const Quadratic& q, PolytopeKind kind, double sr, std::mt19937_64& rng,
           std::vector<double>& losses, Matrix<double>& directions) {
  const auto d = static_cast<int32_t>(q.g.size());
  const Matrix<double> t = make_template(kind, d);
  std::vector<double> r(static_cast<std::size_t>(d * d));
  draw_rotations(RotationStream{rng(), 0}, 0, 1, d, RotationMethod::qr, r);
  Eigen::Map<const Matrix<double>> rot(r.data(), d, d);
  directions = t * rot.transpose();
  losses.resize(static_cast<std::size_t>(t.rows()));
  for (Eigen::Index v = 0; v < t.rows(); ++v)
    losses[static_cast<std::size_t>(v)] = q.at(sr * directions.row(v).transpose());
}

}  // namespace

TEST_CASE("curvature identity tr(H)/d is exact on quadratics", "[optimizer][radius]") {
  std::mt19937_64 rng(5);
  for (PolytopeKind kind : {PolytopeKind::simplex, PolytopeKind::orthoplex, PolytopeKind::cube})
    for (int d : {2, 3, 5}) {
      const Quadratic q = random_quadratic(d, rng);
      std::vector<double> losses;
      Matrix<double> dirs;
      const double sr = 0.37;
      probe(q, kind, sr, rng, losses, dirs);
      std::vector<double> g(static_cast<std::size_t>(d));
      const double curvature = fit_particle_quadratic(losses, q.f0, dirs, sr, g);
      const double exact = q.h.trace() / d;
      INFO(to_string(kind) << " d=" << d);
      REQUIRE(std::abs(curvature - exact) <= 1e-10 * std::max(1.0, std::abs(exact)));
    }
}

TEST_CASE("orthoplex gradients are exact on quadratics", "[optimizer][radius]") {
  std::mt19937_64 rng(6);
  for (int d : {2, 4, 6}) {
    const Quadratic q = random_quadratic(d, rng, 10.0);
    std::vector<double> losses;
    Matrix<double> dirs;
    probe(q, PolytopeKind::orthoplex, 0.8, rng, losses, dirs);
    std::vector<double> g(static_cast<std::size_t>(d));
    fit_particle_quadratic(losses, q.f0, dirs, 0.8, g);
    const Eigen::Map<Eigen::VectorXd> fitted(g.data(), d);
    REQUIRE((fitted - q.g).norm() <= 1e-10 * q.g.norm());
  }
}

TEST_CASE("simplex gradient bias shrinks linearly with the radius", "[optimizer][radius]") {
  std::mt19937_64 rng(8);
  const int d = 3;
  const Quadratic q = random_quadratic(d, rng, 20.0);  // anisotropic
  const Matrix<double> t = make_template(PolytopeKind::simplex, d);
  std::vector<double> r(d * d);
  draw_rotations(RotationStream{rng(), 0}, 0, 1, d, RotationMethod::qr, r);
  Eigen::Map<const Matrix<double>> rot(r.data(), d, d);
  const Matrix<double> dirs = t * rot.transpose();
  std::vector<double> bias;
  for (double sr : {0.1, 0.05, 0.025}) {
    std::vector<double> losses(static_cast<std::size_t>(t.rows())), g(d);
    for (Eigen::Index v = 0; v < t.rows(); ++v)
      losses[static_cast<std::size_t>(v)] = q.at(sr * dirs.row(v).transpose());
    fit_particle_quadratic(losses, q.f0, dirs, sr, g);
    bias.push_back((Eigen::Map<Eigen::VectorXd>(g.data(), d) - q.g).norm());
  }
  REQUIRE(bias[0] > 1e-6);  // the bias exists
  REQUIRE(bias[0] / bias[1] == Approx(2.0).epsilon(1e-6));
  REQUIRE(bias[1] / bias[2] == Approx(2.0).epsilon(1e-6));
}

TEST_CASE("trust-region ratio rules", "[optimizer][radius]") {
  RadiusModelSettings s;
  s.kind = RadiusModelKind::trust_region;
  auto model = make_radius_model(s);
  REQUIRE(model->needs_incumbent());
  REQUIRE(model->multipliers().step == 1.0);

  // Good agreement at the boundary grows the radius.
  model->observe_incumbent(10.0, true);
  model->record_prediction(-1.0, true);
  model->observe_incumbent(9.0, true);  // ratio 1
  REQUIRE(last_trust_ratio(*model) == Approx(1.0));
  REQUIRE(model->multipliers().step == Approx(s.trust_grow));
  REQUIRE(model->multipliers().probe == 1.0);
  // Good agreement inside the region keeps it.
  model->record_prediction(-1.0, false);
  model->observe_incumbent(8.0, true);
  REQUIRE(model->multipliers().step == Approx(s.trust_grow));
  // Poor agreement (an increase) shrinks it.
  model->record_prediction(-1.0, true);
  model->observe_incumbent(8.5, true);  // ratio -0.5
  REQUIRE(last_trust_ratio(*model) == Approx(-0.5));
  REQUIRE(model->multipliers().step == Approx(s.trust_grow * s.trust_shrink));
  const double before = model->multipliers().step;
  // A changed objective (not comparable) forms no ratio and changes nothing.
  model->record_prediction(-1.0, true);
  model->observe_incumbent(100.0, false);
  REQUIRE(std::isnan(last_trust_ratio(*model)));
  REQUIRE(model->multipliers().step == before);
  // An invalidated comparison (momentum-only step) is dropped as well.
  model->record_prediction(-1.0, true);
  model->invalidate();
  model->observe_incumbent(0.0, true);
  REQUIRE(std::isnan(last_trust_ratio(*model)));
  REQUIRE(model->multipliers().step == before);
  // Shrinking stops at trust_min.
  for (int i = 0; i < 100; ++i) {
    model->record_prediction(-1.0, true);
    model->observe_incumbent(1e3 * (i + 1), true);
  }
  REQUIRE(model->multipliers().step == Approx(s.trust_min));
}

TEST_CASE("trust_reject rejects a trial no lower than its incumbent", "[optimizer][radius]") {
  RadiusModelSettings s;
  s.kind = RadiusModelKind::trust_region;
  s.trust_reject = true;
  auto model = make_radius_model(s);
  model->observe_incumbent(10.0, true);  // nothing pending: nothing judged
  REQUIRE(!model->rejected());
  REQUIRE(model->incumbent() == 10.0);
  // A decrease is accepted.
  model->record_prediction(-1.0, false);
  model->observe_incumbent(9.5, true);
  REQUIRE(!model->rejected());
  REQUIRE(model->incumbent() == 9.5);
  // An increase is rejected: the incumbent stays, the radius shrinks.
  model->record_prediction(-1.0, false);
  model->observe_incumbent(9.6, true);
  REQUIRE(model->rejected());
  REQUIRE(model->incumbent() == 9.5);
  REQUIRE(model->multipliers().step == Approx(s.trust_shrink));
  // So is an equal value, and a non-finite one (which shrinks the radius too).
  model->record_prediction(-1.0, false);
  model->observe_incumbent(9.5, true);
  REQUIRE(model->rejected());
  model->record_prediction(-1.0, false);
  model->observe_incumbent(std::numeric_limits<double>::quiet_NaN(), true);
  REQUIRE(model->rejected());
  REQUIRE(model->incumbent() == 9.5);
  REQUIRE(model->multipliers().step == Approx(s.trust_shrink * s.trust_shrink * s.trust_shrink));
  // A comparison that is not comparable (objective changed) never rejects.
  model->record_prediction(-1.0, false);
  model->observe_incumbent(100.0, false);
  REQUIRE(!model->rejected());
  REQUIRE(model->incumbent() == 100.0);
  // Without trust_reject nothing is ever rejected.
  s.trust_reject = false;
  auto plain = make_radius_model(s);
  plain->observe_incumbent(1.0, true);
  plain->record_prediction(-1.0, false);
  plain->observe_incumbent(2.0, true);
  REQUIRE(!plain->rejected());
  REQUIRE(plain->incumbent() == 2.0);
}

TEST_CASE("quadratic step length minimises the block model", "[optimizer][radius]") {
  RadiusModelSettings s;
  s.kind = RadiusModelKind::quadratic;
  auto model = make_radius_model(s);
  REQUIRE(model->move_scale({-2.0, 4.0}) == Approx(0.5));             // Newton step
  REQUIRE(model->move_scale({-2.0, 0.1}) == s.quadratic_max_scale);   // capped
  REQUIRE(model->move_scale({-2.0, -1.0}) == s.quadratic_max_scale);  // concave: the cap
  REQUIRE(model->move_scale({1.0, 1.0}) == 0.0);                      // uphill: stay
}

TEST_CASE("adaptive radius grows after stagnation and shrinks while moving",
          "[optimizer][radius]") {
  RadiusModelSettings s;
  s.kind = RadiusModelKind::adaptive;
  s.stagnation_patience = 3;
  auto model = make_radius_model(s);
  model->observe_costs(1.0);
  model->observe_costs(0.5);  // moving
  REQUIRE(model->multipliers().step == Approx(s.radius_decrease));
  for (int i = 0; i < 3; ++i) model->observe_costs(0.5);  // stagnant x3
  REQUIRE(model->multipliers().step == Approx(s.radius_decrease * s.radius_increase));
}
