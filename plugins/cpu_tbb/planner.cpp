// The planner of the cpu_tbb evaluator (planner.hpp).
#include "planner.hpp"

#include "active_mask.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace polyprobe::cpu_tbb {

const char* path_name(Path path, bool subspace) {
  switch (path) {
    case Path::delta:
      return subspace ? "subspace-delta" : "sparse";
    case Path::dense:
      return "dense";
    case Path::inplace:
      return "inplace";
    case Path::fallback:
      return "fallback";
    case Path::incumbent:
      return "incumbent";
    case Path::site_local:
      return "site-local";
    case Path::count:
      break;
  }
  return "?";
}

const char* decline_text(Decline why) {
  switch (why) {
    case Decline::none:
      return "";
    case Decline::no_prefix_reuse:
      return "a layer is not prefix-reusable, so every candidate runs the whole forward";
    case Decline::not_affine:
      return "delta declined: a moved coordinate belongs to a layer that is not a verified affine "
             "layer";
    case Decline::subspace_transform:
      return "delta declined: a subspace coordinate moves a transformed weight, whose change is "
             "not rank one";
    case Decline::across_host:
      return "delta declined: the particle changes layers on both sides of a host layer";
    case Decline::zero_one_loss:
      return "delta declined: the 0-1 loss is decided by rounding, and an incremental change can "
             "break an exact tie between outputs that a recomputation keeps";
    case Decline::forced:
      return "delta not used: another path was requested";
    case Decline::site_not_declared:
      return "site-local declined: the particle's layer does not declare the site-local contract";
    case Decline::site_subspace:
      return "site-local declined: it serves the full space, not subspace coordinates";
    case Decline::site_spans_layers:
      return "site-local declined: the particle spans more than one layer";
    case Decline::site_unknown_kind:
      return "site-local declined: the plugin has no per-site computation for this layer kind or "
             "its attributes";
    case Decline::site_probe_failed:
      return "site-local probe failed: the per-site computation disagreed with the layer's "
             "forward";
    case Decline::site_forced:
      return "site-local not used: another path was requested";
    case Decline::count:
      break;
  }
  return "?";
}

GroupPlanner::GroupPlanner(const ModelPlan& plan, CoordinateIndex index, std::string forced,
                           bool recompute)
    : plan_(plan), index_(index), forced_(std::move(forced)), recompute_(recompute) {
  const auto n_layers = static_cast<int32_t>(plan_.layers.size());
  first_host_from_.assign(static_cast<std::size_t>(n_layers) + 1, n_layers);
  for (int32_t l = n_layers - 1; l >= 0; --l)
    first_host_from_[static_cast<std::size_t>(l)] =
        plan_.layers[static_cast<std::size_t>(l)].op == LayerOp::host
            ? l
            : first_host_from_[static_cast<std::size_t>(l) + 1];
  layer_path_candidates_.resize(plan_.layers.size() + 1);
  layer_declines_.resize(plan_.layers.size() + 1);
}

