#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/train.hpp>

#include "train/checkpoint.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

namespace polyprobe {
namespace {

using train_detail::Checkpoint;

template <class S>
EvaluationResult evaluate_in(const Model& model, const Loss& loss, const Batch& batch) {
  const Matrix<S> outputs = model.forward<S>(batch.inputs.cast<S>());
  std::vector<S> per(static_cast<std::size_t>(outputs.rows()));
  loss.per_sample(outputs, batch.targets, 0, per);
  EvaluationResult r;
  r.samples = outputs.rows();
  int64_t correct = 0;
  for (Eigen::Index i = 0; i < outputs.rows(); ++i) {
    r.loss += static_cast<double>(per[static_cast<std::size_t>(i)]);
    Eigen::Index best = 0;
    for (Eigen::Index c = 1; c < outputs.cols(); ++c)
      if (outputs(i, c) > outputs(i, best)) best = c;
    correct += best == batch.targets.labels[static_cast<std::size_t>(i)];
  }
  r.loss /= static_cast<double>(std::max<int64_t>(r.samples, 1));
  r.accuracy = static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(r.samples, 1));
  return r;
}

EvaluationResult evaluate_batch(const Model& model, const Loss& loss, const Batch& batch,
                                DType dtype) {
  return dtype == DType::f64 ? evaluate_in<double>(model, loss, batch)
                             : evaluate_in<float>(model, loss, batch);
}

// Appends one JSON object per line to the metrics file, flushed so a crash loses nothing.
class MetricsLog {
 public:
  MetricsLog(const std::filesystem::path& path, bool append) {
    if (path.empty()) return;
    file_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!file_) throw Error("cannot write the metrics file '" + path.string() + "'");
  }
  void write(const nlohmann::json& record) {
    if (file_.is_open()) file_ << record.dump() << std::endl;
  }

 private:
  std::ofstream file_;
};

void check_compatible(const Model& model, const Loss& loss, const DataSplits& data) {
  for (const Dataset* split : {&data.train, &data.validation, &data.test}) {
    if (split->size() == 0 && split != &data.train) continue;
    if (split->features.cols() != model.input_shape().numel())
      throw Error("data '" + split->name + "' has " + std::to_string(split->features.cols()) +
                  " features per sample, but the model's input " + model.input_shape().str() +
                  " has " + std::to_string(model.input_shape().numel()) +
                  "; choose a model file whose input_shape fits the data");
    loss.check_targets(to_batch(*split).targets, model.output_shape().numel());
  }
  if (data.train.size() == 0) throw Error("the training split is empty");
}

}  // namespace

EvaluationResult evaluate_model(const Model& model, const Loss& loss, const Dataset& data,
                                DType dtype) {
  if (data.size() == 0) throw Error("cannot evaluate on the empty data '" + data.name + "'");
  const Batch batch = to_batch(data);
  loss.check_targets(batch.targets, model.output_shape().numel());
  return evaluate_batch(model, loss, batch, dtype);
}

