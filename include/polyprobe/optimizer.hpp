// The polytope optimizer (docs/design.md section 2, polystep's semantics).
//
// PolytopeOptimizer trains a Model without gradients: each step cuts the search vector (the
// flat parameters, or a subspace's coordinates) into particles, probes every particle at the
// rotated vertices of a polytope, scores those candidates through an Evaluator (any backend),
// solves an entropic transport problem per block and moves each particle to the
// transport-weighted barycentre of its step points. It is single-threaded and deterministic:
// the same seed, configuration and evaluator results give the same trajectory, and
// save_state/load_state resume it bit for bit. Every option has polystep's default, and
// OptimizerConfig::validate() rejects invalid combinations with a polyprobe::Error that names
// the rule. docs/optimizer.md documents the options and the recommended configuration.
#pragma once

#include <polyprobe/candidates.hpp>
#include <polyprobe/geometry.hpp>
#include <polyprobe/radius_model.hpp>
#include <polyprobe/schedule.hpp>
#include <polyprobe/transport.hpp>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string_view>

namespace polyprobe {

struct Batch;
class Evaluator;
class Model;
class Subspace;

// How particles are grouped into transport problems: one for all, one per layer, or one per
// block_group_size consecutive parameter tensors. Same number of forwards either way.
enum class BlockStrategy { monolithic, per_layer, grouped };

BlockStrategy parse_block_strategy(std::string_view name);
std::string_view to_string(BlockStrategy strategy);

// The shape of each particle's polytope. identity: the template as polystep has it. bfgs: a
// metric learned per particle from its successive finite-difference gradients (BFGS on the
// inverse Hessian, O(d^2) state per particle); the polytope is sheared by its unit-determinant
// Cholesky factor, so the probes and the move follow curved valleys. It needs the gradient of
// a quadratic or trust_region radius model, and pays off on stationary objectives (minimize(),
// the manual step API on a fixed batch); docs/optimizer.md says when.
enum class MetricKind { identity, bfgs };

MetricKind parse_metric(std::string_view name);
std::string_view to_string(MetricKind kind);

struct OptimizerConfig {
  // Geometry
  int32_t particle_dim = 2;           // d in full space
  int32_t subspace_particle_dim = 8;  // d when searching a subspace
  PolytopeKind polytope = PolytopeKind::simplex;
  int32_t num_probe = 1;  // K probe radii k / (K + 1), k = 1 .. K
  RotationMethod rotation = RotationMethod::automatic;
  bool biased_rotation = false;  // first axis along the particle's last move
  MetricKind metric = MetricKind::identity;

  // Radii: step_r = step_radius * epsilon(t) * controller, same for probe_r
  double step_radius = 1.0;
  double probe_radius = 2.0;
  ScheduleKind schedule = ScheduleKind::constant;
  double epsilon = 0.1;               // also the transport temperature unless ent_epsilon > 0
  double epsilon_final = 0.01;        // linear, cosine
  int64_t total_steps = 50;           // linear, cosine, momentum warm-up (max_iterations)
  double schedule_decay_steps = 100;  // power
  double schedule_power = 0.5;        // power
  double schedule_decay_rate = 0.95;  // progressive

  // Transport
  TransportSolver solver = TransportSolver::automatic;
  double ent_epsilon = 0.0;  // > 0: a temperature independent of the radii
  int32_t sinkhorn_max_iterations = 2000;
  double sinkhorn_tolerance = 1e-6;
  int32_t top_k = 2;  // top_k solver
  CostScaling cost_scaling = CostScaling::none;
  double nonfinite_margin = 10.0;  // non-finite cost -> max finite + margin (1 + |max|)
  // Let an evaluator that solves transports (Evaluator::solves_transport) compute the cost
  // matrix, solve and move where its losses are; false: the host does (same formulas).
  bool device_transport = true;
  // With the transport there: let such an evaluator that draws rotations itself
  // (Evaluator::draws_rotations, the host's bits) do so; false: the host draws and sends them.
  bool device_rotations = true;
  // Processes that share the steps (an evaluator with a StepShard: mpirun) each finish only
  // their own particles and share partial sums and moves; false: each gathers every loss and
  // finishes the whole step. The same bits either way.
  bool sharded_finish = true;

  // Blocks
  BlockStrategy blocks = BlockStrategy::monolithic;
  int32_t block_group_size = 2;  // grouped: parameter tensors per block

  // Heavy-ball momentum: v = mu(t) v + velocity_lr * move, mu from momentum_init to
  // momentum_final linearly over total_steps
  bool momentum = false;
  double momentum_init = 0.5;
  double momentum_final = 0.95;
  double velocity_lr = 1.0;

  // Radius model (RadiusModelSettings documents each field)
  RadiusModelSettings radius;

  // Budget controls
  bool adaptive_probes = false;             // reuse stagnant particles' cost rows (see docs)
  double adaptive_probes_threshold = 1e-6;  // squared move norm of a stagnant particle
  int32_t amortize_steps = 1;               // k: k - 1 momentum-only steps between scored steps
  double amortize_ema = 0.7;                // decay of the velocity a momentum-only step applies
  bool multifidelity_screen = false;
  double screen_fidelity = 0.25;   // fraction of the batch the screen scores on
  double screen_keep_ratio = 0.5;  // fraction of vertices promoted to the full batch

