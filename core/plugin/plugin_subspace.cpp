// A Subspace whose coordinates come from a plugin's subspace kind (pp_subspace_kind).
#include "plugin/plugin_impl.hpp"

#include <polyprobe/registry.hpp>
#include <polyprobe/subspaces.hpp>

namespace polyprobe::detail {
namespace {

// Owns the plugin's subspace object; the coordinates point into its storage, which the ABI
// keeps valid and unchanged until destroy.
class PluginSubspace final : public RankOneSubspace {
 public:
  PluginSubspace(const pp_subspace_kind* kind, std::string plugin, const Model& model,
                 const SubspaceSettings& options)
      : kind_(kind), plugin_(std::move(plugin)) {
    const ModelView view(model);
    const std::vector<ParameterEntry>& layout = model.parameter_entries();
    std::vector<pp_param_entry> entries;
    entries.reserve(layout.size());
    for (const ParameterEntry& p : layout)
      entries.push_back({p.name.c_str(), static_cast<int32_t>(p.layer),
                         static_cast<int32_t>(p.shape.size()), p.shape.data(), p.offset, p.size});
    pp_subspace_options opts{};
    opts.struct_size = sizeof(opts);
    opts.rank = options.rank;
    opts.max_dimension = options.max_subspace_dim;
    opts.seed = options.seed;
    pp_error err{};
    if (kind_->create(view.get(), entries.data(), static_cast<int32_t>(entries.size()), &opts,
                      &self_, &err) != PP_OK ||
        self_ == nullptr)
      throw Error("subspace '" + std::string(kind_->kind) + "' (plugin " + plugin_ +
                  ") cannot span this model: " + error_text(err));
    pp_subspace_view described{};
    described.struct_size = sizeof(described);
    if (kind_->describe(self_, &described, &err) != PP_OK) {
      kind_->destroy(self_);
      throw Error("subspace '" + std::string(kind_->kind) + "' (plugin " + plugin_ +
                  ") cannot describe itself: " + error_text(err));
    }
    n_params_ = described.n_params;
    if (n_params_ != model.num_parameters() || described.dimension < 0 ||
        (described.dimension > 0 && described.coords == nullptr)) {
      kind_->destroy(self_);
      throw Error("subspace '" + std::string(kind_->kind) + "' (plugin " + plugin_ + ") maps " +
                  std::to_string(described.dimension) + " coordinates into " +
                  std::to_string(described.n_params) + " parameters; the model has " +
                  std::to_string(model.num_parameters()) + " (a bug in the plugin)");
    }
    coords_.reserve(static_cast<std::size_t>(described.dimension));
    for (int64_t k = 0; k < described.dimension; ++k) {
      const pp_subspace_coord& c = described.coords[k];
      coords_.push_back({c.offset, c.rows, c.cols, c.row, c.col, c.u, c.v});
    }
    // Per tensor, for explain: how many coordinates move it.
    for (const ParameterEntry& p : layout) {
      SubspaceEntry e{p.name, p.shape.empty() ? 1 : p.shape[0], 1, 0, 0, 0, 0, p.shape.size() < 2};
      if (!e.raw) e.cols = p.size / e.rows;
      for (const RankOneCoordinate& c : coords_) e.coords += c.offset == p.offset ? 1 : 0;
      if (!e.raw) e.coords_a = e.coords;
      entries_.push_back(e);
    }
  }
  ~PluginSubspace() override { kind_->destroy(self_); }
  PluginSubspace(const PluginSubspace&) = delete;
  PluginSubspace& operator=(const PluginSubspace&) = delete;

  std::string kind() const override { return kind_->kind; }

 private:
  const pp_subspace_kind* kind_;
  std::string plugin_;
  void* self_ = nullptr;
};

}  // namespace

std::unique_ptr<Subspace> make_plugin_subspace(const pp_subspace_kind* kind,
                                               const std::string& plugin, const Model& model,
                                               const SubspaceSettings& options) {
  return std::make_unique<PluginSubspace>(kind, plugin, model, options);
}

}  // namespace polyprobe::detail
