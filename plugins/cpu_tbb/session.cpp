#include "session.hpp"

#include "active_mask.hpp"

#include <polyprobe/plugin/kernels/coordinate_runs.hpp>
#include <polyprobe/plugin/kernels/subspace_move.hpp>
#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace polyprobe::cpu_tbb {

namespace {
std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }
}  // namespace

Session::Session(std::unique_ptr<CandidateEvaluator> evaluator, int64_t n_params,
                 const pp_subspace_view* subspace, int threads)
    : evaluator_(std::move(evaluator)),
      n_params_(n_params),
      subspace_(subspace),
      arena_(threads > 0 ? std::make_unique<tbb::task_arena>(threads)
                         : std::make_unique<tbb::task_arena>()) {}

void Session::set_batch(const pp_batch_view& batch) { evaluator_->register_batch(batch); }

void Session::set_particles(const pp_particle_layout& layout) {
  if (layout.d < 1 || layout.n_particles < 0)
    throw std::invalid_argument("particle layout: d must be at least 1");
  if (layout.n_probes < 1) throw std::invalid_argument("particle layout: K must be at least 1");
  const int64_t limit = subspace_ != nullptr ? subspace_->dimension : n_params_;
  const int64_t n = layout.n_particles * layout.d;
  for (int64_t i = 0; i < n; ++i)
    if (layout.coords[i] < -1 || layout.coords[i] >= limit)
      throw std::invalid_argument("particle layout: coordinate " +
                                  std::to_string(layout.coords[i]) + " is outside [0, " +
                                  std::to_string(limit) + ")");
  d_ = layout.d;
  coords_.assign(layout.coords, layout.coords + n);
  std::vector<bool> seen(subspace_ != nullptr ? 0 : idx(n_params_), false);  // a bit each
  distinct_coords_ =
      subspace_ == nullptr && std::all_of(coords_.begin(), coords_.end(), [&](int64_t c) {
        if (c < 0) return true;
        if (seen[idx(c)]) return false;
        seen[idx(c)] = true;
        return true;
      });
  runs_ = distinct_coords_ ? kernels::long_coordinate_runs(coords_)
                           : std::vector<kernels::CoordinateRun>();
  vertices_ = layout.n_vertices;
  probes_ = layout.n_probes;
  ++layout_generation_;
  expanded_layout_ = 0;
}

void Session::set_incumbent(const pp_tensor& theta) {
  if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_TYPE_CPU ||
      pp::numel(theta) != n_params_)
    throw std::invalid_argument("set_incumbent: expected " + std::to_string(n_params_) +
                                " float64 values in host memory");
  const auto values = pp::as_span<const double>(theta);
  incumbent_.assign(values.begin(), values.end());
  has_incumbent_ = true;
  ++version_;
}

void Session::move_incumbent(const double* moves) {
  if (!has_incumbent_) throw std::logic_error("move_incumbent before set_incumbent");
  if (!runs_.empty()) {
    // Each entry is added to once: runs, and blocks of them in parallel, give the serial
    // coordinate loop's bits.
    arena_->execute([&] {
      for (const kernels::CoordinateRun& run : runs_)
        tbb::parallel_for(tbb::blocked_range<int64_t>(0, run.count, 16384),
                          [&](const tbb::blocked_range<int64_t>& r) {
                            kernels::add_run_moves(run, r.begin(), r.end(), moves,
                                                   incumbent_.data());
                          });
    });
  } else if (distinct_coords_) {
    // Each entry is added to once: blocks in parallel give the serial loop's bits.
    arena_->execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, coords_.size(), 16384),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          for (std::size_t c = r.begin(); c != r.end(); ++c)
                            if (coords_[c] >= 0) incumbent_[idx(coords_[c])] += moves[c];
                        });
    });
  } else if (subspace_ != nullptr) {
    std::vector<kernels::SubspaceMove> along;
    along.reserve(coords_.size());
    for (std::size_t c = 0; c < coords_.size(); ++c)
      if (coords_[c] >= 0) along.push_back({subspace_->coords[coords_[c]], moves[c]});
    kernels::apply_subspace_moves(along, incumbent_.data());
  } else {
    for (std::size_t c = 0; c < coords_.size(); ++c)
      if (coords_[c] >= 0) incumbent_[idx(coords_[c])] += moves[c];
  }
  ++version_;
}

