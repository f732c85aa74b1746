// Subspace kinds by name: what `polyprobe train --subspace KIND` and the option table look up.
//
// A kind is a name and a factory that builds the subspace for a model. The core knows "full"
// (no subspace: the optimizer searches the flat parameters) and "hybrid" (subspaces.hpp).
// Plugins add more (the factored subspace is the plugin factored_subspace):
// PluginRegistry::make_subspace() builds the core's kinds through this table and the others
// through the plugin that provides them.
#pragma once

#include <polyprobe/subspace.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace polyprobe {

class Model;

// What a subspace is built from. Fields a kind does not use are ignored by its factory; the
// option table (optimizer_options.hpp) rejects them when a user sets them anyway.
struct SubspaceSettings {
  std::string kind = "full";     // a name find_subspace_kind() or a plugin knows
  int64_t rank = 8;              // basis rank per weight matrix
  int64_t max_subspace_dim = 0;  // bound on the coordinates in all (0: none)
  uint64_t seed = 3;             // draws the bases
};

struct SubspaceKind {
  std::string name;
  std::string summary;  // one line for --help and docs
  // Builds the subspace for `model` (which it must outlive); nullptr means the full
  // parameter space. Throws polyprobe::Error when the settings do not fit the model.
  std::function<std::unique_ptr<Subspace>(const Model& model, const SubspaceSettings& settings)>
      make;
};

// The known kinds, in the order --help lists them.
const std::vector<SubspaceKind>& subspace_kinds();
// The kind named `name`, or nullptr.
const SubspaceKind* find_subspace_kind(std::string_view name);
// "full, hybrid": the names, for error messages.
std::string subspace_kind_names();

// The subspace `settings.kind` builds for `model`, or nullptr for the full space. Throws
// polyprobe::Error naming the known kinds when the kind is unknown.
std::unique_ptr<Subspace> make_subspace(const Model& model, const SubspaceSettings& settings);

}  // namespace polyprobe
