// Set-up and orchestration of the cpu_tbb evaluator: contracts, the incumbent's prefix,
// grouping candidates by particle, choosing each group's path, chunks and threads.
#include "evaluator_impl.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>
#include <unordered_map>

namespace polyprobe::cpu_tbb {
namespace {

// Working memory one worker may hold for its block of candidates when chunk_size is
// automatic. Fixed (not divided by the thread count) so that blocks, and with them every
// loss bit, are the same for any number of threads.
constexpr double kWorkerBudgetBytes = 64.0 * 1024 * 1024;
// Per-thread parameter copies beyond this use the in-place path instead of dense.
constexpr double kParamCopiesBudgetBytes = 4.0 * 1024 * 1024 * 1024;

bool is(const char* a, const char* b) { return a != nullptr && std::strcmp(a, b) == 0; }

}  // namespace

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

template <class S>
EvaluatorImpl<S>::EvaluatorImpl(const pp_model_view& model, const pp_loss_view& loss,
                                const pp_session_options& options)
    : plan_(build_model_plan(model)),
      loss_(kernels::loss_kind(loss.name)),
      l2_(loss.l2),
      threads_(options.threads) {
  // NOLINTNEXTLINE(bugprone-sizeof-expression): the field is a pointer; its size is the check
  if (PP_HAS_FIELD(&options, pp_session_options, host)) host_ = options.host;
  // The field is a pointer and its size is the point of the check.
  // NOLINTNEXTLINE(bugprone-sizeof-expression)
  if (PP_HAS_FIELD(&options, pp_session_options, subspace) && options.subspace != nullptr) {
    subspace_ = options.subspace;
    subspace_mode_ = true;
    if (subspace_->n_params != plan_.n_params)
      throw std::invalid_argument("the subspace maps into " + std::to_string(subspace_->n_params) +
                                  " parameters, the model has " + std::to_string(plan_.n_params));
    std::unordered_map<const double*, int32_t> u_index, v_index;
    coord_u_.assign(static_cast<std::size_t>(subspace_->dimension), -1);
    coord_v_.assign(static_cast<std::size_t>(subspace_->dimension), -1);
    for (int64_t k = 0; k < subspace_->dimension; ++k) {
      const pp_subspace_coord& c = subspace_->coords[k];
      if (c.offset < 0 || c.offset + c.rows * c.cols > plan_.n_params)
        throw std::invalid_argument("subspace coordinate " + std::to_string(k) +
                                    " lies outside the parameters");
      if (c.row < 0) {
        auto [it, added] = u_index.try_emplace(c.u, static_cast<int32_t>(dense_u_.size()));
        if (added) {
          dense_u_.emplace_back(c.u, c.u + c.rows);  // converted to S
          dense_u_layer_.push_back(plan_.owners.empty() ? 0 : plan_.layer_of(c.offset));
        }
        coord_u_[static_cast<std::size_t>(k)] = it->second;
      }
      if (c.col < 0) {
        auto [it, added] = v_index.try_emplace(c.v, static_cast<int32_t>(dense_v_.size()));
        if (added) {
          dense_v_.push_back(c.v);
          dense_v_s_.push_back(
              Eigen::Map<const Eigen::Matrix<double, 1, Eigen::Dynamic>>(c.v, c.cols)
                  .template cast<S>());
          dense_v_layer_.push_back(plan_.owners.empty() ? 0 : plan_.layer_of(c.offset));
        }
        coord_v_[static_cast<std::size_t>(k)] = it->second;
      }
    }
  }
  if (PP_HAS_FIELD(&options, pp_session_options, path) && options.path != nullptr &&
      !is(options.path, "auto")) {
    forced_ = options.path;
    const bool known = forced_ == "sparse" || forced_ == "subspace-delta" || forced_ == "dense" ||
                       forced_ == "inplace" || forced_ == "fallback" || forced_ == "site-local";
    if (!known)
      throw std::invalid_argument("unknown path '" + forced_ + "' (paths: " + kPathNames + ")");
  }
  chunk_ = options.chunk_size;
  chunk_auto_ = chunk_ <= 0;
  arena_ = threads_ > 0 ? std::make_unique<tbb::task_arena>(threads_)
                        : std::make_unique<tbb::task_arena>();
  const auto n_layers = static_cast<int32_t>(plan_.layers.size());
  first_host_from_.assign(static_cast<std::size_t>(n_layers) + 1, n_layers);
  for (int32_t l = n_layers - 1; l >= 0; --l)
    first_host_from_[static_cast<std::size_t>(l)] =
        plan_.layers[static_cast<std::size_t>(l)].op == LayerOp::host
            ? l
            : first_host_from_[static_cast<std::size_t>(l) + 1];
  const double copies = static_cast<double>(arena_->max_concurrency()) *
                        static_cast<double>(plan_.n_params) * sizeof(S);
  inplace_for_dense_ = copies > kParamCopiesBudgetBytes;
  kink_.resize(plan_.layers.size());
  build_site_plans();
  layer_path_candidates_.resize(plan_.layers.size() + 1);
  layer_declines_.resize(plan_.layers.size() + 1);
}

template <class S>
void EvaluatorImpl<S>::register_batch(const pp_batch_view& batch) {
  const auto inputs = pp::as_span<const double>(batch.inputs);
  const int64_t rows = pp::rows(batch.inputs), cols = pp::row_size(batch.inputs);
  if (rows <= 0) throw std::invalid_argument("cannot register an empty batch");
  if (cols != plan_.in_features)
    throw std::invalid_argument("batch has " + std::to_string(cols) +
                                " features, the model expects " +
                                std::to_string(plan_.in_features));
  x_ = Eigen::Map<const Mat<double>>(inputs.data(), rows, cols).template cast<S>();
  batch_ = rows;
  incumbent_ready_ = false;  // the prefix activations belong to the old batch
  labels_.clear();
  targets_.clear();
  if (batch.labels.data != nullptr) {
    const auto labels = pp::as_span<const int64_t>(batch.labels);
    labels_.assign(labels.begin(), labels.end());
  }
  if (batch.targets.data != nullptr) {
    const auto targets = pp::as_span<const double>(batch.targets);
    targets_.assign(targets.begin(), targets.end());
  }
  if (chunk_auto_) chunk_ = auto_chunk();
}

template <class S>
int64_t EvaluatorImpl<S>::auto_chunk() const {
  // Per candidate in flight: a few feature-major buffers of the widest layer.
  const double per_candidate = 4.0 * static_cast<double>(std::max<int64_t>(batch_, 1)) *
                               static_cast<double>(plan_.max_width()) * sizeof(S);
  return std::max<int64_t>(1, static_cast<int64_t>(kWorkerBudgetBytes / per_candidate));
}

template <class S>
double EvaluatorImpl<S>::memory_estimate_bytes() const {
  double widths = static_cast<double>(plan_.in_features), weights = 0, kink = 0;
  for (std::size_t l = 0; l < plan_.layers.size(); ++l) {
    const LayerPlan& layer = plan_.layers[l];
    widths += static_cast<double>(layer.out);
    if (layer.op == LayerOp::affine) weights += static_cast<double>(layer.weight_count);
    if (kink_[l].built)
      kink += static_cast<double>(kink_[l].response.size() + kink_[l].inv_room.size());
  }
  const double n = static_cast<double>(plan_.n_params), b = static_cast<double>(batch_);
  const double workers = arena_->max_concurrency();
  const double params = 8.0 * n + sizeof(S) * (n + weights);                 // base, effective, W^T
  const double copies = inplace_for_dense_ ? 0.0 : workers * sizeof(S) * n;  // dense/fallback
  const double activations = 2.0 * sizeof(S) * b * widths;                   // both layouts
  const double in_flight = workers * 4.0 * sizeof(S) * b * static_cast<double>(plan_.max_width()) *
                           static_cast<double>(chunk_);
  return params + copies + activations + in_flight + sizeof(S) * kink;
}

template <class S>
S EvaluatorImpl<S>::effective(int64_t param, double raw) const {
  // As the forward sees it: the parameter in S, then the layer's transform.
  const S value = static_cast<S>(raw);
  if (plan_.owners.empty()) return value;
  const LayerPlan& layer = plan_.layers[static_cast<std::size_t>(plan_.layer_of(param))];
  if (layer.op != LayerOp::affine) return value;  // host layers apply their own transforms
  const pp_scalar_fn q = param - layer.offset < layer.weight_count ? layer.weight_q : layer.bias_q;
  return q == nullptr ? value : static_cast<S>(q(layer.ctx, static_cast<double>(value)));
}

template <class S>
void EvaluatorImpl<S>::set_base(const double* base) {
  const auto n = static_cast<std::size_t>(plan_.n_params);
  base_.assign(base, base + n);
  eff_.resize(n);
  // Vectorised: this runs once per call over every parameter, and on small candidate sets
  // (subspace steps) it is a visible share of the call.
  const Eigen::Map<const Eigen::VectorXd> all(base, plan_.n_params);
  base_sq_ = all.squaredNorm();
  Eigen::Map<Eigen::Matrix<S, Eigen::Dynamic, 1>>(eff_.data(), plan_.n_params) =
      all.template cast<S>();
  // Transforms, layer by layer (no owner lookup per parameter).
  for (const LayerPlan& layer : plan_.layers) {
    if (layer.op != LayerOp::affine || (layer.weight_q == nullptr && layer.bias_q == nullptr))
      continue;
    for (int64_t i = 0; i < layer.count; ++i) {
      const pp_scalar_fn q = i < layer.weight_count ? layer.weight_q : layer.bias_q;
      S& e = eff_[static_cast<std::size_t>(layer.offset + i)];
      if (q != nullptr) e = static_cast<S>(q(layer.ctx, static_cast<double>(e)));
    }
  }
  ++generation_;
}

template <class S>
void EvaluatorImpl<S>::forward_prefix() {
  const std::size_t n_layers = plan_.layers.size();
  acts_.resize(n_layers + 1);
  acts_t_.resize(n_layers + 1);
  weights_t_.resize(n_layers);
  acts_[0] = x_;
  for (std::size_t l = 0; l < n_layers; ++l)
    forward_layer(plan_.layers[l], acts_[l], eff_.data(), acts_[l + 1]);
  for (std::size_t l = 0; l <= n_layers; ++l) acts_t_[l] = acts_[l].transpose();
  for (std::size_t l = 0; l < n_layers; ++l) {
    const LayerPlan& layer = plan_.layers[l];
    if (layer.op == LayerOp::affine)
      weights_t_[l] =
          Eigen::Map<const Mat<S>>(eff_.data() + layer.offset, layer.out, layer.in).transpose();
  }
  v_src_.resize(static_cast<int64_t>(dense_v_.size()), batch_);
  for (std::size_t j = 0; j < dense_v_.size(); ++j) {
    const Mat<S>& a = acts_[static_cast<std::size_t>(dense_v_layer_[j])];
    const Eigen::Matrix<S, Eigen::Dynamic, 1> v =
        Eigen::Map<const Eigen::VectorXd>(dense_v_[j], a.cols()).template cast<S>();
    v_src_.row(static_cast<int64_t>(j)) = (a * v).transpose();
  }
  base_loss_ = rows_loss(acts_.back(), 0) + l2_ * base_sq_;
  if (loss_ == kernels::LossKind::cross_entropy) {
    const Mat<S>& z = acts_t_.back();
    probs_t_.resize(z.rows(), batch_);
    one_hot_t_.setZero(z.rows(), batch_);
    sample_loss_.resize(batch_);
    for (int64_t b = 0; b < batch_; ++b) {
      const S m = z.col(b).maxCoeff();
      probs_t_.col(b) = (z.col(b).array() - m).exp().matrix();
      const S total = probs_t_.col(b).sum();
      probs_t_.col(b) /= total;
      const int64_t y = labels_[static_cast<std::size_t>(b)];
      one_hot_t_(y, b) = S(1);
      sample_loss_(b) = m + std::log(total) - z(y, b);
    }
  }
}

template <class S>
Decline EvaluatorImpl<S>::build_terms(const Candidates& c, int64_t particle, std::vector<Term>& out,
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
    if (!subspace_mode_) {
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
      if (coord >= subspace_->dimension)
        throw std::out_of_range("subspace coordinate " + std::to_string(coord) +
                                " is outside [0, " + std::to_string(subspace_->dimension) + ")");
      const pp_subspace_coord& sc = subspace_->coords[coord];
      t.layer = plan_.layer_of(sc.offset);
      const LayerPlan& layer = plan_.layers[static_cast<std::size_t>(t.layer)];
      const bool weight = sc.offset == layer.offset && sc.rows == layer.out && sc.cols == layer.in;
      const bool bias = layer.has_bias && sc.offset == layer.offset + layer.weight_count &&
                        sc.rows == layer.out && sc.cols == 1;
      t.row = sc.row;
      t.u_index = coord_u_[static_cast<std::size_t>(coord)];
      if (weight) {
        t.col = sc.col >= 0 ? sc.col : kDenseV;
        t.v_index = coord_v_[static_cast<std::size_t>(coord)];
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

template <class S>
void EvaluatorImpl<S>::plan_groups(const Candidates& c) {
  groups_.clear();
  terms_.clear();
  path_candidates_.fill(0);
  for (auto& a : layer_path_candidates_) a.fill(0);
  for (auto& a : layer_declines_) a.fill(0);
  first_layer_candidates_.assign(plan_.layers.size(), 0);
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
      g.site_why = site_local_decline(g, true);
    } else if (g.why == Decline::none && !force_site) {
      g.path = Path::delta;
      first_layer_candidates_[static_cast<std::size_t>(g.first_layer)] += run_end - begin;
    } else {
      g.site_why = site_local_decline(g, force_delta);
      if (g.site_why == Decline::none)
        g.path = Path::site_local;
      else
        g.path = inplace_for_dense_ ? Path::inplace : Path::dense;
      if (force_site && g.why == Decline::none) g.why = Decline::forced;
    }
    // A particle outside site-local layers says nothing about the site-local path unless
    // that path was requested.
    if (g.site_why == Decline::site_not_declared && !force_site) g.site_why = Decline::none;
    const auto layer = static_cast<std::size_t>(g.first_layer);
    layer_path_candidates_[layer][static_cast<int>(g.path)] += run_end - begin;
    layer_declines_[layer][static_cast<int>(g.why)] += run_end - begin;
    if (g.site_why != Decline::none)
      layer_declines_[layer][static_cast<int>(g.site_why)] += run_end - begin;
    path_candidates_[static_cast<int>(g.path)] += run_end - begin;
    // Blocks of at most chunk_ candidates; they break at particle boundaries and only
    // split a particle whose candidates alone exceed the chunk.
    for (int64_t b = begin; b < run_end; b += chunk_) {
      g.begin = b;
      g.end = std::min(run_end, b + chunk_);
      groups_.push_back(g);
    }
    begin = run_end;
  }
}

template <class S>
void EvaluatorImpl<S>::run_groups(const Candidates& c, double* losses) {
  arena_->execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, groups_.size()),
                      [&](const tbb::blocked_range<std::size_t>& range) {
                        Scratch& s = scratch_.local();
                        for (std::size_t i = range.begin(); i != range.end(); ++i)
                          if (groups_[i].path != Path::inplace)
                            evaluate_group(c, groups_[i], s, losses);
                      });
  });
  // In-place groups share one parameter copy: one at a time, parallel inside.
  Scratch& s = scratch_.local();
  for (const Group& g : groups_)
    if (g.path == Path::inplace) evaluate_inplace(c, g, s, losses);
}

