// Radius models: fixed, stagnation-adaptive, quadratic and trust region.
#include "state_io.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/radius_model.hpp>

#include "quadratic_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace polyprobe {

RadiusModelKind parse_radius_model(std::string_view name) {
  if (name == "fixed") return RadiusModelKind::fixed;
  if (name == "adaptive") return RadiusModelKind::adaptive;
  if (name == "quadratic") return RadiusModelKind::quadratic;
  if (name == "trust_region") return RadiusModelKind::trust_region;
  throw Error("unknown radius model '" + std::string(name) +
              "' (use fixed, adaptive, quadratic or trust_region, or a plugin's model listed by "
              "`polyprobe plugins`)");
}

bool is_builtin_radius_model(std::string_view name) {
  return name == "fixed" || name == "adaptive" || name == "quadratic" || name == "trust_region";
}

std::string_view to_string(RadiusModelKind kind) {
  switch (kind) {
    case RadiusModelKind::fixed:
      return "fixed";
    case RadiusModelKind::adaptive:
      return "adaptive";
    case RadiusModelKind::quadratic:
      return "quadratic";
    case RadiusModelKind::trust_region:
      return "trust_region";
    case RadiusModelKind::plugin:
      return "plugin";
  }
  return "?";
}

double fit_particle_quadratic(std::span<const double> losses, double incumbent,
                              const ConstMatrixRef<double>& directions, double scaled_radius,
                              std::span<double> gradient) {
  const auto vertices = static_cast<std::size_t>(directions.rows());
  const auto d = static_cast<std::size_t>(directions.cols());
  if (losses.size() != vertices || gradient.size() != d)
    throw Error("fit_particle_quadratic: " + std::to_string(losses.size()) + " losses and a " +
                std::to_string(gradient.size()) + "-vector gradient for " +
                std::to_string(vertices) + " directions of dimension " + std::to_string(d));
  return detail::fit_particle_quadratic_rows(
      losses.data(), static_cast<int64_t>(vertices), incumbent, directions.data(),
      static_cast<int64_t>(directions.outerStride()), static_cast<int64_t>(d), scaled_radius,
      gradient.data());
}

namespace {

class FixedRadius final : public RadiusModel {
 public:
  RadiusModelKind kind() const override { return RadiusModelKind::fixed; }
  void save(std::ostream&) const override {}
  void load(std::istream&) override {}
};

// polystep's use_adaptive_radius: shrink the radii while the mean cost keeps moving, grow
// them after `patience` steps without relative change (the search is stuck at this scale).
class AdaptiveRadius final : public RadiusModel {
 public:
  explicit AdaptiveRadius(const RadiusModelSettings& s) : s_(s) {}
  RadiusModelKind kind() const override { return RadiusModelKind::adaptive; }
  RadiusMultipliers multipliers() const override { return {multiplier_, multiplier_}; }
  void observe_costs(double mean_cost) override {
    if (has_previous_) {
      const double change = std::abs(mean_cost - previous_) /
                            std::max(std::abs(previous_), std::numeric_limits<double>::min());
      if (change < s_.stagnation_threshold) {
        if (++stagnant_ >= s_.stagnation_patience) {
          multiplier_ = std::min(multiplier_ * s_.radius_increase, s_.radius_max);
          stagnant_ = 0;
        }
      } else {
        stagnant_ = 0;
        multiplier_ = std::max(multiplier_ * s_.radius_decrease, s_.radius_min);
      }
    }
    previous_ = mean_cost;
    has_previous_ = std::isfinite(mean_cost);
  }
  void save(std::ostream& out) const override {
    state_io::put(out, "adaptive.multiplier", multiplier_);
    state_io::put(out, "adaptive.previous", previous_);
    state_io::put(out, "adaptive.has_previous", has_previous_ ? 1 : 0);
    state_io::put(out, "adaptive.stagnant", stagnant_);
  }
  void load(std::istream& in) override {
    int has = 0;
    state_io::get(in, "adaptive.multiplier", multiplier_);
    state_io::get(in, "adaptive.previous", previous_);
    state_io::get(in, "adaptive.has_previous", has);
    state_io::get(in, "adaptive.stagnant", stagnant_);
    has_previous_ = has != 0;
  }

 private:
  RadiusModelSettings s_;
  double multiplier_ = 1.0;
  double previous_ = 0;
  bool has_previous_ = false;
  int32_t stagnant_ = 0;
};

// The step length that minimises the block's model a slope + a^2 curvature / 2 on
// [0, quadratic_max_scale]: Newton's step when the model is convex, the cap when it is not,
// and no move when the transport move is predicted uphill.
class QuadraticRadius : public RadiusModel {
 public:
  explicit QuadraticRadius(const RadiusModelSettings& s) : s_(s) {}
  RadiusModelKind kind() const override { return RadiusModelKind::quadratic; }
  bool needs_incumbent() const override { return true; }
  double move_scale(const BlockModel& block) const override {
    if (!(block.slope < 0)) return 0.0;
    if (!(block.curvature > 0)) return s_.quadratic_max_scale;
    return std::min(-block.slope / block.curvature, s_.quadratic_max_scale);
  }
  void save(std::ostream&) const override {}
  void load(std::istream&) override {}

