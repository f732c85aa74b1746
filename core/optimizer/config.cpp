// OptimizerConfig::validate(): every rule in one place, each failure naming its fix.
#include <polyprobe/error.hpp>
#include <polyprobe/optimizer.hpp>

#include <cmath>
#include <string>

namespace polyprobe {

BlockStrategy parse_block_strategy(std::string_view name) {
  if (name == "monolithic") return BlockStrategy::monolithic;
  if (name == "per_layer") return BlockStrategy::per_layer;
  if (name == "grouped") return BlockStrategy::grouped;
  throw Error("unknown block strategy '" + std::string(name) +
              "' (use monolithic, per_layer or grouped)");
}

std::string_view to_string(BlockStrategy strategy) {
  switch (strategy) {
    case BlockStrategy::monolithic:
      return "monolithic";
    case BlockStrategy::per_layer:
      return "per_layer";
    case BlockStrategy::grouped:
      return "grouped";
  }
  return "?";
}

MetricKind parse_metric(std::string_view name) {
  if (name == "identity") return MetricKind::identity;
  if (name == "bfgs") return MetricKind::bfgs;
  throw Error("unknown metric '" + std::string(name) + "' (use identity or bfgs)");
}

std::string_view to_string(MetricKind kind) {
  return kind == MetricKind::bfgs ? "bfgs" : "identity";
}

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error("invalid optimizer configuration: " + message);
}

bool positive(double x) { return std::isfinite(x) && x > 0; }
std::string str(double x) { return std::to_string(x); }

}  // namespace

