// The cpu_tbb evaluator: the parts and how one call runs them.
//
// Parts, each in its own header with what it promises:
//   context.hpp           what every path reads: plan, loss, search space, incumbent cache
//   incumbent_cache.hpp   the batch and the incumbent's forward, reused by every path
//   planner.hpp           groups of candidates, the path of each and why others declined
//   delta_path.hpp        sparse / subspace-delta, with kink, direction and cumulant tables
//   materialised_paths.hpp dense, inplace, fallback
//   site_local_path.hpp   conv and attention layers per site
//   scratch.hpp           one worker's buffers
// A call: refresh the incumbent cache when the incumbent's version changed, plan the
// groups, prepare the per-call tables, run the groups on the arena (inplace ones after, one
// at a time), and on an allocation failure halve the chunk and run the call again.
#pragma once

#include "context.hpp"
#include "delta_path.hpp"
#include "evaluator.hpp"
#include "materialised_paths.hpp"
#include "planner.hpp"
#include "site_local_path.hpp"

#include <tbb/enumerable_thread_specific.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace polyprobe::cpu_tbb {

template <class S>
class EvaluatorImpl final : public CandidateEvaluator {
 public:
  EvaluatorImpl(const pp_model_view& model, const pp_loss_view& loss,
                const pp_session_options& options);
  void register_batch(const pp_batch_view& batch) override;
  void evaluate(const Candidates& c, double* losses, double* incumbent_loss,
                uint64_t incumbent_version) override;
  const char* explain() override;

 private:
  using Scratch = WorkerScratch<S>;
  void run_groups(const Candidates& c, double* losses);
  void evaluate_group(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  int64_t auto_chunk() const;
  double memory_estimate_bytes() const;

  EvaluationContext<S> ctx_;
  GroupPlanner planner_;
  DeltaPath<S> delta_;
  MaterialisedPaths<S> materialised_;
  SiteLocalPath<S> site_local_;
  int64_t chunk_ = 0;  // candidates a worker holds at once
  // What the planner's groups were made for (Candidates::structure_key), so a step whose
  // candidates have the last step's structure skips planning (serial, O(P)).
  uint64_t planned_key_ = 0;
  int64_t planned_chunk_ = -1;
  bool planned_inplace_ = false;
  // The mask the planner's selection and tasks_ were made for (Candidates::active; copied, so
  // a call with the same particles skips selecting): none when !selected_by_mask_.
  bool selected_by_mask_ = false;
  std::vector<uint8_t> selected_mask_;
  bool chunk_auto_ = true;
  int64_t chunk_halvings_ = 0;      // allocation failures survived by halving the chunk
  bool inplace_for_dense_ = false;  // per-thread parameter copies would not fit
  tbb::enumerable_thread_specific<Scratch> scratch_;
  // The last call's wall time per phase (explain's "last_call_ms"): where a step's time goes
  // at many threads, on hosts without a profiler.
  struct PhaseTimes {
    double incumbent = 0, plan = 0, tables = 0, groups = 0, inplace = 0;
    double busy = 0;          // the workers' time in groups, summed
    double longest_task = 0;  // the slowest task (a range of groups) of the groups phase
  } last_ms_;
  // Per worker, of the current call: time in group tasks, and the longest task. Timed per
  // task, not per group: groups of a few candidates are microseconds each.
  struct TaskTimes {
    double busy = 0, longest = 0;
  };
  tbb::enumerable_thread_specific<TaskTimes> task_ms_;
  // The groups phase's tasks, [begin, end) runs of groups: every site-local, dense or fallback
  // group alone (a few candidates but whole layers each: up to 100 times a delta group), delta
  // groups together up to kCandidatesPerTask candidates. An automatic partition of the groups
  // left one worker a run of every conv particle's site-local group (10 ms of a 14 ms phase).
  std::vector<std::pair<std::size_t, std::size_t>> tasks_;
  void plan_tasks();
  std::string explain_;
};

}  // namespace polyprobe::cpu_tbb
