// The cpu_tbb plugin's dense evaluator: every candidate's forward from the first layer it
// changes, parallel over particles with oneTBB.
//
// Per call: the incumbent's activations are computed once (prefix reuse); each particle's
// V x K candidates run the layers they change one by one, then are stacked so that every
// later layer, whose weights they share, is one GEMM over the whole group. Each thread
// keeps its own copy of the effective parameters (Q(W) for transformed weights) and moves
// only the particle's d entries, reverting them afterwards: no allocation per candidate.
// Each candidate's loss is computed by one thread in a fixed order, so results do not
// depend on the thread count.
#pragma once

#include <polyprobe/plugin_abi.h>

#include <memory>
#include <string>

namespace polyprobe::cpu_tbb {

class DenseEvaluator {
 public:
  virtual ~DenseEvaluator() = default;
  virtual void register_batch(const pp_batch_view& batch) = 0;
  virtual void evaluate(const pp_candidates& candidates, double* losses) = 0;
  virtual const char* explain() = 0;
};

// Throws std::invalid_argument naming what it cannot serve.
std::unique_ptr<DenseEvaluator> make_dense_evaluator(const pp_model_view& model,
                                                     const pp_loss_view& loss,
                                                     const pp_eval_options& options);

// Empty when the evaluator can serve this model and loss, else the reason.
std::string dense_unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                                     const pp_eval_options& options);

}  // namespace polyprobe::cpu_tbb
