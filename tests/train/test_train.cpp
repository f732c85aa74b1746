// The training loop: it learns, keeps the best validation state, stops when told, writes
// metrics, and resumes from a checkpoint exactly.
#include "io/temp_dir.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/safetensors.hpp>
#include <polyprobe/subspace.hpp>
#include <polyprobe/train.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <chrono>
#include <cmath>
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
  // The phases are parts of the run's wall time, each of them spent.
  const TrainResult::Phases& in = result.seconds_in;
  CHECK(in.step > 0);
  CHECK(in.record > 0);
  CHECK(in.validation > 0);
  CHECK(in.step + in.record + in.validation <= result.seconds);
}

TEST_CASE("validate_every and the time limit add validations, and the best one is restored",
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

// The build tree's plugins: cpu_tbb (the evaluator whose session caches projections) and
// factored_subspace.
const PluginRegistry& build_plugins() {
  static PluginRegistry* r = [] {
    auto* loaded = new PluginRegistry();
    loaded->load_directories({PluginRegistry::executable_plugin_dir()});
    return loaded;
  }();
  return *r;
}

// A run that searches a subspace of kind `kind`, rotated every `interval` steps, scored by
// cpu_tbb (its session is recreated at every rotation and on resume).
struct SubspaceRun {
  SubspaceRun(const std::string& kind, int64_t interval) {
    OptimizerConfig config = quick_config();
    config.subspace_particle_dim = 4;
    config.momentum = true;  // state in subspace coordinates that a rotation drops
    config.subspace_rotation_interval = interval;
    subspace = build_plugins().make_subspace(model, {kind, 2, 0, 5});
    optimizer = std::make_unique<PolytopeOptimizer>(model, config, subspace.get());
    EvaluatorRequest request;
    request.backend = "cpu_tbb";
    request.subspace = subspace.get();
    evaluator = build_plugins().make_evaluator(model, *loss, request);
  }
  TrainResult train(const DataSplits& data, const TrainOptions& options) {
    return polyprobe::train(model, *loss, *optimizer, *evaluator, data, options);
  }
  std::vector<uint8_t> weights_file() const { return serialize_safetensors(model_tensors(model)); }

  Model model = linear_model();
  std::unique_ptr<Loss> loss = make_loss("cross_entropy");
  std::unique_ptr<Subspace> subspace;
  std::unique_ptr<PolytopeOptimizer> optimizer;
  std::unique_ptr<Evaluator> evaluator;
};

TEST_CASE("subspace rotation: a run resumed between rotations ends bit-identical",
          "[train][checkpoint][rotation]") {
  const DataSplits data = small_digits();
  TrainOptions options;
  options.epochs = 2;  // 4 steps an epoch: rotations before steps 3 and 6
  options.batch_size = 100;
  options.seed = 7;
  for (const std::string kind : {"hybrid", "factored"}) {
    INFO(kind);
    SubspaceRun straight(kind, 3);
    const TrainResult full = straight.train(data, options);
    CHECK(straight.subspace->epoch() == 2);  // the last step, 7, is in epoch 7 / 3
    SubspaceRun fixed(kind, 0);
    (void)fixed.train(data, options);
    CHECK(fixed.weights_file() != straight.weights_file());  // rotation changed the run

    for (const int stop_after : {2, 4}) {  // before the first rotation, after it
      INFO("stopped after " << stop_after << " steps");
      testing::TempDir dir;
      TrainOptions cut_options = options;
      cut_options.checkpoint_path = dir / "run.ckpt";
      std::atomic<bool> stop{false};
      cut_options.stop = &stop;
      int steps = 0;
      cut_options.on_progress = [&](const TrainProgress&) { stop = ++steps == stop_after; };
      SubspaceRun first(kind, 3);
      const TrainResult cut = first.train(data, cut_options);
      REQUIRE(cut.interrupted);
      REQUIRE(cut.steps == stop_after);

      cut_options.stop = nullptr;
      cut_options.on_progress = nullptr;
      cut_options.resume = true;
      SubspaceRun second(kind, 3);  // a fresh subspace at epoch 0, as in a new process
      const TrainResult resumed = second.train(data, cut_options);
      CHECK(resumed.steps == full.steps);
      CHECK(resumed.evaluations == full.evaluations);
      CHECK(second.subspace->epoch() == straight.subspace->epoch());
      CHECK(second.weights_file() == straight.weights_file());
      for (std::size_t i = 0; i < second.model.parameters().size(); ++i)
        REQUIRE(second.model.parameters()[i] == straight.model.parameters()[i]);
    }
  }
}

TEST_CASE("a process that leaves the files to another writes none, and the agreed stop rules",
          "[train][distributed]") {
  // What polyprobe_distributed asks of train(): ranks other than 0 write nothing, and every
  // rank stops where the leader's clock and signals say (agree_on_stop's answer).
  const DataSplits data = small_digits();
  testing::TempDir dir;
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 100;
  options.seed = 7;
  options.checkpoint_path = dir / "run.ckpt";
  options.metrics_path = dir / "metrics.jsonl";
  options.write_files = false;
  std::vector<uint32_t> asked;
  options.agree_on_stop = [&](uint32_t reasons) {
    asked.push_back(reasons);
    // The leader was interrupted after step 2, though this process was not.
    return asked.size() == 4 ? uint32_t{stop_interrupted} : uint32_t{0};
  };
  Run run;
  const TrainResult result =
      train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options);
  CHECK(result.interrupted);
  CHECK(result.steps == 2);
  CHECK(asked == std::vector<uint32_t>{0, 0, 0, 0});  // twice a step: time limit, then stop
  CHECK(dir.files().empty());
}

