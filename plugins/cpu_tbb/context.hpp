// What every path of the cpu_tbb evaluator reads during a call: the model plan, the loss,
// the search space's coordinate tables, the incumbent cache, the planner's terms and the
// threads, plus the small helpers that map a particle's coordinates to parameters.
//
// Built once per evaluator; the paths hold a reference and never outlive it. Paths read it
// concurrently during a call; the evaluator writes it only between calls (the in-place path,
// which runs alone, moves inc.eff and puts it back).
#pragma once

#include "evaluator.hpp"
#include "incumbent_cache.hpp"
#include "model_plan.hpp"
#include "planner.hpp"
#include "scratch.hpp"

#include <polyprobe/plugin/kernels/losses.hpp>

#include <tbb/task_arena.h>
#include <Eigen/Core>

#include <cstdint>
#include <memory>
#include <vector>

namespace polyprobe::cpu_tbb {

template <class S>
struct EvaluationContext {
  // Throws std::invalid_argument for a subspace that does not fit the model.
  EvaluationContext(const pp_model_view& model, const pp_loss_view& loss_view,
                    const pp_session_options& options);

  // The parameters a group's particle moves (s.touched, ascending) and, per parameter and
  // displacement component, d(param) / d(component) (s.coef [touched * d]).
  void collect_touched(const Candidates& c, int64_t particle, WorkerScratch<S>& s) const;
  // The l2 term of candidate `cand` of group g (s as collect_touched left it, in a subspace).
  double l2_term(const Candidates& c, const Group& g, int64_t cand,
                 const WorkerScratch<S>& s) const;
  S effective(int64_t param, double raw) const { return inc.effective(plan, param, raw); }
  double rows_loss(const Mat<S>& out, int64_t first_row) const {
    return inc.rows_loss(loss, out, first_row);
  }
  CoordinateIndex coordinate_index() const {
    return {subspace_mode ? subspace : nullptr, &coord_u, &coord_v};
  }

  ModelPlan plan;
  kernels::LossKind loss;
  double l2;
  int threads;
  std::unique_ptr<tbb::task_arena> arena;

  // The search space: raw parameters, or the subspace's coordinates.
  bool subspace_mode = false;
  const pp_subspace_view* subspace = nullptr;
  const pp_host_api* host = nullptr;      // the host's named operations (may be null)
  std::vector<int32_t> coord_u, coord_v;  // per subspace coordinate: dense u / v index
  std::vector<std::vector<S>> dense_u;    // dense u vectors of subspace coordinates, in S
  std::vector<Eigen::Matrix<S, 1, Eigen::Dynamic>> dense_v_s;  // dense v vectors, in S
  std::vector<int32_t> dense_u_layer, dense_v_layer;           // the layer of each
  // v^T x of the dense v vectors for the incumbent cache (made once they are known).
  std::unique_ptr<DirectionProjections<S>> projections;

  IncumbentCache<S> inc;
  const GroupPlanner* planner = nullptr;  // set by the evaluator; its terms during a call
};

}  // namespace polyprobe::cpu_tbb
