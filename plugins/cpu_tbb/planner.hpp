// The planner: which path each group of candidates takes, and why the others declined.
//
// GroupPlanner cuts a candidate set into groups (adjacent candidates that move one particle,
// at most `chunk` of them), turns each particle's coordinates into Terms (rank-one changes
// of affine layers) and picks the group's path from the layers' verified contracts and the
// forced path, if any. It keeps, for the last call, the groups, their terms and the
// candidate counts per path and per decline reason that explain() reports. It computes no
// loss and owns no model data (the plan and the subspace outlive it). One thread at a time.
#pragma once

#include "evaluator.hpp"
#include "model_plan.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {

enum class Path : int { delta, dense, inplace, fallback, incumbent, site_local, count };
inline constexpr int kPathCount = static_cast<int>(Path::count);
// "sparse" or "subspace-delta" for the delta path, by search space.
const char* path_name(Path path, bool subspace);

// Why a group did not take the delta path.
enum class Decline : int {
  none,
  no_prefix_reuse,     // a layer is not prefix-reusable (model-wide)
  not_affine,          // a moved coordinate belongs to a layer not verified affine
  subspace_transform,  // a subspace coordinate moves a transformed weight (not rank one)
  across_host,         // the particle changes layers on both sides of a host layer
  zero_one_loss,       // the 0-1 loss, which rounding decides (model-wide)
  forced,              // another path was requested
  // why a group whose particle lies in a site-local layer did not take the site-local path
  site_not_declared,  // a layer of the particle does not declare the site-local contract
  site_subspace,      // subspace coordinates (the path serves the full space)
  site_spans_layers,  // the particle's coordinates lie in more than one layer
  site_unknown_kind,  // the plugin has no per-site computation for the kind (or attributes)
  site_probe_failed,  // the per-site computation disagreed with the layer's forward
  site_forced,        // another path was requested
  count
};
inline constexpr int kDeclineCount = static_cast<int>(Decline::count);
const char* decline_text(Decline why);

// One coordinate of a particle as a rank-one change of an affine layer's pre-activation:
// dz = theta * u (v^T x), u = e_row or a dense vector, v = e_col, a dense vector or the
// bias input 1.
inline constexpr int64_t kDenseV = -1, kBias = -2;
struct Term {
  int32_t layer = 0;
  int32_t slot = 0;      // the particle's displacement component that drives it
  int64_t row = 0;       // >= 0: one output unit; -1: dense u (u_index)
  int64_t col = 0;       // >= 0: one input feature; kDenseV: dense v (v_index); kBias
  int32_t u_index = -1;  // into the search space's dense u vectors
  int32_t v_index = -1;  // into the search space's dense v vectors
  int64_t param = -1;    // full space: the parameter moved (its transform gives theta)
};

// A block of adjacent candidates that move one particle, and the path it takes.
struct Group {
  int64_t begin = 0, end = 0;
  int64_t particle = 0;
  Path path = Path::fallback;
  Decline why = Decline::none;
  int32_t first_layer = 0;                 // the first layer the particle changes
  int64_t terms_begin = 0, terms_end = 0;  // into GroupPlanner::terms()
  Decline site_why = Decline::none;        // why the site-local path declined (if it did)
};

// The search space's coordinate tables the planner reads: null subspace = full space
// (coordinates are parameters); else per coordinate the index of its dense u / v (-1: none).
struct CoordinateIndex {
  const pp_subspace_view* subspace = nullptr;
  const std::vector<int32_t>* coord_u = nullptr;
  const std::vector<int32_t>* coord_v = nullptr;
};

class GroupPlanner {
 public:
  // `plan` and the index's tables outlive the planner. `forced` is "" (auto) or a path name.
  // `recompute`: every changed layer is recomputed (the dense or inplace path), never
  // carried as an incremental change (the 0-1 loss: a change's rounding residue can break an
  // exact tie between outputs that the reference's recomputation keeps).
  GroupPlanner(const ModelPlan& plan, CoordinateIndex index, std::string forced, bool recompute);

  // Whether a group can take the site-local path: Decline::none, else why not. Called with
  // the group's terms already in terms(); `other_forced` says another path was requested.
  using SiteDecline = std::function<Decline(const Group& group, bool other_forced)>;

  // Plans the groups of `c` (replacing the last call's) and selects them all. Throws
  // std::out_of_range naming a particle or coordinate outside the bound structure.
  void plan(const Candidates& c, int64_t chunk, bool inplace_for_dense,
            const SiteDecline& site_decline);
  // Which planned groups the coming call runs: those of the particles `active` marks
  // ([n_particles] of the planned set; null: every group), and the counts below for them. A
  // plan is a function of the layout alone, so calls that score different particles of one
  // layout (the slices or chunks of a sharded step, adaptive_probes' masks) share it and pay
  // only this: O(P) to read the mask and O(groups selected). Throws std::logic_error for a mask
  // when the planned candidates were not in particle order (an explicit set).
  void select(const uint8_t* active);

  const std::string& forced() const { return forced_; }
  const std::vector<Group>& groups() const { return groups_; }
  // Indices into groups() of the selected ones, ascending.
  const std::vector<std::size_t>& selected() const { return selected_; }
  const std::vector<Term>& terms() const { return terms_; }
  // The counts below are of the selected groups (the coming call's).
  // Per layer: the delta candidates whose first changed layer it is.
  const std::vector<int64_t>& first_layer_candidates() const { return first_layer_candidates_; }
  // What the tables' thresholds count: first_layer_candidates() over the whole bound layout
  // for a probe-form step (Candidates::step_candidates_per_particle), else over the last call.
  const std::vector<int64_t>& threshold_candidates() const {
    return layout_counted_ ? layout_candidates_ : first_layer_candidates_;
  }
  // Per layer (the first the particle changes): candidates per path and per decline.
  const std::vector<std::array<int64_t, kPathCount>>& layer_path_candidates() const {
    return layer_path_candidates_;
  }
  const std::vector<std::array<int64_t, kDeclineCount>>& layer_declines() const {
    return layer_declines_;
  }
  const std::array<int64_t, kPathCount>& path_candidates() const { return path_candidates_; }

 private:
  // Whether a particle whose build_terms gave `why` (and `has_terms`) takes the delta path.
  bool takes_delta(Decline why, bool has_terms) const;
  // layout_candidates_ for c's layout, unless already counted for it.
  void count_layout(const Candidates& c);
  // Appends the particle's terms to `out`; returns why the delta path cannot take it.
  Decline build_terms(const Candidates& c, int64_t particle, std::vector<Term>& out,
                      int32_t& first) const;

  const ModelPlan& plan_;
  CoordinateIndex index_;
  std::string forced_;
  bool recompute_ = false;
  std::vector<int32_t> first_host_from_;  // first host layer index >= l (n_layers if none)
  std::vector<Group> groups_;
  std::vector<Term> terms_;
  std::vector<std::size_t> particle_groups_;  // [P + 1]: particle i's groups (empty: unordered)
  std::vector<std::size_t> selected_;
  std::vector<int64_t> first_layer_candidates_;
  std::vector<int64_t> layout_candidates_;  // count_layout's, for layout_key_ and layout_per_
  uint64_t layout_key_ = 0;
  int64_t layout_per_ = 0;
  bool layout_counted_ = false;  // threshold_candidates() reads layout_candidates_
  std::array<int64_t, kPathCount> path_candidates_{};
  std::vector<std::array<int64_t, kPathCount>> layer_path_candidates_;
  std::vector<std::array<int64_t, kDeclineCount>> layer_declines_;
};

}  // namespace polyprobe::cpu_tbb