Candidates Session::base_candidates() const {
  Candidates c;
  c.d = d_;
  c.n_particles = d_ > 0 ? static_cast<int64_t>(coords_.size()) / d_ : 0;
  c.coords = coords_.data();
  c.base_params = incumbent_.data();
  c.n_params = n_params_;
  return c;
}

void Session::score(const pp_score_request& r, double* losses, double* incumbent_loss) {
  last_expand_ms_ = 0;
  if (!has_incumbent_) throw std::logic_error("score before set_incumbent");
  Candidates c = base_candidates();
  if (r.form == PP_CANDIDATES_EXPLICIT) {
    if (r.count > 0 && d_ == 0) throw std::logic_error("score before set_particles");
    for (int64_t i = 0; i < r.count; ++i)
      if (r.particle[i] < 0 || r.particle[i] >= c.n_particles)
        throw std::invalid_argument("candidate " + std::to_string(i) + " moves particle " +
                                    std::to_string(r.particle[i]) + " of " +
                                    std::to_string(c.n_particles));
    c.count = r.count;
    c.particle = r.particle;
    c.displacement = r.displacement;
    evaluator_->evaluate(c, losses, incumbent_loss, version_);
    return;
  }
  if (r.form != PP_CANDIDATES_POLYTOPE)
    throw std::invalid_argument("score: unknown candidate form " + std::to_string(r.form));
  if (vertices_ == 0) throw std::logic_error("score: the particle layout has no polytope");
  // Expand the step: candidate (i, v, k) at probe_radius * k / (K + 1) * direction (i, v),
  // the optimizer's own expression, so the displacements are its bits.
  const int64_t P = c.n_particles, V = vertices_;
  const int32_t K = probes_;
  // Every particle's candidates, in particle order, whatever the mask: one layout, so the
  // evaluator plans it once and a mask (a rank's slice or chunk, adaptive_probes' reuse) only
  // selects its particles' groups.
  if (expanded_layout_ != layout_generation_) {
    expanded_layout_ = 0;  // until rebuilt
    particle_.resize(idx(P * V * K));
    for (int64_t i = 0; i < P; ++i)
      std::fill_n(particle_.begin() + static_cast<std::ptrdiff_t>(i * V * K), V * K, i);
    expanded_layout_ = layout_generation_;
    ++structure_key_;
  }
  const auto expand_start = std::chrono::steady_clock::now();
  displacement_.resize(particle_.size() * idx(d_));
  const double* directions = r.directions;
  const double radius = r.probe_radius;
  arena_->execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, P, 1024),
                      [&](const tbb::blocked_range<int64_t>& range) {
                        const auto expand = [&](int64_t i) {
                          double* out = displacement_.data() + i * V * K * d_;
                          for (int64_t v = 0; v < V; ++v)
                            for (int32_t k = 1; k <= K; ++k) {
                              const double scale = radius * k / (K + 1.0);
                              const double* dir = directions + (i * V + v) * d_;
                              for (int32_t j = 0; j < d_; ++j) *out++ = scale * dir[j];
                            }
                        };
                        if (r.active == nullptr)
                          for (int64_t i = range.begin(); i != range.end(); ++i) expand(i);
                        else
                          for_each_active(r.active, range.begin(), range.end(), expand);
                      });
  });
  last_expand_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - expand_start)
          .count();
  c.count = static_cast<int64_t>(particle_.size());
  c.particle = particle_.data();
  c.displacement = displacement_.data();
  c.structure_key = structure_key_;
  c.step_candidates_per_particle = V * K;
  c.layout_key = layout_generation_;
  c.active = r.active;
  evaluator_->evaluate(c, losses, incumbent_loss, version_);
}

const char* Session::explain() {
  nlohmann::json j = nlohmann::json::parse(evaluator_->explain());
  if (j.contains("last_call_ms")) j["last_call_ms"]["expand"] = last_expand_ms_;
  explain_ = j.dump();
  return explain_.c_str();
}

void Session::read_incumbent(pp_tensor& theta) const {
  if (!has_incumbent_) throw std::logic_error("read_incumbent before set_incumbent");
  if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_TYPE_CPU ||
      pp::numel(theta) != n_params_)
    throw std::invalid_argument("read_incumbent: expected room for " + std::to_string(n_params_) +
                                " float64 values in host memory");
  std::copy(incumbent_.begin(), incumbent_.end(), static_cast<double*>(theta.data));
}

}  // namespace polyprobe::cpu_tbb