TEST_CASE("a schedule over time anneals by the clock or the steps, whichever is further",
          "[train][schedule]") {
  const DataSplits data = small_digits();
  OptimizerConfig config = quick_config();
  config.schedule = ScheduleKind::cosine;
  config.epsilon = 0.05;
  config.epsilon_final = 0.005;
  config.total_steps = 12;  // 3 epochs of 4 steps
  struct CosineRun {
    Model model = linear_model();
    std::unique_ptr<Loss> loss = make_loss("cross_entropy");
    std::unique_ptr<Evaluator> evaluator = make_reference_evaluator(model, *loss);
  };
  const auto run = [&](TrainOptions options, std::vector<double>& epsilons) {
    CosineRun r;
    PolytopeOptimizer optimizer(r.model, config);
    options.epochs = 3;
    options.batch_size = 100;
    options.on_progress = [&](const TrainProgress& p) { epsilons.push_back(p.epsilon); };
    train(r.model, *r.loss, optimizer, *r.evaluator, data, options);
    return std::vector<double>(r.model.parameters().begin(), r.model.parameters().end());
  };
  const EpsilonSchedule cosine(ScheduleSettings{ScheduleKind::cosine, 0.05, 0.005, 12});
  std::vector<double> by_steps;
  const std::vector<double> stepped = run(TrainOptions{}, by_steps);
  REQUIRE(by_steps.size() == 12);
  for (int64_t s = 0; s < 12; ++s) CHECK(by_steps[s] == cosine.at(s));

  // A clock that has not moved: the steps decide, the very same run.
  TrainOptions timed;
  timed.schedule_over_time = true;
  timed.time_limit_s = 1000;
  timed.agree_on_clock = [](double) { return 0.0; };
  std::vector<double> still;
  CHECK(run(timed, still) == stepped);
  CHECK(still == by_steps);

  // Half the time limit gone before the first step: the schedule starts half way, and the
  // steps take over once they are further along.
  timed.agree_on_clock = [](double) { return 500.0; };
  std::vector<double> halfway;
  const std::vector<double> moved = run(timed, halfway);
  REQUIRE(halfway.size() == 12);
  for (int64_t s = 0; s < 12; ++s)
    CHECK(halfway[s] == cosine.at(s, std::max(0.5, static_cast<double>(s) / 12)));
  CHECK(halfway[0] < by_steps[0]);
  CHECK(moved != stepped);

  // It needs a time limit, and a schedule that depends on the run's length.
  std::vector<double> unused;
  timed.time_limit_s = 0;
  CHECK_THROWS_WITH(run(timed, unused), Catch::Contains("set a time limit"));
  timed.time_limit_s = 1000;
  config.schedule = ScheduleKind::constant;
  CHECK_THROWS_WITH(run(timed, unused), Catch::Contains("has no effect"));
}

