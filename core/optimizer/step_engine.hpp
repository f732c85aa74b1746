// The model-agnostic core of one optimizer step (internal).
//
// StepEngine owns everything of a step that does not depend on how candidates are scored:
// the schedule, the rotations and their RNG, the candidate displacements, the cost matrix and
// its transport solves (one per block), the barycentric move, momentum, the radius model and
// the adaptive-probe cache. A step is plan() -> [screen()] -> finish(), or coast() for a
// momentum-only step; PolytopeOptimizer, AskTellOptimizer and minimize() drive it with their
// own evaluation in between. Moves are returned as displacements of the P particles in the
// search coordinates; the caller applies them.
//
// Threads: the per-particle work (rotations, directions, cost rows, transport rows, the move,
// the quadratic fit, the metric, momentum) runs on set_threads() threads. Rotation i of step
// t comes from the counter-based stream of (seed, t, i), every reduction adds fixed chunks in
// order, so a trajectory is the same bits for any thread count.
#pragma once

#include "step_threads.hpp"

#include <polyprobe/geometry.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/radius_model.hpp>

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <polyprobe/step_shard.hpp>

namespace polyprobe {
class Evaluator;
}  // namespace polyprobe

namespace polyprobe::detail {

class RowChunks;

// Particles [first, first + count) form one transport problem.
struct BlockRange {
  int64_t first = 0;
  int64_t count = 0;
};

class StepEngine {
 public:
  // `solver` must be resolved (not automatic). Blocks must tile [0, particles).
  StepEngine(const OptimizerConfig& config, int32_t d, int64_t particles,
             std::vector<BlockRange> blocks, TransportSolver solver);

  // Threads for the step's own work (0 = all the process may use); results do not depend on it.
  void set_threads(int threads) { threads_.set_threads(threads); }
  // Those threads, for the caller's own per-particle work of the step.
  const StepThreads& threads() const { return threads_; }

  int32_t dim() const { return d_; }
  int64_t particle_count() const { return particles_; }
  int64_t vertex_count() const { return vertices_; }
  int32_t probes() const { return probes_; }
  int64_t candidates_per_step() const { return particles_ * vertices_ * probes_; }
  int64_t step_index() const { return step_; }
  const Matrix<double>& polytope() const { return template_; }
  bool next_is_scored() const { return step_ % amortize_ == 0; }
  bool needs_incumbent() const { return radius_->needs_incumbent(); }
  // trust_reject: the incumbent is scored before plan() and passed to review() first.
  bool reviews_steps() const { return config_.radius.trust_reject && needs_incumbent(); }
  const RadiusModel& radius_model() const { return *radius_; }

  // Phase 1 of a scored step: draws rotations and fills displacements() in candidate order
  // c = (i V + v) K + (k - 1). `objective_key` changes whenever the objective does.
  // With `only` (ascending, disjoint ranges; empty: every particle), only those particles'
  // rotations and directions are drawn (processes that share the step, StepShard): each is
  // the bits it would be in a whole plan, and the others keep stale values nobody may read.
  // With `leave_rotations` (a whole plan of plain rotations: no `only`, bias, adaptive reuse
  // or metric), the rotations and directions are not drawn: the evaluator draws them from
  // rotation_stream() (Evaluator::draws_rotations). Reading rotations(), probe_directions()
  // or displacements(), screening or finishing on the host draws them here after all, the
  // same bits.
  void plan(uint64_t objective_key, std::span<const ParticleRange> only = {},
            bool leave_rotations = false);
  // The counter-based stream of the planned step's rotations.
  const RotationStream& rotation_stream() const { return stream_; }
  // Whether plan() left this step's rotations to the evaluator and nobody has drawn them since.
  bool rotations_left() const { return !drawn_; }
  // [P V K d], expanded from the probe directions on first use (the one-call polytope form
  // of VectorSearch never needs it).
  std::span<const double> displacements() const;
  // Particles whose losses adaptive_probes reuses this step (their candidates need no score).
  const std::vector<char>& reused() const { return reused_; }
  // The unit-radius probe directions of the planned step [P V d]: displacement (i, v, k) is
  // planned_probe_radius() * k / (K + 1) times row (i, v), bit for bit.
  std::span<const double> probe_directions() const;
  double planned_probe_radius() const { return probe_r_; }
  // The rotations of the step in flight or just finished [P d d], and the transport weights
  // of the last finished step [P V] (for tests and diagnostics).
  std::span<const double> rotations() const;
  const Matrix<double>& weights() const { return weights_; }

