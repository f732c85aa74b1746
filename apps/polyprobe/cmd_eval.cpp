// `polyprobe eval`: loss and accuracy of saved weights on a data split.
//
// Reads the model file beside the weights (or --model), applies the standardisation saved in
// the weights' metadata (so the inputs are scaled exactly as in training), rebuilds the same
// split from --seed and the fractions, and reports loss and accuracy; the last line is
// "<split> accuracy: NN.N%".
#include "cli.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/safetensors.hpp>
#include <polyprobe/train.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <iomanip>
#include <iostream>

namespace polyprobe::app {
namespace {

// A loss that is not finite is a failure, not a result: the weights overflow on this data.
Error non_finite_loss(const EvaluationResult& r, const std::string& which,
                      const std::filesystem::path& weights) {
  return Error("the " + which + " loss is " + (std::isnan(r.loss) ? "NaN" : "infinite") +
               ": the weights '" + weights.string() +
               "' give non-finite outputs on this data (they are not usable here)");
}

int run(Context& ctx) {
  const po::variables_map& vm = ctx.vm;
  if (!vm.count("weights")) throw UsageError("--weights FILE is required (a .safetensors file)");
  if (vm["seed"].as<int64_t>() < 0)
    throw UsageError("--seed must be >= 0, got " + std::to_string(vm["seed"].as<int64_t>()));
  const std::filesystem::path weights_path = vm["weights"].as<std::string>();
  std::filesystem::path model_path = weights_path;
  model_path.replace_extension(".json");
  if (vm.count("model")) model_path = vm["model"].as<std::string>();
  // The weights first: a missing weights file is named as such, not by its derived .json.
  const TensorFile weights = read_safetensors(weights_path);
  ModelFile spec = read_model_file(model_path, ctx.layers);
  assign_model_tensors(spec.model, weights, weights_path.string());
  if (vm.count("loss")) spec.loss = vm["loss"].as<std::string>();
  const auto loss = make_loss(spec.loss, 0.0);

  std::string data_name = vm["data"].as<std::string>();
  if (data_name.empty())
    data_name = weights.metadata.contains("polyprobe.data") ? weights.metadata.at("polyprobe.data")
                                                            : "digits";
  std::optional<Standardizer> standardizer;
  if (weights.metadata.contains("polyprobe.standardize"))
    standardizer = Standardizer::from_text(weights.metadata.at("polyprobe.standardize"),
                                           weights_path.string());
  SplitOptions split;
  split.seed = static_cast<uint64_t>(vm["seed"].as<int64_t>());
  split.validation_fraction = vm["validation-fraction"].as<double>();
  split.test_fraction = vm["test-fraction"].as<double>();
  const std::string which = vm["split"].as<std::string>();
  if (which == "all") split.validation_fraction = split.test_fraction = 0.0;
  const PreparedData data = prepare_data(data_name, split, standardizer ? &*standardizer : nullptr);
  const Dataset* chosen = which == "test"                      ? &data.splits.test
                          : which == "validation"              ? &data.splits.validation
                          : which == "train" || which == "all" ? &data.splits.train
                                                               : nullptr;
  if (chosen == nullptr) throw UsageError("--split must be train, validation, test or all");
  const EvaluationResult r =
      evaluate_model(spec.model, *loss, *chosen, parse_dtype(vm["dtype"].as<std::string>()));
  if (ctx.json) {
    *ctx.out << nlohmann::json{{"split", which},
                               {"samples", r.samples},
                               {"loss", r.loss},
                               {"accuracy", r.accuracy},
                               {"loss_name", spec.loss}}
                    .dump()
             << "\n";
    if (!std::isfinite(r.loss)) throw non_finite_loss(r, which, weights_path);
    return 0;
  }
  *ctx.out << "model: " << model_path.string() << ", weights: " << weights_path.string()
           << "\ndata: " << data_name << " (" << which << " split, " << r.samples << " samples)\n"
           << which << " loss (" << spec.loss << "): " << std::fixed << std::setprecision(4)
           << r.loss << "\n"
           << which << " accuracy: " << std::setprecision(1) << 100.0 * r.accuracy << "%"
           << std::endl;
  if (!std::isfinite(r.loss)) throw non_finite_loss(r, which, weights_path);
  return 0;
}

}  // namespace

Command eval_command() {
  Command c;
  c.name = "eval";
  c.summary = "loss and accuracy of saved weights (safetensors) on a data split";
  c.description =
      "Loads FILE.safetensors and its model file FILE.json (or --model), standardises the data\n"
      "with the statistics saved at training time, and evaluates one split. Use the same\n"
      "--seed and fractions as the training run to get its test split.\n\n"
      "examples:\n"
      "  polyprobe train --save run.safetensors && polyprobe eval --weights run.safetensors\n"
      "  polyprobe eval --weights run.safetensors --model run.json --data digits --split all "
      "--json";
  c.uses_plugins = true;
  c.options = [](po::options_description& o, po::positional_options_description& p) {
    o.add_options()("weights", po::value<std::string>()->value_name("FILE"),
                    "weights (.safetensors)")("model", po::value<std::string>()->value_name("FILE"),
                                              "model file (default: the weights file with .json)")(
        "data", po::value<std::string>()->default_value(""),
        "data set or file (default: the one the weights were trained on)")(
        "split", po::value<std::string>()->default_value("test"),
        "train, validation, test, or all (the whole data set)")(
        "loss", po::value<std::string>(), "loss to report (default: the model file's)")(
        "seed", po::value<int64_t>()->default_value(0), "seed of the split (as in training)")(
        "validation-fraction", number_value(0.15), "as in training")(
        "test-fraction", number_value(0.15), "as in training")(
        "dtype", po::value<std::string>()->default_value("float32"), "float32 or float64")(
        "json", po::bool_switch(), "machine-readable output");
    p.add("weights", 1);
  };
  c.run = run;
  return c;
}

}  // namespace polyprobe::app
