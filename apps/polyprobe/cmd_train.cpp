// `polyprobe train`: train a model file (or the default MLP) on a data set without gradients.
//
// With no arguments it trains an MLP on the embedded digits data and ends with the line
// "test accuracy: NN.N%". Progress goes to stderr: a bar on a terminal, one line per epoch
// otherwise, nothing with --quiet. Ctrl-C stops between two steps, leaves a complete
// checkpoint to --resume from and, with --save, the best weights so far. Every output path is
// checked before any work, and none may be one of the run's inputs.
#include "cli.hpp"
#include "train_ranks.hpp"

#include <polyprobe/atomic_file.hpp>
#include <polyprobe/data.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/optimizer_options.hpp>
#include <polyprobe/safetensors.hpp>
#include <polyprobe/subspace.hpp>
#include <polyprobe/train.hpp>

#include <nlohmann/json.hpp>

#include <sys/ioctl.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

namespace polyprobe::app {
namespace {

std::atomic<bool> g_stop_requested{false};

extern "C" void request_stop(int) {
  g_stop_requested.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

// The built-in model (no --model) and the schedule defaults that go with it. `cnn` is the
// default on digits: it generalises where the MLP overfits (98.5 % test against 95.9 % on the
// no-argument split, in about 2 s on 2 cores: docs/training.md "Quality bars"); `mlp`
// elsewhere, whose larger images would make the conv's candidates costly.
struct BuiltinModel {
  std::string arch;   // "cnn", "mlp", or empty: a --model file
  int64_t width = 0;  // cnn: channels; mlp: hidden units
  int64_t batch = 128, epochs = 20;
};

BuiltinModel builtin_model(const po::variables_map& vm) {
  const bool hidden = vm.count("hidden") != 0, channels = vm.count("channels") != 0;
  if (vm.count("model")) {
    for (const char* name : {"arch", "hidden", "channels"})
      if (vm.count(name))
        throw UsageError(std::string("--") + name +
                         " describes the built-in model; it has no effect with --model");
    return {};
  }
  BuiltinModel m;
  if (vm.count("arch"))
    m.arch = vm["arch"].as<std::string>();
  else
    m.arch = hidden                                     ? "mlp"
             : channels                                 ? "cnn"
             : vm["data"].as<std::string>() == "digits" ? "cnn"
                                                        : "mlp";
  if (m.arch != "cnn" && m.arch != "mlp")
    throw UsageError("--arch must be cnn or mlp, got '" + m.arch + "'");
  if (m.arch == "cnn" && hidden)
    throw UsageError("--hidden sizes --arch mlp; the cnn is sized by --channels");
  if (m.arch == "mlp" && channels)
    throw UsageError("--channels sizes --arch cnn; the mlp is sized by --hidden");
  m.width = m.arch == "cnn" ? (channels ? vm["channels"].as<int64_t>() : 16)
                            : (hidden ? vm["hidden"].as<int64_t>() : 32);
  if (m.width <= 0)
    throw UsageError(std::string(m.arch == "cnn" ? "--channels" : "--hidden") +
                     " must be positive");
  if (m.arch == "cnn") m.batch = 32, m.epochs = 16;
  return m;
}

// cnn: conv2d 3x3 (padding 1) with `width` channels, ReLU, 2x2 max-pool, linear; mlp:
// flatten, linear(width), ReLU, linear. One output per class.
ModelFile make_builtin_model(const BuiltinModel& m, const Dataset& data,
                             const LayerFactory& factory) {
  nlohmann::json layers;
  std::vector<int64_t> shape = data.sample_shape.dims;
  if (m.arch == "cnn") {
    if (shape.size() == 2) shape.insert(shape.begin(), 1);
    if (shape.size() != 3 || shape[1] < 2 || shape[2] < 2)
      throw UsageError(
          "--arch cnn needs image samples ([channels, height, width], at least 2 x "
          "2); this data's samples have shape " +
          data.sample_shape.str() + ": use --arch mlp or a --model file");
    layers = {{{"kind", "conv2d"}, {"out_channels", m.width}, {"kernel_size", 3}, {"padding", 1}},
              {{"kind", "relu"}},
              {{"kind", "max_pool2d"}, {"kernel_size", 2}},
              {{"kind", "flatten"}}};
  } else {
    layers = {
        {{"kind", "flatten"}}, {{"kind", "linear"}, {"out_features", m.width}}, {{"kind", "relu"}}};
  }
  layers.push_back({{"kind", "linear"}, {"out_features", data.num_classes}});
  const nlohmann::json doc = {{"polyprobe_model", 1}, {"input_shape", shape}, {"layers", layers}};
  return parse_model_file(doc.dump(), "the built-in " + m.arch, factory);
}

// The model file written beside a weights file: weights.safetensors -> weights.json.
std::filesystem::path model_path_for(const std::filesystem::path& weights) {
  std::filesystem::path p = weights;
  return p.replace_extension(".json");
}

// True when `a` and `b` name the same file: the same inode when both exist, else the same
// normalised absolute path.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec))
    return std::filesystem::equivalent(a, b, ec);
  return std::filesystem::weakly_canonical(a, ec) == std::filesystem::weakly_canonical(b, ec);
}

// Throws unless `path` (the output `what`) can be created or replaced: a regular file or none
// (never a device, a folder, a read-only file or a library in use), in a writable folder.
void check_writable(const std::filesystem::path& path, const std::string& what) {
  std::error_code ec;
  const std::filesystem::path folder = std::filesystem::absolute(path, ec).parent_path();
  const std::string name = what + " '" + path.string() + "'";
  io::check_output_file(path, what);
  if (!std::filesystem::is_directory(folder, ec))
    throw Error("cannot write " + name + ": the folder '" + folder.string() +
                "' does not exist (create it or choose another path)");
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw Error("cannot write " + name + ": the folder '" + folder.string() + "' is not writable");
}

// The run's files, checked before any work: no output may replace an input (the model file,
// the data file, the config file), every output must be writable (check_writable), and none
// may be written by another process at the same time: the locks returned hold them for the run.
std::vector<std::unique_ptr<io::OutputLock>> check_files(const po::variables_map& vm,
                                                         const std::filesystem::path& save,
                                                         const TrainOptions& options) {
  std::vector<std::pair<std::filesystem::path, std::string>> outputs;
  if (!save.empty()) {
    outputs.emplace_back(save, "--save file");
    outputs.emplace_back(model_path_for(save), "model file (the --save file with .json)");
  }
  if (!options.checkpoint_path.empty())
    outputs.emplace_back(options.checkpoint_path, vm.count("checkpoint")
                                                      ? "--checkpoint file"
                                                      : "checkpoint (the --save file + .ckpt)");
  if (!options.metrics_path.empty()) outputs.emplace_back(options.metrics_path, "--metrics file");
  std::vector<std::pair<std::filesystem::path, std::string>> inputs;
  if (vm.count("model")) inputs.emplace_back(vm["model"].as<std::string>(), "--model");
  if (vm.count("config")) inputs.emplace_back(vm["config"].as<std::string>(), "--config");
  const std::string data = vm["data"].as<std::string>();
  if (std::filesystem::exists(data)) inputs.emplace_back(data, "--data");
  for (const auto& [out, out_what] : outputs) {
    for (const auto& [in, in_what] : inputs)
      if (same_file(out, in))
        throw UsageError("the " + out_what + " '" + out.string() + "' is the " + in_what +
                         " input; it would be overwritten: choose another " +
                         (out_what.starts_with("model file")
                              ? std::string("--save name")
                              : out_what.substr(0, out_what.find(' '))));
    for (const auto& [other, other_what] : outputs)
      if (&other != &out && same_file(out, other) && &other < &out)
        throw UsageError("the " + out_what + " and the " + other_what + " are both '" +
                         out.string() + "'; choose different paths");
    check_writable(out, out_what);
  }
  // Rank 0 alone writes the files (and so locks them) when ranks share the run.
  std::vector<std::unique_ptr<io::OutputLock>> locks;
  if (!leader_process()) return locks;
  for (const auto& [out, out_what] : outputs)
    locks.push_back(std::make_unique<io::OutputLock>(out, out_what));
  return locks;
}

// The optimizer's options as `train` shows them: one --help section per group of the core's
// option table, every value a string that the table parses (so the command line and --config
// files read the same text, and the defaults print as the table prints them).
void add_optimizer_options(po::options_description& options) {
  const OptimizerSettings defaults = training_defaults();
  std::vector<std::pair<std::string, std::unique_ptr<po::options_description>>> groups;
  for (const OptimizerOption& option : optimizer_options()) {
    if (option.scope == OptionScope::minimize) continue;
    const std::string caption = "optimizer: " + option.group;
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const auto& g) { return g.first == caption; });
    if (group == groups.end())
      group =
          groups.emplace(groups.end(), caption, std::make_unique<po::options_description>(caption));
    std::string help = option.help;
    if (!option.requirement.empty()) help += "; needs " + option.requirement;
    auto* value = po::value<std::string>()->default_value(option.get(defaults));
    switch (option.type) {
      case OptionType::integer:
        value->value_name("N");
        break;
      case OptionType::number:
        value->value_name("X");
        break;
      case OptionType::flag:
        value->implicit_value("on")->value_name("on|off");
        break;
      case OptionType::choice:
        value->value_name("NAME");
        break;
    }
    group->second->add_options()(option.name.c_str(), value, help.c_str());
  }
  for (const auto& group : groups) options.add(*group.second);
}