  // Phase 0 of a scored step when reviews_steps(): the loss of the current point (the last
  // step's trial). Returns true when the trust region rejects that step: the caller must put
  // the search vector back where it was before the last move. finish() then takes no
  // incumbent (the engine knows it).
  bool review(double loss, uint64_t objective_key);

  // Optional phase 1b (multifidelity_screen): the losses of the outer probe of every vertex
  // on the screen batch, [P V]. Returns the (i, v) pairs to score on the full batch, [P V].
  const std::vector<char>& screen(std::span<const double> screen_losses);

  // Phase 2: `losses` [P V K] (entries of reused particles and unscreened vertices are
  // ignored); `incumbents` holds f(X) (one shared value) or f(X_i) (one per particle) when
  // needs_incumbent(), else nothing. Writes the particle moves into `moves` [P d].
  // With `shard` (not null; only where transport_offloadable()): this process's particles
  // (shard->bounds()) are the only ones whose losses are read and whose cost rows, plan rows and
  // moves are computed; the chunk partials, Sinkhorn's row duals and the moves are shared, so
  // every process returns the same info and all moves, the bits of an unsharded finish.
  // cost_, weights() and the scaled costs then hold only this process's rows.
  StepInfo finish(std::span<const double> losses, std::span<const double> incumbents,
                  std::span<double> moves, StepShard* shard = nullptr);

  // Phase 2 with the transport on the backend (Evaluator::solves_transport()): the losses of
  // the step were scored with score(probe, {}) and stayed with `backend`, which computes the
  // cost matrix, the solve, the move and the quadratic sums; the core does the rest exactly as
  // finish() does. Only for steps where transport_offloadable().
  StepInfo finish_on(Evaluator& backend, std::span<const double> incumbents,
                     std::span<double> moves);
  // Whether the planned step's transport may run on a backend, or be finished sharded: no
  // screening, no adaptive probes (their caches keep cost rows on the host) and the identity
  // metric.
  bool transport_offloadable() const;
  // finish_on() also fetches the transport plan, so weights() holds it (tests).
  void keep_weights(bool keep) { keep_weights_ = keep; }

  // A momentum-only step (amortize_steps): moves = amortize_ema * velocity, no evaluation.
  StepInfo coast(std::span<double> moves);

  // After external changes of the incumbent: drop velocity, cache and deferred comparisons.
  void forget_history();
  // After the search coordinates changed meaning (a subspace rotation): drop what is
  // expressed in them (velocity, last move, cached cost rows, the metric). The radius model,
  // its deferred comparison (about losses, not coordinates), the schedule and the transport
  // duals stay.
  void change_basis();

  // After sharded steps each process holds Sinkhorn's row duals of its own particles only
  // (they are not sent every step); this makes them whole on every process, through `shard`
  // (the processes of those steps, every one calling it). A no-op when they are whole.
  void gather_duals(StepShard& shard);
  bool duals_spread() const { return !spread_duals_.empty(); }

  // Throws while the row duals are spread (gather_duals first).
  void save(std::ostream& out) const;
  void load(std::istream& in);

  // How far along the run linear and cosine schedules and momentum's warm-up are, in [0, 1],
  // in place of step / total_steps from the next step on (nullopt: the steps). Not state: the
  // caller sets it before every step it times.
  void set_run_progress(std::optional<double> progress) { run_progress_ = progress; }

