// The reference evaluator: materialise each candidate and run the plain forward.
//
// Deliberately naive: no sharing between candidates, no parallelism. It is the yardstick
// that every fast path is tested against, so it must stay obviously correct.
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/subspace.hpp>

namespace polyprobe {
namespace {

class ReferenceEvaluator final : public Evaluator {
 public:
  ReferenceEvaluator(const Model& model, const Loss& loss, const Subspace* subspace,
                     EvaluatorOptions options)
      : Evaluator(subspace), model_(model), loss_(loss), subspace_(subspace), options_(options) {
    if (subspace_ != nullptr && subspace_->parameter_count() != model_.num_parameters())
      throw Error("subspace maps into " + std::to_string(subspace_->parameter_count()) +
                  " parameters but the model has " + std::to_string(model_.num_parameters()));
  }

  std::string name() const override { return "reference"; }
  int threads() const override { return options_.threads; }

  void register_batch(const Batch& batch) override {
    if (batch.size() == 0) throw Error("cannot register an empty batch");
    if (batch.inputs.cols() != model_.input_shape().numel())
      throw Error("batch inputs have " + std::to_string(batch.inputs.cols()) +
                  " features, the model expects " + std::to_string(model_.input_shape().numel()));
    loss_.check_targets(batch.targets, model_.output_shape().numel());
    batch_ = batch;
    registered_ = true;
  }

  double evaluate_base(std::span<const double> base) override {
    require_registered();
    return objective(model_, loss_, batch_, base, options_.dtype);
  }

  void evaluate(std::span<const double> base, const CandidateSet& set,
                std::span<double> losses) override {
    require_registered();
    set.validate();
    if (static_cast<int64_t>(losses.size()) != set.size())
      throw Error("loss buffer holds " + std::to_string(losses.size()) + " values for " +
                  std::to_string(set.size()) + " candidates");
    const int32_t d = set.particles->d;
    std::vector<double> params;
    for (int64_t c = 0; c < set.size(); ++c) {
      params.assign(base.begin(), base.end());
      const auto coords = set.particles->particle(set.particle[static_cast<std::size_t>(c)]);
      const auto delta =
          set.displacement.subspan(static_cast<std::size_t>(c * d), static_cast<std::size_t>(d));
      if (subspace_ != nullptr) {
        subspace_->apply(coords, delta, params);
      } else {
        for (int32_t k = 0; k < d; ++k) {
          const int64_t coord = coords[static_cast<std::size_t>(k)];
          if (coord < 0) continue;
          if (coord >= model_.num_parameters())
            throw Error("candidate " + std::to_string(c) + " moves coordinate " +
                        std::to_string(coord) + " of a model with " +
                        std::to_string(model_.num_parameters()) + " parameters");
          params[static_cast<std::size_t>(coord)] += delta[static_cast<std::size_t>(k)];
        }
      }
      losses[static_cast<std::size_t>(c)] =
          objective(model_, loss_, batch_, params, options_.dtype);
    }
  }

  nlohmann::json explain() const override {
    return {{"evaluator", "reference"},
            {"path", "sequential"},
            {"dtype", to_string(options_.dtype)},
            {"why", "one candidate at a time, materialised; the yardstick for every other path"}};
  }

 private:
  void require_registered() const {
    if (!registered_) throw Error("evaluator used before register_batch()");
  }

  const Model& model_;
  const Loss& loss_;
  const Subspace* subspace_;
  EvaluatorOptions options_;
  Batch batch_;
  bool registered_ = false;
};

}  // namespace

std::unique_ptr<Evaluator> make_reference_evaluator(const Model& model, const Loss& loss,
                                                    const Subspace* subspace,
                                                    EvaluatorOptions options) {
  if (options.candidate_dtype != CandidateDType::compute)
    throw Error("the reference evaluator computes every candidate in " +
                std::string(to_string(options.dtype)) + "; candidate_autocast (--candidate-dtype " +
                std::string(to_string(options.candidate_dtype)) +
                ") needs a backend that offers it (the cuda plugin, --device cuda)");
  return std::make_unique<ReferenceEvaluator>(model, loss, subspace, options);
}

}  // namespace polyprobe