Decline GroupPlanner::build_terms(const Candidates& c, int64_t particle, std::vector<Term>& out,
                                  int32_t& first) const {
  const int32_t d = c.d;
  int32_t last = -1;
  first = static_cast<int32_t>(plan_.layers.size());
  Decline why = Decline::none;
  for (int32_t k = 0; k < d; ++k) {
    const int64_t coord = c.coords[particle * d + k];
    if (coord < 0) continue;
    Term t;
    t.slot = k;
    if (index_.subspace == nullptr) {
      if (coord >= plan_.n_params)
        throw std::out_of_range("coordinate " + std::to_string(coord) + " is outside the " +
                                std::to_string(plan_.n_params) + " parameters");
      t.layer = plan_.layer_of(coord);
      const LayerPlan& layer = plan_.layers[static_cast<std::size_t>(t.layer)];
      const int64_t idx = coord - layer.offset;
      t.param = coord;
      if (idx < layer.weight_count) {
        t.row = idx / layer.in;
        t.col = idx % layer.in;
      } else {
        t.row = idx - layer.weight_count;
        t.col = kBias;
      }
      if (layer.op != LayerOp::affine) why = Decline::not_affine;
    } else {
      if (coord >= index_.subspace->dimension)
        throw std::out_of_range("subspace coordinate " + std::to_string(coord) +
                                " is outside [0, " + std::to_string(index_.subspace->dimension) +
                                ")");
      const pp_subspace_coord& sc = index_.subspace->coords[coord];
      t.layer = plan_.layer_of(sc.offset);
      const LayerPlan& layer = plan_.layers[static_cast<std::size_t>(t.layer)];
      const bool weight = sc.offset == layer.offset && sc.rows == layer.out && sc.cols == layer.in;
      const bool bias = layer.has_bias && sc.offset == layer.offset + layer.weight_count &&
                        sc.rows == layer.out && sc.cols == 1;
      t.row = sc.row;
      t.u_index = (*index_.coord_u)[static_cast<std::size_t>(coord)];
      if (weight) {
        t.col = sc.col >= 0 ? sc.col : kDenseV;
        t.v_index = (*index_.coord_v)[static_cast<std::size_t>(coord)];
        if (layer.weight_q != nullptr && why == Decline::none) why = Decline::subspace_transform;
      } else if (bias) {
        t.col = kBias;
        if (layer.bias_q != nullptr && why == Decline::none) why = Decline::subspace_transform;
      }
      if (layer.op != LayerOp::affine || !(weight || bias)) why = Decline::not_affine;
    }
    first = std::min(first, t.layer);
    last = std::max(last, t.layer);
    out.push_back(t);
  }
  if (last < 0) return Decline::none;
  if (why == Decline::none && first_host_from_[static_cast<std::size_t>(first)] < last)
    why = Decline::across_host;
  return why;
}

bool GroupPlanner::takes_delta(Decline why, bool has_terms) const {
  const bool force_delta = forced_ == "sparse" || forced_ == "subspace-delta";
  return has_terms && plan_.no_prefix_reuse.empty() && (forced_.empty() || force_delta) &&
         why == Decline::none && !recompute_;
}

void GroupPlanner::count_layout(const Candidates& c) {
  layout_counted_ = c.step_candidates_per_particle > 0 && c.layout_key != 0;
  if (!layout_counted_ ||
      (c.layout_key == layout_key_ && c.step_candidates_per_particle == layout_per_))
    return;
  layout_candidates_.assign(plan_.layers.size(), 0);
  std::vector<Term> scratch;
  for (int64_t particle = 0; particle < c.n_particles; ++particle) {
    scratch.clear();
    int32_t first = 0;
    const Decline why = build_terms(c, particle, scratch, first);
    if (takes_delta(why, !scratch.empty()))
      layout_candidates_[static_cast<std::size_t>(first)] += c.step_candidates_per_particle;
  }
  layout_key_ = c.layout_key;
  layout_per_ = c.step_candidates_per_particle;
}