// The optimizer from the training defaults and the options the user gave (command line or
// --config); the schedule runs over the whole run. Every rule of the table is checked here,
// before any work.
OptimizerSettings optimizer_settings(const po::variables_map& vm, const PluginRegistry& registry,
                                     int64_t total_steps, uint64_t seed) {
  OptimizerSettings settings = training_defaults();
  // The loaded plugins' subspace kinds and radius models are names the table accepts too.
  for (const NamedComponent& kind : registry.subspace_kinds())
    if (kind.provider != "core") settings.plugin_subspace_kinds.push_back(kind.name);
  for (const NamedComponent& model : registry.radius_models())
    if (model.provider != "core") settings.plugin_radius_models.push_back(model.name);
  // A kind polyprobe ships as a plugin that is not on the plugin path: say which plugin.
  if (vm.count("subspace")) {
    const std::string kind = vm["subspace"].as<std::string>();
    const std::string shipped = shipped_plugin_of("subspace", kind);
    const auto& offered = settings.plugin_subspace_kinds;
    if (!shipped.empty() && std::find(offered.begin(), offered.end(), kind) == offered.end())
      throw UsageError("--subspace: unknown subspace kind '" + kind +
                       "' (kinds: " + subspace_kind_names() + "). polyprobe ships --subspace " +
                       kind + " as the plugin '" + shipped + "' (libpolyprobe_" + shipped +
                       ".so), which is not on the plugin path: put its folder there "
                       "(--plugin-dir DIR or POLYPROBE_PLUGIN_PATH) or reinstall it into the "
                       "install's plugin folder");
  }
  try {
    for (const OptimizerOption& option : optimizer_options())
      if (option.scope != OptionScope::minimize && vm.count(option.name) &&
          !vm[option.name].defaulted())
        set_option(settings, option.name, vm[option.name].as<std::string>());
    settings.optimizer.total_steps = total_steps;
    settings.optimizer.seed = seed;
    if (!settings.given.contains("subspace-seed")) settings.subspace.seed = seed + 3;
    // A plugin's radius model is created now, told the configuration as it stands, so a
    // configuration it refuses is an error before any work.
    const std::string radius_options = vm["radius-options"].as<std::string>();
    if (settings.optimizer.radius.kind == RadiusModelKind::plugin)
      registry.choose_radius_model(settings.optimizer.radius.plugin_name, settings.optimizer,
                                   settings.subspace.kind != "full", radius_options);
    else if (!vm["radius-options"].defaulted())
      throw UsageError(
          "--radius-options has no effect here: it applies to a plugin's radius "
          "model (drop it or choose one with --radius-model)");
    validate_settings(settings, OptionScope::training);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  return settings;
}

// The terminal's width in columns: stderr's window size, else $COLUMNS, else 80.
int terminal_width() {
  winsize size{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    const int n = std::atoi(columns);
    if (n > 0) return n;
  }
  return 80;
}

// Progress on stderr: a redrawn bar on a terminal (cut to its width, so it never wraps), a
// line per validation otherwise. Loss and accuracy are the epoch's running means, weighted by
// batch size, not the last batch's.
class ProgressDisplay {
 public:
  ProgressDisplay(std::ostream& err, bool quiet)
      : err_(err), quiet_(quiet), tty_(isatty(STDERR_FILENO)) {}
  void update(const TrainProgress& p) {
    if (quiet_) return;
    if (p.epoch != epoch_) epoch_ = p.epoch, samples_ = 0, loss_sum_ = 0, correct_sum_ = 0;
    const auto n = static_cast<double>(std::max<int64_t>(p.batch_samples, 1));
    samples_ += n;
    loss_sum_ += n * p.loss;
    correct_sum_ += n * p.accuracy;
    const int64_t total = std::max<int64_t>(p.epochs * p.steps_per_epoch, 1);
    std::ostringstream line;
    line << "epoch " << p.epoch + 1 << "/" << p.epochs << "  step " << p.step << "/" << total
         << "  loss " << std::fixed << std::setprecision(4) << loss_sum_ / samples_ << "  acc "
         << std::setprecision(1) << 100 * correct_sum_ / samples_ << "%";
    if (p.validation_accuracy) line << "  val acc " << 100 * *p.validation_accuracy << "%";
    line << "  " << std::setprecision(1) << p.seconds << "s";
    if (p.step < total && p.step > 0)
      line << "  eta " << std::setprecision(0)
           << p.seconds / static_cast<double>(p.step) * static_cast<double>(total - p.step) << "s";
    if (tty_) {
      const int width = terminal_width();
      std::string text = line.str();
      // The bar takes what the numbers leave, up to 20 columns; none below 5.
      const int room = width - 1 - static_cast<int>(text.size()) - 3;
      const int bar = room >= 5 ? std::min(room, 20) : 0;
      if (bar > 0) {
        const auto filled = static_cast<int>(bar * std::min<int64_t>(p.step, total) / total);
        text = "[" + std::string(static_cast<std::size_t>(filled), '#') +
               std::string(static_cast<std::size_t>(bar - filled), '.') + "] " + text;
      }
      // One column short of the width: a line that fills it would wrap on some terminals.
      text.resize(std::min(text.size(), static_cast<std::size_t>(std::max(width - 1, 1))));
      err_ << "\r" << text << "\033[K" << std::flush;
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
  int64_t epoch_ = -1;
  double samples_ = 0, loss_sum_ = 0, correct_sum_ = 0;
};

// "1 step", "2 steps".
std::string count(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// How far the run got, in the progress bar's words: "20 epochs" when it ran them all, "3 of
// 20 epochs" when it stopped at the end of one, and "epoch 3/20: 2 complete and 5 steps" when
// it stopped inside one (the epoch the progress bar showed last).
std::string epochs_done(const TrainResult& result, int64_t steps_per_epoch, int64_t epochs) {
  const int64_t into = result.steps - result.epochs_completed * steps_per_epoch;
  if (into <= 0 || result.epochs_completed >= epochs)
    return result.epochs_completed >= epochs
               ? count(result.epochs_completed, "epoch")
               : std::to_string(result.epochs_completed) + " of " + count(epochs, "epoch");
  return "epoch " + std::to_string(result.epochs_completed + 1) + "/" + std::to_string(epochs) +
         ": " + std::to_string(result.epochs_completed) + " complete and " + count(into, "step");
}

std::string percent(double fraction) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * fraction << "%";
  return s.str();
}

void check_fractions(const SplitOptions& split) {
  for (const auto& [value, name] : {std::pair{split.validation_fraction, "--validation-fraction"},
                                    std::pair{split.test_fraction, "--test-fraction"}})
    if (!(value >= 0 && value < 1))
      throw UsageError(std::string(name) + " must be in [0, 1), not " + format_number(value));
  if (split.validation_fraction + split.test_fraction >= 1)
    throw UsageError("--validation-fraction and --test-fraction must sum to less than 1");
}

// Before any training: every split a fraction asks for holds samples, the training split
// holds every class, and the batch fits; says what to change.
void check_splits(const DataSplits& splits, const SplitOptions& split, int64_t batch,
                  std::ostream& err) {
  const std::string name = splits.train.name.substr(0, splits.train.name.find('/'));
  const int64_t total = splits.train.size() + splits.validation.size() + splits.test.size();
  const auto empty = [&](const char* which, const char* option, double fraction) {
    throw UsageError("data '" + name + "' has " + std::to_string(total) + " sample" +
                     (total == 1 ? "" : "s") + ": " + option + " " + format_number(fraction) +
                     " leaves the " + which + " split empty; add samples, raise " + option +
                     ", or set it to 0 to go without a " + which + " split");
  };
  if (split.validation_fraction > 0 && splits.validation.size() == 0)
    empty("validation", "--validation-fraction", split.validation_fraction);
  if (split.test_fraction > 0 && splits.test.size() == 0)
    empty("test", "--test-fraction", split.test_fraction);
  std::vector<int64_t> seen(
      static_cast<std::size_t>(std::max<int64_t>(splits.train.num_classes, 0)));
  for (const int64_t label : splits.train.labels)
    if (label >= 0 && label < static_cast<int64_t>(seen.size()))
      ++seen[static_cast<std::size_t>(label)];
  const auto missing = std::count(seen.begin(), seen.end(), 0);
  if (missing > 0)
    err << "polyprobe train: warning: " << missing << " of the " << seen.size()
        << " classes never appear in the training split (" << splits.train.size()
        << " samples); the model cannot learn them\n";
  if (batch > splits.train.size())
    err << "polyprobe train: warning: --batch " << batch << " is larger than the training split ("
        << splits.train.size() << " samples); every step uses the whole split\n";
}

// The bytes of memory this machine has (0 when unknown).
double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// Refuses a built-in model that could not be held, before allocating it: its parameters (the
// run keeps several copies: current, best, before a step, the candidates' working sets,
// counted as 8) and the activations of a batch (the conv's output and its ReLU, twice).
void check_builtin_size(const BuiltinModel& m, const Dataset& data, int64_t batch) {
  const std::vector<int64_t>& dims = data.sample_shape.dims;
  double features = 1;
  for (const int64_t d : dims) features *= static_cast<double>(d);
  const auto width = static_cast<double>(m.width), classes = static_cast<double>(data.num_classes);
  double parameters = width * (features + 1) + classes * (width + 1);  // the mlp
  double activations = static_cast<double>(batch) * width * 2;
  if (m.arch == "cnn" && dims.size() >= 2) {
    const double channels = dims.size() == 3 ? static_cast<double>(dims[0]) : 1.0;
    const double pixels = features / channels;
    // The 2x2 max-pool keeps floor(height / 2) x floor(width / 2) cells.
    const int64_t pooled_cells = (dims[dims.size() - 2] / 2) * (dims[dims.size() - 1] / 2);
    const auto pooled = static_cast<double>(pooled_cells);
    parameters = width * (channels * 9 + 1) + classes * (width * pooled + 1);
    activations = static_cast<double>(batch) * width * pixels * 4;
  }
  const double needed = (parameters * 8 + activations) * sizeof(double);
  const double memory = physical_memory_bytes();
  if (memory > 0 && needed > memory) {
    std::ostringstream why;
    why << std::setprecision(3) << (m.arch == "cnn" ? "--channels " : "--hidden ") << m.width
        << " gives the built-in " << m.arch << " " << parameters
        << " parameters; training it (--batch " << batch << ") needs about " << needed / 1e9
        << " GB, and this machine has " << memory / 1e9 << " GB: choose a smaller "
        << (m.arch == "cnn" ? "--channels" : "--hidden");
    throw UsageError(why.str());
  }
}

// Writes the weights and the model file beside them; returns the line saying so.
std::string save_weights(const std::filesystem::path& save, const Model& model,
                         const ModelFile& spec, const PreparedData& data, const std::string& name) {
  TensorFile weights = model_tensors(model);
  weights.metadata["polyprobe.standardize"] = data.standardizer.to_text();
  weights.metadata["polyprobe.data"] = name;
  write_safetensors(save, weights);
  write_model_file(model_path_for(save), model, spec.loss, spec.l2);
  return save.string() + " and " + model_path_for(save).string();
}

// What every rank states at start-up (TrainRanks::agree_to_start): the model, the data, every
// option that shapes the run (not the ones that are each rank's own: plugin folders, threads,
// output files, --explain, --quiet) and the backend.
std::vector<std::pair<std::string, std::string>> startup_facts(
    const po::variables_map& vm, const Model& model, const ModelFile& spec,
    const DataSplits& splits, const Evaluator& evaluator, const TrainOptions& options) {
  std::vector<std::pair<std::string, std::string>> facts;
  facts.emplace_back("polyprobe version", POLYPROBE_VERSION);
  for (const auto& [name, value] : vm) {
    if (name == "plugin-dir" || name == "threads" || name == "quiet" || name == "explain" ||
        name == "config" || name == "rank-timeout" || name == "metrics" || name == "save" ||
        name == "checkpoint")
      continue;
    std::string text = "(a value of another type)";
    const boost::any& any = value.value();
    if (const auto* str = boost::any_cast<std::string>(&any)) text = *str;
    if (const auto* i64 = boost::any_cast<int64_t>(&any)) text = std::to_string(*i64);
    if (const auto* i32 = boost::any_cast<int>(&any)) text = std::to_string(*i32);
    if (const auto* num = boost::any_cast<double>(&any)) text = format_number(*num);
    if (const auto* flag = boost::any_cast<bool>(&any)) text = *flag ? "true" : "false";
    facts.emplace_back("option --" + name, text);
  }
  std::string layers;
  for (std::size_t i = 0; i < model.num_layers(); ++i)
    layers += model.layer(i).kind() + " -> " + model.layer(i).output_shape().str() + "; ";
  facts.emplace_back("model (layers)", TrainRanks::digest(layers.data(), layers.size()));
  const auto params = model.parameters();
  facts.emplace_back("model (initial parameters)",
                     TrainRanks::digest(params.data(), params.size_bytes()));
  facts.emplace_back("loss", spec.loss + ", l2 " + format_number(spec.l2));
  for (const Dataset* split : {&splits.train, &splits.validation, &splits.test}) {
    const std::string which = "data (" + split->name + ")";
    facts.emplace_back(which + " samples", std::to_string(split->size()));
    facts.emplace_back(which + " features",
                       TrainRanks::digest(split->features.data(),
                                          static_cast<std::size_t>(split->features.size()) *
                                              sizeof(*split->features.data())));
    facts.emplace_back(
        which + " labels",
        TrainRanks::digest(split->labels.data(), split->labels.size() * sizeof(split->labels[0])));
  }
  facts.emplace_back("backend", evaluator.name());
  if (options.resume) {
    std::ifstream file(options.checkpoint_path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    facts.emplace_back("checkpoint read by --resume",
                       TrainRanks::digest(bytes.data(), bytes.size()));
  }
  return facts;
}

int train_run(Context& ctx, TrainRanks& ranks) {
  const po::variables_map& vm = ctx.vm;
  if (vm["seed"].as<int64_t>() < 0)
    throw UsageError("--seed must be >= 0, got " + std::to_string(vm["seed"].as<int64_t>()));
  const auto seed = static_cast<uint64_t>(vm["seed"].as<int64_t>());

  const BuiltinModel builtin = builtin_model(vm);
  TrainOptions options;
  options.epochs = vm.count("epochs") ? vm["epochs"].as<int64_t>() : builtin.epochs;
  options.batch_size = vm.count("batch") ? vm["batch"].as<int64_t>() : builtin.batch;
  options.seed = seed;
  options.patience = vm["patience"].as<int64_t>();
  options.validate_every = vm["validate-every"].as<int64_t>();
  if (options.validate_every < 0) throw UsageError("--validate-every must be >= 0");
  options.time_limit_s = vm["time-limit"].as<double>();
  if (options.batch_size <= 0) throw UsageError("--batch must be positive");
  if (options.epochs <= 0) throw UsageError("--epochs must be positive");
  if (options.patience < 0) throw UsageError("--patience must be >= 0 (0: never stop early)");
  if (!(options.time_limit_s >= 0) || !std::isfinite(options.time_limit_s))
    throw UsageError("--time-limit must be a number of seconds >= 0 (0: none)");
  const std::string clock = vm["schedule-clock"].as<std::string>();
  if (clock != "steps" && clock != "time")
    throw UsageError("--schedule-clock: unknown clock '" + clock + "' (steps or time)");
  options.schedule_over_time = clock == "time";
  if (options.schedule_over_time && options.time_limit_s <= 0)
    throw UsageError(
        "--schedule-clock time runs the schedule over --time-limit's seconds: add --time-limit "
        "SECONDS");
  if (vm.count("metrics")) options.metrics_path = vm["metrics"].as<std::string>();
  options.record_test = vm["metrics-test"].as<bool>();
  if (options.record_test && options.metrics_path.empty())
    throw UsageError("--metrics-test writes into the metrics file: add --metrics FILE");
  // Given empty, an output option would silently write nothing.
  for (const char* output : {"save", "checkpoint", "metrics"})
    if (vm.count(output) && vm[output].as<std::string>().empty())
      throw UsageError(std::string("--") + output +
                       " needs a file name, got an empty one (leave the option out to write no " +
                       output + " file)");
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
  const auto output_locks = check_files(vm, save, options);

  SplitOptions split;
  split.seed = seed;
  split.validation_fraction = vm["validation-fraction"].as<double>();
  split.test_fraction = vm["test-fraction"].as<double>();
  check_fractions(split);
  const std::string data_name = vm["data"].as<std::string>();
  const PreparedData data = prepare_data(data_name, split);
  const DataSplits& splits = data.splits;
  check_splits(splits, split, options.batch_size, *ctx.err);

  if (!vm.count("model")) check_builtin_size(builtin, splits.train, options.batch_size);
  ModelFile spec = vm.count("model") ? read_model_file(vm["model"].as<std::string>(), ctx.layers)
                                     : make_builtin_model(builtin, splits.train, ctx.layers);
  if (vm.count("loss")) spec.loss = vm["loss"].as<std::string>();
  if (vm.count("l2")) spec.l2 = vm["l2"].as<double>();
  Model& model = spec.model;
  model.initialize(seed);
  const auto loss = make_loss(spec.loss, spec.l2);

  const int64_t steps_per_epoch =
      (splits.train.size() + options.batch_size - 1) / options.batch_size;
  const OptimizerSettings settings =
      optimizer_settings(vm, ctx.registry, options.epochs * steps_per_epoch, seed);
  const ScheduleKind schedule = settings.optimizer.schedule;
  if (options.schedule_over_time && schedule != ScheduleKind::linear &&
      schedule != ScheduleKind::cosine && !settings.optimizer.momentum)
    throw UsageError("--schedule-clock time has no effect with --schedule " +
                     std::string(to_string(schedule)) +
                     ": only linear and cosine schedules (and momentum's warm-up) run over the "
                     "run's length");
  // The subspace is recreated identically on --resume: its bases depend only on its settings.
  const std::unique_ptr<Subspace> subspace = ctx.registry.make_subspace(model, settings.subspace);
  // The sizes that are known only once the optimizer and the evaluator exist: an allocation
  // that fails there names the options that set them.
  const auto too_large = [&](const std::string& what) {
    return Error("out of memory while creating the " + what + " for " +
                 std::to_string(model.num_parameters()) + " parameters with --num-probe " +
                 std::to_string(settings.optimizer.num_probe) + " and --batch " +
                 std::to_string(options.batch_size) +
                 ": this machine cannot hold it (lower them, or the model's size)");
  };
  std::unique_ptr<PolytopeOptimizer> optimizer_held;
  try {
    optimizer_held = std::make_unique<PolytopeOptimizer>(model, settings.optimizer, subspace.get());
  } catch (const std::bad_alloc&) {
    throw too_large("optimizer");
  } catch (const std::length_error&) {
    throw too_large("optimizer");
  }
  PolytopeOptimizer& optimizer = *optimizer_held;
  // Scoring a step holds at least a loss per candidate and sample: refused before it is
  // allocated when that alone is more than the machine has.
  const double step_bytes = static_cast<double>(optimizer.next_step_cost()) *
                            static_cast<double>(options.batch_size) * sizeof(double);
  if (const double memory = physical_memory_bytes(); memory > 0 && step_bytes > memory) {
    std::ostringstream why;
    why << std::setprecision(3) << "a step scores " << optimizer.next_step_cost()
        << " candidates (--num-probe " << settings.optimizer.num_probe << ", "
        << model.num_parameters() << " parameters); on --batch " << options.batch_size
        << " that needs at least " << step_bytes / 1e9 << " GB, and this machine has "
        << memory / 1e9 << " GB: lower --num-probe or --batch";
    throw UsageError(why.str());
  }
  EvaluatorRequest model_request = request;
  model_request.subspace = subspace.get();
  Selection selection;
  std::unique_ptr<Evaluator> evaluator;
  try {
    evaluator = ctx.registry.make_evaluator(model, *loss, model_request, &selection);
  } catch (const std::bad_alloc&) {
    throw too_large("evaluator");
  }
  // The screen of --multifidelity-screen scores the first rows of each batch with its own
  // evaluator (registered on them by the optimizer).
  std::unique_ptr<Evaluator> screen_evaluator;
  if (settings.optimizer.multifidelity_screen) {
    screen_evaluator = ctx.registry.make_evaluator(model, *loss, model_request);
    optimizer.set_screen_evaluator(*screen_evaluator);
  }
  if (vm["explain"].as<bool>()) {
    *ctx.err << selection.to_json().dump(2) << "\n";
    // Who provides the search space and the radius model (the core or a plugin).
    const auto provider = [](const std::vector<NamedComponent>& components,
                             const std::string& name) {
      for (const NamedComponent& c : components)
        if (c.name == name)
          return c.provider == "core" ? std::string("the core") : "plugin " + c.provider;
      return std::string("?");
    };
    *ctx.err << "subspace " << settings.subspace.kind << ": "
             << provider(ctx.registry.subspace_kinds(), settings.subspace.kind) << "\n";
    const std::string radius = settings.optimizer.radius.kind == RadiusModelKind::plugin
                                   ? settings.optimizer.radius.plugin_name
                                   : std::string(to_string(settings.optimizer.radius.kind));
    *ctx.err << "radius model " << radius << ": " << provider(ctx.registry.radius_models(), radius)
             << "\n";
    // A layer whose declared contract failed the evaluator's probe runs on a slower path:
    // say which and why, since the model file promised more.
    const nlohmann::json explained = evaluator->explain();
    const nlohmann::json plugin = explained.value("plugin", nlohmann::json::object());
    for (const nlohmann::json& layer : plugin.value("layers", nlohmann::json::array()))
      if (layer.contains("contract_not_trusted"))
        *ctx.err << "layer " << layer.value("layer", -1) << " ("
                 << layer.value("kind", std::string("?")) << "): declared contract not trusted: "
                 << layer["contract_not_trusted"].get<std::string>() << "\n";
  }

  if (ranks.size() > 1) {
    ranks.agree_to_start("", startup_facts(vm, model, spec, splits, *evaluator, options));
    evaluator = ranks.shard(std::move(evaluator), vm["rank-exchange"].as<std::string>(),
                            request.device == "cuda", vm["rank-balance"].as<std::string>(),
                            vm["rank-waits"].as<std::string>());
    options.write_files = ranks.leader();
    options.agree_on_stop = ranks.stop_agreement();
    options.agree_on_clock = ranks.clock_agreement();
  }

  std::ostream& out = *ctx.out;
  out << "data: " << splits.train.name.substr(0, splits.train.name.find('/')) << " ("
      << splits.train.size() << " train, " << splits.validation.size() << " validation, "
      << splits.test.size() << " test, " << splits.train.num_classes << " classes)\n"
      << "model: " << model.num_layers() << " layers, " << model.num_parameters()
      << " parameters; loss " << spec.loss << "; evaluator " << evaluator->name();
  if (ranks.size() > 1)
    out << " on each of " << ranks.size() << " ranks (exchanges over " << ranks.exchange()
        << "; slices balanced by " << ranks.balance() << "; waits " << ranks.waits()
        << "; sharded finish " << (settings.optimizer.sharded_finish ? "on" : "off") << ")";
  if (subspace)
    out << "; subspace " << subspace->kind() << " (" << subspace->dimension() << " coordinates)";
  if (settings.optimizer.radius.kind == RadiusModelKind::plugin)
    out << "; radius model " << settings.optimizer.radius.plugin_name << " (plugin)";
  out << "\n" << std::flush;
  options.on_resume = [&](const TrainProgress& p) {
    out << "resuming from step " << p.step << " (epoch " << p.epoch + 1 << ", " << p.candidates
        << " candidates, " << std::fixed << std::setprecision(1) << p.seconds << " s) of "
        << options.checkpoint_path.string() << "\n"
        << std::flush;
  };

  ProgressDisplay display(*ctx.err, vm["quiet"].as<bool>());
  options.on_progress = [&](const TrainProgress& p) { display.update(p); };
  g_stop_requested.store(false);
  options.stop = &g_stop_requested;
  const auto previous = std::signal(SIGINT, request_stop);
  TrainResult result;
  try {
    result = train(model, *loss, optimizer, *evaluator, splits, options);
  } catch (const NonFiniteLossError& e) {
    std::signal(SIGINT, previous);
    display.finish();
    std::string message = e.what();
    const auto kind = ctx.layers.kinds().find(e.layer_kind);
    if (kind != ctx.layers.kinds().end())
      message +=
          kind->second.provider == "core"
              ? " (a core layer kind)"
              : " (layer kind '" + e.layer_kind + "' from plugin '" + kind->second.provider + "')";
    // A failed run keeps what it had validated: the best state goes where --save asked.
    if (!save.empty() && ranks.leader()) {
      if (e.best_step >= 0) {
        try {
          message += "; saved the best validated weights (validation accuracy " +
                     percent(e.best_validation_accuracy) + ", step " + std::to_string(e.best_step) +
                     ") to " + save_weights(save, model, spec, data, data_name);
        } catch (const Error& failed) {
          message +=
              std::string("; saving the best validated weights failed too: ") + failed.what();
        }
      } else {
        message += "; no state was validated yet, so " + save.string() + " is not written";
      }
    }
    if (!options.checkpoint_path.empty() && std::filesystem::exists(options.checkpoint_path))
      message += "; --resume from " + options.checkpoint_path.string() +
                 " would repeat the same steps: change the optimizer's options (a smaller "
                 "--step-radius) or the model first";
    throw Error(message);
  } catch (const std::bad_alloc&) {
    std::signal(SIGINT, previous);
    display.finish();
    throw too_large("candidates of a step");
  } catch (...) {
    std::signal(SIGINT, previous);
    display.finish();
    throw;
  }
  std::signal(SIGINT, previous);
  display.finish();

  out << "trained " << count(result.steps, "step") << " ("
      << epochs_done(result, steps_per_epoch, options.epochs) << ", "
      << count(result.evaluations, "candidate") << ") in " << std::fixed << std::setprecision(1)
      << result.seconds << " s";
  // Where the time went, so a slow run says whether the steps, the records or validation cost.
  out << " (steps " << result.seconds_in.step << " s, minibatch records "
      << result.seconds_in.record << " s, validation " << result.seconds_in.validation << " s)";
  if (result.stopped_early)
    out << "; stopped early (no validation gain for --patience validations)";
  if (result.reached_time_limit) out << "; reached --time-limit";
  if (result.reverted_steps > 0)
    out << "; " << result.reverted_steps << " step" << (result.reverted_steps == 1 ? "" : "s")
        << " reverted (non-finite loss)";
  out << "\n";
  if (result.interrupted) {
    // train() wrote the checkpoint (the current state) and left the best validated state in
    // the model.
    out << "interrupted at step " << result.steps;
    const auto parameters = model.parameters();
    const bool finite = std::all_of(parameters.begin(), parameters.end(),
                                    [](double v) { return std::isfinite(v); });
    if (!save.empty() && ranks.leader() && finite) {
      const std::string saved = save_weights(save, model, spec, data, data_name);
      if (result.best_epoch >= 0)
        out << "; saved the best weights so far (validation accuracy "
            << percent(result.best_validation_accuracy) << ", step " << result.best_step << ") to "
            << saved;
      else
        out << "; saved the current weights (not validated yet) to " << saved;
    }
    if (!options.checkpoint_path.empty())
      out << "; checkpoint " << options.checkpoint_path.string() << " (continue with --resume)";
    out << "\n";
    return 130;
  }
  if (result.best_epoch >= 0)
    out << (splits.validation.size() > 0 ? "best validation accuracy: "
                                         : "best training-split accuracy (no validation split): ")
        << percent(result.best_validation_accuracy) << " (step " << result.best_step << ", epoch "
        << result.best_epoch + 1 << ", restored)\n";
  if (!save.empty() && ranks.leader())
    out << "saved " << save_weights(save, model, spec, data, data_name) << "\n";
  if (splits.test.size() == 0) {
    out << "no test split (--test-fraction 0): test accuracy not measured" << std::endl;
    return 0;
  }
  const EvaluationResult test =
      evaluate_model(model, *loss, splits.test, options.dtype, evaluator->threads());
  // The metrics file ends with the test result of the restored state, so a file alone gives
  // one point of a test-accuracy-against-time curve (scripts/accuracy_curves.py). Rank 0 alone
  // writes it, as every other file.
  if (!options.metrics_path.empty() && ranks.leader()) {
    std::ofstream metrics(options.metrics_path, std::ios::app);
    metrics << nlohmann::json{{"split", "test"},           {"step", result.steps},
                              {"seconds", result.seconds}, {"restored_step", result.best_step},
                              {"loss", test.loss},         {"accuracy", test.accuracy}}
                   .dump()
            << std::endl;
    if (!metrics)
      throw Error("writing the test record to the metrics file '" + options.metrics_path.string() +
                  "' failed (is its disk full?)");
  }
  out << "test loss: " << std::setprecision(4) << test.loss << "\n";
  out << "test accuracy: " << percent(test.accuracy) << std::endl;
  return 0;
}

// Alone, the run; with ranks, a rank that fails before the start-up agreement says why there
// (so every rank hears it, once), and one that fails after it ends the job (TrainRanks::fail).
int run(Context& ctx) {
  const double timeout = ctx.vm["rank-timeout"].as<double>();
  if (!(timeout >= 0) || !std::isfinite(timeout))
    throw UsageError("--rank-timeout must be a number of seconds >= 0 (0: wait for ever)");
  const std::string exchange = ctx.vm["rank-exchange"].as<std::string>();
  if (exchange != "auto" && exchange != "mpi" && exchange != "nccl")
    throw UsageError("--rank-exchange must be auto, mpi or nccl, got '" + exchange + "'");
  const std::string balance = ctx.vm["rank-balance"].as<std::string>();
  if (balance != "auto" && balance != "wall" && balance != "cpu")
    throw UsageError("--rank-balance must be auto, wall or cpu, got '" + balance + "'");
  const std::string waits = ctx.vm["rank-waits"].as<std::string>();
  if (waits != "auto" && waits != "poll" && waits != "pause")
    throw UsageError("--rank-waits must be auto, poll or pause, got '" + waits + "'");
  // Shared with ctx.after_error, which outlives this frame.
  const auto held = std::make_shared<TrainRanks>(timeout);
  TrainRanks& ranks = *held;
  try {
    return train_run(ctx, ranks);
  } catch (const std::exception& e) {
    if (ranks.size() == 1) throw;
    if (ranks.agreed()) ranks.fail(e.what());
    // From here every rank throws the start-up verdict and rank 0 alone prints it. The others
    // leave only once it has (a barrier after the print): mpirun ends the job when a rank
    // exits with an error, and a rank that left first could take rank 0's message with it.
    ctx.after_error = [held] { held->sync(); };
    if (ranks.asked()) throw;  // the agreement's own verdict, thrown on every rank
    const std::exception_ptr original = std::current_exception();
    try {
      ranks.agree_to_start(e.what(), {});
    } catch (const Error& together) {
      // Every rank met this same error: report it as itself (a usage error exits 2).
      if (std::string(together.what()) == e.what()) std::rethrow_exception(original);
      throw;
    }
    throw;
  }
}

}  // namespace

Command train_command() {
  Command c;
  c.name = "train";
  c.summary = "train a model without gradients (no arguments: a small CNN on the embedded digits)";
  c.description =
      "Trains a model file (--model; default: a built-in CNN on digits, an MLP elsewhere) on a\n"
      "data set (--data: digits, fashion-mnist, a .csv/.csv.gz file or an IDX images file),\n"
      "with the polytope optimizer and the chosen evaluator backend. Features are standardised "
      "with\n"
      "statistics of the training split; validation runs after every epoch (or every\n"
      "--validate-every steps) and when --time-limit ends the run, and the best validation\n"
      "state is restored at the end. The last line is the test accuracy.\n\n"
      "The optimizer options below are the whole polytope optimizer, grouped as\n"
      "docs/training.md lists them; each is also a --config key (`num-probe = 2`). An option\n"
      "that has no effect where it is given, or an invalid combination, is an error naming\n"
      "the rule. Flags: --momentum alone, or --momentum=off.\n\n"
      "examples:\n"
      "  polyprobe train\n"
      "  polyprobe train --arch mlp --hidden 64 --epochs 40\n"
      "  polyprobe train --subspace hybrid --subspace-rank 4 --step-radius 1\n"
      "  polyprobe train --num-probe 2 --polytope orthoplex --blocks per_layer\n"
      "  polyprobe train --momentum --radius-model fixed\n"
      "  polyprobe train --model examples/models/staircase_mlp.json --save staircase.safetensors\n"
      "  polyprobe train --config examples/configs/fashion-mnist.ini --metrics fm.jsonl\n"
      "  polyprobe train --save run.safetensors --epochs 40   # Ctrl-C at any time, then:\n"
      "  polyprobe train --save run.safetensors --epochs 40 --resume\n"
      "  polyprobe eval --weights run.safetensors\n"
      "  mpirun -np 2 polyprobe train --save run.safetensors   # candidates shared by 2 ranks";
  c.options = [](po::options_description& o, po::positional_options_description&) {
    o.add_options()(
        "data", po::value<std::string>()->default_value("digits"),
        "data set: digits (embedded), fashion-mnist, a .csv/.csv.gz file, or an IDX images file")(
        "model", po::value<std::string>()->value_name("FILE"),
        "JSON model file (docs/models.md); default: the built-in --arch")(
        "arch", po::value<std::string>()->value_name("NAME"),
        "built-in model: cnn (conv2d 3x3 with --channels, relu, 2x2 max-pool, linear; image "
        "data) or mlp (flatten, linear(--hidden), relu, linear). Default: cnn on digits, else "
        "mlp")("channels", po::value<int64_t>()->value_name("N"),
               "channels of the built-in cnn (default 16)")(
        "hidden", po::value<int64_t>()->value_name("N"),
        "hidden units of the built-in mlp (default 32; alone, it selects the mlp)")(
        "loss", po::value<std::string>(),
        "cross_entropy, mse, hinge or zero_one (default: the model file's, else cross_entropy)")(
        "l2", po::value<double>(), "weight of l2 * |theta|^2 in the objective")(
        "epochs", po::value<int64_t>()->value_name("N"),
        "passes over the training split (default: 16 for the built-in cnn, else 20)")(
        "batch", po::value<int64_t>()->value_name("N"),
        "minibatch size (default: 32 for the built-in cnn, else 128)")(
        "seed", po::value<int64_t>()->default_value(0), "seed of initialisation, splits, batches")(
        "patience", po::value<int64_t>()->default_value(0),
        "stop after this many validations without gain (0: never)")(
        "validate-every", po::value<int64_t>()->default_value(0),
        "measure the validation split every this many steps (0: after every epoch); the best "
        "validated state is restored at the end")("time-limit", number_value(0),
                                                  "stop after this many seconds (0: none)")(
        "schedule-clock", po::value<std::string>()->default_value("steps")->value_name("CLOCK"),
        "what a linear or cosine schedule runs over: steps (the epochs' steps; repeatable) or "
        "time (whichever ends the run first, the epochs or --time-limit, so a timed run ends "
        "annealed; the steps then depend on the clock)")(
        "validation-fraction", number_value(0.15),
        "share of the training data held out for validation")(
        "test-fraction", number_value(0.15),
        "share held out for testing (data sets without their own test split)")(
        "metrics", po::value<std::string>()->value_name("FILE"),
        "write JSON lines (step, epoch, loss, accuracy, candidates, seconds, paths) to FILE; "
        "`polyprobe report FILE -o report.html` draws them")(
        "metrics-test", po::bool_switch(),
        "with --metrics: measure the test split whenever the best validated state changes and "
        "write its accuracy into every validation record (for curves of test accuracy against "
        "time: scripts/accuracy_curves.py)")(
        "save", po::value<std::string>()->value_name("FILE"),
        "write the trained weights to FILE (safetensors) and the model file beside it "
        "(FILE with .json); checkpoints go to FILE.ckpt")(
        "checkpoint", po::value<std::string>()->value_name("FILE"),
        "checkpoint file (default: the --save file + .ckpt), written after every epoch")(
        "resume", po::bool_switch(), "continue from the checkpoint")(
        "radius-options", po::value<std::string>()->default_value("{}")->value_name("JSON"),
        "options of a plugin's radius model (--radius-model), as a JSON object")(
        "rank-timeout", number_value(300),
        "under mpirun: seconds a rank waits for the others (a step, the start-up) before it "
        "ends the job saying which wait timed out (0: wait for ever)")(
        "rank-exchange", po::value<std::string>()->default_value("auto")->value_name("HOW"),
        "under mpirun: how the losses cross between ranks: mpi (host memory), nccl (between GPU "
        "buffers, one GPU a rank), or auto (nccl when the backend runs on the GPU and every rank "
        "has its own, else mpi); the start-up line says which and why")(
        "rank-balance", po::value<std::string>()->default_value("auto")->value_name("CLOCK"),
        "under mpirun: what each rank's slice of the candidates is balanced by: wall (the ranks' "
        "scoring wall times: what a step waits for), cpu (their CPU times: blind to other "
        "processes on a rank's cores) or auto (wall unless the ranks of a machine run more "
        "threads than it gives them CPUs); the start-up line says which and why. The losses, "
        "and so the trajectory, are the same whichever")(
        "rank-waits", po::value<std::string>()->default_value("auto")->value_name("HOW"),
        "under mpirun: how a rank waits for the others in an exchange: poll (test MPI without "
        "pause: the quickest answer, and a core kept busy), pause (after 200 us, test with "
        "pauses of 50-200 us, leaving shared cores to the ranks still computing) or auto (poll "
        "where every rank has CPUs of its own, as mpirun --bind-to core gives them); the "
        "start-up line says which and why");
    add_optimizer_options(o);
    add_backend_options(o);
  };
  c.run = run;
  return c;
}

}  // namespace polyprobe::app