template <class S>
void EvaluatorImpl<S>::evaluate_group(const Candidates& c, const Group& g, Scratch& s,
                                      double* losses) const {
  switch (g.path) {
    case Path::delta:
      evaluate_delta(c, g, s, losses);
      return;
    case Path::dense:
      evaluate_dense(c, g, s, losses);
      return;
    case Path::fallback:
      evaluate_fallback(c, g, s, losses);
      return;
    case Path::site_local:
      evaluate_site_local(c, g, s, losses);
      return;
    case Path::incumbent:
      std::fill(losses + g.begin, losses + g.end, base_loss_);
      return;
    case Path::inplace:
    case Path::count:
      break;
  }
}

template <class S>
void EvaluatorImpl<S>::collect_touched(const Candidates& c, int64_t particle, Scratch& s) const {
  const int32_t d = c.d;
  s.entries.clear();
  for (int32_t k = 0; k < d; ++k) {
    const int64_t coord = c.coords[particle * d + k];
    if (coord < 0) continue;
    if (!subspace_mode_) {
      if (coord >= plan_.n_params) throw std::out_of_range("coordinate out of range");
      s.entries.push_back({coord, {k, 1.0}});
      continue;
    }
    if (coord >= subspace_->dimension) throw std::out_of_range("subspace coordinate out of range");
    const pp_subspace_coord& sc = subspace_->coords[coord];
    for (int64_t r = 0; r < sc.rows; ++r) {
      if (sc.row >= 0 && r != sc.row) continue;
      const double ur = sc.row >= 0 ? 1.0 : sc.u[r];
      for (int64_t i = 0; i < sc.cols; ++i) {
        if (sc.col >= 0 && i != sc.col) continue;
        s.entries.push_back({sc.offset + r * sc.cols + i, {k, sc.col >= 0 ? ur : ur * sc.v[i]}});
      }
    }
  }
  std::sort(s.entries.begin(), s.entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  s.touched.clear();
  s.coef.clear();
  for (const auto& [param, kc] : s.entries) {
    if (s.touched.empty() || s.touched.back() != param) {
      s.touched.push_back(param);
      s.coef.resize(s.coef.size() + static_cast<std::size_t>(d), 0.0);
    }
    s.coef[(s.touched.size() - 1) * static_cast<std::size_t>(d) +
           static_cast<std::size_t>(kc.first)] += kc.second;
  }
  s.raw.resize(s.touched.size());
}

template <class S>
double EvaluatorImpl<S>::l2_term(const Candidates& c, const Group& g, int64_t cand,
                                 Scratch& s) const {
  if (l2_ == 0.0) return 0.0;
  const int32_t d = c.d;
  const double* delta = c.displacement + cand * d;
  double sq = base_sq_;
  if (!subspace_mode_) {
    for (int32_t k = 0; k < d; ++k) {
      const int64_t coord = c.coords[g.particle * d + k];
      if (coord < 0) continue;
      const double b = base_[static_cast<std::size_t>(coord)];
      sq += (b + delta[k]) * (b + delta[k]) - b * b;
    }
    return l2_ * sq;
  }
  // s.touched / s.coef describe this group's particle (collect_touched).
  for (std::size_t t = 0; t < s.touched.size(); ++t) {
    double raw = base_[static_cast<std::size_t>(s.touched[t])];
    for (int32_t k = 0; k < d; ++k)
      raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
    const double b = base_[static_cast<std::size_t>(s.touched[t])];
    sq += raw * raw - b * b;
  }
  return l2_ * sq;
}

template <class S>
void EvaluatorImpl<S>::evaluate(const Candidates& c, double* losses, double* incumbent_loss,
                                uint64_t incumbent_version) {
  if (batch_ == 0) throw std::logic_error("score before set_batch");
  if (c.n_params != plan_.n_params)
    throw std::invalid_argument("base parameter vector has " + std::to_string(c.n_params) +
                                " entries, the model has " + std::to_string(plan_.n_params));
  if (!incumbent_ready_ || incumbent_version != incumbent_version_) {
    set_base(c.base_params);
    forward_prefix();
    incumbent_version_ = incumbent_version;
    incumbent_ready_ = true;
  }
  if (incumbent_loss != nullptr) *incumbent_loss = base_loss_;
  if (c.count == 0) return;
  for (;;) {
    try {
      plan_groups(c);
      prepare_site_local();
      build_kink_tables();
      build_direction_tables();
      run_groups(c, losses);
      return;
    } catch (const std::bad_alloc&) {
      // Too much held at once: halve the chunk and run the whole set again.
      if (chunk_ <= 1) throw;
      chunk_ = std::max<int64_t>(1, chunk_ / 2);
      ++chunk_halvings_;
      scratch_.clear();
      for (KinkTable& k : kink_) k = KinkTable{};
    }
  }
}

template <class S>
const char* EvaluatorImpl<S>::explain() {
  using nlohmann::json;
  json layers = json::array();
  for (std::size_t l = 0; l < plan_.layers.size(); ++l) {
    const LayerPlan& layer = plan_.layers[l];
    json paths = json::object(), declined = json::array();
    for (int p = 0; p < kPathCount; ++p)
      if (layer_path_candidates_[l][static_cast<std::size_t>(p)] > 0)
        paths[path_name(static_cast<Path>(p), subspace_mode_)] =
            layer_path_candidates_[l][static_cast<std::size_t>(p)];
    for (int w = 1; w < static_cast<int>(Decline::count); ++w)
      if (layer_declines_[l][static_cast<std::size_t>(w)] > 0)
        declined.push_back({{"why", decline_text(static_cast<Decline>(w))},
                            {"candidates", layer_declines_[l][static_cast<std::size_t>(w)]}});
    json entry = {
        {"layer", l},
        {"kind", layer.view->kind},
        {"runs_as",
         layer.op == LayerOp::elementwise && layer.is_relu ? "relu (native)" : op_name(layer.op)},
        {"parameters", layer.count},
        {"candidates_starting_here", paths},
        {"declined", declined},
        {"kink_tables", kink_[l].built}};
    if (!layer.probe_note.empty()) entry["contract_not_trusted"] = layer.probe_note;
    if (site_[l].declared)
      entry["site_local"] = site_[l].usable() ? "yes (probed)" + site_[l].attention : site_[l].note;
    layers.push_back(entry);
  }
  json counts = json::object();
  for (int p = 0; p < kPathCount; ++p)
    counts[path_name(static_cast<Path>(p), subspace_mode_)] =
        path_candidates_[static_cast<std::size_t>(p)];
  json j = {{"plugin", "cpu_tbb"},
            {"dtype", std::is_same_v<S, float> ? "float32" : "float64"},
            {"threads", arena_->max_concurrency()},
            {"space", subspace_mode_ ? std::string("subspace (") + subspace_->kind + ")" : "full"},
            {"forced_path", forced_.empty() ? "auto" : forced_},
            {"chunk_size", chunk_},
            {"chunk_size_automatic", chunk_auto_},
            {"chunk_halvings", chunk_halvings_},
            {"memory_estimate_bytes", memory_estimate_bytes()},
            {"dense_uses_inplace", inplace_for_dense_},
            {"prefix_reuse", plan_.no_prefix_reuse.empty() ? "yes" : plan_.no_prefix_reuse},
            {"last_call_candidates_per_path", counts},
            {"layers", layers},
            {"paths",
             {{"sparse",
               "full space: the particle's change propagates as a delta, sparse through "
               "elementwise layers, dense one affine layer later"},
              {"subspace-delta", "rank-one subspace coordinates propagate as deltas"},
              {"dense",
               "the changed layers' weights materialised per candidate, later layers one "
               "GEMM over the particle's candidates"},
              {"inplace", "apply, score, revert on one shared parameter copy"},
              {"fallback", "the whole forward of each materialised candidate"},
              {"site-local",
               "a particle in one conv or attention layer: only the output channels or heads "
               "it owns recomputed per candidate, the suffix one pass over the group"}}}};
  explain_ = j.dump();
  return explain_.c_str();
}

template class EvaluatorImpl<float>;
template class EvaluatorImpl<double>;

std::string unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                               const pp_session_options& options) {
  if (options.device != PP_DEVICE_CPU) return "it runs on the cpu only";
  if (options.dtype != PP_DTYPE_F32 && options.dtype != PP_DTYPE_F64)
    return std::string("it computes in float32 or float64, not ") + pp::dtype_name(options.dtype);
  if (kernels::loss_kind(loss.name) == kernels::LossKind::unknown)
    return std::string("unknown loss '") + (loss.name ? loss.name : "") + "'";
  for (int32_t i = 0; i < model.n_layers; ++i)
    if (model.layers[i].host_forward == nullptr)
      return "layer " + std::to_string(i) + " (" + model.layers[i].kind + ") has no host forward";
  // NOLINTNEXTLINE(bugprone-sizeof-expression): the field is a pointer; its size is the check
  if (PP_HAS_FIELD(&options, pp_session_options, subspace) && options.subspace != nullptr &&
      options.subspace->n_params != model.n_params)
    return "the subspace maps into " + std::to_string(options.subspace->n_params) +
           " parameters, the model has " + std::to_string(model.n_params);
  return {};
}

std::unique_ptr<CandidateEvaluator> make_candidate_evaluator(const pp_model_view& model,
                                                             const pp_loss_view& loss,
                                                             const pp_session_options& options) {
  if (const std::string why = unsupported_reason(model, loss, options); !why.empty())
    throw std::invalid_argument(why);
  if (options.dtype == PP_DTYPE_F32)
    return std::make_unique<EvaluatorImpl<float>>(model, loss, options);
  return std::make_unique<EvaluatorImpl<double>>(model, loss, options);
}

}  // namespace polyprobe::cpu_tbb