void OptimizerConfig::validate() const {
  require(particle_dim >= 1 && particle_dim <= 4096,
          "particle_dim must be in [1, 4096], got " + std::to_string(particle_dim));
  require(
      subspace_particle_dim >= 1 && subspace_particle_dim <= 4096,
      "subspace_particle_dim must be in [1, 4096], got " + std::to_string(subspace_particle_dim));
  require(polytope != PolytopeKind::cube || (particle_dim <= 16 && subspace_particle_dim <= 16),
          "the cube has 2^d vertices; with polytope = cube keep particle_dim and "
          "subspace_particle_dim <= 16 (or use the orthoplex, 2d vertices)");
  require(subspace_rotation_interval >= 0,
          "subspace_rotation_interval must be 0 (never) or a positive step count, got " +
              std::to_string(subspace_rotation_interval));
  require(num_probe >= 1, "num_probe (K) must be at least 1, got " + std::to_string(num_probe));
  require(positive(step_radius),
          "step_radius must be positive and finite, got " + str(step_radius));
  require(positive(probe_radius),
          "probe_radius must be positive and finite, got " + str(probe_radius));
  require(positive(epsilon), "epsilon must be positive and finite, got " + str(epsilon));
  require(std::isfinite(ent_epsilon) && ent_epsilon >= 0,
          "ent_epsilon must be 0 (use epsilon) or positive, got " + str(ent_epsilon));
  if (schedule == ScheduleKind::linear || schedule == ScheduleKind::cosine ||
      schedule == ScheduleKind::progressive)
    require(positive(epsilon_final), "schedule " + std::string(to_string(schedule)) +
                                         " needs a positive epsilon_final, got " +
                                         str(epsilon_final));
  if (schedule == ScheduleKind::linear || schedule == ScheduleKind::cosine)
    require(total_steps >= 1, "schedule " + std::string(to_string(schedule)) +
                                  " runs over total_steps, which must be >= 1");
  if (schedule == ScheduleKind::power) {
    require(positive(schedule_decay_steps), "schedule power needs schedule_decay_steps > 0");
    require(std::isfinite(schedule_power) && schedule_power >= 0,
            "schedule power needs schedule_power >= 0");
  }
  if (schedule == ScheduleKind::progressive) {
    require(schedule_decay_rate > 0 && schedule_decay_rate < 1,
            "schedule progressive needs schedule_decay_rate in (0, 1)");
    require(epsilon_final <= epsilon, "schedule progressive needs epsilon_final <= epsilon");
    require(solver == TransportSolver::sinkhorn || solver == TransportSolver::automatic,
            "schedule progressive reacts to an iterative solve: use solver = sinkhorn");
  }
  require(sinkhorn_max_iterations >= 1, "sinkhorn_max_iterations must be at least 1");
  require(positive(sinkhorn_tolerance), "sinkhorn_tolerance must be positive");
  if (solver == TransportSolver::top_k) {
    const int32_t d = std::min(particle_dim, subspace_particle_dim);
    const int64_t vertices = polytope_vertex_count(polytope, d);
    require(top_k >= 1 && top_k <= vertices,
            "solver top_k needs 1 <= top_k <= V = " + std::to_string(vertices) + " vertices, got " +
                std::to_string(top_k));
  }
  require(positive(nonfinite_margin), "nonfinite_margin must be positive");
  require(blocks != BlockStrategy::grouped || block_group_size >= 1,
          "blocks = grouped needs block_group_size >= 1, got " + std::to_string(block_group_size));
  if (momentum) {
    require(momentum_init >= 0 && momentum_init < 1 && momentum_final >= 0 && momentum_final < 1,
            "momentum coefficients momentum_init and momentum_final must be in [0, 1)");
    require(positive(velocity_lr), "velocity_lr must be positive");
    require(total_steps >= 1, "momentum warms up over total_steps, which must be >= 1");
  }

  const RadiusModelSettings& r = radius;
  require(r.kind != RadiusModelKind::plugin || static_cast<bool>(r.plugin_factory),
          "radius model '" + r.plugin_name +
              "' is a plugin's: choose it through PluginRegistry::choose_radius_model");
  if (r.kind == RadiusModelKind::adaptive) {
    require(r.stagnation_patience >= 1, "radius.stagnation_patience must be at least 1");
    require(std::isfinite(r.stagnation_threshold) && r.stagnation_threshold >= 0,
            "radius.stagnation_threshold must be >= 0");
    require(r.radius_increase >= 1 && std::isfinite(r.radius_increase),
            "radius.radius_increase must be >= 1");
    require(r.radius_decrease > 0 && r.radius_decrease <= 1,
            "radius.radius_decrease must be in (0, 1]");
    require(positive(r.radius_min) && r.radius_min <= 1 && r.radius_max >= 1 &&
                std::isfinite(r.radius_max),
            "radius bounds need 0 < radius_min <= 1 <= radius_max");
  }
  const bool quadratic =
      r.kind == RadiusModelKind::quadratic || r.kind == RadiusModelKind::trust_region;
  if (quadratic)
    require(positive(r.quadratic_max_scale), "radius.quadratic_max_scale must be positive");
  if (r.kind == RadiusModelKind::trust_region) {
    require(r.trust_shrink_below < r.trust_grow_above,
            "trust region needs trust_shrink_below < trust_grow_above");
    require(r.trust_shrink > 0 && r.trust_shrink < 1, "trust region needs trust_shrink in (0, 1)");
    require(r.trust_grow >= 1 && std::isfinite(r.trust_grow), "trust region needs trust_grow >= 1");
    require(
        positive(r.trust_min) && r.trust_min <= 1 && r.trust_max >= 1 && std::isfinite(r.trust_max),
        "trust region needs 0 < trust_min <= 1 <= trust_max");
  }
  require(metric == MetricKind::identity || quadratic,
          "metric = bfgs learns from the finite-difference gradient of the quadratic model: set "
          "radius.kind = quadratic or trust_region");
  require(!r.trust_reject || r.kind == RadiusModelKind::trust_region,
          "radius.trust_reject needs radius.kind = trust_region (it undoes steps the trust "
          "region judged)");

  require(std::isfinite(adaptive_probes_threshold) && adaptive_probes_threshold >= 0,
          "adaptive_probes_threshold must be >= 0");
  require(!(adaptive_probes && quadratic),
          "adaptive_probes cannot run with the quadratic or trust_region radius model: the "
          "finite-difference model needs every loss measured at the current incumbent; turn "
          "adaptive_probes off");
  require(amortize_steps >= 1,
          "amortize_steps must be at least 1, got " + std::to_string(amortize_steps));
  require(amortize_ema >= 0 && amortize_ema <= 1, "amortize_ema must be in [0, 1]");
  if (multifidelity_screen) {
    require(screen_fidelity > 0 && screen_fidelity < 1, "screen_fidelity must be in (0, 1)");
    require(screen_keep_ratio > 0 && screen_keep_ratio < 1, "screen_keep_ratio must be in (0, 1)");
    require(screen_fidelity / num_probe + screen_keep_ratio < 1,
            "multifidelity_screen requires screen_fidelity / num_probe + screen_keep_ratio < 1 "
            "(got " +
                str(screen_fidelity / num_probe + screen_keep_ratio) +
                "); above that the screen buys work instead of saving it");
    require(!quadratic,
            "multifidelity_screen cannot run with the quadratic or trust_region radius model: "
            "they need a full single-fidelity loss for every vertex");
  }
}

}  // namespace polyprobe