TrainResult train(Model& model, const Loss& loss, PolytopeOptimizer& optimizer,
                  Evaluator& evaluator, const DataSplits& data, const TrainOptions& options) {
  if (optimizer.uses_trust_region())
    throw Error(
        "train() cannot drive the trust_region radius model: its comparisons assume one "
        "fixed objective, and minibatches change it every step. Use another radius "
        "model (fixed, adaptive, quadratic) or the manual step API "
        "(PolytopeOptimizer::register_evaluator and step with objective tokens)");
  if (options.epochs < 0) throw Error("epochs must be >= 0");
  if (options.patience < 0) throw Error("patience must be >= 0");
  if (options.validate_every < 0) throw Error("validate_every must be >= 0");
  if (options.resume && options.checkpoint_path.empty())
    throw Error("resuming needs a checkpoint file (--save or --checkpoint)");
  check_compatible(model, loss, data);

  MinibatchStream stream(data.train, options.batch_size, options.seed);
  Checkpoint state;
  state.seed = options.seed;
  state.batch_size = options.batch_size;
  state.best_parameters.assign(model.parameters().begin(), model.parameters().end());
  if (options.resume) {
    state = train_detail::read_checkpoint(options.checkpoint_path);
    if (state.seed != options.seed || state.batch_size != options.batch_size)
      throw Error("checkpoint '" + options.checkpoint_path.string() + "' was written with seed " +
                  std::to_string(state.seed) + " and batch " + std::to_string(state.batch_size) +
                  "; resume with the same --seed and --batch");
    if (static_cast<int64_t>(state.parameters.size()) != model.num_parameters() ||
        state.best_parameters.size() != state.parameters.size())
      throw Error("checkpoint '" + options.checkpoint_path.string() + "' holds " +
                  std::to_string(state.parameters.size()) + " parameters, the model has " +
                  std::to_string(model.num_parameters()) + "; it belongs to another model");
    std::copy(state.parameters.begin(), state.parameters.end(), model.parameters().begin());
    std::istringstream optimizer_state(state.optimizer_state);
    optimizer.load_state(optimizer_state);
    stream.seek(state.epoch, state.position);
  }
  MetricsLog metrics(options.metrics_path, options.resume);

  const auto started = std::chrono::steady_clock::now();
  const double seconds_before = state.seconds;
  const auto elapsed = [&] {
    return seconds_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const auto save_checkpoint = [&] {
    if (options.checkpoint_path.empty()) return;
    state.parameters.assign(model.parameters().begin(), model.parameters().end());
    state.epoch = stream.epoch();
    state.position = stream.position();
    state.seconds = elapsed();
    std::ostringstream out;
    optimizer.save_state(out);
    state.optimizer_state = out.str();
    train_detail::write_checkpoint(options.checkpoint_path, state);
  };

  TrainResult result;
  const int64_t steps_per_epoch = stream.batches_per_epoch();
  // Measures the validation split and keeps the parameters if they are the best so far.
  const auto validate = [&](int64_t epoch) {
    const Dataset& check = data.validation.size() > 0 ? data.validation : data.train;
    const EvaluationResult v = evaluate_model(model, loss, check, options.dtype);
    ++state.validations;
    metrics.write({{"step", state.step},
                   {"epoch", epoch},
                   {"split", "validation"},
                   {"loss", v.loss},
                   {"accuracy", v.accuracy},
                   {"candidates", state.evaluations},
                   {"seconds", elapsed()}});
    const bool better = state.best_epoch < 0 || v.accuracy > state.best_accuracy ||
                        (v.accuracy == state.best_accuracy && v.loss < state.best_loss);
    if (better) {
      state.best_epoch = epoch;
      state.best_step = state.step;
      state.best_accuracy = v.accuracy;
      state.best_loss = v.loss;
      state.best_parameters.assign(model.parameters().begin(), model.parameters().end());
      state.epochs_without_improvement = 0;
    } else {
      ++state.epochs_without_improvement;
    }
    if (options.patience > 0 && state.epochs_without_improvement >= options.patience)
      result.stopped_early = true;
    return v.accuracy;
  };
  bool stop = state.epochs_completed >= options.epochs;
  while (!stop) {
    const Batch batch = stream.next();
    optimizer.register_evaluator(evaluator, batch);
    const StepInfo info = optimizer.step();
    state.evaluations += info.candidates;
    ++state.step;
    const EvaluationResult now = evaluate_batch(model, loss, batch, options.dtype);
    TrainProgress progress{state.step,        stream.epoch(), steps_per_epoch,
                           options.epochs,    now.loss,       now.accuracy,
                           state.evaluations, elapsed(),      std::nullopt};
    metrics.write({{"step", progress.step},
                   {"epoch", progress.epoch},
                   {"loss", progress.loss},
                   {"accuracy", progress.accuracy},
                   {"candidates", progress.candidates},
                   {"seconds", progress.seconds}});
    const bool epoch_done = stream.position() == data.train.size();
    if (epoch_done) ++state.epochs_completed;
    if (options.time_limit_s > 0 && elapsed() >= options.time_limit_s)
      result.reached_time_limit = true;
    const bool periodic = options.validate_every > 0 && state.step % options.validate_every == 0;
    // Validate at every epoch end (unless validate_every replaces it), every validate_every
    // steps, and at the time limit, so the last stretch of a timed run is not thrown away.
    if ((epoch_done && (options.validate_every == 0 || state.epochs_completed >= options.epochs)) ||
        periodic || result.reached_time_limit) {
      progress.validation_accuracy = validate(progress.epoch);
      save_checkpoint();
    }
    if (options.on_progress) options.on_progress(progress);
    if (options.stop != nullptr && options.stop->load()) result.interrupted = true;
    stop = state.epochs_completed >= options.epochs || result.stopped_early ||
           result.reached_time_limit || result.interrupted;
  }
  // A run cut short between validations still leaves a checkpoint to resume from.
  if (result.interrupted) save_checkpoint();

  result.steps = state.step;
  result.epochs_completed = state.epochs_completed;
  result.evaluations = state.evaluations;
  result.seconds = elapsed();
  result.best_epoch = state.best_epoch;
  result.best_step = state.best_step;
  result.validations = state.validations;
  result.best_validation_accuracy = state.best_accuracy;
  result.best_validation_loss = state.best_loss;
  if (state.best_epoch >= 0 && !result.interrupted) {
    std::copy(state.best_parameters.begin(), state.best_parameters.end(),
              model.parameters().begin());
    optimizer.resync_from_model();
  }
  return result;
}

}  // namespace polyprobe