 protected:
  RadiusModelSettings s_;
};

// Trust region over the quadratic model: the step-radius multiplier follows the ratio of the
// actual change between consecutive incumbents to the change the model predicted. The
// comparison is deferred to the next scored step, which measures the new incumbent, and is
// dropped whenever the caller says the two incumbents are not comparable.
class TrustRegion final : public QuadraticRadius {
 public:
  explicit TrustRegion(const RadiusModelSettings& s) : QuadraticRadius(s) {}
  RadiusModelKind kind() const override { return RadiusModelKind::trust_region; }
  RadiusMultipliers multipliers() const override {
    return {multiplier_, s_.trust_scales_probe ? multiplier_ : 1.0};
  }
  void observe_incumbent(double loss, bool comparable) override {
    last_ratio_ = std::numeric_limits<double>::quiet_NaN();
    rejected_ = false;
    const bool judged = pending_ && comparable && pending_prediction_ < 0;
    if (judged && std::isfinite(loss)) {
      const double actual = loss - pending_incumbent_;
      last_ratio_ = actual / pending_prediction_;
      if (last_ratio_ < s_.trust_shrink_below)
        multiplier_ = std::max(multiplier_ * s_.trust_shrink, s_.trust_min);
      else if (last_ratio_ > s_.trust_grow_above && pending_at_boundary_)
        multiplier_ = std::min(multiplier_ * s_.trust_grow, s_.trust_max);
    } else if (judged && s_.trust_reject) {
      multiplier_ = std::max(multiplier_ * s_.trust_shrink, s_.trust_min);  // a non-finite trial
    }
    pending_ = false;
    // trust_reject: a trial no lower than the incumbent it left (NaN included) is undone.
    rejected_ = judged && s_.trust_reject && std::isfinite(pending_incumbent_) &&
                !(loss < pending_incumbent_);
    incumbent_ = rejected_ ? pending_incumbent_ : loss;
  }
  bool rejected() const override { return rejected_; }
  double incumbent() const override { return incumbent_; }
  void record_prediction(double predicted_change, bool at_boundary) override {
    pending_ = std::isfinite(predicted_change) && std::isfinite(incumbent_);
    pending_prediction_ = predicted_change;
    pending_incumbent_ = incumbent_;
    pending_at_boundary_ = at_boundary;
  }
  void invalidate() override {
    pending_ = false;
    rejected_ = false;
  }
  void save(std::ostream& out) const override {
    state_io::put(out, "trust.multiplier", multiplier_);
    state_io::put(out, "trust.incumbent", incumbent_);
    state_io::put(out, "trust.pending", pending_ ? 1 : 0);
    state_io::put(out, "trust.pending_prediction", pending_prediction_);
    state_io::put(out, "trust.pending_incumbent", pending_incumbent_);
    state_io::put(out, "trust.pending_at_boundary", pending_at_boundary_ ? 1 : 0);
    state_io::put(out, "trust.last_ratio", last_ratio_);
  }
  void load(std::istream& in) override {
    int pending = 0, boundary = 0;
    state_io::get(in, "trust.multiplier", multiplier_);
    state_io::get(in, "trust.incumbent", incumbent_);
    state_io::get(in, "trust.pending", pending);
    state_io::get(in, "trust.pending_prediction", pending_prediction_);
    state_io::get(in, "trust.pending_incumbent", pending_incumbent_);
    state_io::get(in, "trust.pending_at_boundary", boundary);
    state_io::get(in, "trust.last_ratio", last_ratio_);
    pending_ = pending != 0;
    pending_at_boundary_ = boundary != 0;
    rejected_ = false;
  }
  double last_ratio() const { return last_ratio_; }

 private:
  double multiplier_ = 1.0;
  double incumbent_ = std::numeric_limits<double>::quiet_NaN();
  bool pending_ = false;
  double pending_prediction_ = 0;
  double pending_incumbent_ = 0;
  bool pending_at_boundary_ = false;
  double last_ratio_ = std::numeric_limits<double>::quiet_NaN();
  bool rejected_ = false;  // of the last observe_incumbent(); consumed within the step
};

}  // namespace

std::unique_ptr<RadiusModel> make_radius_model(const RadiusModelSettings& settings) {
  switch (settings.kind) {
    case RadiusModelKind::fixed:
      return std::make_unique<FixedRadius>();
    case RadiusModelKind::adaptive:
      return std::make_unique<AdaptiveRadius>(settings);
    case RadiusModelKind::quadratic:
      return std::make_unique<QuadraticRadius>(settings);
    case RadiusModelKind::trust_region:
      return std::make_unique<TrustRegion>(settings);
    case RadiusModelKind::plugin:
      if (!settings.plugin_factory)
        throw Error("radius model '" + settings.plugin_name +
                    "': a plugin radius model needs its factory (PluginRegistry::"
                    "radius_model_factory)");
      return settings.plugin_factory();
  }
  throw Error("make_radius_model: unknown kind");
}

double last_trust_ratio(const RadiusModel& model) {
  if (const auto* trust = dynamic_cast<const TrustRegion*>(&model)) return trust->last_ratio();
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace polyprobe
