// `polyprobe train`: train a model file (or the default MLP) on a data set without gradients.
//
// With no arguments it trains an MLP on the embedded digits data and ends with the line
// "test accuracy: NN.N%". Progress goes to stderr: a bar on a terminal, one line per epoch
// otherwise, nothing with --quiet. Ctrl-C stops between two steps and leaves a complete
// checkpoint to --resume from.
#include "cli.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/safetensors.hpp>
#include <polyprobe/train.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace polyprobe::app {
namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void request_stop(int) {
  g_stop_requested.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// The default model: flatten, one hidden ReLU layer, one output per class.
ModelFile default_model(const Dataset& data, const LayerFactory& factory, int64_t hidden) {
  const nlohmann::json doc = {{"polyprobe_model", 1},
                              {"input_shape", data.sample_shape.dims},
                              {"layers",
                               {{{"kind", "flatten"}},
                                {{"kind", "linear"}, {"out_features", hidden}},
                                {{"kind", "relu"}},
                                {{"kind", "linear"}, {"out_features", data.num_classes}}}}};
  return parse_model_file(doc.dump(), "the default MLP", factory);
}

// The model file written beside a weights file: weights.safetensors -> weights.json.
std::filesystem::path model_path_for(const std::filesystem::path& weights) {
  std::filesystem::path p = weights;
  return p.replace_extension(".json");
}

OptimizerConfig optimizer_config(const po::variables_map& vm, int64_t total_steps, uint64_t seed) {
  OptimizerConfig config;
  config.particle_dim = vm["particle-dim"].as<int>();
  config.step_radius = vm["step-radius"].as<double>();
  config.probe_radius = vm["probe-radius"].as<double>();
  config.epsilon = vm["epsilon"].as<double>();
  config.epsilon_final = vm["epsilon-final"].as<double>();
  config.schedule = parse_schedule(vm["schedule"].as<std::string>());
  config.radius.kind = parse_radius_model(vm["radius-model"].as<std::string>());
  if (config.radius.kind == RadiusModelKind::trust_region)
    throw UsageError(
        "--radius-model trust_region needs one fixed objective, and minibatches change it every "
        "step; use fixed, adaptive or quadratic here, or the library's manual step API");
  config.polytope = parse_polytope(vm["polytope"].as<std::string>());
  config.total_steps = total_steps;
  config.seed = seed;
  config.validate();
  return config;
}

// Progress on stderr: a redrawn bar on a terminal, a line per epoch otherwise.
class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& err, bool quiet)
      : err_(err), quiet_(quiet), tty_(isatty(STDERR_FILENO)) {}
  void update(const TrainProgress& p) {
    if (quiet_) return;
    const int64_t total = std::max<int64_t>(p.epochs * p.steps_per_epoch, 1);
    std::ostringstream line;
    line << "epoch " << p.epoch + 1 << "/" << p.epochs << "  step " << p.step << "  loss "
         << std::fixed << std::setprecision(4) << p.loss << "  batch acc " << std::setprecision(1)
         << 100 * p.accuracy << "%";
    if (p.validation_accuracy) line << "  val acc " << 100 * *p.validation_accuracy << "%";
    line << "  " << std::setprecision(1) << p.seconds << "s";
    if (tty_) {
      const int width = 24;
      const auto filled = static_cast<int>(width * std::min<int64_t>(p.step, total) / total);
      err_ << "\r[" << std::string(static_cast<std::size_t>(filled), '#')
           << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << line.str()
           << "\033[K" << std::flush;
      if (p.validation_accuracy && p.step >= total) err_ << "\n";
    } else if (p.validation_accuracy) {
      err_ << line.str() << "\n" << std::flush;
    }
  }
  void finish() {
    if (!quiet_ && tty_) err_ << "\n" << std::flush;
  }

 private:
  std::ostream& err_;
  bool quiet_, tty_;
};

std::string percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return s.str();
}

