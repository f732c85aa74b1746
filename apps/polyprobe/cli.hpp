// The host app's command framework.
//
// Each subcommand is a Command: its options (Boost.Program_options), a help text with
// examples, and a run function. run_command parses the command line and, with --config,
// an INI-style file whose keys are the same long option names (the command line wins),
// prints --help, loads plugins when the command asks for them, and turns every
// polyprobe::Error into one line on stderr and a non-zero exit: 2 for usage errors, 1 for
// failures.
#pragma once

#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/registry.hpp>

#include <boost/program_options.hpp>

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace polyprobe::app {

namespace po = boost::program_options;

// What every command gets: parsed options, and the plugins and layer kinds when loaded.
struct Context {
  po::variables_map vm;
  PluginRegistry registry;
  LayerFactory layers = LayerFactory::with_builtins();
  bool json = false;   // --json where the command has it
  bool quiet = false;  // --quiet: no progress
  std::ostream* out;
  std::ostream* err;
  // Set by a command that must act once its error is printed (train's ranks wait for rank 0's
  // message before they exit); run_command calls it after printing. May be empty.
  std::function<void()> after_error;
};

struct Command {
  std::string name;
  std::string summary;      // one line for `polyprobe --help`
  std::string description;  // paragraphs and examples for `polyprobe NAME --help`
  bool uses_plugins = true;
  // Adds the command's own options.
  std::function<void(po::options_description&, po::positional_options_description&)> options;
  std::function<int(Context&)> run;
};

// A usage error (bad option value, missing argument): exit code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

int run_command(const Command& command, const std::vector<std::string>& args);

// The commands, in the order `polyprobe --help` lists them (commands.cpp).
const std::vector<Command>& commands();

// The shortest text that reads back as `value` (0.15, not 0.14999999999999999).
std::string format_number(double value);

// A number option whose --help default prints as typed.
po::typed_value<double>* number_value(double default_value);

// The candidate nearest to `word` by edit distance, or "" when none is near enough to be a
// likely typo.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

// Backend selection options shared by commands that evaluate candidates.
void add_backend_options(po::options_description& options);
EvaluatorRequest evaluator_request(const Context& context);

// The plugin polyprobe itself ships a named component in ("" when none): `component` is
// "subspace" or "radius_model". Errors for a component that is not on the plugin path name
// the plugin to put back; the core itself knows no plugin.
std::string shipped_plugin_of(const std::string& component, const std::string& name);

}  // namespace polyprobe::app
