// Epsilon schedules: the step-dependent factor that scales both radii.
//
// polystep's radii are "the learning rate": step_r = step_radius * epsilon(t) * controller and
// probe_r = probe_radius * epsilon(t) * controller, and epsilon(t) is also the entropic
// temperature of the transport solve unless a separate one is set. A schedule is a pure
// function of the step index, except the progressive one, which reacts to how hard the last
// transport solve was; its state is saved with the optimizer.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string_view>

namespace polyprobe {

enum class ScheduleKind {
  constant,     // epsilon
  linear,       // epsilon -> epsilon_final linearly over total_steps, then held
  cosine,       // epsilon -> epsilon_final along a half cosine over total_steps, then held
  power,        // epsilon * (1 + t / schedule_decay_steps)^(-schedule_power)
  progressive,  // ProgOT-style: starts at epsilon, decays by schedule_decay_rate while the
                // transport solve converges, backs off when it does not (iterative solvers)
};

ScheduleKind parse_schedule(std::string_view name);
std::string_view to_string(ScheduleKind kind);

struct ScheduleSettings {
  ScheduleKind kind = ScheduleKind::constant;
  double epsilon = 0.1;
  double epsilon_final = 0.01;
  int64_t total_steps = 50;
  double decay_steps = 100.0;
  double power = 0.5;
  double decay_rate = 0.95;  // progressive: factor per converged solve (1 / it on failure)
};

class EpsilonSchedule {
 public:
  explicit EpsilonSchedule(ScheduleSettings settings = {});
  // epsilon at step `step` (0-based). `progress` (in [0, 1]), when given, is how far along
  // the run linear and cosine schedules are, in place of step / total_steps (a run timed by
  // the clock instead of its steps); the other kinds ignore it.
  double at(int64_t step, std::optional<double> progress = std::nullopt) const;
  // Progressive feedback: whether the last iterative solve met its tolerance.
  void observe_solve(bool converged);
  void save(std::ostream& out) const;
  void load(std::istream& in);

 private:
  ScheduleSettings settings_;
  double progressive_epsilon_;
};

}  // namespace polyprobe