  // Subspace rotation: before every step whose index is a positive multiple of this, the
  // subspace moves to epoch step / interval (Subspace::rotate_to; the moves so far are in
  // the weights already). What lives in subspace coordinates (momentum velocity, the last
  // move of biased_rotation, adaptive-probe cost rows, the bfgs metric) starts again; the
  // radius model, the schedule and the transport warm starts keep their state. 0 = never.
  // Needs a subspace that can rotate (PolytopeOptimizer only).
  int64_t subspace_rotation_interval = 0;

  uint64_t seed = 0;

  // Throws polyprobe::Error naming the first broken rule and how to fix it.
  void validate() const;
};

struct StepInfo {
  int64_t step = 0;           // index of this step (0-based)
  double incumbent_loss = 0;  // f(X) when measured, else the mean candidate cost
  bool incumbent_measured = false;
  double mean_cost = 0;        // mean of the cost matrix (NaN on momentum-only steps)
  double best_cost = 0;        // smallest cost-matrix entry
  int64_t candidates = 0;      // full-batch evaluations this step (incumbent included)
  int64_t screened = 0;        // screen-fidelity evaluations this step
  int64_t reused = 0;          // candidates whose loss adaptive_probes reused
  bool reverted = false;       // the move was non-finite and was undone
  bool rejected = false;       // trust_reject: the previous step was undone before this one
  bool momentum_only = false;  // an amortized step: no evaluation
  double step_radius = 0;
  double probe_radius = 0;
  double epsilon = 0;           // schedule value this step
  double move_norm = 0;         // |X_{t+1} - X_t| in search coordinates
  double predicted_change = 0;  // quadratic models: sum of block predictions, else NaN
  double trust_ratio = 0;       // trust_region: actual / predicted, NaN when none formed
  int32_t transport_iterations = 0;
  bool transport_converged = true;
  // Wall ms of this step's phases, where the step's time goes (bench step reports them):
  // plan = rotations and directions; score = the evaluator's calls; cost, transport, move =
  // the cost matrix, the transport solves, the barycentric move (with a quadratic radius
  // model, each particle's fit in the same pass); tail = momentum, the finiteness check, the
  // caches; apply = the move into the parameters and the evaluators' sessions. Zero where a
  // phase did not run.
  struct Phases {
    double plan = 0, score = 0, cost = 0, transport = 0, move = 0, tail = 0, apply = 0;
  } phase_ms;
};

class PolytopeOptimizer {
 public:
  // Keeps a reference to `model` (and `subspace`, when given: the search then runs over the
  // subspace's coordinates with the incumbent at theta = 0; with subspace_rotation_interval
  // the optimizer rotates it, and the evaluators made on it follow). Validates the
  // configuration.
  PolytopeOptimizer(Model& model, OptimizerConfig config, Subspace* subspace = nullptr);
  ~PolytopeOptimizer();
  PolytopeOptimizer(PolytopeOptimizer&&) noexcept;
  PolytopeOptimizer& operator=(PolytopeOptimizer&&) noexcept;

  // Calls evaluator.register_batch(batch) and scores the coming steps with it. A new batch
  // invalidates any deferred trust-region comparison. With multifidelity_screen the screen
  // evaluator (set_screen_evaluator) is registered on the batch's first rows too.
  void register_evaluator(Evaluator& evaluator, const Batch& batch);
  // A second evaluator for the cheap screening pass of multifidelity_screen.
  void set_screen_evaluator(Evaluator& screen_evaluator);

  // One step; writes model.parameters(). Pass a new objective_token whenever the objective
  // changed without a register_evaluator() call (a trust-region model requires it).
  StepInfo step(uint64_t objective_token = 0);
  // Re-reads the parameters after external weight changes; drops momentum and deferred
  // comparisons that referred to the old weights.
  void resync_from_model();
  // How far along the run linear and cosine schedules and momentum's warm-up are, as a
  // fraction in [0, 1], in place of steps() / total_steps from the next step on; nullopt goes
  // back to the steps. train() sets it before every step of a run timed by the clock
  // (TrainOptions::schedule_over_time). Not part of the saved state.
  void set_schedule_progress(std::optional<double> fraction);

  // The whole optimizer state (RNG, duals, radii and controllers, pending prediction,
  // momentum, caches), exactly; load_state requires the same configuration and model shape.
  // After steps finished sharded (an evaluator with a StepShard: mpirun), every process must
  // call gather_state() first: save_state throws until then.
  void save_state(std::ostream& out) const;
  // Processes that share the steps keep part of the state each (Sinkhorn's row duals of their
  // own particles) between steps; this makes it whole on every process. Every process calls it,
  // at the same point; a no-op for one process.
  void gather_state();
  void load_state(std::istream& in);

  const OptimizerConfig& config() const;
  const ParticleMap& particles() const;
  int64_t steps() const;
  int64_t evaluations() const;         // full-batch candidates scored so far (incumbents too)
  int64_t screen_evaluations() const;  // screen-fidelity candidates scored so far
  // The most full-batch evaluations the next step can spend (to stay within a budget).
  int64_t next_step_cost() const;
  bool uses_trust_region() const;  // train() refuses such optimizers

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polyprobe
