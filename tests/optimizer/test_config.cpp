// Every invalid configuration is rejected by validate() with a message naming its rule.
#include <catch2/catch.hpp>

#include <polyprobe/error.hpp>
#include <polyprobe/optimizer.hpp>

#include <functional>
#include <string>
#include <vector>

using namespace polyprobe;

namespace {

struct Case {
  std::string reason;  // a fragment the message must contain
  std::function<void(OptimizerConfig&)> edit;
};

}  // namespace

TEST_CASE("the default configuration is valid", "[optimizer][config]") {
  REQUIRE_NOTHROW(OptimizerConfig{}.validate());
  OptimizerConfig best;  // polystep's best at a fixed budget: simplex + quadratic + TR + K=1
  best.radius.kind = RadiusModelKind::trust_region;
  REQUIRE_NOTHROW(best.validate());
}

TEST_CASE("invalid configurations are rejected with their reason", "[optimizer][config]") {
  const std::vector<Case> cases = {
      {"particle_dim", [](auto& c) { c.particle_dim = 0; }},
      {"subspace_particle_dim", [](auto& c) { c.subspace_particle_dim = 0; }},
      {"2^d vertices",
       [](auto& c) {
         c.polytope = PolytopeKind::cube;
         c.particle_dim = 17;
       }},
      {"num_probe", [](auto& c) { c.num_probe = 0; }},
      {"metric = bfgs learns from the finite-difference gradient",
       [](auto& c) { c.metric = MetricKind::bfgs; }},  // the default radius model is fixed
      {"step_radius", [](auto& c) { c.step_radius = 0; }},
      {"probe_radius", [](auto& c) { c.probe_radius = -1; }},
      {"epsilon must", [](auto& c) { c.epsilon = 0; }},
      {"ent_epsilon", [](auto& c) { c.ent_epsilon = -1; }},
      {"epsilon_final",
       [](auto& c) {
         c.schedule = ScheduleKind::linear;
         c.epsilon_final = 0;
       }},
      {"total_steps",
       [](auto& c) {
         c.schedule = ScheduleKind::cosine;
         c.total_steps = 0;
       }},
      {"schedule_decay_steps",
       [](auto& c) {
         c.schedule = ScheduleKind::power;
         c.schedule_decay_steps = 0;
       }},
      {"schedule_power",
       [](auto& c) {
         c.schedule = ScheduleKind::power;
         c.schedule_power = -1;
       }},
      {"schedule_decay_rate",
       [](auto& c) {
         c.schedule = ScheduleKind::progressive;
         c.schedule_decay_rate = 1;
       }},
      {"epsilon_final <= epsilon",
       [](auto& c) {
         c.schedule = ScheduleKind::progressive;
         c.epsilon_final = 1;
       }},
      {"use solver = sinkhorn",
       [](auto& c) {
         c.schedule = ScheduleKind::progressive;
         c.solver = TransportSolver::softmax;
       }},
      {"sinkhorn_max_iterations", [](auto& c) { c.sinkhorn_max_iterations = 0; }},
      {"sinkhorn_tolerance", [](auto& c) { c.sinkhorn_tolerance = 0; }},
      {"top_k",
       [](auto& c) {
         c.solver = TransportSolver::top_k;
         c.top_k = 4;
       }},
      {"nonfinite_margin", [](auto& c) { c.nonfinite_margin = 0; }},
      {"block_group_size",
       [](auto& c) {
         c.blocks = BlockStrategy::grouped;
         c.block_group_size = 0;
       }},
      {"momentum coefficients",
       [](auto& c) {
         c.momentum = true;
         c.momentum_final = 1;
       }},
      {"velocity_lr",
       [](auto& c) {
         c.momentum = true;
         c.velocity_lr = 0;
       }},
      {"stagnation_patience",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::adaptive;
         c.radius.stagnation_patience = 0;
       }},
      {"radius_increase",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::adaptive;
         c.radius.radius_increase = 0.5;
       }},
      {"radius_decrease",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::adaptive;
         c.radius.radius_decrease = 0;
       }},
      {"radius_min",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::adaptive;
         c.radius.radius_min = 2;
       }},
      {"quadratic_max_scale",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::quadratic;
         c.radius.quadratic_max_scale = 0;
       }},
      {"trust_shrink_below < trust_grow_above",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::trust_region;
         c.radius.trust_shrink_below = 0.9;
       }},
      {"trust_shrink in",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::trust_region;
         c.radius.trust_shrink = 1;
       }},
      {"trust_grow",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::trust_region;
         c.radius.trust_grow = 0.5;
       }},
      {"trust_min",
       [](auto& c) {
         c.radius.kind = RadiusModelKind::trust_region;
         c.radius.trust_min = 0;
       }},
      {"trust_reject needs", [](auto& c) { c.radius.trust_reject = true; }},
      {"adaptive_probes_threshold", [](auto& c) { c.adaptive_probes_threshold = -1; }},
      {"adaptive_probes cannot run with the quadratic",
       [](auto& c) {
         c.adaptive_probes = true;
         c.radius.kind = RadiusModelKind::quadratic;
       }},
      {"amortize_steps", [](auto& c) { c.amortize_steps = 0; }},
      {"amortize_ema", [](auto& c) { c.amortize_ema = 2; }},
      {"screen_fidelity must",
       [](auto& c) {
         c.multifidelity_screen = true;
         c.screen_fidelity = 0;
       }},
      {"screen_keep_ratio must",
       [](auto& c) {
         c.multifidelity_screen = true;
         c.screen_keep_ratio = 1;
       }},
      {"screen_fidelity / num_probe + screen_keep_ratio < 1",
       [](auto& c) {
         c.multifidelity_screen = true;
         c.screen_fidelity = 0.6;
       }},
      {"multifidelity_screen cannot run with the quadratic",
       [](auto& c) {
         c.multifidelity_screen = true;
         c.radius.kind = RadiusModelKind::trust_region;
       }},
  };
  for (const Case& c : cases) {
    OptimizerConfig config;
    c.edit(config);
    INFO("rule: " << c.reason);
    REQUIRE_THROWS_WITH(config.validate(), Catch::Contains(c.reason) &&
                                               Catch::Contains("invalid optimizer configuration"));
  }
  // The screen rule is about the ratio, not the fields: more probes make the same screen valid.
  OptimizerConfig screen;
  screen.multifidelity_screen = true;
  screen.screen_fidelity = 0.6;
  screen.num_probe = 2;
  REQUIRE_NOTHROW(screen.validate());
}

TEST_CASE("option names parse and print", "[optimizer][config]") {
  REQUIRE(parse_polytope("orthoplex") == PolytopeKind::orthoplex);
  REQUIRE(parse_schedule("cosine") == ScheduleKind::cosine);
  REQUIRE(parse_transport_solver("top_k") == TransportSolver::top_k);
  REQUIRE(parse_radius_model("trust_region") == RadiusModelKind::trust_region);
  REQUIRE(parse_block_strategy("per_layer") == BlockStrategy::per_layer);
  REQUIRE(parse_cost_scaling("min_max") == CostScaling::min_max);
  REQUIRE(to_string(BlockStrategy::grouped) == "grouped");
  REQUIRE(parse_metric("bfgs") == MetricKind::bfgs);
  REQUIRE(to_string(MetricKind::identity) == "identity");
  REQUIRE_THROWS_WITH(parse_metric("newton"), Catch::Contains("identity or bfgs"));
  REQUIRE_THROWS_WITH(parse_polytope("sphere"), Catch::Contains("simplex, orthoplex or cube"));
}