 private:
  // Solves one block's transport into weights_; returns its Sinkhorn result (iterations and
  // convergence; the closed-form rules report 0 and converged).
  // plan()'s draws and directions for the particles of `range`.
  void plan_particles(const RotationStream& stream, bool may_reuse, const ParticleRange& range);
  // Directions (and sheared directions) of particles [begin, end) from their rotations.
  void direct_particles(int64_t begin, int64_t end) const;
  // The rotations and directions a plan() left to the evaluator, when something reads them.
  void draw_left_rotations() const;
  // With `shard`, only this process's rows (and the exchanges of their partials).
  TransportResult solve_block(const BlockRange& block, double temperature, StepShard* shard);
  StepInfo begin_info() const;
  // finish()'s common parts: the checks and the reviewed incumbent; the radius model's view
  // of f(X) and the step radius; the block step lengths, momentum, the finiteness check and
  // the caches (host_costs: cost_ holds this step's matrix). finish_tail's `own` (null: none):
  // the rows of a shared step this process computed, whose moves it scales and carries the
  // momentum of before every process's moves are shared (RowChunks::share_rows).
  std::span<const double> check_finish(std::span<const double> incumbents,
                                       std::span<const double> moves, bool& reviewed);
  StepInfo scored_info() const;  // begin_info() with the planned epsilon and probe radius
  double observe_incumbent(std::span<const double> incumbents, bool reviewed, StepInfo& info);
  StepInfo finish_tail(StepInfo& info, const std::vector<BlockModel>& models,
                       std::span<double> moves, bool host_costs, const RowChunks* own = nullptr);
  double momentum_coefficient() const;
  // metric = bfgs: maps the template-space moves through each particle's factor and updates
  // the metric with this step's gradients.
  void apply_metric(std::span<double> moves);

  OptimizerConfig config_;
  int32_t d_;
  int64_t particles_;
  int64_t vertices_;
  int32_t probes_;
  int32_t amortize_;
  std::vector<BlockRange> blocks_;
  TransportSolver solver_;
  Matrix<double> template_;
  EpsilonSchedule schedule_;
  std::optional<double> run_progress_;
  std::unique_ptr<RadiusModel> radius_;
  RotationMethod rotation_method_;  // resolved for P particles
  StepThreads threads_;

  // Persistent state (checkpointed).
  int64_t step_ = 0;
  std::vector<SinkhornDuals> duals_;  // per block
  // Not empty: the bounds of the sharded step whose row duals each process kept for its own
  // particles (gather_duals makes them whole).
  std::vector<int64_t> spread_duals_;
  // [P d]: the last move applied, momentum and all, which momentum carries into the next step
  // (biased rotations, adaptive probes and the metric read it as the last move).
  std::vector<double> velocity_;
  std::vector<double> cache_costs_;      // [P V]
  std::vector<double> cache_rotations_;  // [P d d]
  std::vector<char> cache_valid_;        // [P]
  uint64_t cache_key_ = 0;
  double cache_step_r_ = 0, cache_probe_r_ = 0;
  uint64_t prediction_key_ = 0;
  bool prediction_valid_ = false;
  // metric = bfgs (metric.hpp): per particle the inverse Hessian estimate [P d d], its
  // unit-determinant factor that shapes the polytope [P d d], the gradient at the incumbent
  // in search coordinates [P d], whether that gradient belongs to the current incumbent's
  // predecessor, and whether the estimate has had its first (scaling) update.
  std::vector<double> metric_inverse_, metric_factor_, metric_gradient_;
  std::vector<char> metric_gradient_valid_, metric_started_;
  // review() of the step in flight: the incumbent it settled on (not checkpointed: a step
  // is reviewed and finished within one call of the driver).
  bool reviewed_ = false;
  double reviewed_incumbent_ = 0;

  // The step in flight (rebuilt by plan()).
  bool planned_ = false;
  uint64_t key_ = 0;
  double epsilon_ = 0, probe_r_ = 0, step_r_plan_ = 0;
  RotationStream stream_;
  // Drawn by plan() or, when it left them to the evaluator, on first read (hence mutable).
  mutable bool drawn_ = true;
  mutable std::vector<double> rotations_;   // [P d d]
  mutable std::vector<double> directions_;  // [P V d]: R_i t_v
  mutable std::vector<double> sheared_;     // [P V d]: L_i R_i t_v (metric = bfgs)
  std::vector<double> gradients_;           // [P d]: the quadratic fit's gradient in template space
  mutable std::vector<double> displacements_;  // [P V K d], valid when displacements_ready_
  mutable bool displacements_ready_ = false;
  Matrix<double> scaled_;     // [P V] solve_block's scaled costs (rows of its block), kept
  std::vector<char> reused_;  // [P]
  bool screened_ = false;
  std::vector<double> screen_losses_;               // [P V]
  std::vector<char> keep_;                          // [P V]
  Matrix<double> cost_, weights_;                   // [P V]
  std::vector<int64_t> block_first_, block_count_;  // finish_on's request
  bool keep_weights_ = false;
};

}  // namespace polyprobe::detail