int run(Context& ctx) {
  const po::variables_map& vm = ctx.vm;
  const auto seed = static_cast<uint64_t>(vm["seed"].as<int64_t>());
  SplitOptions split;
  split.seed = seed;
  split.validation_fraction = vm["validation-fraction"].as<double>();
  split.test_fraction = vm["test-fraction"].as<double>();
  const PreparedData data = prepare_data(vm["data"].as<std::string>(), split);
  const DataSplits& splits = data.splits;

  ModelFile spec = vm.count("model")
                       ? read_model_file(vm["model"].as<std::string>(), ctx.layers)
                       : default_model(splits.train, ctx.layers, vm["hidden"].as<int64_t>());
  if (vm.count("loss")) spec.loss = vm["loss"].as<std::string>();
  if (vm.count("l2")) spec.l2 = vm["l2"].as<double>();
  Model& model = spec.model;
  model.initialize(seed);
  const auto loss = make_loss(spec.loss, spec.l2);

  TrainOptions options;
  options.epochs = vm["epochs"].as<int64_t>();
  options.batch_size = vm["batch"].as<int64_t>();
  options.seed = seed;
  options.patience = vm["patience"].as<int64_t>();
  options.validate_every = vm["validate-every"].as<int64_t>();
  if (options.validate_every < 0) throw UsageError("--validate-every must be >= 0");
  options.time_limit_s = vm["time-limit"].as<double>();
  if (options.batch_size <= 0) throw UsageError("--batch must be positive");
  if (options.epochs <= 0) throw UsageError("--epochs must be positive");
  if (vm.count("metrics")) options.metrics_path = vm["metrics"].as<std::string>();
  std::filesystem::path save;
  if (vm.count("save")) save = vm["save"].as<std::string>();
  if (vm.count("checkpoint"))
    options.checkpoint_path = vm["checkpoint"].as<std::string>();
  else if (!save.empty())
    options.checkpoint_path = save.string() + ".ckpt";
  options.resume = vm["resume"].as<bool>();
  if (options.resume && options.checkpoint_path.empty())
    throw UsageError("--resume needs --save FILE (its FILE.ckpt) or --checkpoint FILE");
  const EvaluatorRequest request = evaluator_request(ctx);
  options.dtype = request.options.dtype;

  const int64_t steps_per_epoch =
      (splits.train.size() + options.batch_size - 1) / options.batch_size;
  PolytopeOptimizer optimizer(model, optimizer_config(vm, options.epochs * steps_per_epoch, seed));
  Selection selection;
  auto evaluator = ctx.registry.make_evaluator(model, *loss, request, &selection);
  if (vm["explain"].as<bool>()) *ctx.err << selection.to_json().dump(2) << "\n";

  std::ostream& out = *ctx.out;
  out << "data: " << splits.train.name.substr(0, splits.train.name.find('/')) << " ("
      << splits.train.size() << " train, " << splits.validation.size() << " validation, "
      << splits.test.size() << " test, " << splits.train.num_classes << " classes)\n"
      << "model: " << model.num_layers() << " layers, " << model.num_parameters()
      << " parameters; loss " << spec.loss << "; evaluator " << evaluator->name() << "\n"
      << std::flush;

  ProgressDisplay display(*ctx.err, vm["quiet"].as<bool>());
  options.on_progress = [&](const TrainProgress& p) { display.update(p); };
  g_stop_requested.store(false);
  options.stop = &g_stop_requested;
  const auto previous = std::signal(SIGINT, request_stop);
  TrainResult result;
  try {
    result = train(model, *loss, optimizer, *evaluator, splits, options);
  } catch (...) {
    std::signal(SIGINT, previous);
    display.finish();
    throw;
  }
  std::signal(SIGINT, previous);
  display.finish();

  out << "trained " << result.steps << " steps (" << result.epochs_completed << " epochs, "
      << result.evaluations << " candidates) in " << std::fixed << std::setprecision(1)
      << result.seconds << " s";
  if (result.stopped_early)
    out << "; stopped early (no validation gain for --patience validations)";
  if (result.reached_time_limit) out << "; reached --time-limit";
  out << "\n";
  if (result.interrupted) {
    out << "interrupted";
    if (!options.checkpoint_path.empty())
      out << "; checkpoint " << options.checkpoint_path.string() << " (continue with --resume)";
    out << "\n";
    return 130;
  }
  if (result.best_epoch >= 0)
    out << "best validation accuracy: " << percent(result.best_validation_accuracy) << " (step "
        << result.best_step << ", epoch " << result.best_epoch + 1 << ", restored)\n";
  if (!save.empty()) {
    TensorFile weights = model_tensors(model);
    weights.metadata["polyprobe.standardize"] = data.standardizer.to_text();
    weights.metadata["polyprobe.data"] = vm["data"].as<std::string>();
    write_safetensors(save, weights);
    write_model_file(model_path_for(save), model, spec.loss, spec.l2);
    out << "saved " << save.string() << " and " << model_path_for(save).string() << "\n";
  }
  const EvaluationResult test = evaluate_model(model, *loss, splits.test, options.dtype);
  out << "test loss: " << std::setprecision(4) << test.loss << "\n";
  out << "test accuracy: " << percent(test.accuracy) << std::endl;
  return 0;
}

}  // namespace