void GroupPlanner::plan(const Candidates& c, int64_t chunk, bool inplace_for_dense,
                        const SiteDecline& site_decline) {
  count_layout(c);
  groups_.clear();
  terms_.clear();
  // Each particle's groups, while the candidates' particles ascend (a probe's layout).
  particle_groups_.assign(static_cast<std::size_t>(c.n_particles) + 1, 0);
  bool ascending = true;
  int64_t last_particle = -1;
  const auto n_layers = static_cast<int32_t>(plan_.layers.size());
  const bool force_delta = forced_ == "sparse" || forced_ == "subspace-delta";
  const bool force_site = forced_ == "site-local";
  for (int64_t begin = 0; begin < c.count;) {
    const int64_t particle = c.particle[begin];
    if (particle < 0 || particle >= c.n_particles)
      throw std::out_of_range("candidate " + std::to_string(begin) + " moves particle " +
                              std::to_string(particle) + " of " + std::to_string(c.n_particles));
    int64_t run_end = begin + 1;
    while (run_end < c.count && c.particle[run_end] == particle) ++run_end;
    ascending = ascending && particle > last_particle;
    last_particle = particle;
    Group g;
    g.particle = particle;
    g.terms_begin = static_cast<int64_t>(terms_.size());
    g.why = build_terms(c, particle, terms_, g.first_layer);
    g.terms_end = static_cast<int64_t>(terms_.size());
    // By layer, stably: an insertion sort (a particle has d terms; std::stable_sort would
    // allocate a buffer per particle).
    for (auto it = terms_.begin() + g.terms_begin + 1; it < terms_.end(); ++it)
      for (auto at = it; at > terms_.begin() + g.terms_begin && (at - 1)->layer > at->layer; --at)
        std::iter_swap(at - 1, at);
    if (g.terms_begin == g.terms_end) {
      g.path = Path::incumbent;  // only padding moves
      g.first_layer = n_layers;
    } else if (!plan_.no_prefix_reuse.empty()) {
      g.path = Path::fallback;
      g.why = Decline::no_prefix_reuse;
    } else if (!forced_.empty() && !force_delta && !force_site) {
      g.path = forced_ == "dense"     ? Path::dense
               : forced_ == "inplace" ? Path::inplace
                                      : Path::fallback;
      if (g.why == Decline::none) g.why = Decline::forced;
      g.site_why = site_decline(g, true);
    } else if (recompute_) {
      g.path = inplace_for_dense ? Path::inplace : Path::dense;
      if (g.why == Decline::none) g.why = Decline::zero_one_loss;
    } else if (takes_delta(g.why, true)) {
      g.path = Path::delta;
    } else {
      g.site_why = site_decline(g, force_delta);
      if (g.site_why == Decline::none)
        g.path = Path::site_local;
      else
        g.path = inplace_for_dense ? Path::inplace : Path::dense;
      if (force_site && g.why == Decline::none) g.why = Decline::forced;
    }
    // A particle outside site-local layers says nothing about the site-local path unless
    // that path was requested.
    if (g.site_why == Decline::site_not_declared && !force_site) g.site_why = Decline::none;
    // Blocks of at most chunk candidates; they break at particle boundaries and only
    // split a particle whose candidates alone exceed the chunk.
    for (int64_t b = begin; b < run_end; b += chunk) {
      g.begin = b;
      g.end = std::min(run_end, b + chunk);
      groups_.push_back(g);
    }
    if (ascending) particle_groups_[static_cast<std::size_t>(particle) + 1] = groups_.size();
    begin = run_end;
  }
  if (ascending) {
    // Particles without candidates own no groups: their ranges are empty.
    for (std::size_t i = 1; i < particle_groups_.size(); ++i)
      particle_groups_[i] = std::max(particle_groups_[i], particle_groups_[i - 1]);
  } else {
    particle_groups_.clear();
  }
  select(nullptr);
}

void GroupPlanner::select(const uint8_t* active) {
  selected_.clear();
  if (active == nullptr) {
    selected_.resize(groups_.size());
    for (std::size_t i = 0; i < groups_.size(); ++i) selected_[i] = i;
  } else {
    if (particle_groups_.empty())
      throw std::logic_error(
          "GroupPlanner::select: the planned candidates are not in particle order, so they "
          "cannot be selected by particle");
    const auto P = static_cast<int64_t>(particle_groups_.size()) - 1;
    for_each_active(active, 0, P, [&](int64_t i) {
      const auto p = static_cast<std::size_t>(i);
      for (std::size_t g = particle_groups_[p]; g < particle_groups_[p + 1]; ++g)
        selected_.push_back(g);
    });
  }
  path_candidates_.fill(0);
  for (auto& a : layer_path_candidates_) a.fill(0);
  for (auto& a : layer_declines_) a.fill(0);
  first_layer_candidates_.assign(plan_.layers.size(), 0);
  for (const std::size_t i : selected_) {
    const Group& g = groups_[i];
    const int64_t n = g.end - g.begin;
    const auto layer = static_cast<std::size_t>(g.first_layer);
    if (g.path == Path::delta) first_layer_candidates_[layer] += n;
    layer_path_candidates_[layer][static_cast<int>(g.path)] += n;
    layer_declines_[layer][static_cast<int>(g.why)] += n;
    if (g.site_why != Decline::none) layer_declines_[layer][static_cast<int>(g.site_why)] += n;
    path_candidates_[static_cast<int>(g.path)] += n;
  }
}

}  // namespace polyprobe::cpu_tbb
