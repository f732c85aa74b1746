// Epsilon schedules.
#include "state_io.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/schedule.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace polyprobe {

ScheduleKind parse_schedule(std::string_view name) {
  if (name == "constant") return ScheduleKind::constant;
  if (name == "linear") return ScheduleKind::linear;
  if (name == "cosine") return ScheduleKind::cosine;
  if (name == "power") return ScheduleKind::power;
  if (name == "progressive") return ScheduleKind::progressive;
  throw Error("unknown schedule '" + std::string(name) +
              "' (use constant, linear, cosine, power or progressive)");
}

std::string_view to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::constant:
      return "constant";
    case ScheduleKind::linear:
      return "linear";
    case ScheduleKind::cosine:
      return "cosine";
    case ScheduleKind::power:
      return "power";
    case ScheduleKind::progressive:
      return "progressive";
  }
  return "?";
}

EpsilonSchedule::EpsilonSchedule(ScheduleSettings settings)
    : settings_(settings), progressive_epsilon_(settings.epsilon) {}

double EpsilonSchedule::at(int64_t step, std::optional<double> run_progress) const {
  const double start = settings_.epsilon;
  const double end = settings_.epsilon_final;
  const double progress =
      run_progress ? std::clamp(*run_progress, 0.0, 1.0)
      : settings_.total_steps > 0
          ? std::min(1.0, static_cast<double>(step) / static_cast<double>(settings_.total_steps))
          : 1.0;
  switch (settings_.kind) {
    case ScheduleKind::constant:
      return start;
    case ScheduleKind::linear:
      return start + (end - start) * progress;
    case ScheduleKind::cosine:
      return end + 0.5 * (start - end) * (1 + std::cos(std::numbers::pi * progress));
    case ScheduleKind::power:
      return start *
             std::pow(1 + static_cast<double>(step) / settings_.decay_steps, -settings_.power);
    case ScheduleKind::progressive:
      return progressive_epsilon_;
  }
  return start;
}

void EpsilonSchedule::observe_solve(bool converged) {
  if (settings_.kind != ScheduleKind::progressive) return;
  // A converged solve means the plan can afford to be sharper; a failed one means the
  // temperature is already too low for the solver, so back off towards the start.
  progressive_epsilon_ = converged ? progressive_epsilon_ * settings_.decay_rate
                                   : progressive_epsilon_ / settings_.decay_rate;
  progressive_epsilon_ =
      std::clamp(progressive_epsilon_, settings_.epsilon_final, settings_.epsilon);
}

void EpsilonSchedule::save(std::ostream& out) const {
  state_io::put(out, "schedule.progressive_epsilon", progressive_epsilon_);
}

void EpsilonSchedule::load(std::istream& in) {
  state_io::get(in, "schedule.progressive_epsilon", progressive_epsilon_);
}

}  // namespace polyprobe