Command train_command() {
  Command c;
  c.name = "train";
  c.summary = "train a model without gradients (no arguments: an MLP on the embedded digits)";
  c.description =
      "Trains a model file (--model; default: an MLP with one hidden ReLU layer) on a data set\n"
      "(--data: digits, fashion-mnist, a .csv/.csv.gz file or an IDX images file), with the\n"
      "polytope optimizer and the chosen evaluator backend. Features are standardised with\n"
      "statistics of the training split; validation runs after every epoch (or every\n"
      "--validate-every steps) and when --time-limit ends the run, and the best validation\n"
      "state is restored at the end. The last line is the test accuracy.\n\n"
      "examples:\n"
      "  polyprobe train\n"
      "  polyprobe train --model examples/models/step_mlp.json --epochs 20 --save "
      "step.safetensors\n"
      "  polyprobe train --data fashion-mnist --model examples/models/binary_mlp.json --metrics "
      "m.jsonl\n"
      "  polyprobe train --save run.safetensors --resume   # continue after Ctrl-C\n"
      "  polyprobe eval --weights run.safetensors";
  c.options = [](po::options_description& o, po::positional_options_description&) {
    o.add_options()(
        "data", po::value<std::string>()->default_value("digits"),
        "data set: digits (embedded), fashion-mnist, a .csv/.csv.gz file, or an IDX images file")(
        "model", po::value<std::string>()->value_name("FILE"),
        "JSON model file (docs/models.md); default: flatten, linear(--hidden), relu, linear")(
        "hidden", po::value<int64_t>()->default_value(32), "hidden units of the default MLP")(
        "loss", po::value<std::string>(),
        "cross_entropy, mse, hinge or zero_one (default: the model file's, else cross_entropy)")(
        "l2", po::value<double>(), "weight of l2 * |theta|^2 in the objective")(
        "epochs", po::value<int64_t>()->default_value(20), "passes over the training split")(
        "batch", po::value<int64_t>()->default_value(128), "minibatch size")(
        "seed", po::value<int64_t>()->default_value(0), "seed of initialisation, splits, batches")(
        "patience", po::value<int64_t>()->default_value(0),
        "stop after this many validations without gain (0: never)")(
        "validate-every", po::value<int64_t>()->default_value(0),
        "measure the validation split every this many steps (0: after every epoch); the best "
        "validated state is restored at the end")("time-limit",
                                                  po::value<double>()->default_value(0),
                                                  "stop after this many seconds (0: none)")(
        "validation-fraction", po::value<double>()->default_value(0.15),
        "share of the training data held out for validation")(
        "test-fraction", po::value<double>()->default_value(0.15),
        "share held out for testing (data sets without their own test split)")(
        "metrics", po::value<std::string>()->value_name("FILE"),
        "write JSON lines (step, epoch, loss, accuracy, candidates, seconds) to FILE")(
        "save", po::value<std::string>()->value_name("FILE"),
        "write the trained weights to FILE (safetensors) and the model file beside it "
        "(FILE with .json); checkpoints go to FILE.ckpt")(
        "checkpoint", po::value<std::string>()->value_name("FILE"),
        "checkpoint file (default: the --save file + .ckpt), written after every epoch")(
        "resume", po::bool_switch(), "continue from the checkpoint")(
        "step-radius", po::value<double>()->default_value(2.0), "optimizer step radius")(
        "probe-radius", po::value<double>()->default_value(2.0), "optimizer probe radius")(
        "epsilon", po::value<double>()->default_value(0.3), "radius scale (and OT temperature)")(
        "epsilon-final", po::value<double>()->default_value(0.02),
        "final epsilon (linear, cosine)")(
        "schedule", po::value<std::string>()->default_value("cosine"),
        "epsilon schedule: constant, linear, cosine, progressive, power")(
        "radius-model", po::value<std::string>()->default_value("quadratic"),
        "fixed, adaptive or quadratic (trust_region needs the manual step API)")(
        "polytope", po::value<std::string>()->default_value("simplex"),
        "simplex, orthoplex or cube")("particle-dim", po::value<int>()->default_value(2),
                                      "coordinates per particle");
    add_backend_options(o);
  };
  c.run = run;
  return c;
}

}  // namespace polyprobe::app
