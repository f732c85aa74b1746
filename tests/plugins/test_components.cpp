// Subspace kinds and radius models from plugins: the example radius model plateau
// (examples/radius_model_plugin) and the factored subspace (plugins/factored_subspace) drive
// the optimizer through the registry, refuse what they cannot serve with their reason, and a
// training run that uses both resumes from its checkpoint bit for bit.
#include "io/temp_dir.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/radius_model.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/subspace.hpp>
#include <polyprobe/train.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <sstream>

namespace polyprobe {
namespace {

// The build tree's plugins (cpu_tbb, factored_subspace) and the example plugins (plateau).
const PluginRegistry& registry() {
  static PluginRegistry* r = [] {
    auto* loaded = new PluginRegistry();
    loaded->load_directories(
        {POLYPROBE_EXAMPLE_PLUGIN_DIR, PluginRegistry::executable_plugin_dir()});
    return loaded;
  }();
  for (const char* name : {"plateau", "factored_subspace", "cpu_tbb"}) {
    const PluginInfo* info = r->find(name);
    if (info == nullptr || !info->available)
      FAIL("plugin " << name << " is not available" << (info ? ": " + info->reason : ""));
  }
  return *r;
}

bool lists(const std::vector<NamedComponent>& components, const std::string& name,
           const std::string& provider) {
  return std::any_of(components.begin(), components.end(), [&](const NamedComponent& c) {
    return c.name == name && c.provider == provider;
  });
}

TEST_CASE("plugin radius models and subspace kinds are listed with their provider",
          "[plugins][components]") {
  CHECK(lists(registry().radius_models(), "plateau", "plateau"));
  CHECK(lists(registry().radius_models(), "quadratic", "core"));
  CHECK(lists(registry().subspace_kinds(), "factored", "factored_subspace"));
  CHECK(lists(registry().subspace_kinds(), "hybrid", "core"));
  const PluginInfo* plateau = registry().find("plateau");
  REQUIRE(plateau != nullptr);
  REQUIRE(plateau->capabilities.size() == 1);
  CHECK(plateau->capabilities[0].component == "radius_model");
  CHECK(plateau->capabilities[0].name == "plateau");
}

TEST_CASE("a plugin radius model refuses bad options and unknown names with the reason",
          "[plugins][components][errors]") {
  OptimizerConfig config;
  const auto refused = [&](const std::string& name, const std::string& options) {
    try {
      registry().choose_radius_model(name, config, false, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("plateau", R"({"patience": 0})"),
             Catch::Contains("radius model 'plateau' (plugin plateau) refuses this "
                             "configuration: plateau: patience must be at least 1"));
  CHECK_THAT(refused("plateau", R"({"patiense": 3})"),
             Catch::Contains("unknown option 'patiense'"));
  CHECK_THAT(refused("plateu", "{}"), Catch::Contains("unknown radius model 'plateu'") &&
                                          Catch::Contains("plateau") &&
                                          Catch::Contains("trust_region"));
  CHECK_THAT(refused("quadratic", R"({"a": 1})"), Catch::Contains("is built in"));
  registry().choose_radius_model("quadratic", config, false);
  CHECK(config.radius.kind == RadiusModelKind::quadratic);
}

TEST_CASE("a plugin radius model drives the radii and its state round-trips exactly",
          "[plugins][components][checkpoint]") {
  OptimizerConfig config;
  registry().choose_radius_model("plateau", config, false,
                                 R"({"patience": 2, "factor": 0.5, "min_multiplier": 0.2})");
  REQUIRE(config.radius.kind == RadiusModelKind::plugin);
  const auto model = make_radius_model(config.radius);
  CHECK(model->name() == "plateau");
  CHECK_FALSE(model->needs_incumbent());
  CHECK(model->multipliers().step == 1.0);
  model->observe_costs(1.0);  // the first cost is the best so far
  model->observe_costs(1.0);
  CHECK(model->multipliers().step == 1.0);
  model->observe_costs(1.0);  // two stagnant steps: halved
  CHECK(model->multipliers().step == 0.5);
  CHECK(model->multipliers().probe == 0.5);
  model->observe_costs(0.5);  // progress resets the count
  model->observe_costs(0.5);
  CHECK(model->multipliers().step == 0.5);
  std::stringstream state;
  model->save(state);
  const auto copy = make_radius_model(config.radius);
  copy->load(state);
  for (const auto& m : {model.get(), copy.get()}) m->observe_costs(0.5);
  CHECK(copy->multipliers().step == 0.25);
  CHECK(copy->multipliers().step == model->multipliers().step);
  for (int i = 0; i < 6; ++i) model->observe_costs(0.5);
  CHECK(model->multipliers().step == 0.2);  // floored
  // A state of another model is refused by name.
  std::stringstream foreign("radius.plugin elsewhere\nradius.state 0 -\n");
  CHECK_THROWS_WITH(copy->load(foreign), Catch::Contains("written with radius model 'elsewhere'"));
}

// Digits, reduced to a quick problem: 300 samples, a 64-12-10 MLP.
DataSplits small_digits() {
  SplitOptions options;
  options.seed = 1;
  PreparedData data = prepare_data("digits", options);
  std::vector<int64_t> rows(300);
  std::iota(rows.begin(), rows.end(), 0);
  data.splits.train = data.splits.train.subset(rows);
  return data.splits;
}

// Which of the plugin components a Run uses, and its evaluator.
struct Variant {
  bool subspace = true;       // the factored subspace (else the full space)
  bool plugin_radius = true;  // the plateau radius model (else fixed)
  bool cpu_tbb = true;        // cpu_tbb (else the reference evaluator)
};
Variant g_variant;

struct Run {
  Model model = [] {
    ModelFile f = parse_model_file(R"({"input_shape": [64], "layers": [
        {"kind": "linear", "out_features": 12}, {"kind": "relu"},
        {"kind": "linear", "out_features": 10}]})",
                                   "test", LayerFactory::with_builtins());
    f.model.initialize(3);
    return f.model;
  }();
  std::unique_ptr<Loss> loss = make_loss("cross_entropy");
  std::unique_ptr<Subspace> subspace =
      g_variant.subspace ? registry().make_subspace(model, {"factored", 3, 0, 5}) : nullptr;
  OptimizerConfig config = [this] {
    OptimizerConfig c;
    c.epsilon = 0.05;
    c.seed = 4;
    c.subspace_particle_dim = 4;
    if (g_variant.plugin_radius)
      registry().choose_radius_model("plateau", c, true, R"({"patience": 1, "threshold": 0.5})");
    return c;
  }();
  PolytopeOptimizer optimizer{model, config, subspace.get()};
  std::unique_ptr<Evaluator> evaluator = [this] {
    EvaluatorRequest request;
    request.backend = g_variant.cpu_tbb ? "cpu_tbb" : "reference";
    request.subspace = subspace.get();
    return registry().make_evaluator(model, *loss, request);
  }();
};

TEST_CASE("the plateau model shrinks the radii of real optimizer steps in a factored subspace",
          "[plugins][components]") {
  const DataSplits data = small_digits();
  Run run;
  const Batch batch = to_batch(data.train);
  run.optimizer.register_evaluator(*run.evaluator, batch);
  std::vector<double> radii;
  for (int i = 0; i < 6; ++i) radii.push_back(run.optimizer.step().step_radius);
  // threshold 0.5 counts every step without a halving of the cost as stagnant: patience 1
  // halves the multiplier every step after the first (the schedule is constant at first).
  CHECK(radii[2] < radii[1]);
  CHECK(radii[5] < radii[2]);
}

TEST_CASE("training with a plugin subspace and radius model resumes bit for bit",
          "[plugins][components][checkpoint]") {
  const DataSplits data = small_digits();
  // The plugin subspace and radius model together on the reference evaluator and on cpu_tbb,
  // and each alone with cpu_tbb. (cpu_tbb's session once moved its incumbent with FMAs and
  // resumed only to rounding; it now moves by the host's bits: plugins/cpu_tbb/CMakeLists.txt.)
  g_variant = GENERATE(Variant{true, true, false}, Variant{true, true, true},
                       Variant{false, true, true}, Variant{true, false, true});
  INFO("subspace " << g_variant.subspace << " plugin radius " << g_variant.plugin_radius
                   << " cpu_tbb " << g_variant.cpu_tbb);
  testing::TempDir dir;
  TrainOptions options;
  options.epochs = 2;
  options.batch_size = 100;
  options.seed = 7;

  Run straight;
  const TrainResult full =
      train(straight.model, *straight.loss, straight.optimizer, *straight.evaluator, data, options);

  options.checkpoint_path = dir / "run.ckpt";
  std::atomic<bool> stop{false};
  options.stop = &stop;
  int steps = 0;
  options.on_progress = [&](const TrainProgress&) { stop = ++steps == 4; };
  Run first;
  const TrainResult cut =
      train(first.model, *first.loss, first.optimizer, *first.evaluator, data, options);
  REQUIRE(cut.interrupted);
  REQUIRE(cut.steps == 4);

  options.stop = nullptr;
  options.on_progress = nullptr;
  options.resume = true;
  Run second;  // a fresh subspace and radius model, restored from the checkpoint
  const TrainResult resumed =
      train(second.model, *second.loss, second.optimizer, *second.evaluator, data, options);
  CHECK(resumed.steps == full.steps);
  CHECK(resumed.evaluations == full.evaluations);
  CHECK(resumed.best_validation_loss == full.best_validation_loss);
  for (std::size_t i = 0; i < second.model.parameters().size(); ++i)
    REQUIRE(second.model.parameters()[i] == straight.model.parameters()[i]);
  std::stringstream a, b;
  straight.optimizer.save_state(a);
  second.optimizer.save_state(b);
  CHECK(a.str() == b.str());  // the plateau's state included
  if (g_variant.plugin_radius) CHECK_THAT(a.str(), Catch::Contains("radius.plugin plateau"));
}

}  // namespace
}  // namespace polyprobe
