#include "cli.hpp"

#include <polyprobe/error.hpp>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

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
      "install's plugin folder")(
      "no-operation", po::value<std::vector<std::string>>()->value_name("NAME")->composing(),
      "leave the named operation (`polyprobe plugins` lists them: sdpa, factored_correction) "
      "to the layers' and evaluators' own code, to compare a plugin's kernel with it "
      "(repeatable)")("quiet,q", po::bool_switch(), "no progress output");
  return common;
}

// `prefix` ("polyprobe train: ") begins each warning line.
void load_plugins(Context& context, const std::string& prefix) {
  std::vector<fs::path> dirs;
  if (context.vm.count("plugin-dir")) {
    for (const std::string& dir : context.vm["plugin-dir"].as<std::vector<std::string>>()) {
      if (!fs::is_directory(dir)) throw UsageError("--plugin-dir '" + dir + "' is not a directory");
      dirs.push_back(fs::absolute(dir));  // what the user named, whatever the search does later
    }
  }
  if (context.vm.count("no-operation"))
    for (const std::string& name : context.vm["no-operation"].as<std::vector<std::string>>())
      context.registry.withhold_operation(name);
  std::vector<std::string> warnings;
  context.registry.load_directories(PluginRegistry::search_path(dirs, &warnings));
  warnings.insert(warnings.end(), context.registry.warnings().begin(),
                  context.registry.warnings().end());
  for (const std::string& warning : warnings)
    *context.err << prefix << "warning: " << warning << "\n";
  if (context.vm.count("no-operation")) {
    const std::vector<std::string> offered = context.registry.offered_operations();
    for (const std::string& name : context.vm["no-operation"].as<std::vector<std::string>>())
      if (std::find(offered.begin(), offered.end(), name) == offered.end()) {
        std::string known;
        for (const std::string& o : offered) known += (known.empty() ? "" : ", ") + o;
        throw UsageError(
            "--no-operation '" + name + "': no loaded plugin offers it (" +
            (known.empty() ? std::string("none offers any operation") : "offered: " + known) +
            "; `polyprobe plugins` lists them)");
      }
  }
  context.registry.register_layers(context.layers);
}

std::vector<std::string> long_names(const po::options_description& options) {
  std::vector<std::string> names;
  for (const auto& option : options.options()) names.push_back(option->long_name());
  return names;
}

std::string did_you_mean(const std::string& word, const po::options_description& options,
                         const std::string& dashes) {
  const std::string near = nearest(word, long_names(options));
  return near.empty() ? "" : " (did you mean " + dashes + near + "?)";
}

// The longest config file and config line read: a configuration is a few hundred bytes, so a
// larger one is a mistake (a device such as /dev/zero, a data file given as --config).
constexpr std::uintmax_t kMaxConfigBytes = 1 << 20;
constexpr std::size_t kMaxConfigLine = 4096;

// `text` cut to `limit` characters, saying how much was left out, for messages that quote
// what the user gave.
std::string quoted_excerpt(const std::string& text, std::size_t limit = 80) {
  if (text.size() <= limit) return text;
  return text.substr(0, limit) + "... (" + std::to_string(text.size()) + " characters)";
}

// The text of the --config file, checked: a regular file, not too large.
std::string read_config_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    throw UsageError("config file '" + path + "' cannot be read (does it exist?)");
  if (fs::is_directory(status))
    throw UsageError("config file '" + path + "' is a folder; --config takes a file");
  if (!fs::is_regular_file(status))
    throw UsageError("config file '" + path +
                     "' is not a regular file (a device or a pipe); --config takes a file");
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxConfigBytes)
    throw UsageError("config file '" + path + "' is " + std::to_string(size) +
                     " bytes, more than the limit of " + std::to_string(kMaxConfigBytes) +
                     ": is it really a configuration?");
  std::ifstream file(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!file && !file.eof())
    throw UsageError("config file '" + path + "' cannot be read (is it readable?)");
  return text;
}

// Every line of a config file is short and every key a known option other than `config`
// (files do not include others): names the file, the line and the nearest option, which
// Boost's parser does not.
void check_config_lines(const std::string& path, const std::string& text,
                        const po::options_description& options) {
  std::istringstream file(text);
  const std::vector<std::string> names = long_names(options);
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    const std::string where = "config file '" + path + "', line " + std::to_string(number) + ": ";
    if (line.size() > kMaxConfigLine)
      throw UsageError(where + "the line is " + std::to_string(line.size()) +
                       " characters long, more than the limit of " +
                       std::to_string(kMaxConfigLine));
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#' || line[first] == '[') continue;
    std::string key = line.substr(first, line.find('=') - first);
    key.erase(key.find_last_not_of(" \t\r") + 1);
    if (key == "config")
      throw UsageError(where +
                       "a config file cannot name another (`config = ...`): put its "
                       "options in this file, or give --config once on the command line");
    if (std::find(names.begin(), names.end(), key) == names.end())
      throw UsageError(where + "unknown option '" + quoted_excerpt(key) + "'" +
                       did_you_mean(key, options, ""));
  }
}

