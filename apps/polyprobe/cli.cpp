#include "cli.hpp"

#include <polyprobe/error.hpp>

#include <unistd.h>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace polyprobe::app {
namespace fs = std::filesystem;

namespace {

po::options_description common_options() {
  po::options_description common("Common options");
  common.add_options()("help,h", "show this help and exit")(
      "config", po::value<std::string>()->value_name("FILE"),
      "read options from FILE (INI style: one `name = value` per line, names as the long "
      "options without dashes); the command line wins")(
      "plugin-dir", po::value<std::vector<std::string>>()->value_name("DIR")->composing(),
      "search DIR for plugins first (repeatable); then POLYPROBE_PLUGIN_PATH, then the "
      "install's plugin folder")("quiet,q", po::bool_switch(), "no progress output");
  return common;
}

void load_plugins(Context& context) {
  std::vector<fs::path> dirs;
  if (context.vm.count("plugin-dir")) {
    for (const std::string& dir : context.vm["plugin-dir"].as<std::vector<std::string>>()) {
      if (!fs::is_directory(dir)) throw UsageError("--plugin-dir '" + dir + "' is not a directory");
      dirs.emplace_back(dir);
    }
  }
  context.registry.load_directories(PluginRegistry::search_path(dirs));
  context.registry.register_layers(context.layers);
}

}  // namespace

int run_command(const Command& command, const std::vector<std::string>& args) {
  const std::string prefix = "polyprobe " + command.name + ": ";
  po::options_description own(command.name + " options");
  po::positional_options_description positional;
  if (command.options) command.options(own, positional);
  po::options_description all;
  all.add(own).add(common_options());
  Context context;
  context.out = &std::cout;
  context.err = &std::cerr;
  try {
    try {
      po::store(po::command_line_parser(args).options(all).positional(positional).run(),
                context.vm);
      if (context.vm.count("help")) {
        std::cout << "usage: polyprobe " << command.name << " [options]\n\n"
                  << command.summary << "\n\n";
        if (!command.description.empty()) std::cout << command.description << "\n\n";
        std::cout << all << "\n";
        return 0;
      }
      if (context.vm.count("config")) {
        const std::string path = context.vm["config"].as<std::string>();
        std::ifstream file(path);
        if (!file) throw UsageError("config file '" + path + "' cannot be read (does it exist?)");
        po::store(po::parse_config_file(file, all), context.vm);
      }
      po::notify(context.vm);
    } catch (const po::error& e) {
      throw UsageError(std::string(e.what()) + " (see `polyprobe " + command.name + " --help`)");
    }
    // --json is a switch for most commands, a file name for `bench`.
    context.json = context.vm.count("json") && context.vm["json"].value().type() == typeid(bool) &&
                   context.vm["json"].as<bool>();
    context.quiet = context.vm["quiet"].as<bool>() || !isatty(STDERR_FILENO);
    if (command.uses_plugins) load_plugins(context);
    return command.run(context);
  } catch (const UsageError& e) {
    std::cerr << prefix << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << prefix << "error: " << e.what() << "\n";
    return 1;
  }
}

std::string format_number(double value) {
  std::array<char, 64> text{};
  const auto [end, ec] = std::to_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() ? std::string(text.data(), end) : std::to_string(value);
}

void add_backend_options(po::options_description& options) {
  options.add_options()(
      "backend", po::value<std::string>()->default_value("auto"),
      "evaluator backend: auto (the best plugin that can serve, else the core's reference), "
      "reference, or a plugin name from `polyprobe plugins`")(
      "device", po::value<std::string>()->default_value("cpu"), "cpu or cuda")(
      "dtype", po::value<std::string>()->default_value("float32"),
      "candidate compute precision: float32 or float64")(
      "threads", po::value<int>()->default_value(0), "worker threads (0 = all cores)")(
      "explain", po::bool_switch(), "print why each component was chosen");
}

EvaluatorRequest evaluator_request(const Context& context) {
  EvaluatorRequest request;
  request.backend = context.vm["backend"].as<std::string>();
  request.device = context.vm["device"].as<std::string>();
  try {
    request.options.dtype = parse_dtype(context.vm["dtype"].as<std::string>());
  } catch (const Error& e) {
    throw UsageError(std::string("--dtype: ") + e.what());
  }
  request.options.threads = context.vm["threads"].as<int>();
  if (request.options.threads < 0) throw UsageError("--threads must be >= 0");
  return request;
}

}  // namespace polyprobe::app
