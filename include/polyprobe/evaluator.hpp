// Candidate evaluators.
//
// An Evaluator is created for one model structure, one loss and optionally one subspace
// (null: candidates move raw parameters), then registered on a minibatch, then asked for
// the loss of every candidate of a set around base parameters. It computes exactly
// polyprobe::objective() (regularisation included) in its compute dtype; every evaluator
// is tested against the core's sequential float64 reference. After layers change, make a
// new evaluator; after a batch change, register again. The model must outlive it.
#pragma once

#include <polyprobe/batch.hpp>
#include <polyprobe/candidates.hpp>
#include <polyprobe/tensor.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <span>
#include <string>

namespace polyprobe {

class Model;
class Loss;
class Subspace;

struct EvaluatorOptions {
  DType dtype = DType::f64;
  int threads = 0;         // 0 = all the process may use
  int64_t chunk_size = 0;  // candidates held at once; 0 = automatic
};

class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // "reference", or "<plugin>/<path>".
  virtual std::string name() const = 0;
  virtual void register_batch(const Batch& batch) = 0;
  // The objective at `base` (the incumbent).
  virtual double evaluate_base(std::span<const double> base) = 0;
  // losses[c] = objective of candidate c of `set` around `base`.
  virtual void evaluate(std::span<const double> base, const CandidateSet& set,
                        std::span<double> losses) = 0;
  // What ran and why (paths taken and declined); {} when there is nothing to say.
  virtual nlohmann::json explain() const { return nlohmann::json::object(); }
};

// The core's reference: one candidate at a time, materialised, in options.dtype.
// Obviously correct and slow; the yardstick for every other path.
std::unique_ptr<Evaluator> make_reference_evaluator(const Model& model, const Loss& loss,
                                                    const Subspace* subspace = nullptr,
                                                    EvaluatorOptions options = {});

}  // namespace polyprobe
