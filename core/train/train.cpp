#include <polyprobe/atomic_file.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/layer.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/step_shard.hpp>
#include <polyprobe/train.hpp>

#include "optimizer/step_threads.hpp"
#include "train/checkpoint.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

namespace polyprobe {
namespace {

using train_detail::Checkpoint;

// Rows per chunk of an evaluation: a function of the row count alone, so the chunks (and
// their forwards and partial sums, added in chunk order) are the same for any thread count
// and the results do not depend on it. A minibatch (the post-step record) goes in chunks of
// 32 rows, so that its forward runs on a few threads while each chunk's layers still pay
// their per-call work (a quantised layer's transform of its weights) a few times, not once per
// handful of rows; a validation or test split in chunks of 64.
int64_t evaluation_rows(int64_t rows) { return rows <= 256 ? 32 : 64; }

// The chunks an evaluation computes here: all of them, or with processes that share the steps
// (StepShard: each process's evaluator scores its slice of the candidates) an even share, whose
// partial sums then cross to every process (StepShard::share). Every process adds the same
// partials in chunk order, so the result is the same bits for any process and thread count, and
// a run of 16 one-thread ranks does not evaluate every minibatch, validation and test split on
// one thread each. Every process calls it at the same points (the collective inside).
template <class S>
EvaluationResult evaluate_in(const Model& model, const Loss& loss, const Matrix<double>& inputs,
                             const Targets& targets, const detail::StepThreads& threads,
                             StepShard* processes) {
  const int64_t rows = inputs.rows();
  const int64_t chunk_rows = evaluation_rows(rows);
  const int64_t chunks = detail::StepThreads::chunk_count(rows, chunk_rows);
  const int shares = processes != nullptr ? processes->processes() : 1;
  const int mine = processes != nullptr ? processes->index() : 0;
  // [2 chunks]: chunk c's loss sum and count of right answers (exact in a double below 2^53),
  // side by side, so that process r's chunks are one range: offsets[r] = 2 * its first chunk.
  std::vector<double> partials(static_cast<std::size_t>(2 * chunks), 0.0);
  std::vector<int64_t> offsets(static_cast<std::size_t>(shares) + 1);
  for (int r = 0; r <= shares; ++r)
    offsets[static_cast<std::size_t>(r)] = 2 * (chunks * r / shares);
  const int64_t first = offsets[static_cast<std::size_t>(mine)] / 2;
  const int64_t first_row = first * chunk_rows;
  const int64_t end_row =
      std::min(rows, offsets[static_cast<std::size_t>(mine) + 1] / 2 * chunk_rows);
  // Layers' forwards are const and may run concurrently (as evaluators already run them);
  // the parameters are converted once for every chunk.
  const std::vector<S> params = model.params_as<S>();
  threads.for_chunks(
      std::max<int64_t>(0, end_row - first_row), chunk_rows, [&](int64_t c, int64_t b, int64_t e) {
        const int64_t chunk = first + c, begin = first_row + b, end = first_row + e;
        const Matrix<S> outputs = model.forward_converted<S>(
            inputs.middleRows(begin, end - begin).template cast<S>(), params);
        std::vector<S> per(static_cast<std::size_t>(outputs.rows()));
        loss.per_sample(outputs, targets, begin, per);
        double sum = 0;
        int64_t right = 0;
        for (Eigen::Index i = 0; i < outputs.rows(); ++i) {
          sum += static_cast<double>(per[static_cast<std::size_t>(i)]);
          Eigen::Index best = 0;
          for (Eigen::Index k = 1; k < outputs.cols(); ++k)
            if (outputs(i, k) > outputs(i, best)) best = k;
          right += best == targets.labels[static_cast<std::size_t>(begin + i)];
        }
        partials[static_cast<std::size_t>(2 * chunk)] = sum;
        partials[static_cast<std::size_t>(2 * chunk + 1)] = static_cast<double>(right);
      });
  if (shares > 1) processes->share(partials, offsets, "an evaluation's partial sums");
  EvaluationResult r;
  r.samples = rows;
  double right = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    r.loss += partials[static_cast<std::size_t>(2 * c)];
    right += partials[static_cast<std::size_t>(2 * c + 1)];
  }
  r.loss /= static_cast<double>(std::max<int64_t>(r.samples, 1));
  r.accuracy = right / static_cast<double>(std::max<int64_t>(r.samples, 1));
  return r;
}

EvaluationResult evaluate_rows(const Model& model, const Loss& loss, const Matrix<double>& inputs,
                               const Targets& targets, DType dtype,
                               const detail::StepThreads& threads, StepShard* processes) {
  return dtype == DType::f64 ? evaluate_in<double>(model, loss, inputs, targets, threads, processes)
                             : evaluate_in<float>(model, loss, inputs, targets, threads, processes);
}

EvaluationResult evaluate_batch(const Model& model, const Loss& loss, const Batch& batch,
                                DType dtype, const detail::StepThreads& threads,
                                StepShard* processes) {
  return evaluate_rows(model, loss, batch.inputs, batch.targets, dtype, threads, processes);
}

// The labels of a data set as targets, without copying its features.
Targets targets_of(const Dataset& data) {
  Targets targets;
  targets.labels = data.labels;
  return targets;
}

// evaluate_model() on `threads` (and `processes`, as evaluate_in), without copying the data's
// features.
EvaluationResult evaluate_data(const Model& model, const Loss& loss, const Dataset& data,
                               DType dtype, const detail::StepThreads& threads,
                               StepShard* processes = nullptr) {
  if (data.size() == 0) throw Error("cannot evaluate on the empty data '" + data.name + "'");
  const Targets targets = targets_of(data);
  loss.check_targets(targets, model.output_shape().numel());
  return evaluate_rows(model, loss, data.features, targets, dtype, threads, processes);
}

// Appends one JSON object per line to the metrics file, flushed so a crash loses nothing.
class MetricsLog {
 public:
  MetricsLog(const std::filesystem::path& path, bool append) : path_(path) {
    if (path.empty()) return;
    file_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!file_) throw Error("cannot write the metrics file '" + path.string() + "'");
  }
  // Each record is flushed, so a failed write (a full disk) is caught at the record it loses.
  void write(const nlohmann::json& record) {
    if (!file_.is_open()) return;
    file_ << record.dump() << std::endl;
    if (!file_)
      throw Error("writing the metrics file '" + path_.string() +
                  "' failed (is its disk full?); the records up to the last one are in it");
  }

