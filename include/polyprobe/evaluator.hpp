// Candidate evaluators.
//
// An Evaluator is created for one model structure, one loss and optionally one subspace
// (null: candidates move raw parameters), then registered on a minibatch, then asked for
// the loss of candidates. It computes exactly polyprobe::objective() (regularisation
// included) in its compute dtype; every evaluator is tested against the core's sequential
// float64 reference. After layers change, make a new evaluator; after a batch change,
// register again. The model (and the subspace) must outlive it. One thread at a time.
// When the subspace rotates (Subspace::generation() changes), the evaluator follows on its
// next call: a plugin recreates its session on the new map (sending the batch, particles
// and incumbent again), so no result depends on the old vectors.
//
// Two ways to ask:
// - stateless: evaluate(base, set, losses) and evaluate_base(base), for any base vector and
//   particle map (tests, benchmarks, minimize());
// - a session, which is how the optimizer steps (plugin API 2): bind the particle structure
//   once, set the incumbent once, then per step score() the step's candidates and the
//   incumbent in one call and move_incumbent() by the step's move. A plugin keeps the
//   incumbent on its device; only the move crosses per step. The base class keeps a host
//   mirror of the incumbent, moved by the same arithmetic as the optimizer's own copy, so
//   sync_incumbent() can tell (exactly) whether the caller's vector is still the session's.
#pragma once

#include <polyprobe/batch.hpp>
#include <polyprobe/candidates.hpp>
#include <polyprobe/geometry.hpp>
#include <polyprobe/step_shard.hpp>
#include <polyprobe/tensor.hpp>
#include <polyprobe/transport.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace polyprobe {

class Model;
class Loss;
class Subspace;

// candidate_autocast (--candidate-dtype): the candidates' forwards in a reduced precision
// with float32 accumulation, the incumbent's in the compute dtype. Only a backend that
// declares it runs it (the cuda plugin); every other backend refuses it, never ignores it.
enum class CandidateDType { compute, bf16, fp16 };
std::string_view to_string(CandidateDType dtype);
// "same" (the compute dtype), "bf16"/"bfloat16" or "fp16"/"float16"; throws Error otherwise.
CandidateDType parse_candidate_dtype(std::string_view name);

struct EvaluatorOptions {
  DType dtype = DType::f64;
  int threads = 0;         // 0 = all the process may use
  int64_t chunk_size = 0;  // candidates held at once; 0 = automatic
  CandidateDType candidate_dtype = CandidateDType::compute;
};

// A step's candidates as the optimizer produces them: particle i (unless active[i] == 0) at
// each vertex v and probe k = 1..K, displaced by probe_radius * k / (K + 1) * directions[i,
// v, :]. Losses come back as [P V K] in (i, v, k) order; inactive particles' entries are
// left as they were.
struct PolytopeProbe {
  std::span<const double> directions;  // [P V d]: the rotated (and shaped) unit template
  double probe_radius = 0;
  std::span<const char> active;  // [P], or empty for every particle
  // [P d d] row-major R_i, directions[i, v, :] = R_i t_v, or empty when a metric shapes the
  // directions; a device backend may send these (per particle) instead of the directions.
  std::span<const double> rotations;
  // Not null (only for an evaluator whose draws_rotations(d) is true): directions and
  // rotations are empty, and R_i is particle i's rotation of this stream (draw_rotations),
  // which the evaluator draws itself.
  const RotationStream* stream = nullptr;
};

// The transport half of a step, for a backend that solves it where its losses are
// (solves_transport()): the cost matrix from the [P V K] losses of the last score(probe, {}),
// the per-block statistics, the non-finite penalty, the scaling, the solve, the barycentric
// move and the quadratic model's block sums, with the formulas of the core's StepEngine. The
// core decides everything else (radii, solver settings, what the sums mean).
struct TransportStepRequest {
  TransportSolver solver = TransportSolver::softmax;  // resolved (not automatic)
  int32_t top_k = 1;                                  // top_k; greedy is 1
  SinkhornSettings sinkhorn;
  double temperature = 1;
  CostScaling cost_scaling = CostScaling::none;
  double nonfinite_margin = 10;
  std::span<const int64_t> block_first, block_count;  // the blocks tile [0, P) in order
  double step_radius = 0;
  std::vector<SinkhornDuals>* duals = nullptr;  // sinkhorn: per block, warm start in and out
  std::span<const double> incumbents;  // quadratic model: f(X) (1 or P values); empty = none
  double scaled_radius = 0;            // the fit's probe radius, probe_r K / (K + 1)
  std::span<double> moves;             // out: [P d]
  std::span<double> weights;           // out (optional): [P V], or empty
};

