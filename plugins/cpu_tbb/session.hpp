// The cpu_tbb evaluator session (plugin API 2): what a run fixes crosses once and stays here.
//
// A Session keeps the particle layout, the polytope and the incumbent (a double copy, moved
// by the same arithmetic as the host's, kernels/subspace_move.hpp), and turns each score
// request into the candidate set the evaluation paths consume: the optimizer's polytope
// form is expanded here from the step's directions, so only O(P V d) values cross per step.
// The incumbent's version changes with every set or move, which is what tells the
// evaluator to redo the incumbent's forward (once per step, however many score calls).
// One host thread at a time; the evaluator parallelises inside.
#pragma once

#include "evaluator.hpp"

#include <polyprobe/plugin/abi.h>
#include <polyprobe/plugin/kernels/coordinate_runs.hpp>

#include <tbb/task_arena.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {

class Session {
 public:
  // `subspace` (may be null) stays valid for the session's life (the host's promise).
  // `threads` (0 = all the process may use) bounds the expansion's parallel loop, as it
  // bounds the evaluator's.
  Session(std::unique_ptr<CandidateEvaluator> evaluator, int64_t n_params,
          const pp_subspace_view* subspace, int threads);

  void set_batch(const pp_batch_view& batch);
  void set_particles(const pp_particle_layout& layout);
  void set_incumbent(const pp_tensor& theta);
  void move_incumbent(const double* moves);
  void score(const pp_score_request& request, double* losses, double* incumbent_loss);
  void read_incumbent(pp_tensor& theta) const;
  // The evaluator's account, with the last expansion's wall time in "last_call_ms".
  const char* explain();

 private:
  Candidates base_candidates() const;

  std::unique_ptr<CandidateEvaluator> evaluator_;
  int64_t n_params_;
  const pp_subspace_view* subspace_;
  int32_t d_ = 0;
  std::vector<int64_t> coords_;  // [P d]
  // No coordinate belongs to two particles and no subspace maps them: moves are applied to
  // the incumbent in parallel.
  bool distinct_coords_ = false;
  // With distinct coordinates, coords_ as runs of consecutive parameters (empty: too short).
  std::vector<kernels::CoordinateRun> runs_;
  int64_t vertices_ = 0;
  int32_t probes_ = 1;
  std::vector<double> incumbent_;
  bool has_incumbent_ = false;
  uint64_t version_ = 0;
  // The polytope form expanded (reused between steps): the candidates' particles, every
  // particle's V K candidates in particle order, are rebuilt only when the layout changes; the
  // active particles' displacements are refilled in parallel every call. The structure key
  // names the layout, so the evaluator keeps its plan for the whole run, and an active set (a
  // sharded rank's slice or chunks, adaptive_probes' reuse) only selects from it.
  std::vector<int64_t> particle_;  // [P V K]: the particle of each candidate of the layout
  std::vector<double> displacement_;
  uint64_t layout_generation_ = 1;  // bumped by set_particles
  uint64_t expanded_layout_ = 0;    // the layout particle_ was built for (0: none)
  uint64_t structure_key_ = 0;      // Candidates::structure_key of particle_ (0: none)
  std::unique_ptr<tbb::task_arena> arena_;
  double last_expand_ms_ = 0;  // the polytope form's expansion in the last score call
  std::string explain_;
};

}  // namespace polyprobe::cpu_tbb
