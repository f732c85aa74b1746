// The core's subspace kinds: full (none) and hybrid (plugins add more: PluginRegistry).
#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/subspace_kinds.hpp>
#include <polyprobe/subspaces.hpp>

namespace polyprobe {

const std::vector<SubspaceKind>& subspace_kinds() {
  static const std::vector<SubspaceKind> kinds = {
      {"full", "no subspace: particles cut the flat parameter vector (particle-dim each)",
       [](const Model&, const SubspaceSettings&) { return std::unique_ptr<Subspace>(); }},
      {"hybrid",
       "fixed orthonormal bases on both sides of every weight (dW = A V^T and U B), biases raw; "
       "subspace-rank per matrix, max-subspace-dim bounds the total",
       [](const Model& model, const SubspaceSettings& s) -> std::unique_ptr<Subspace> {
         HybridSubspace::Options options;
         options.rank = s.rank;
         options.max_subspace_dim = s.max_subspace_dim;
         options.seed = s.seed;
         return HybridSubspace::from_layout(model.parameter_entries(), model.num_parameters(),
                                            options);
       }},
  };
  return kinds;
}

const SubspaceKind* find_subspace_kind(std::string_view name) {
  for (const SubspaceKind& kind : subspace_kinds())
    if (kind.name == name) return &kind;
  return nullptr;
}

std::string subspace_kind_names() {
  std::string names;
  for (const SubspaceKind& kind : subspace_kinds())
    names += (names.empty() ? "" : ", ") + kind.name;
  return names;
}

std::unique_ptr<Subspace> make_subspace(const Model& model, const SubspaceSettings& settings) {
  const SubspaceKind* kind = find_subspace_kind(settings.kind);
  if (kind == nullptr)
    throw Error("unknown subspace kind '" + settings.kind + "' (kinds: " + subspace_kind_names() +
                ")");
  return kind->make(model, settings);
}

}  // namespace polyprobe