// What a backend's transport reports for one block.
struct TransportBlockResult {
  double cost_sum = 0;  // finite cost entries: their sum, number and minimum
  int64_t finite = 0;
  double best_cost = 0;
  int32_t iterations = 0;  // Sinkhorn iterations (0 for the closed-form rules)
  bool converged = true;
  double slope = 0, curvature = 0;  // quadratic model: sum g_i . m_i, sum c_i |m_i|^2
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // "reference", or "<plugin>".
  virtual std::string name() const = 0;
  virtual void register_batch(const Batch& batch) = 0;
  // The threads the optimizer's own work of a step (rotations, cost matrix, transport solve,
  // move) may use around this evaluator's calls: the options' thread count (0 = all the
  // process may use), so one --threads governs the whole step. 1 by default (evaluators that
  // say nothing, such as minimize()'s function adapter, run the step on the calling thread).
  virtual int threads() const { return 1; }

  // --- Stateless calls
  // The objective at `base`.
  virtual double evaluate_base(std::span<const double> base) = 0;
  // losses[c] = objective of candidate c of `set` around `base`.
  virtual void evaluate(std::span<const double> base, const CandidateSet& set,
                        std::span<double> losses) = 0;
  // What ran and why (paths taken and declined); {} when there is nothing to say.
  virtual nlohmann::json explain() const { return nlohmann::json::object(); }

  // --- The session (the optimizer's step)
  // The particle structure of the coming steps, with the polytope template [V d] and the
  // probe count K (kept; crosses to a plugin once).
  void bind_particles(const ParticleMap& particles, const Matrix<double>& polytope, int32_t probes);
  // Whether exactly this structure is bound (an O(P d) comparison).
  bool has_particles(const ParticleMap& particles, const Matrix<double>& polytope,
                     int32_t probes) const;
  // Changes at every bind_particles(), to a value no other binding in the process had (0
  // before the first): a caller that bound this evaluator, or found has_particles() true, at
  // binding() == s and sees s again knows the same structure is still bound, without
  // has_particles()' comparison (which every rank of a sharded step would pay every step).
  uint64_t binding() const { return binding_; }
  // Makes `theta` the incumbent unless it already is (exact comparison with the mirror).
  void sync_incumbent(std::span<const double> theta);
  // Moves the incumbent by [P d] moves in search coordinates: through the subspace given at
  // construction, else raw parameters (the arithmetic of Subspace::apply / +=, so a caller
  // that moves its own copy the same way stays bit-identical with the mirror). `moved`
  // (optional) is such a copy, already moved: the mirror takes its values instead of
  // repeating the arithmetic (one pass fewer over the parameters each step, on every rank).
  void move_incumbent(std::span<const double> moves, std::span<const double> moved = {});
  // Scores the step's candidates around the incumbent and, when incumbent_loss is not null,
  // the incumbent itself, in one call.
  void score(const PolytopeProbe& probe, std::span<double> losses, double* incumbent_loss);
  // Scores an explicit set of candidates around the incumbent (set.particles must be the
  // bound map) and, when incumbent_loss is not null, the incumbent.
  void score(const CandidateSet& set, std::span<double> losses, double* incumbent_loss);
  // Whether this evaluator solves the transport half of a step (TransportStepRequest) on
  // its device. When it does, score(probe, {}, ...) with an empty loss span keeps the losses
  // there for the solve_transport() call that must follow. The default: no.
  virtual bool solves_transport() const { return false; }
  // Whether this evaluator, one that solves_transport(), draws a step's rotations of particles
  // of dimension d itself, with the host's bits (PolytopeProbe::stream): the step then sends
  // nothing per particle. The default: no.
  virtual bool draws_rotations(int32_t d) const {
    (void)d;
    return false;
  }
  // Solves the step just scored; `blocks` has one entry per block. Throws when the
  // evaluator does not solve transports.
  virtual void solve_transport(const TransportStepRequest& request,
                               std::span<TransportBlockResult> blocks);
  // The processes this evaluator's steps are shared with (a sharding decorator, StepShard),
  // or null (the default): one process scores and finishes every step. Owned by the evaluator.
  virtual StepShard* step_shard() { return nullptr; }
  // The incumbent as the evaluator holds it (read back from a plugin's device).
  std::vector<double> read_incumbent();
  // The host mirror of the incumbent (empty before the first sync).
  std::span<const double> incumbent() const {
    return mirror_owner_ != nullptr ? mirror_owner_->incumbent() : std::span(incumbent_);
  }