// An error message as printed: one that quotes a huge value the user gave (a 10 MB option)
// keeps its start and its end.
std::string printable_message(const std::string& message) {
  constexpr std::size_t kLimit = 2000;
  if (message.size() <= kLimit) return message;
  return message.substr(0, kLimit / 2) + " [... " + std::to_string(message.size() - kLimit) +
         " characters left out ...] " + message.substr(message.size() - kLimit / 2);
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
        const std::string text = read_config_file(path);
        check_config_lines(path, text, all);
        std::istringstream file(text);
        po::store(po::parse_config_file(file, all), context.vm);
      }
      po::notify(context.vm);
    } catch (const po::unknown_option& e) {
      std::string name = e.get_option_name();
      name.erase(0, name.find_first_not_of('-'));
      throw UsageError(std::string(e.what()) + did_you_mean(name, all, "--") + " (see `polyprobe " +
                       command.name + " --help`)");
    } catch (const po::error& e) {
      throw UsageError(std::string(e.what()) + " (see `polyprobe " + command.name + " --help`)");
    }
    // --json is a switch for most commands, a file name for `bench`.
    context.json = context.vm.count("json") && context.vm["json"].value().type() == typeid(bool) &&
                   context.vm["json"].as<bool>();
    context.quiet = context.vm["quiet"].as<bool>() || !isatty(STDERR_FILENO);
    if (command.uses_plugins) load_plugins(context, prefix);
    return command.run(context);
  } catch (const UsageError& e) {
    std::cerr << prefix << "error: " << printable_message(e.what()) << "\n";
    if (context.after_error) context.after_error();
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << prefix << "error: out of memory (a size given, or the data, is larger than this "
              << "machine can hold)\n";
    if (context.after_error) context.after_error();
    return 1;
  } catch (const std::exception& e) {
    std::cerr << prefix << "error: " << printable_message(e.what()) << "\n";
    if (context.after_error) context.after_error();
    return 1;
  }
}

std::string format_number(double value) {
  std::array<char, 64> text{};
  const auto [end, ec] = std::to_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() ? std::string(text.data(), end) : std::to_string(value);
}

po::typed_value<double>* number_value(double default_value) {
  return po::value<double>()->default_value(default_value, format_number(default_value));
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  const auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::size_t> row(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  std::size_t best_distance = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    // The lengths' difference bounds the distance from below: a word far longer than every
    // candidate (a pasted value) costs nothing to reject.
    const std::size_t gap = word.size() > candidate.size() ? word.size() - candidate.size()
                                                           : candidate.size() - word.size();
    if (gap >= best_distance) continue;
    const std::size_t d = distance(word, candidate);
    if (d < best_distance) best_distance = d, best = candidate;
  }
  return best;
}

void add_backend_options(po::options_description& options) {
  options.add_options()(
      "backend", po::value<std::string>()->default_value("auto"),
      "evaluator backend: auto (the best plugin that can serve, else the core's reference), "
      "reference, or a plugin name from `polyprobe plugins`")(
      "device", po::value<std::string>()->default_value("cpu"),
      "the device to evaluate on: cpu, cuda, or any device a loaded plugin declares (`polyprobe "
      "plugins` lists them as type/name)")("dtype",
                                           po::value<std::string>()->default_value("float32"),
                                           "candidate compute precision: float32 or float64")(
      "candidate-dtype", po::value<std::string>()->default_value("same"),
      "candidate_autocast: same (the --dtype), or bf16 / fp16 to run the candidates' forwards "
      "in that precision with float32 accumulation (the incumbent's stay in --dtype); --device "
      "cuda --dtype float32 only, refused with the reason elsewhere")(
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
  try {
    request.options.candidate_dtype =
        parse_candidate_dtype(context.vm["candidate-dtype"].as<std::string>());
  } catch (const Error& e) {
    throw UsageError(std::string("--candidate-dtype: ") + e.what());
  }
  request.options.threads = context.vm["threads"].as<int>();
  if (request.options.threads < 0) throw UsageError("--threads must be >= 0");
  return request;
}

std::string shipped_plugin_of(const std::string& component, const std::string& name) {
  if (component == "subspace" && name == "factored") return "factored_subspace";
  return {};
}

}  // namespace polyprobe::app
