// Ask/tell over a swarm: descent, sizes, exact resume between ask and tell.
#include <catch2/catch.hpp>

#include <polyprobe/ask_tell.hpp>
#include <polyprobe/error.hpp>

#include <sstream>
#include <vector>

using namespace polyprobe;

namespace {

std::vector<double> sphere(const Matrix<double>& x) {
  std::vector<double> out(static_cast<std::size_t>(x.rows()));
  for (Eigen::Index r = 0; r < x.rows(); ++r)
    out[static_cast<std::size_t>(r)] = (x.row(r).array() - 0.5).square().sum();
  return out;
}

}  // namespace

TEST_CASE("ask/tell minimises a sphere with a swarm", "[optimizer][ask_tell]") {
  OptimizerConfig config;
  config.particle_dim = 2;
  config.seed = 4;
  const Matrix<double> start = Matrix<double>::Constant(16, 2, 3.0);
  AskTellOptimizer opt(start, config);
  const Matrix<double>& asked = opt.ask();
  REQUIRE(asked.rows() == 16 * 3);
  REQUIRE(&opt.ask() == &asked);  // asking twice returns the pending candidates
  opt.tell(sphere(asked));
  for (int s = 0; s < 200; ++s) opt.tell(sphere(opt.ask()));
  REQUIRE(opt.best_loss() < 0.05);
  REQUIRE(opt.evaluations() == 201 * 48);
  REQUIRE_THROWS_WITH(opt.tell(std::vector<double>(48)), Catch::Contains("without a pending ask"));
  opt.ask();
  REQUIRE_THROWS_WITH(opt.tell(std::vector<double>(3)), Catch::Contains("3 losses for 48"));
}

TEST_CASE("ask/tell resumes bit-identically, even between ask and tell", "[optimizer][ask_tell]") {
  OptimizerConfig config;
  config.particle_dim = 3;
  config.radius.kind = RadiusModelKind::trust_region;
  config.seed = 5;
  const Matrix<double> start = Matrix<double>::Constant(4, 3, 1.0);
  AskTellOptimizer straight(start, config);
  for (int s = 0; s < 10; ++s) straight.tell(sphere(straight.ask()));

  AskTellOptimizer first(start, config);
  for (int s = 0; s < 4; ++s) first.tell(sphere(first.ask()));
  const Matrix<double> pending = first.ask();
  REQUIRE(pending.rows() == 4 * 4 + 4);  // candidates, then one incumbent per particle
  std::stringstream state;
  first.save_state(state);
  AskTellOptimizer second(Matrix<double>::Zero(4, 3), config);
  second.load_state(state);
  REQUIRE(second.ask() == pending);
  for (int s = 4; s < 10; ++s) second.tell(sphere(second.ask()));
  REQUIRE(second.particles() == straight.particles());
  REQUIRE(second.best_loss() == straight.best_loss());
}

TEST_CASE("ask/tell rejects what it cannot serve", "[optimizer][ask_tell]") {
  OptimizerConfig config;
  config.particle_dim = 2;
  REQUIRE_THROWS_WITH(AskTellOptimizer(Matrix<double>::Zero(3, 4), config),
                      Catch::Contains("particle_dim"));
  config.adaptive_probes = true;
  REQUIRE_THROWS_WITH(AskTellOptimizer(Matrix<double>::Zero(3, 2), config),
                      Catch::Contains("adaptive_probes"));
  config.adaptive_probes = false;
  config.radius.kind = RadiusModelKind::trust_region;
  config.radius.trust_reject = true;
  REQUIRE_THROWS_WITH(AskTellOptimizer(Matrix<double>::Zero(3, 2), config),
                      Catch::Contains("trust_reject"));
}