 protected:
  // `subspace` (may be null) maps moves into parameters for move_incumbent().
  explicit Evaluator(const Subspace* subspace = nullptr);

  // Overridden by evaluators that keep their own session (plugins); the defaults serve the
  // session through the stateless calls on the host mirror.
  // The subspace's map changed (rotation): rebuild whatever was derived from it, then send
  // what is bound again (particles_bound(), incumbent()). Called by follow_subspace().
  virtual void session_subspace_changed() {}
  virtual void session_particles() {}
  virtual void session_incumbent() {}
  virtual void session_move(std::span<const double> moves) { (void)moves; }
  virtual void session_score(const PolytopeProbe& probe, std::span<double> losses,
                             double* incumbent_loss);
  virtual void session_score(const CandidateSet& set, std::span<double> losses,
                             double* incumbent_loss);
  virtual std::vector<double> session_read() {
    const std::span<const double> theta = incumbent();
    return {theta.begin(), theta.end()};
  }

  // Calls session_subspace_changed() once when the subspace's generation moved since the
  // last call; every session call runs it first, and an override that talks to its backend
  // outside them (register_batch) calls it itself. (solve_transport needs none: it follows
  // a score() on the same map.)
  void follow_subspace();
  // For a decorator whose session is the evaluator it wraps (`inner`, which must outlive it):
  // sync_incumbent and move_incumbent go straight to inner, whose mirror is then the only one
  // (instead of one a layer, each moved every step), and session_incumbent / session_move are
  // not called. Call once, before the first sync.
  void share_mirror_of(Evaluator& inner) { mirror_owner_ = &inner; }
  bool particles_bound() const { return bound_; }
  const ParticleMap& bound_particles() const { return particles_; }
  const Matrix<double>& bound_polytope() const { return polytope_; }
  int32_t bound_probes() const { return probes_; }

 private:
  const Subspace* move_space_;
  uint64_t subspace_generation_ = 0;  // of move_space_, as the session last saw it
  ParticleMap particles_;
  Matrix<double> polytope_;
  int32_t probes_ = 1;
  bool bound_ = false;
  uint64_t binding_ = 0;
  std::vector<double> incumbent_;
  bool has_incumbent_ = false;
  Evaluator* mirror_owner_ = nullptr;  // share_mirror_of: the evaluator keeping the mirror
  // Scratch of the default session_score (an explicit set built from a probe).
  std::vector<int64_t> scratch_particle_;
  std::vector<double> scratch_displacement_, scratch_losses_;
};

// The base of an evaluator that wraps another (a decorator, such as the sharding one of
// polyprobe_distributed): the name, the batch, the thread count and the stateless calls go to
// the wrapped evaluator unchanged, its incumbent is the only one (share_mirror_of), and the
// particles bound here are bound there. A decorator overrides only what it changes, e.g. the
// session's scoring (whose defaults read the wrapped mirror and score through evaluate()).
// Owns the wrapped evaluator; same threading as it.
class DecoratingEvaluator : public Evaluator {
 public:
  std::string name() const override { return inner_->name(); }
  void register_batch(const Batch& batch) override { inner_->register_batch(batch); }
  int threads() const override { return inner_->threads(); }
  double evaluate_base(std::span<const double> base) override {
    return inner_->evaluate_base(base);
  }
  void evaluate(std::span<const double> base, const CandidateSet& set,
                std::span<double> losses) override {
    inner_->evaluate(base, set, losses);
  }

 protected:
  // `inner` must not be null (throws polyprobe::Error naming `who`); `subspace` as Evaluator's.
  DecoratingEvaluator(std::unique_ptr<Evaluator> inner, const char* who,
                      const Subspace* subspace = nullptr);
  Evaluator& inner() { return *inner_; }
  const Evaluator& inner() const { return *inner_; }
  void session_particles() override {
    inner_->bind_particles(bound_particles(), bound_polytope(), bound_probes());
  }
  std::vector<double> session_read() override { return inner_->read_incumbent(); }

 private:
  std::unique_ptr<Evaluator> inner_;
};

// The core's reference: one candidate at a time, materialised, in options.dtype.
// Obviously correct and slow; the yardstick for every other path.
std::unique_ptr<Evaluator> make_reference_evaluator(const Model& model, const Loss& loss,
                                                    const Subspace* subspace = nullptr,
                                                    EvaluatorOptions options = {});

}  // namespace polyprobe
