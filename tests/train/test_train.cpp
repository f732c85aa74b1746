// The training loop: it learns, keeps the best validation state, stops when told, writes
// metrics, and resumes from a checkpoint exactly.
#include "io/temp_dir.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/train.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <iostream>
#include <numeric>

namespace polyprobe {
namespace {

// Digits, reduced to a quick problem: 400 samples.
DataSplits small_digits() {
  SplitOptions options;
  options.seed = 1;
  PreparedData data = prepare_data("digits", options);
  std::vector<int64_t> rows(400);
  std::iota(rows.begin(), rows.end(), 0);
  data.splits.train = data.splits.train.subset(rows);
  return data.splits;
}

Model linear_model() {
  ModelFile f = parse_model_file(R"({"input_shape": [64], "layers": [
      {"kind": "linear", "out_features": 10}]})",
                                 "test", LayerFactory::with_builtins());
  f.model.initialize(3);
  return f.model;
}

OptimizerConfig quick_config() {
  OptimizerConfig config;
  config.epsilon = 0.05;
  config.seed = 4;
  return config;
}

struct Run {
  Model model = linear_model();
  std::unique_ptr<Loss> loss = make_loss("cross_entropy");
  PolytopeOptimizer optimizer{model, quick_config()};
  std::unique_ptr<Evaluator> evaluator = make_reference_evaluator(model, *loss);
};

}  // namespace

TEST_CASE("training learns and restores the best validation state", "[train]") {
  const DataSplits data = small_digits();
  Run run;
  const double before = evaluate_model(run.model, *run.loss, data.validation).accuracy;
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 100;
  std::vector<TrainProgress> progress;
  options.on_progress = [&](const TrainProgress& p) { progress.push_back(p); };
  const TrainResult result =
      train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options);
  CHECK(result.steps == 12);
  CHECK(result.epochs_completed == 3);
  CHECK(progress.size() == 12);
  CHECK(progress.back().validation_accuracy.has_value());
  CHECK(result.evaluations > 0);
  const double after = evaluate_model(run.model, *run.loss, data.validation).accuracy;
  CHECK(after > before + 0.2);
  CHECK(after == result.best_validation_accuracy);  // the restored state is the best one
}

TEST_CASE("validate_every and the time limit add validations; the best one is restored",
          "[train]") {
  const DataSplits data = small_digits();
  Run run;
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 100;  // 4 steps per epoch
  options.validate_every = 3;
  std::vector<std::pair<int64_t, double>> validated;  // (step, accuracy)
  options.on_progress = [&](const TrainProgress& p) {
    if (p.validation_accuracy) validated.emplace_back(p.step, *p.validation_accuracy);
  };
  const TrainResult result =
      train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options);
  // Every third step, and the final state at the end of the last epoch.
  REQUIRE(validated.size() == 3);
  CHECK(validated[0].first == 3);
  CHECK(validated[1].first == 6);
  CHECK(validated[2].first == 8);
  CHECK(result.validations == 3);
  double best = 0;
  int64_t best_step = -1;
  for (const auto& [step, accuracy] : validated)
    if (accuracy > best) best = accuracy, best_step = step;
  CHECK(result.best_validation_accuracy == best);
  CHECK(result.best_step == best_step);
  CHECK(evaluate_model(run.model, *run.loss, data.validation).accuracy == best);

  // A time limit that has passed after the first step still validates that step's state.
  Run timed;
  TrainOptions limited;
  limited.epochs = 5;
  limited.batch_size = 100;
  limited.time_limit_s = 1e-9;
  const TrainResult cut =
      train(timed.model, *timed.loss, timed.optimizer, *timed.evaluator, data, limited);
  CHECK(cut.reached_time_limit);
  CHECK(cut.steps == 1);
  CHECK(cut.validations == 1);
  CHECK(cut.best_step == 1);
  CHECK(evaluate_model(timed.model, *timed.loss, data.validation).accuracy ==
        cut.best_validation_accuracy);

  TrainOptions bad;
  bad.validate_every = -1;
  CHECK_THROWS_WITH(train(timed.model, *timed.loss, timed.optimizer, *timed.evaluator, data, bad),
                    Catch::Contains("validate_every"));
}