TEST_CASE("a stopped run leaves the best validated state in the model, resuming names its step",
          "[train][checkpoint]") {
  const DataSplits data = small_digits();
  testing::TempDir dir;
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 100;
  options.validate_every = 2;
  options.checkpoint_path = dir / "run.ckpt";
  std::atomic<bool> stop{false};
  options.stop = &stop;
  int steps = 0;
  options.on_progress = [&](const TrainProgress&) { stop = ++steps == 5; };
  Run first;
  const TrainResult cut =
      train(first.model, *first.loss, first.optimizer, *first.evaluator, data, options);
  REQUIRE(cut.interrupted);
  CHECK(cut.steps == 5);
  CHECK(cut.validations == 2);  // steps 2 and 4
  CHECK(cut.resumed_from_step == -1);
  CHECK(evaluate_model(first.model, *first.loss, data.validation).accuracy ==
        cut.best_validation_accuracy);

  options.stop = nullptr;
  options.on_progress = nullptr;
  options.resume = true;
  std::vector<int64_t> resumed_at;
  options.on_resume = [&](const TrainProgress& p) { resumed_at.push_back(p.step); };
  Run second;
  const TrainResult resumed =
      train(second.model, *second.loss, second.optimizer, *second.evaluator, data, options);
  CHECK(resumed_at == std::vector<int64_t>{5});
  CHECK(resumed.resumed_from_step == 5);
  CHECK(resumed.steps == 12);
}

// A model whose first layer is the fixture plugin's nan_shift (x + shift, NaN once more than
// `max_moved` shifts are not 0; always NaN for a negative max_moved), then a linear layer.
constexpr int64_t kMaxMoved = 2;  // a candidate moves one particle (2 scalars), a step all

struct NanRun {
  explicit NanRun(int64_t max_moved) {
    static PluginRegistry registry;
    static const LayerFactory factory = [] {
      registry.load_directories({POLYPROBE_FIXTURE_PLUGIN_DIR});
      LayerFactory f = LayerFactory::with_builtins();
      registry.register_layers(f);
      return f;
    }();
    const nlohmann::json doc = {{"input_shape", {64}},
                                {"layers",
                                 {{{"kind", "nan_shift"}, {"max_moved", max_moved}},
                                  {{"kind", "linear"}, {"out_features", 10}}}}};
    model = parse_model_file(doc.dump(), "nan model", factory).model;
    model.initialize(3);
    optimizer = std::make_unique<PolytopeOptimizer>(model, quick_config());
    evaluator = make_reference_evaluator(model, *loss);
  }
  TrainResult train(const DataSplits& data, const TrainOptions& options) {
    return polyprobe::train(model, *loss, *optimizer, *evaluator, data, options);
  }
  Model model{Shape{{1}}};
  std::unique_ptr<Loss> loss = make_loss("cross_entropy");
  std::unique_ptr<PolytopeOptimizer> optimizer;
  std::unique_ptr<Evaluator> evaluator;
};

std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

TEST_CASE("a model that is NaN everywhere stops at the first step, naming its layer",
          "[train][nonfinite]") {
  const DataSplits data = small_digits();
  NanRun run(-1);
  TrainOptions options;
  options.batch_size = 100;
  try {
    run.train(data, options);
    FAIL("train() accepted a model whose loss is NaN");
  } catch (const NonFiniteLossError& e) {
    CHECK(e.layer_kind == "nan_shift");
    CHECK_THAT(e.what(), Catch::Contains("step 1") &&
                             Catch::Contains("layers[0] (nan_shift) writes non-finite outputs"));
  }
}

TEST_CASE("steps into a NaN region are reverted and every recorded loss stays finite",
          "[train][nonfinite]") {
  const DataSplits data = small_digits();
  testing::TempDir dir;
  NanRun run(kMaxMoved);
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 100;
  options.max_reverted_steps = 1000;
  options.metrics_path = dir / "m.jsonl";
  const TrainResult result = run.train(data, options);
  CHECK(result.reverted_steps > 0);
  CHECK(result.steps == 12);
  CHECK(std::isfinite(result.best_validation_loss));
  CHECK(std::isfinite(evaluate_model(run.model, *run.loss, data.validation).loss));
  int64_t reverted = 0;
  for (const auto& record : read_metrics(dir / "m.jsonl")) {
    CHECK(record["loss"].is_number());
    reverted += record.contains("reverted");
  }
  CHECK(reverted == result.reverted_steps);

  // Given up after max_reverted_steps in a row, naming the layer; nothing was validated, so
  // the model keeps the last finite state.
  NanRun strict(kMaxMoved);
  options.max_reverted_steps = 1;
  options.metrics_path.clear();
  try {
    strict.train(data, options);
    FAIL("train() went on after a reverted step with max_reverted_steps = 1");
  } catch (const NonFiniteLossError& e) {
    CHECK(e.layer_kind == "nan_shift");
    CHECK_THAT(e.what(), Catch::Contains("1 steps in a row"));
  }
  CHECK(std::isfinite(evaluate_model(strict.model, *strict.loss, data.validation).loss));
}

