// The optimizer over one flat search vector whose candidates an Evaluator scores (internal).
//
// VectorSearch drives a StepEngine for "one vector cut into particles" problems: a model's
// parameters (PolytopeOptimizer) or a plain function's argument (minimize). Candidate i,v,k
// is the base vector with particle i moved, described to the evaluator as a CandidateSet;
// moves are applied to the raw coordinates or, with a subspace, through it (incumbent at
// theta = 0). It counts evaluations exactly as polystep does: one candidate on one batch.
#pragma once

#include "step_engine.hpp"

#include <polyprobe/candidates.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/plugin/kernels/coordinate_runs.hpp>
#include <polyprobe/subspace.hpp>

#include <array>
#include <iosfwd>
#include <span>
#include <utility>
#include <vector>

namespace polyprobe::detail {

class VectorSearch {
 public:
  VectorSearch(const OptimizerConfig& config, ParticleMap particles, std::vector<BlockRange> blocks,
               const Subspace* subspace);

  // One step on `params`: scores through `evaluator` (and `screen` for multifidelity_screen)
  // and applies the move.
  StepInfo step(std::span<double> params, Evaluator& evaluator, Evaluator* screen,
                uint64_t objective_key);
  int64_t next_step_cost() const;
  const ParticleMap& particles() const { return particles_; }
  StepEngine& engine() { return engine_; }
  const StepEngine& engine() const { return engine_; }
  int64_t evaluations() const { return evaluations_; }
  int64_t screen_evaluations() const { return screen_evaluations_; }

  void save(std::ostream& out) const;
  void load(std::istream& in);

 private:
  void apply(std::span<double> params, std::span<const double> moves) const;
  // Whether `eval` holds this search's particles and polytope (both fixed for the search's
  // life) with `probes` probes: compared once per binding of it (Evaluator::binding()) and
  // probe count, and known from then on.
  bool holds_particles(const Evaluator& eval, int32_t probes);

  OptimizerConfig config_;
  ParticleMap particles_;
  const Subspace* subspace_;
  StepEngine engine_;
  int64_t evaluations_ = 0;
  int64_t screen_evaluations_ = 0;
  // Buffers reused between steps.
  std::vector<int64_t> candidate_particle_, candidate_index_;
  std::vector<double> candidate_displacement_, candidate_losses_, losses_, moves_;
  std::vector<char> active_;  // [P] when adaptive_probes reuses some particles, else empty
  std::vector<ParticleRange> planned_;  // a shared step's particles this process plans
  // Bindings found to hold this search's particles, with their probe counts: the evaluator's
  // and the screen's (holds_particles).
  std::array<std::pair<uint64_t, int32_t>, 2> holding_{};
  // No coordinate belongs to two particles: the move may be applied in parallel.
  bool distinct_coords_ = false;
  // The layout's coordinates as runs of consecutive parameters (empty: too short to pay).
  std::vector<kernels::CoordinateRun> runs_;
  // trust_reject: the search vector before the last applied move (checkpointed).
  std::vector<double> previous_;
};

// The solver polystep picks when none is named: Sinkhorn in full space, softmax in a subspace.
TransportSolver resolve_solver(TransportSolver requested, bool subspace);

}  // namespace polyprobe::detail
