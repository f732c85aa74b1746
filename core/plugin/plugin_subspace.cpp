// A Subspace whose coordinates come from a plugin's subspace kind (pp_subspace_kind).
#include "plugin/plugin_impl.hpp"

#include <polyprobe/registry.hpp>
#include <polyprobe/subspaces.hpp>

namespace polyprobe::detail {
namespace {

// Owns the plugin's subspace object; the coordinates point into its storage, which the ABI
// keeps valid and unchanged until destroy. Rotation creates the plugin's object again with
// the epoch's seed and swaps it in once it has described itself with the same layout.
// The plugin's object is created from the subspace's own copy of the model's structure.
class PluginSubspace final : public RankOneSubspace {
 public:
  PluginSubspace(const pp_subspace_kind* kind, std::string plugin, const Model& model,
                 const SubspaceSettings& options)
      : kind_(kind), plugin_(std::move(plugin)), model_(model), options_(options) {
    n_params_ = model_.num_parameters();
    self_ = create(options.seed, coords_);
    // Per tensor, for explain: how many coordinates move it.
    for (const ParameterEntry& p : model_.parameter_entries()) {
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
  bool can_rotate() const override { return true; }

 protected:
  void redraw(uint64_t epoch) override {
    std::vector<RankOneCoordinate> coords;
    void* fresh = create(rotation_seed(options_.seed, epoch), coords);
    // The optimizer's particles index the coordinates: each must still move the same tensor
    // the same way (row or column), only along other vectors.
    for (std::size_t k = 0; k < coords.size(); ++k) {
      const RankOneCoordinate &a = coords_[k], &b = coords[k];
      if (a.offset != b.offset || a.rows != b.rows || a.cols != b.cols || a.row != b.row ||
          a.col != b.col || (a.u == nullptr) != (b.u == nullptr) ||
          (a.v == nullptr) != (b.v == nullptr)) {
        kind_->destroy(fresh);
        throw Error(who() + " changed what coordinate " + std::to_string(k) +
                    " moves when recreated with another seed (rotation); the host needs the "
                    "same coordinate layout for every seed (a bug in the plugin)");
      }
    }
    kind_->destroy(self_);
    self_ = fresh;
    coords_ = std::move(coords);
  }

 private:
  std::string who() const {
    return "subspace '" + std::string(kind_->kind) + "' (plugin " + plugin_ + ")";
  }

  // Creates the plugin's object with `seed` and reads its coordinates into `coords`. Checks
  // the dimension against the current one when there is one (a rotation).
  void* create(uint64_t seed, std::vector<RankOneCoordinate>& coords) const {
    const ModelView view(model_);
    const std::vector<ParameterEntry>& layout = model_.parameter_entries();
    std::vector<pp_param_entry> entries;
    entries.reserve(layout.size());
    for (const ParameterEntry& p : layout)
      entries.push_back({p.name.c_str(), static_cast<int32_t>(p.layer),
                         static_cast<int32_t>(p.shape.size()), p.shape.data(), p.offset, p.size});
    pp_subspace_options opts{};
    opts.struct_size = sizeof(opts);
    opts.rank = options_.rank;
    opts.max_dimension = options_.max_subspace_dim;
    opts.seed = seed;
    pp_error err{};
    void* self = nullptr;
    if (kind_->create(view.get(), entries.data(), static_cast<int32_t>(entries.size()), &opts,
                      &self, &err) != PP_OK ||
        self == nullptr)
      throw Error(who() + " cannot span this model: " + error_text(err));
    pp_subspace_view described{};
    described.struct_size = sizeof(described);
    if (kind_->describe(self, &described, &err) != PP_OK) {
      kind_->destroy(self);
      throw Error(who() + " cannot describe itself: " + error_text(err));
    }
    if (described.n_params != model_.num_parameters() || described.dimension < 0 ||
        (described.dimension > 0 && described.coords == nullptr)) {
      kind_->destroy(self);
      throw Error(who() + " maps " + std::to_string(described.dimension) + " coordinates into " +
                  std::to_string(described.n_params) + " parameters; the model has " +
                  std::to_string(model_.num_parameters()) + " (a bug in the plugin)");
    }
    if (!coords_.empty() && described.dimension != dimension()) {
      kind_->destroy(self);
      throw Error(who() + " has " + std::to_string(described.dimension) +
                  " coordinates when recreated with another seed (rotation), " +
                  std::to_string(dimension()) +
                  " before; the dimension must not depend on the seed (a bug in the plugin)");
    }
    coords.clear();
    coords.reserve(static_cast<std::size_t>(described.dimension));
    for (int64_t k = 0; k < described.dimension; ++k) {
      const pp_subspace_coord& c = described.coords[k];
      coords.push_back({c.offset, c.rows, c.cols, c.row, c.col, c.u, c.v});
    }
    return self;
  }

  const pp_subspace_kind* kind_;
  std::string plugin_;
  // A copy (the layers are shared, the parameters are not read): the result of
  // make_subspace does not refer to the caller's model, and rotation creates from this.
  const Model model_;
  SubspaceSettings options_;
  void* self_ = nullptr;
};

}  // namespace

std::unique_ptr<Subspace> make_plugin_subspace(const pp_subspace_kind* kind,
                                               const std::string& plugin, const Model& model,
                                               const SubspaceSettings& options) {
  return std::make_unique<PluginSubspace>(kind, plugin, model, options);
}

}  // namespace polyprobe::detail