TEST_CASE("train() refuses the trust-region radius model", "[train][errors]") {
  const DataSplits data = small_digits();
  Model model = linear_model();
  OptimizerConfig config = quick_config();
  config.radius.kind = RadiusModelKind::trust_region;
  PolytopeOptimizer optimizer(model, config);
  const auto loss = make_loss("cross_entropy");
  const auto evaluator = make_reference_evaluator(model, *loss);
  CHECK_THROWS_WITH(train(model, *loss, optimizer, *evaluator, data, {}),
                    Catch::Contains("manual step API"));
}

TEST_CASE("data that does not fit the model is refused", "[train][errors]") {
  DataSplits data = small_digits();
  Run run;
  data.train.labels[0] = 12;
  CHECK_THROWS_WITH(train(run.model, *run.loss, run.optimizer, *run.evaluator, data, {}),
                    Catch::Contains("out of range"));
  ModelFile wide = parse_model_file(R"({"input_shape": [65], "layers": [
      {"kind": "linear", "out_features": 10}]})",
                                    "wide", LayerFactory::with_builtins());
  PolytopeOptimizer optimizer(wide.model, quick_config());
  CHECK_THROWS_WITH(train(wide.model, *run.loss, optimizer, *run.evaluator, small_digits(), {}),
                    Catch::Contains("input_shape"));
}

TEST_CASE("metrics are JSON lines and a stop request leaves a checkpoint that resumes exactly",
          "[train][checkpoint]") {
  const DataSplits data = small_digits();
  testing::TempDir dir;
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 100;
  options.seed = 7;

  Run straight;
  const TrainResult full =
      train(straight.model, *straight.loss, straight.optimizer, *straight.evaluator, data, options);

  // The same run, stopped after 3 steps (mid-epoch) and resumed in a fresh process state.
  options.checkpoint_path = dir / "run.ckpt";
  options.metrics_path = dir / "metrics.jsonl";
  std::atomic<bool> stop{false};
  options.stop = &stop;
  int steps = 0;
  options.on_progress = [&](const TrainProgress&) { stop = ++steps == 3; };
  Run first;
  const TrainResult cut =
      train(first.model, *first.loss, first.optimizer, *first.evaluator, data, options);
  CHECK(cut.interrupted);
  CHECK(cut.steps == 3);
  CHECK(std::filesystem::exists(dir / "run.ckpt"));

  options.stop = nullptr;
  options.on_progress = nullptr;
  options.resume = true;
  Run second;
  const TrainResult resumed =
      train(second.model, *second.loss, second.optimizer, *second.evaluator, data, options);
  CHECK(resumed.steps == full.steps);
  CHECK(resumed.evaluations == full.evaluations);
  CHECK(resumed.best_validation_accuracy == full.best_validation_accuracy);
  for (std::size_t i = 0; i < second.model.parameters().size(); ++i)
    REQUIRE(second.model.parameters()[i] == straight.model.parameters()[i]);

  std::ifstream metrics(dir / "metrics.jsonl");
  std::string line;
  int lines = 0, validations = 0;
  while (std::getline(metrics, line)) {
    const auto record = nlohmann::json::parse(line);
    for (const char* key : {"step", "epoch", "loss", "accuracy", "candidates", "seconds"})
      CHECK(record.contains(key));
    validations += record.contains("split");
    ++lines;
  }
  CHECK(lines == 8 + 2);  // 8 steps, 2 validations
  CHECK(validations == 2);
  // Only the checkpoint and the metrics: no temporary files left behind.
  CHECK(dir.files().size() == 2);
}

TEST_CASE("a damaged checkpoint is an error and not a crash", "[train][checkpoint][errors]") {
  testing::TempDir dir;
  const DataSplits data = small_digits();
  Run run;
  TrainOptions options;
  options.resume = true;
  options.checkpoint_path = dir.write("bad.ckpt", "polyprobe-checkpoint 1\n\x05");
  CHECK_THROWS_WITH(train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options),
                    Catch::Contains("bad.ckpt") && Catch::Contains("truncated"));
  options.checkpoint_path = dir.write("other.ckpt", "hello");
  CHECK_THROWS_WITH(train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options),
                    Catch::Contains("not a polyprobe checkpoint"));
}

}  // namespace polyprobe