 private:
  std::filesystem::path path_;
  std::ofstream file_;
};

// Where a non-finite loss comes from: the first layer whose output on `batch` is not finite
// although its input is. Sets `kind` to that layer's kind ("" when it is the data, the
// parameters or the loss).
template <class S>
std::string locate_nonfinite_in(const Model& model, const Batch& batch, std::string& kind) {
  Matrix<S> x = batch.inputs.cast<S>();
  if (!x.allFinite()) return "the input data holds non-finite features";
  const auto all = model.parameters();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (!std::isfinite(all[i])) return "parameter " + std::to_string(i) + " is not finite";
  const std::vector<S> params(all.begin(), all.end());
  for (std::size_t i = 0; i < model.num_layers(); ++i) {
    const Layer& layer = model.layer(i);
    int64_t count = 0;
    for (const ParamSpec& spec : layer.parameters()) count += spec.numel();
    Matrix<S> y(x.rows(), layer.output_shape().numel());
    layer.forward(
        x,
        std::span<const S>(params).subspan(static_cast<std::size_t>(model.layer_offset(i)),
                                           static_cast<std::size_t>(count)),
        y);
    if (!y.allFinite()) {
      kind = layer.kind();
      return "layers[" + std::to_string(i) + "] (" + kind +
             ") writes non-finite outputs from finite inputs";
    }
    x = std::move(y);
  }
  return "every layer's output is finite, so the loss itself is not (check --loss against the "
         "model's outputs)";
}