TEST_CASE("a run given up on non-finite losses leaves its best validated state in the model",
          "[train][nonfinite]") {
  const DataSplits data = small_digits();
  NanRun run(kMaxMoved);
  const std::vector<double> initial(run.model.parameters().begin(), run.model.parameters().end());
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 100;
  options.validate_every = 1;  // every step: the first validates the (reverted) initial state
  options.max_reverted_steps = 3;
  try {
    run.train(data, options);
    FAIL("train() went on past max_reverted_steps");
  } catch (const NonFiniteLossError& e) {
    CHECK(e.best_step == 1);
    CHECK(e.best_validation_accuracy ==
          evaluate_model(run.model, *run.loss, data.validation).accuracy);
  }
  const std::vector<double> left(run.model.parameters().begin(), run.model.parameters().end());
  CHECK(left == initial);
}

TEST_CASE("train() refuses a negative time limit and outputs that are devices",
          "[train][outputs]") {
  const DataSplits data = small_digits();
  Run run;
  TrainOptions options;
  options.time_limit_s = -1;
  CHECK_THROWS_WITH(train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options),
                    Catch::Contains("time_limit_s must be a number of seconds >= 0"));
  testing::TempDir dir;
  const std::filesystem::path fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  options.time_limit_s = 0;
  options.metrics_path = fifo;
  CHECK_THROWS_WITH(
      train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options),
      Catch::Contains("the metrics file '" + fifo.string() + "'") && Catch::Contains("a FIFO"));
  options.metrics_path.clear();
  options.checkpoint_path = fifo;
  CHECK_THROWS_WITH(train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options),
                    Catch::Contains("the checkpoint file '" + fifo.string() + "'"));
  CHECK(std::filesystem::is_fifo(fifo));
}

TEST_CASE("a validation whose loss is not finite never becomes the best state",
          "[train][nonfinite]") {
  DataSplits data = small_digits();
  data.validation.features(0, 0) = std::numeric_limits<double>::quiet_NaN();
  testing::TempDir dir;
  Run run;
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 100;
  options.metrics_path = dir / "m.jsonl";
  const TrainResult result =
      train(run.model, *run.loss, run.optimizer, *run.evaluator, data, options);
  CHECK(result.validations == 2);
  CHECK(result.best_epoch == -1);
  int nonfinite = 0;
  for (const auto& record : read_metrics(dir / "m.jsonl"))
    if (record.contains("split")) nonfinite += record.contains("nonfinite");
  CHECK(nonfinite == 2);
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

namespace polyprobe {

TEST_CASE("evaluate_model gives the same result on any thread count", "[train]") {
  const DataSplits data = small_digits();  // 400 training rows: seven chunks of 64 and a tail
  Model model = linear_model();
  const std::unique_ptr<Loss> loss = make_loss("cross_entropy");
  for (const DType dtype : {DType::f32, DType::f64}) {
    const EvaluationResult one = evaluate_model(model, *loss, data.train, dtype, 1);
    const EvaluationResult two = evaluate_model(model, *loss, data.train, dtype, 2);
    const EvaluationResult all = evaluate_model(model, *loss, data.train, dtype, 0);
    CHECK(one.samples == 400);
    CHECK(one.loss == two.loss);
    CHECK(one.loss == all.loss);
    CHECK(one.accuracy == two.accuracy);
    CHECK(one.accuracy == all.accuracy);
    // And it is the mean over the rows: the model's own forward of all of them at once.
    const Matrix<double> out = model.forward<double>(data.train.features);
    int64_t right = 0;
    for (Eigen::Index i = 0; i < out.rows(); ++i) {
      Eigen::Index best = 0;
      for (Eigen::Index c = 1; c < out.cols(); ++c)
        if (out(i, c) > out(i, best)) best = c;
      right += best == data.train.labels[static_cast<std::size_t>(i)];
    }
    CHECK(one.accuracy ==
          Approx(static_cast<double>(right) / 400.0).margin(dtype == DType::f32 ? 0.01 : 1e-12));
  }
}

}  // namespace polyprobe
