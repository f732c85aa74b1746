// Radius models: the controllers that decide the radii and step lengths of the optimizer.
//
// The optimizer asks its RadiusModel, every scored step, for multipliers on the scheduled
// radii, whether it needs the shared incumbent evaluation f(X), and how far to move along the
// transport move of each block given that block's local quadratic model. It then reports the
// incumbent, the prediction it acted on and the step's costs. Implementations: fixed (the
// schedule alone), adaptive (stagnation-based radius), quadratic (finite-difference model
// chooses the step length) and trust_region (quadratic plus a radius that follows the ratio of
// actual to predicted decrease). A plugin may add more (RadiusModelKind::plugin: the
// settings carry the factory that makes it, PluginRegistry::radius_model_factory). Their
// state is part of the optimizer's checkpoint.
#pragma once

#include <polyprobe/tensor.hpp>

#include <functional>
#include <iosfwd>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace polyprobe {

enum class RadiusModelKind { fixed, adaptive, quadratic, trust_region, plugin };

// The built-in models by name; throws for any other (plugins' names are resolved by the
// registry, PluginRegistry::radius_model_factory).
RadiusModelKind parse_radius_model(std::string_view name);
std::string_view to_string(RadiusModelKind kind);
// Whether `name` is one of the built-in models.
bool is_builtin_radius_model(std::string_view name);

class RadiusModel;

struct RadiusModelSettings {
  RadiusModelKind kind = RadiusModelKind::fixed;
  // adaptive (polystep's use_adaptive_radius)
  double stagnation_threshold = 1e-4;  // relative change of the mean cost that counts as none
  int32_t stagnation_patience = 10;    // stagnant steps before the radius grows
  double radius_increase = 1.5;
  double radius_decrease = 0.9;
  double radius_min = 0.5;  // multiplier bounds
  double radius_max = 3.0;
  // quadratic and trust_region
  double quadratic_max_scale = 2.0;  // longest step, in multiples of the transport move
  // trust_region
  double trust_shrink_below = 0.25;  // ratio actual / predicted under which the radius shrinks
  double trust_grow_above = 0.75;    // ratio over which a step at the boundary grows it
  double trust_shrink = 0.5;
  double trust_grow = 2.0;
  double trust_min = 1e-4;  // step-radius multiplier bounds
  double trust_max = 4.0;
  // Whether the probe radius follows the trust radius too. polystep adapts step_radius only
  // (false); shrinking both lets finite differences resolve the small scales that accurate
  // convergence on smooth problems needs (docs/optimizer.md).
  bool trust_scales_probe = false;
  // Whether a step that did not lower the incumbent is undone (not in polystep, which always
  // moves). The optimizer then scores the trial point first, before the candidates: when
  // f(X_new) >= f(X_old) (or is not finite) it returns to X_old, the radius shrinks as the
  // ratio rule says, and the step probes around X_old again. Needs a stationary objective,
  // the manual step API or minimize(); the ask/tell interface refuses it.
  bool trust_reject = false;
  // plugin: its name (for messages and checkpoints) and the factory that creates one model
  // per optimizer; the factory holds what it needs (the plugin, the optimizer's settings).
  std::string plugin_name;
  std::function<std::unique_ptr<RadiusModel>()> plugin_factory;
};

// The quadratic model of one block along its transport move m: the predicted change of the
// objective for the move a m is q(a) = a slope + a^2 curvature / 2.
struct BlockModel {
  double slope = 0;
  double curvature = 0;
};

struct RadiusMultipliers {
  double step = 1.0;
  double probe = 1.0;
};

class RadiusModel {
 public:
  virtual ~RadiusModel() = default;
  virtual RadiusModelKind kind() const = 0;
  // The name users choose it by ("fixed", ..., or a plugin's model name).
  virtual std::string name() const { return std::string(to_string(kind())); }
  // Whether each scored step must evaluate the incumbent f(X) (one shared evaluation).
  virtual bool needs_incumbent() const { return false; }
  // Multipliers on the scheduled radii for the coming step.
  virtual RadiusMultipliers multipliers() const { return {}; }
  // f(X_t) of a scored step. `comparable` is false when the objective token or the batch
  // changed, or a momentum-only step intervened, since the last recorded prediction; the
  // deferred comparison is then dropped, never used.
  virtual void observe_incumbent(double /*loss*/, bool /*comparable*/) {}
  // Step length along a block's transport move, as a multiple of it (1 = the move itself).
  virtual double move_scale(const BlockModel& /*block*/) const { return 1.0; }
  // The predicted change of the step just taken (sum over blocks).
  // `at_boundary`: the step length hit quadratic_max_scale (a trust region may then grow).
  virtual void record_prediction(double /*predicted_change*/, bool /*at_boundary*/) {}
  // The mean candidate cost of the step just scored (stagnation feedback).
  virtual void observe_costs(double /*mean_cost*/) {}
  // Forget any deferred comparison (objective changed, momentum-only step, resync).
  virtual void invalidate() {}
  // Whether the last observe_incumbent() rejected the step it judged (trust_reject): the
  // caller returns to the previous incumbent, whose loss incumbent() then gives.
  virtual bool rejected() const { return false; }
  virtual double incumbent() const { return std::numeric_limits<double>::quiet_NaN(); }
  virtual void save(std::ostream& out) const = 0;
  virtual void load(std::istream& in) = 0;
};

std::unique_ptr<RadiusModel> make_radius_model(const RadiusModelSettings& settings);

// The last trust-region ratio actual / predicted, or NaN when none was formed (for StepInfo).
double last_trust_ratio(const RadiusModel& model);

// The finite-difference model of one particle from the losses at its V vertices, probed at
// displacement s r R t_v (`directions` holds the V rotated unit vertices R t_v as rows):
//   g = d / (V s r) sum_v (L_v - L_ref) R t_v,   tr(H)/d = 2 (mean_v L_v - f(X)) / (s r)^2.
// Writes g into `gradient` (d) and returns tr(H)/d. Exact on quadratics for the orthoplex;
// the simplex gradient carries an O(s r) bias from anisotropic curvature.
double fit_particle_quadratic(std::span<const double> losses, double incumbent,
                              const ConstMatrixRef<double>& directions, double scaled_radius,
                              std::span<double> gradient);

}  // namespace polyprobe