[[noreturn]] void throw_nonfinite(const Model& model, const Batch& batch, DType dtype,
                                  const std::string& what) {
  std::string kind;
  const std::string where = dtype == DType::f64 ? locate_nonfinite_in<double>(model, batch, kind)
                                                : locate_nonfinite_in<float>(model, batch, kind);
  throw NonFiniteLossError(what + ": " + where, kind);
}

// Candidates per evaluation path in the evaluator's last call, from its explain(): a plugin's
// counts ("last_call_candidates_per_path", the paths that scored any), else the one path the
// evaluator names (the reference's "sequential") with all `candidates`.
nlohmann::json candidates_per_path(const Evaluator& evaluator, int64_t candidates) {
  const nlohmann::json explained = evaluator.explain();
  nlohmann::json paths = nlohmann::json::object();
  const auto plugin = explained.find("plugin");
  if (plugin != explained.end() && plugin->is_object()) {
    const auto counts = plugin->find("last_call_candidates_per_path");
    if (counts != plugin->end() && counts->is_object())
      for (const auto& [path, count] : counts->items())
        if (count.is_number() && count.get<double>() > 0) paths[path] = count;
    return paths;
  }
  const auto path = explained.find("path");
  if (path != explained.end() && path->is_string()) paths[path->get<std::string>()] = candidates;
  return paths;
}

void check_compatible(const Model& model, const Loss& loss, const DataSplits& data) {
  for (const Dataset* split : {&data.train, &data.validation, &data.test}) {
    if (split->size() == 0 && split != &data.train) continue;
    if (split->features.cols() != model.input_shape().numel())
      throw Error("data '" + split->name + "' has " + std::to_string(split->features.cols()) +
                  " features per sample, but the model's input " + model.input_shape().str() +
                  " has " + std::to_string(model.input_shape().numel()) +
                  "; choose a model file whose input_shape fits the data");
    loss.check_targets(targets_of(*split), model.output_shape().numel());
  }
  if (data.train.size() == 0) throw Error("the training split is empty");
}

}  // namespace

