// The evaluation context of the cpu_tbb evaluator (context.hpp).
#include "context.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace polyprobe::cpu_tbb {

template <class S>
EvaluationContext<S>::EvaluationContext(const pp_model_view& model, const pp_loss_view& loss_view,
                                        const pp_session_options& options)
    : plan(build_model_plan(model)),
      loss(kernels::loss_kind(loss_view.name)),
      l2(loss_view.l2),
      threads(options.threads),
      arena(options.threads > 0 ? std::make_unique<tbb::task_arena>(options.threads)
                                : std::make_unique<tbb::task_arena>()) {
  // NOLINTNEXTLINE(bugprone-sizeof-expression): the field is a pointer; its size is the check
  if (PP_HAS_FIELD(&options, pp_session_options, host)) host = options.host;
  // The field is a pointer and its size is the point of the check.
  // NOLINTNEXTLINE(bugprone-sizeof-expression)
  if (PP_HAS_FIELD(&options, pp_session_options, subspace) && options.subspace != nullptr) {
    subspace = options.subspace;
    subspace_mode = true;
    if (subspace->n_params != plan.n_params)
      throw std::invalid_argument("the subspace maps into " + std::to_string(subspace->n_params) +
                                  " parameters, the model has " + std::to_string(plan.n_params));
    std::unordered_map<const double*, int32_t> u_index, v_index;
    coord_u.assign(static_cast<std::size_t>(subspace->dimension), -1);
    coord_v.assign(static_cast<std::size_t>(subspace->dimension), -1);
    for (int64_t k = 0; k < subspace->dimension; ++k) {
      const pp_subspace_coord& c = subspace->coords[k];
      if (c.offset < 0 || c.offset + c.rows * c.cols > plan.n_params)
        throw std::invalid_argument("subspace coordinate " + std::to_string(k) +
                                    " lies outside the parameters");
      if (c.row < 0) {
        auto [it, added] = u_index.try_emplace(c.u, static_cast<int32_t>(dense_u.size()));
        if (added) {
          dense_u.emplace_back(c.u, c.u + c.rows);  // converted to S
          dense_u_layer.push_back(plan.owners.empty() ? 0 : plan.layer_of(c.offset));
        }
        coord_u[static_cast<std::size_t>(k)] = it->second;
      }
      if (c.col < 0) {
        auto [it, added] = v_index.try_emplace(c.v, static_cast<int32_t>(dense_v_s.size()));
        if (added) {
          dense_v_s.push_back(
              Eigen::Map<const Eigen::Matrix<double, 1, Eigen::Dynamic>>(c.v, c.cols)
                  .template cast<S>());
          dense_v_layer.push_back(plan.owners.empty() ? 0 : plan.layer_of(c.offset));
        }
        coord_v[static_cast<std::size_t>(k)] = it->second;
      }
    }
  }
  projections = std::make_unique<DirectionProjections<S>>(plan, dense_v_s, dense_v_layer, host);
}

template <class S>
void EvaluationContext<S>::collect_touched(const Candidates& c, int64_t particle,
                                           WorkerScratch<S>& s) const {
  const int32_t d = c.d;
  s.entries.clear();
  for (int32_t k = 0; k < d; ++k) {
    const int64_t coord = c.coords[particle * d + k];
    if (coord < 0) continue;
    if (!subspace_mode) {
      if (coord >= plan.n_params) throw std::out_of_range("coordinate out of range");
      s.entries.push_back({coord, {k, 1.0}});
      continue;
    }
    if (coord >= subspace->dimension) throw std::out_of_range("subspace coordinate out of range");
    const pp_subspace_coord& sc = subspace->coords[coord];
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
double EvaluationContext<S>::l2_term(const Candidates& c, const Group& g, int64_t cand,
                                     const WorkerScratch<S>& s) const {
  if (l2 == 0.0) return 0.0;
  const int32_t d = c.d;
  const double* delta = c.displacement + cand * d;
  double sq = inc.base_sq;
  if (!subspace_mode) {
    for (int32_t k = 0; k < d; ++k) {
      const int64_t coord = c.coords[g.particle * d + k];
      if (coord < 0) continue;
      const double b = inc.base[static_cast<std::size_t>(coord)];
      sq += (b + delta[k]) * (b + delta[k]) - b * b;
    }
    return l2 * sq;
  }
  // s.touched / s.coef describe this group's particle (collect_touched).
  for (std::size_t t = 0; t < s.touched.size(); ++t) {
    double raw = inc.base[static_cast<std::size_t>(s.touched[t])];
    for (int32_t k = 0; k < d; ++k)
      raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
    const double b = inc.base[static_cast<std::size_t>(s.touched[t])];
    sq += raw * raw - b * b;
  }
  return l2 * sq;
}

template struct EvaluationContext<float>;
template struct EvaluationContext<double>;

}  // namespace polyprobe::cpu_tbb
