// The cpu_tbb plugin's candidate evaluator: every CPU evaluation path behind one object.
//
// A candidate set arrives grouped by particle (the V x K candidates of one particle are
// adjacent). Each group takes the fastest path whose conditions hold, checked per group
// and explained: `sparse` / `subspace-delta` (propagate the particle's change as a delta
// through verified affine and elementwise layers), `dense` (materialise the changed
// layers' weights, then one GEMM per later layer over the whole group), `inplace` (apply,
// score, revert on one shared parameter copy when per-thread copies would not fit),
// `site-local` (a particle in one conv or attention layer: only the channels or heads it
// owns are recomputed, then the suffix once over the group) and
// `fallback` (the whole forward of every materialised candidate through the host's
// layers: always correct). The incumbent's activations are computed once per call (prefix
// reuse). Work is split over particles with oneTBB; each candidate's loss is computed by
// one thread in a fixed order, so results do not depend on the thread count.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <memory>
#include <string>

namespace polyprobe::cpu_tbb {

// A candidate set as the paths consume it: candidate c moves particle particle[c] of
// coords [n_particles * d] by displacement[c*d .. c*d+d) around base_params.
struct Candidates {
  int64_t count = 0;
  int32_t d = 0;
  const int64_t* particle = nullptr;
  const double* displacement = nullptr;
  int64_t n_particles = 0;
  const int64_t* coords = nullptr;
  const double* base_params = nullptr;
  int64_t n_params = 0;
  // Nonzero: the same key as an earlier call promises the same `particle` sequence and
  // coordinates (the session's expansion of an unchanged layout), so the evaluator may reuse
  // that call's plan of groups and paths. 0: plan afresh.
  uint64_t structure_key = 0;
  // [n_particles]: the particles whose candidates this call scores (null: every candidate);
  // the others' displacements are not read and their losses are left as they were. Only for
  // candidates in particle order (the session's expansion of a probe).
  const uint8_t* active = nullptr;
  // A probe-form step (the session's expansion of a polytope probe): its candidates a particle
  // (V K), and a key that changes whenever the bound layout does. Then the tables' thresholds
  // count the whole layout's candidates, not this call's, so a call that scores a slice of the
  // step (a rank of a sharded step) takes every candidate's route as the whole step does: the
  // same bits. 0: count this call's.
  int64_t step_candidates_per_particle = 0;
  uint64_t layout_key = 0;
};

class CandidateEvaluator {
 public:
  virtual ~CandidateEvaluator() = default;
  virtual void register_batch(const pp_batch_view& batch) = 0;
  // losses[count] of the candidates (of the active particles' only, with Candidates::active)
  // and, when incumbent_loss is not null, the objective at
  // base_params. `incumbent_version` names the base: the incumbent's forward (the prefix
  // every path reuses) and its effective weights are recomputed only when it changes.
  virtual void evaluate(const Candidates& candidates, double* losses, double* incumbent_loss,
                        uint64_t incumbent_version) = 0;
  // JSON: per layer and particle block the path and why others declined, the chunk size,
  // the memory estimate, and per path the candidates of the last call.
  virtual const char* explain() = 0;
};

// The paths a caller may force (pp_session_options.path); "auto" or null lets each group choose.
inline constexpr const char* kPathNames =
    "auto, sparse, subspace-delta, site-local, dense, inplace, fallback";

// Throws std::invalid_argument naming what it cannot serve.
std::unique_ptr<CandidateEvaluator> make_candidate_evaluator(const pp_model_view& model,
                                                             const pp_loss_view& loss,
                                                             const pp_session_options& options);

// Empty when the evaluator can serve this model, loss and options, else the reason.
std::string unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                               const pp_session_options& options);

}  // namespace polyprobe::cpu_tbb