EvaluationResult evaluate_model(const Model& model, const Loss& loss, const Dataset& data,
                                DType dtype, int threads) {
  return evaluate_data(model, loss, data, dtype, detail::StepThreads(threads));
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
  if (options.max_reverted_steps < 1) throw Error("max_reverted_steps must be >= 1");
  if (!(options.time_limit_s >= 0) || !std::isfinite(options.time_limit_s))
    throw Error("time_limit_s must be a number of seconds >= 0 (0: none)");
  if (options.schedule_over_time) {
    if (options.time_limit_s <= 0)
      throw Error(
          "schedule_over_time runs the schedule over time_limit_s, which is 0 (no limit): set a "
          "time limit");
    const OptimizerConfig& config = optimizer.config();
    const bool by_length = config.schedule == ScheduleKind::linear ||
                           config.schedule == ScheduleKind::cosine || config.momentum;
    if (!by_length)
      throw Error("schedule_over_time has no effect on the schedule '" +
                  std::string(to_string(config.schedule)) +
                  "' without momentum: only linear and cosine schedules (and momentum's "
                  "warm-up) depend on the run's length");
  }
  if (options.resume && options.checkpoint_path.empty())
    throw Error("resuming needs a checkpoint file (--save or --checkpoint)");
  // The output files are regular files or new ones, never a device or a library in use.
  if (options.write_files) {
    if (!options.metrics_path.empty()) io::check_output_file(options.metrics_path, "metrics file");
    if (!options.checkpoint_path.empty())
      io::check_output_file(options.checkpoint_path, "checkpoint file");
  }
  check_compatible(model, loss, data);
  // The loop's own evaluations (the batch after each step, validation, test) on the
  // evaluator's threads, as the optimizer's step runs.
  const detail::StepThreads threads(evaluator.threads());
  // Processes that share the steps share the loop's evaluations too (evaluate_in).
  StepShard* const processes = evaluator.step_shard();

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
  TrainResult result;
  if (options.resume) {
    result.resumed_from_step = state.step;
    if (options.on_resume)
      options.on_resume(TrainProgress{state.step, state.epoch, stream.batches_per_epoch(),
                                      options.epochs, 0, 0, 0, state.evaluations, state.seconds,
                                      std::nullopt});
  }
  MetricsLog metrics(options.write_files ? options.metrics_path : std::filesystem::path(),
                     options.resume);

  const auto started = std::chrono::steady_clock::now();
  const double seconds_before = state.seconds;
  const auto elapsed = [&] {
    return seconds_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const auto save_checkpoint = [&] {
    // Every process, even those that write nothing: a sharded state is gathered collectively.
    optimizer.gather_state();
    if (options.checkpoint_path.empty() || !options.write_files) return;
    state.parameters.assign(model.parameters().begin(), model.parameters().end());
    state.epoch = stream.epoch();
    state.position = stream.position();
    state.seconds = elapsed();
    std::ostringstream out;
    optimizer.save_state(out);
    state.optimizer_state = out.str();
    train_detail::write_checkpoint(options.checkpoint_path, state);
  };

  const int64_t steps_per_epoch = stream.batches_per_epoch();
  std::optional<double> best_test_accuracy;  // record_test: of the best state so far
  // Measures the validation split and keeps the parameters if they are the best so far.
  const auto validate = [&](int64_t epoch) {
    const Dataset& check = data.validation.size() > 0 ? data.validation : data.train;
    const EvaluationResult v = evaluate_data(model, loss, check, options.dtype, threads, processes);
    ++state.validations;
    const bool finite = std::isfinite(v.loss);
    nlohmann::json record = {{"step", state.step},     {"epoch", epoch},
                             {"split", "validation"},  {"loss", v.loss},
                             {"accuracy", v.accuracy}, {"candidates", state.evaluations},
                             {"seconds", elapsed()}};
    // JSON has no NaN: the loss is written as null, and this says why.
    if (!finite) record["nonfinite"] = "loss (never kept as the best state)";
    // A non-finite validation never becomes the best state.
    const bool better = finite && (state.best_epoch < 0 || v.accuracy > state.best_accuracy ||
                                   (v.accuracy == state.best_accuracy && v.loss < state.best_loss));
    if (options.record_test && data.test.size() > 0) {
      if (better)
        best_test_accuracy =
            evaluate_data(model, loss, data.test, options.dtype, threads, processes).accuracy;
      if (best_test_accuracy) record["best_test_accuracy"] = *best_test_accuracy;
    }
    metrics.write(record);
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
  // The parameters before and after the step, to revert a non-finite one.
  std::vector<double> before, after;
  int64_t reverted_in_a_row = 0;
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  bool stop = state.epochs_completed >= options.epochs;
  while (!stop) {
    const Batch batch = stream.next();
    before.assign(model.parameters().begin(), model.parameters().end());
    if (options.schedule_over_time) {
      double seconds = elapsed();
      if (options.agree_on_clock) seconds = options.agree_on_clock(seconds);
      const double by_steps =
          static_cast<double>(state.step) /
          static_cast<double>(std::max<int64_t>(1, optimizer.config().total_steps));
      optimizer.set_schedule_progress(
          std::min(1.0, std::max(by_steps, seconds / options.time_limit_s)));
    }
    auto phase = Clock::now();
    optimizer.register_evaluator(evaluator, batch);
    const StepInfo info = optimizer.step();
    result.seconds_in.step += seconds_since(phase);
    state.evaluations += info.candidates;
    ++state.step;
    phase = Clock::now();
    EvaluationResult now = evaluate_batch(model, loss, batch, options.dtype, threads, processes);
    result.seconds_in.record += seconds_since(phase);
    bool reverted = false;
    if (!std::isfinite(now.loss)) {
      // Undo the step; if the state before it is not finite either, nothing will be.
      after.assign(model.parameters().begin(), model.parameters().end());
      std::copy(before.begin(), before.end(), model.parameters().begin());
      optimizer.resync_from_model();
      now = evaluate_batch(model, loss, batch, options.dtype, threads, processes);
      if (!std::isfinite(now.loss))
        throw_nonfinite(model, batch, options.dtype,
                        "the loss on the training minibatch of step " + std::to_string(state.step) +
                            " is not finite before the step moved anything, so no step can fix it");
      reverted = true;
      ++result.reverted_steps;
      if (++reverted_in_a_row >= options.max_reverted_steps) {
        // Diagnose the last step's state, then leave the last finite one in the model.
        std::copy(after.begin(), after.end(), model.parameters().begin());
        try {
          throw_nonfinite(model, batch, options.dtype,
                          std::to_string(reverted_in_a_row) +
                              " steps in a row made the training loss non-finite and were "
                              "reverted (up to step " +
                              std::to_string(state.step) + ")");
        } catch (NonFiniteLossError& e) {
          // The best validated state, as a finished run leaves it, else the last finite one.
          if (state.best_epoch >= 0) {
            std::copy(state.best_parameters.begin(), state.best_parameters.end(),
                      model.parameters().begin());
            e.best_step = state.best_step;
            e.best_validation_accuracy = state.best_accuracy;
          } else {
            std::copy(before.begin(), before.end(), model.parameters().begin());
          }
          optimizer.resync_from_model();
          throw;
        }
      }
    } else {
      reverted_in_a_row = 0;
    }
    TrainProgress progress{state.step, stream.epoch(), steps_per_epoch, options.epochs,
                           now.loss,   now.accuracy,   now.samples,     state.evaluations,
                           elapsed(),  std::nullopt,   reverted,        info.epsilon};
    nlohmann::json record = {{"step", progress.step},
                             {"epoch", progress.epoch},
                             {"loss", progress.loss},
                             {"accuracy", progress.accuracy},
                             {"candidates", progress.candidates},
                             {"seconds", progress.seconds},
                             {"epsilon", progress.epsilon}};
    if (!options.metrics_path.empty() && options.write_files) {
      nlohmann::json paths = candidates_per_path(evaluator, info.candidates);
      if (!paths.empty()) record["paths"] = std::move(paths);
    }
    // The loss and accuracy are then those of the restored state.
    if (reverted) record["reverted"] = "non-finite loss";
    metrics.write(record);
    const bool epoch_done = stream.position() == data.train.size();
    if (epoch_done) ++state.epochs_completed;
    // The clock and the signals are this process's; with agree_on_stop the leader's decide.
    const auto agreed = [&](uint32_t reasons) {
      return options.agree_on_stop ? options.agree_on_stop(reasons) : reasons;
    };
    if (agreed(options.time_limit_s > 0 && elapsed() >= options.time_limit_s
                   ? uint32_t{stop_time_limit}
                   : 0U) != 0)
      result.reached_time_limit = true;
    const bool periodic = options.validate_every > 0 && state.step % options.validate_every == 0;
    // Validate at every epoch end (unless validate_every replaces it), every validate_every
    // steps, and at the time limit, so the last stretch of a timed run is not thrown away.
    if ((epoch_done && (options.validate_every == 0 || state.epochs_completed >= options.epochs)) ||
        periodic || result.reached_time_limit) {
      phase = Clock::now();
      progress.validation_accuracy = validate(progress.epoch);
      save_checkpoint();
      result.seconds_in.validation += seconds_since(phase);
    }
    if (options.on_progress) options.on_progress(progress);
    // After on_progress, which may ask to stop after this very step.
    if (agreed(options.stop != nullptr && options.stop->load() ? uint32_t{stop_interrupted} : 0U) !=
        0)
      result.interrupted = true;
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
  // After the checkpoint, so an interrupted run resumes from its current state but leaves the
  // best validated one in the model for the caller to save.
  if (state.best_epoch >= 0) {
    std::copy(state.best_parameters.begin(), state.best_parameters.end(),
              model.parameters().begin());
    optimizer.resync_from_model();
  }
  return result;
}

}  // namespace polyprobe
