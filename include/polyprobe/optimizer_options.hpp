// The optimizer's options by name: one table that `polyprobe train` (its command line and
// --config files) and `polyprobe bench dfo --dfo-config` read, and docs/training.md lists.
//
// Each option names one OptimizerConfig field (or one SubspaceSettings field): its type, its
// help, the group it is listed under, where it applies (training, minimize()) and, when it
// only matters in some configurations, the rule that says which (`--top-k` needs
// `--solver top_k`). set_option() parses a value into OptimizerSettings and records that the
// user gave it; validate_settings() then checks every rule: the option requirements (an
// option given where it has no effect is an error, not silently ignored), the subspace and
// training rules, and OptimizerConfig::validate(). Every failure is one polyprobe::Error line
// naming the option(s) and the fix. The table is immutable after its first use and safe to
// read from any thread.
#pragma once

#include <polyprobe/optimizer.hpp>
#include <polyprobe/subspace_kinds.hpp>

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace polyprobe {

// Everything the option table sets: the optimizer, the subspace it searches, and the names
// of the options given explicitly (canonical names, for the requirement rules).
struct OptimizerSettings {
  OptimizerConfig optimizer;
  SubspaceSettings subspace;
  std::set<std::string, std::less<>> given;
  // The subspace kinds and radius models the loaded plugins add (PluginRegistry lists them),
  // which --subspace and --radius-model then accept beside the core's. A plugin radius model
  // sets radius.kind = plugin and radius.plugin_name; its factory comes from
  // PluginRegistry::choose_radius_model() before validate_settings().
  std::vector<std::string> plugin_subspace_kinds;
  std::vector<std::string> plugin_radius_models;
};

enum class OptionType { integer, number, flag, choice };

// Where an option applies.
enum class OptionScope {
  both,      // `polyprobe train` and minimize() (bench dfo)
  training,  // `polyprobe train` only (subspaces: minimize() has no model)
  minimize,  // minimize() only (trust region: train() refuses it)
};

struct OptimizerOption {
  std::string name;                  // "step-radius": the long option and config-file key
  std::vector<std::string> aliases;  // other accepted keys ("K" for num-probe)
  std::string group;                 // heading in --help and docs/training.md
  OptionType type = OptionType::number;
  OptionScope scope = OptionScope::both;
  std::vector<std::string> choices;  // choice: the accepted values
  std::string help;                  // one sentence: what it does and when to change it
  // When set, the option only has an effect while `applies` holds; `requirement` says so in
  // words ("--solver top_k") for the error and the docs.
  std::function<bool(const OptimizerSettings&)> applies;
  std::string requirement;
  // Parses `value` into the settings (throws polyprobe::Error on a malformed value).
  std::function<void(OptimizerSettings&, std::string_view value)> set;
  // The current value as text that set() reads back.
  std::function<std::string(const OptimizerSettings&)> get;
};

// The table, grouped and in --help order.
const std::vector<OptimizerOption>& optimizer_options();

// The option named `key` (its name, or an alias; '_' and '-' are the same), or nullptr.
const OptimizerOption* find_option(std::string_view key);

// Sets option `key` from the text `value` and records it in settings.given. Throws
// polyprobe::Error "unknown optimizer option 'x' (did you mean ...)" or "--name: expected a
// number, got 'x'".
void set_option(OptimizerSettings& settings, std::string_view key, std::string_view value);

// Every rule for `scope` (training: also the subspace, and no trust_region; minimize: the
// optimizer alone). Throws polyprobe::Error naming the first broken rule.
void validate_settings(const OptimizerSettings& settings, OptionScope scope);

// The defaults of `polyprobe train` (tuned on digits; docs/training.md says how).
OptimizerSettings training_defaults();

}  // namespace polyprobe
