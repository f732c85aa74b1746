// Subspace kinds by name: what `polyprobe train --subspace KIND` and the option table look up.
//
// A kind is a name and a factory that builds the subspace for a model. The core knows "full"
// (no subspace: the optimizer searches the flat parameters), "hybrid" and "factored"
// (subspaces.hpp). The lookup goes through find_subspace_kind() only, so kinds from plugins
// can be added to it without touching its callers.
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
  std::string kind = "full";     // a name find_subspace_kind() knows
  int64_t rank = 8;              // basis rank per weight matrix (hybrid, factored)
  int64_t max_subspace_dim = 0;  // hybrid: bound on the coordinates in all (0: none)
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
// "full, hybrid, factored": the names, for error messages.
std::string subspace_kind_names();

// The subspace `settings.kind` builds for `model`, or nullptr for the full space. Throws
// polyprobe::Error naming the known kinds when the kind is unknown.
std::unique_ptr<Subspace> make_subspace(const Model& model, const SubspaceSettings& settings);

}  // namespace polyprobe
