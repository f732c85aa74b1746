// The plugin registry: finds, loads and chooses plugins at run time.
//
// Search order (docs/design.md section 4): directories given explicitly (--plugin-dir), then
// POLYPROBE_PLUGIN_PATH (colon-separated), then the install's plugin folder relative to the
// running executable (<prefix>/lib/polyprobe/plugins; the build tree mirrors it). Never the
// current directory. Each library is loaded once (RTLD_NOW | RTLD_LOCAL) and never
// unloaded. A library that fails to load, speaks another ABI, has no entry symbol, throws,
// duplicates a loaded name, or is unusable on this machine is recorded with its reason and
// never aborts loading the others.
//
// Devices are named (--device cpu, cuda, rocm, ...): "cpu" and "cuda" always, any other
// when a loaded plugin declares it with a capability (plugin/abi.h, pp_device_type).
//
// Selection, per component kind: an explicit user choice beats policy (the requested
// device), policy beats score (the plugin's probe), and the name breaks ties. An explicit
// choice that cannot serve is an error; automatic selection falls back to the core's
// reference and says so. Every decision is kept in a Selection for --explain.
#pragma once

#include <polyprobe/plugin/abi.h>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/operations.hpp>
#include <polyprobe/subspace_kinds.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace polyprobe {

class Accumulator;
class LayerFactory;
class Loss;
class Model;
struct OptimizerConfig;
struct RadiusModelSettings;

struct CapabilityInfo {
  std::string component;  // "evaluator", "accumulator", "layer", "subspace", "radius_model"
  std::string name;
  std::string device;       // the device's name, as --device takes it: "cpu", "cuda", ...
  std::string device_type;  // "cpu", "gpu" or "accelerator"
  std::vector<std::string> dtypes;
  std::string summary;
  // An evaluator's reduced candidate dtypes (candidate_autocast): "bf16", "fp16" or none.
  std::vector<std::string> candidate_dtypes;
};

struct PluginInfo {
  std::string name;  // from the descriptor, or the file name when it never got that far
  std::string version;
  std::string vendor;
  std::string summary;
  std::filesystem::path path;
  uint32_t abi = 0;        // the descriptor's api_version (0 if unknown)
  bool loaded = false;     // the descriptor was read
  bool available = false;  // loaded and its probe scored it above 0
  int score = 0;
  std::string reason;  // why not available (empty when available)
  std::vector<CapabilityInfo> capabilities;
};

// Why a component was chosen: the winner and one line per candidate considered.
struct Selection {
  std::string component;
  std::string chosen;  // plugin name, or "reference" for the core's own
  std::vector<std::string> reasons;
  nlohmann::json to_json() const;
};

struct EvaluatorRequest {
  std::string backend;         // "" or "auto": choose; "reference"; or a plugin name
  std::string device = "cpu";  // the policy: the device the user asked for
  EvaluatorOptions options;
  // (optional) candidates move subspace coordinates; must outlive the evaluator. Plugins
  // see rank-one subspaces (subspaces.hpp); any other kind is served by the reference.
  const Subspace* subspace = nullptr;
  std::string path;  // "" or "auto": the plugin chooses; else force this path
};

// A component that can be chosen by name, and who provides it ("core" or a plugin's name).
struct NamedComponent {
  std::string name;
  std::string provider;
  std::string summary;
};

class PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // The search path: `explicit_dirs`, then POLYPROBE_PLUGIN_PATH, then the executable's
  // plugin folder (when the executable's location is known). A relative entry of
  // POLYPROBE_PLUGIN_PATH (".", "plugins") would depend on the working folder: it is ignored,
  // with a line in `warnings` (when given).
  static std::vector<std::filesystem::path> search_path(
      const std::vector<std::filesystem::path>& explicit_dirs,
      std::vector<std::string>* warnings = nullptr);
  // <dir of the running executable>/../lib/polyprobe/plugins, if it can be found.
  static std::filesystem::path executable_plugin_dir();

  // Operations named `name` that plugins loaded from now on offer are not put into
  // operations(): layers and evaluators then compute them with their own code (to compare a
  // plugin's kernel with that code, or to rule it out). Noted in the offering plugin's reason.
  void withhold_operation(const std::string& name) { withheld_.push_back(name); }
  // The names of the operations the loaded plugins offer, withheld or not, sorted, once each.
  std::vector<std::string> offered_operations() const;

  // Loads every polyprobe plugin library (libpolyprobe_*.so) in `dirs`, in order.
  void load_directories(const std::vector<std::filesystem::path>& dirs);
  // Loads one library by path; never throws (failures are recorded).
  void load_library(const std::filesystem::path& path);

  const std::vector<PluginInfo>& plugins() const { return infos_; }
  // What loading found unsafe or surprising, one line each, for the host to show: a plugin
  // folder or file any user may write, a plugin that shadows the shipped one of its name.
  const std::vector<std::string>& warnings() const { return warnings_; }
  const PluginInfo* find(const std::string& name) const;

  // Makes every layer kind of every available plugin creatable by `factory`, and hands the
  // plugins' operations to the layers it creates (factory.operations()). A kind that
  // collides with an existing one is skipped and noted in that plugin's reason.
  void register_layers(LayerFactory& factory);

  // The usable operations of the available plugins (the kernel registry); evaluator
  // sessions get them through pp_session_options.host.
  const OperationTable& operations() const { return *operations_; }

  // The device names --device accepts: "cpu" and "cuda", and every device a loaded plugin
  // declares with a capability; sorted, once each.
  std::vector<std::string> device_names() const;

  // Chooses and creates an evaluator. Throws polyprobe::Error when an explicit backend
  // cannot serve or does not exist, or when the device is none of device_names() (the
  // message lists them and says how to load more plugins). `selection` (optional) receives
  // the reasons.
  std::unique_ptr<Evaluator> make_evaluator(const Model& model, const Loss& loss,
                                            const EvaluatorRequest& request,
                                            Selection* selection = nullptr) const;

  // The subspace kinds --subspace accepts: the core's (subspace_kinds.hpp: full, hybrid) and
  // every available plugin's, in load order; a plugin's kind that repeats an earlier one is
  // skipped.
  std::vector<NamedComponent> subspace_kinds() const;
  // Creates the subspace `settings.kind` of `model` (null for "full"): the core's kinds
  // through subspace_kinds.hpp, any other from the plugin that provides it. Throws Error
  // when no available plugin provides it (naming the plugin that would, when one was found
  // but is unusable) or when the kind refuses the model (with its reason). The result does
  // not refer to the model.
  std::unique_ptr<Subspace> make_subspace(const Model& model,
                                          const SubspaceSettings& settings) const;

  // The radius models --radius-model accepts: the core's and every available plugin's.
  std::vector<NamedComponent> radius_models() const;
  // Sets `config.radius` to the radius model `name`: a built-in one (its kind), or a
  // plugin's (kind plugin, with the factory that makes one per optimizer from `config` as
  // it stands and `options_json`). One plugin model is created at once, so a configuration
  // it refuses is an Error here, with its reason, not at the first step. Throws for
  // unknown names, listing the known ones. `subspace`: the search runs over one.
  void choose_radius_model(const std::string& name, OptimizerConfig& config, bool subspace,
                           const std::string& options_json = "{}") const;

  // Runs available plugin `plugin`'s own benchmark `suite` (pp_plugin.bench) with `options`
  // and returns its {"records": [...]}. Throws polyprobe::Error naming the plugin when it is
  // missing, unavailable (with its reason), offers no benchmarks, or the run fails.
  nlohmann::json run_plugin_bench(const std::string& plugin, const std::string& suite,
                                  const nlohmann::json& options) const;

  // Chooses and creates an accumulator of `strategy` ("auto", "scatter", "segment", ... as
  // the plugin names them): `backend` "" or "auto" takes the highest-scoring plugin that
  // declares the strategy (else the core's reference), "reference" the reference, else the
  // named plugin (an error if it lacks the strategy). `threads` 0 = all the process may use.
  std::unique_ptr<Accumulator> make_accumulator(const std::string& backend,
                                                const std::string& strategy, int threads = 0,
                                                Selection* selection = nullptr) const;

 private:
  struct Loaded;
  std::vector<PluginInfo> infos_;
  std::vector<const pp_plugin*> descriptors_;   // parallel to infos_ (null if not loaded)
  std::shared_ptr<OperationTable> operations_;  // shared with the evaluators it serves
  std::vector<std::string> withheld_;           // withhold_operation's names
  std::vector<std::string> warnings_;           // warnings()
};

}  // namespace polyprobe
