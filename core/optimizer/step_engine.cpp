// One optimizer step, independent of how candidates are scored.
#include "step_engine.hpp"

#include "metric.hpp"
#include "quadratic_fit.hpp"
#include "row_chunks.hpp"
#include "state_io.hpp"
#include "transport_threads.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace polyprobe::detail {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// metric = bfgs learns only from moves at least this long, in probe radii (apply_metric).
constexpr double kMetricMinMove = 0.5;

// Particles per chunk of the step's parallel loops (fixed: step_threads.hpp).
constexpr int64_t kParticleGrain = 1024;

// Written first in a checkpoint: the rotation stream it continues. Version 2 is the
// counter-based Philox stream; version 1 checkpoints (std::mt19937_64 state) cannot resume
// the same trajectory.
constexpr int64_t kRotationStream = 2;

ScheduleSettings schedule_settings(const OptimizerConfig& c) {
  ScheduleSettings s;
  s.kind = c.schedule;
  s.epsilon = c.epsilon;
  s.epsilon_final = c.epsilon_final;
  s.total_steps = c.total_steps;
  s.decay_steps = c.schedule_decay_steps;
  s.power = c.schedule_power;
  s.decay_rate = c.schedule_decay_rate;
  return s;
}

std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }

// scaled <- cost with every non-finite entry replaced by a finite penalty above every finite
// cost of the block, so a diverging candidate repels mass instead of poisoning the solve, then
// scaled as scale_cost (transport.hpp) does: its statistic (the mean or maximum magnitude, or
// the range) over the penalised block. False when no cost is finite. This process's chunks of
// rows (RowChunks), in parallel; one exchange carries each chunk's partials: the worst finite
// cost, the counts of finite and non-finite entries and the statistic's parts over the finite
// entries, with the penalties' share added once the penalty is known (in chunk order: the bits
// depend on neither the thread nor the process count).
bool penalise_and_scale(const ConstMatrixRef<double>& cost, MatrixRef<double> scaled, double margin,
                        CostScaling scaling, const RowChunks& chunks, const StepThreads& threads) {
  const auto cols = cost.cols();
  constexpr int64_t kWidth = 5;  // worst, finite, non-finite, then sum |c| / max |c| / min c
  std::vector<double> partial(idx(chunks.count() * kWidth));
  chunks.for_own(threads, [&](int64_t chunk, int64_t begin, int64_t end) {
    double worst = -std::numeric_limits<double>::infinity();
    double a = scaling == CostScaling::min_max ? std::numeric_limits<double>::infinity() : 0.0;
    int64_t finite = 0, nonfinite = 0;
    for (Eigen::Index i = begin; i < end; ++i)
      for (Eigen::Index v = 0; v < cols; ++v) {
        const double c = cost(i, v);
        scaled(i, v) = c;
        if (!std::isfinite(c)) {
          ++nonfinite;
          continue;
        }
        ++finite;
        worst = std::max(worst, c);
        if (scaling == CostScaling::mean) a += std::abs(c);
        if (scaling == CostScaling::max_cost) a = std::max(a, std::abs(c));
        if (scaling == CostScaling::min_max) a = std::min(a, c);
      }
    double* out = partial.data() + kWidth * chunk;
    out[0] = worst;
    out[1] = static_cast<double>(finite);
    out[2] = static_cast<double>(nonfinite);
    out[3] = a;
  });
  chunks.share_chunks(partial, kWidth, "the cost matrix's worst finite cost and scale");
  double worst = -std::numeric_limits<double>::infinity();
  bool any_finite = false, any_nonfinite = false;
  for (int64_t c = 0; c < chunks.count(); ++c) {
    worst = std::max(worst, partial[idx(kWidth * c)]);
    any_finite = any_finite || partial[idx(kWidth * c + 1)] != 0;
    any_nonfinite = any_nonfinite || partial[idx(kWidth * c + 2)] != 0;
  }
  if (!any_finite) return false;
  const double penalty = worst + margin * (1 + std::abs(worst));
  // The statistic over the penalised block: each chunk's non-finite entries count as penalties.
  double a = scaling == CostScaling::min_max ? std::numeric_limits<double>::infinity() : 0.0;
  for (int64_t c = 0; c < chunks.count(); ++c) {
    const double part = partial[idx(kWidth * c + 3)], nonfinite = partial[idx(kWidth * c + 2)];
    if (scaling == CostScaling::mean)
      a += nonfinite > 0 ? part + nonfinite * std::abs(penalty) : part;
    if (scaling == CostScaling::max_cost)
      a = std::max(a, nonfinite > 0 ? std::max(part, std::abs(penalty)) : part);
    if (scaling == CostScaling::min_max) a = std::min(a, part);  // the penalty is above it
  }
  double shift = 0, divisor = 1;
  if (scaling == CostScaling::mean) divisor = a / static_cast<double>(scaled.size());
  if (scaling == CostScaling::max_cost) divisor = a;
  if (scaling == CostScaling::min_max) shift = a, divisor = (any_nonfinite ? penalty : worst) - a;
  if (!(divisor > 0)) divisor = 1;
  if (!any_nonfinite && shift == 0 && divisor == 1) return true;
  chunks.for_own(threads, [&](int64_t, int64_t begin, int64_t end) {
    for (Eigen::Index i = begin; i < end; ++i)
      for (Eigen::Index v = 0; v < cols; ++v) {
        double& c = scaled(i, v);
        if (!std::isfinite(c)) c = penalty;
        if (shift != 0) c -= shift;
        if (divisor != 1) c /= divisor;
      }
  });
  return true;
}

// Flags travel through the checkpoint as doubles (state_io has no other vector type).
std::vector<double> flags(const std::vector<char>& values) {
  return {values.begin(), values.end()};
}

std::vector<char> from_flags(const std::vector<double>& values) {
  std::vector<char> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = values[i] != 0 ? 1 : 0;
  return out;
}

}  // namespace

StepEngine::StepEngine(const OptimizerConfig& config, int32_t d, int64_t particles,
                       std::vector<BlockRange> blocks, TransportSolver solver)
    : config_(config),
      d_(d),
      particles_(particles),
      vertices_(polytope_vertex_count(config.polytope, d)),
      probes_(config.num_probe),
      amortize_(config.amortize_steps),
      blocks_(std::move(blocks)),
      solver_(solver),
      template_(make_template(config.polytope, d)),
      schedule_(schedule_settings(config)),
      radius_(make_radius_model(config.radius)),
      rotation_method_(resolve_rotation_method(config.rotation, particles, d)) {
  if (solver_ == TransportSolver::automatic)
    throw Error("StepEngine: the transport solver must be resolved before construction");
  if (solver_ == TransportSolver::top_k && config.top_k > vertices_)
    throw Error("solver top_k needs top_k <= V = " + std::to_string(vertices_) + ", got " +
                std::to_string(config.top_k));
  int64_t next = 0;
  for (const BlockRange& b : blocks_) {
    if (b.first != next || b.count <= 0)
      throw Error("StepEngine: blocks must tile the particles in order without gaps");
    next += b.count;
  }
  if (next != particles_)
    throw Error("StepEngine: blocks cover " + std::to_string(next) + " of " +
                std::to_string(particles_) + " particles");
  // Sinkhorn's uniform vertex marginal pins a block of one particle to uniform weights, whose
  // barycentre is the centre: that block could never move. The automatic choice falls back to
  // the softmax rule for such blocks (solve_block); asking for sinkhorn by name is an error.
  if (solver_ == TransportSolver::sinkhorn && config.solver == TransportSolver::sinkhorn)
    for (const BlockRange& b : blocks_)
      if (b.count == 1)
        throw Error(
            "solver sinkhorn cannot move a transport block of one particle (its uniform "
            "vertex marginal forces uniform weights); use solver softmax, or leave the solver "
            "automatic, or give the block more particles (smaller particle_dim, other blocks)");
  duals_.resize(blocks_.size());
  const auto pd = idx(particles_ * d_);
  velocity_.assign(pd, 0.0);
  cache_costs_.assign(idx(particles_ * vertices_), 0.0);
  cache_rotations_.assign(pd * idx(d_), 0.0);
  cache_valid_.assign(idx(particles_), 0);
  reused_.assign(idx(particles_), 0);
  if (config_.metric == MetricKind::bfgs) {
    metric_inverse_.assign(pd * idx(d_), 0.0);
    for (int64_t i = 0; i < particles_; ++i)
      for (int32_t j = 0; j < d_; ++j) metric_inverse_[idx((i * d_ + j) * d_ + j)] = 1.0;
    metric_factor_ = metric_inverse_;
    metric_gradient_.assign(pd, 0.0);
    metric_gradient_valid_.assign(idx(particles_), 0);
    metric_started_.assign(idx(particles_), 0);
  }
}

double StepEngine::momentum_coefficient() const {
  const double progress =
      run_progress_
          ? std::clamp(*run_progress_, 0.0, 1.0)
          : std::min(1.0, static_cast<double>(step_) /
                              static_cast<double>(std::max<int64_t>(1, config_.total_steps)));
  return config_.momentum_init + (config_.momentum_final - config_.momentum_init) * progress;
}

StepInfo StepEngine::begin_info() const {
  StepInfo info;
  info.step = step_;
  info.predicted_change = kNaN;
  info.trust_ratio = kNaN;
  info.mean_cost = kNaN;
  info.best_cost = kNaN;
  info.incumbent_loss = kNaN;
  return info;
}

StepInfo StepEngine::scored_info() const {
  StepInfo info = begin_info();
  info.epsilon = epsilon_;
  info.probe_radius = probe_r_;
  return info;
}

void StepEngine::plan(uint64_t objective_key, std::span<const ParticleRange> only,
                      bool leave_rotations) {
  if (!next_is_scored()) throw Error("StepEngine::plan on a momentum-only step; call coast()");
  key_ = objective_key;
  epsilon_ = schedule_.at(step_, run_progress_);
  const RadiusMultipliers m = radius_->multipliers();
  probe_r_ = config_.probe_radius * epsilon_ * m.probe;
  step_r_plan_ = config_.step_radius * epsilon_ * m.step;

  const auto P = particles_, V = vertices_;
  const int64_t dd = int64_t{d_} * d_;
  rotations_.resize(idx(P * dd));
  directions_.resize(idx(P * V * d_));
  const bool shaped = config_.metric == MetricKind::bfgs;
  if (shaped) sheared_.resize(idx(P * V * d_));
  const bool may_reuse = config_.adaptive_probes && key_ == cache_key_ &&
                         step_r_plan_ == cache_step_r_ && probe_r_ == cache_probe_r_;
  stream_ = RotationStream{config_.seed, static_cast<uint64_t>(step_)};
  if (leave_rotations) {
    if (!only.empty() || may_reuse || shaped || config_.biased_rotation)
      throw Error(
          "StepEngine::plan: only a whole step of plain rotations (no bias, reuse or metric) "
          "can be left to the evaluator");
    std::fill(reused_.begin(), reused_.end(), 0);
    drawn_ = false;
  } else {
    const ParticleRange every{0, P};
    for (const ParticleRange& range :
         only.empty() ? std::span<const ParticleRange>(&every, 1) : only)
      plan_particles(stream_, may_reuse, range);
    drawn_ = true;
  }
  displacements_ready_ = false;
  screened_ = false;
  planned_ = true;
}

void StepEngine::plan_particles(const RotationStream& stream, bool may_reuse,
                                const ParticleRange& range) {
  const int64_t dd = int64_t{d_} * d_;
  threads_.for_chunks(range.last - range.first, kParticleGrain, [&](int64_t, int64_t b, int64_t e) {
    const int64_t begin = range.first + b, end = range.first + e, n = e - b;
    draw_rotations(stream, begin, n, d_, rotation_method_,
                   std::span<double>(rotations_).subspan(idx(begin * dd), idx(n * dd)),
                   config_.biased_rotation
                       ? std::span<const double>(velocity_).subspan(idx(begin * d_), idx(n * d_))
                       : std::span<const double>());
    for (int64_t i = begin; i < end; ++i) {
      reused_[idx(i)] = 0;
      if (may_reuse && cache_valid_[idx(i)]) {
        double norm2 = 0;
        for (int32_t j = 0; j < d_; ++j)
          norm2 += velocity_[idx(i * d_ + j)] * velocity_[idx(i * d_ + j)];
        if (norm2 < config_.adaptive_probes_threshold) {
          reused_[idx(i)] = 1;
          // The cached costs were measured with the cached rotation: keep them together.
          std::copy_n(cache_rotations_.begin() + static_cast<std::ptrdiff_t>(i * dd), dd,
                      rotations_.begin() + static_cast<std::ptrdiff_t>(i * dd));
        }
      }
    }
    direct_particles(begin, end);
  });
}

void StepEngine::direct_particles(int64_t begin, int64_t end) const {
  const auto V = vertices_;
  const int64_t dd = int64_t{d_} * d_;
  const bool shaped = config_.metric == MetricKind::bfgs;
  for (int64_t i = begin; i < end; ++i) {
    Eigen::Map<const Matrix<double>> rot(rotations_.data() + i * dd, d_, d_);
    Eigen::Map<Matrix<double>> dir(directions_.data() + i * V * d_, V, d_);
    dir.noalias() = template_ * rot.transpose();  // row v = (R t_v)^T
    if (shaped) {
      Eigen::Map<const Matrix<double>> factor(metric_factor_.data() + i * dd, d_, d_);
      Eigen::Map<Matrix<double>> sheared(sheared_.data() + i * V * d_, V, d_);
      sheared.noalias() = dir * factor.transpose();  // row v = (L R t_v)^T
    }
  }
}

void StepEngine::draw_left_rotations() const {
  if (drawn_) return;
  // plan() left them to the evaluator and someone reads them after all: the bits plan() would
  // have drawn (no bias, reuse or metric, which a left plan never has).
  const int64_t dd = int64_t{d_} * d_;
  threads_.for_chunks(particles_, kParticleGrain, [&](int64_t, int64_t begin, int64_t end) {
    draw_rotations(stream_, begin, end - begin, d_, rotation_method_,
                   std::span<double>(rotations_).subspan(idx(begin * dd), idx((end - begin) * dd)),
                   std::span<const double>());
    direct_particles(begin, end);
  });
  drawn_ = true;
}

std::span<const double> StepEngine::rotations() const {
  draw_left_rotations();
  return rotations_;
}

std::span<const double> StepEngine::probe_directions() const {
  draw_left_rotations();
  return config_.metric == MetricKind::bfgs ? std::span<const double>(sheared_)
                                            : std::span<const double>(directions_);
}

std::span<const double> StepEngine::displacements() const {
  if (!displacements_ready_) {
    const auto P = particles_, V = vertices_;
    const auto K = probes_;
    displacements_.resize(idx(P * V * K * d_));
    const std::span<const double> unit = probe_directions();
    for (int64_t i = 0; i < P; ++i)
      for (int64_t v = 0; v < V; ++v)
        for (int32_t k = 1; k <= K; ++k) {
          const double scale = probe_r_ * k / (K + 1.0);
          double* out = displacements_.data() + ((i * V + v) * K + (k - 1)) * d_;
          for (int32_t j = 0; j < d_; ++j) out[j] = scale * unit[idx((i * V + v) * d_ + j)];
        }
    displacements_ready_ = true;
  }
  return displacements_;
}

bool StepEngine::review(double loss, uint64_t objective_key) {
  if (!reviews_steps()) throw Error("StepEngine::review without trust_reject");
  if (!next_is_scored()) throw Error("StepEngine::review on a momentum-only step");
  const bool comparable = prediction_valid_ && prediction_key_ == objective_key;
  radius_->observe_incumbent(loss, comparable);
  prediction_valid_ = false;
  reviewed_ = true;
  reviewed_incumbent_ = radius_->incumbent();
  const bool rejected = radius_->rejected();
  if (rejected) {
    // Back at the previous incumbent: the move that left it carries no momentum.
    std::fill(velocity_.begin(), velocity_.end(), 0.0);
  }
  return rejected;
}

const std::vector<char>& StepEngine::screen(std::span<const double> screen_losses) {
  if (!planned_) throw Error("StepEngine::screen before plan()");
  const auto P = particles_, V = vertices_;
  if (static_cast<int64_t>(screen_losses.size()) != P * V)
    throw Error("screen: expected " + std::to_string(P * V) + " losses, got " +
                std::to_string(screen_losses.size()));
  draw_left_rotations();
  screen_losses_.assign(screen_losses.begin(), screen_losses.end());
  keep_.assign(idx(P * V), 0);
  const bool antithetic = config_.polytope == PolytopeKind::orthoplex;
  std::vector<double> score;
  std::vector<int64_t> order;
  for (int64_t i = 0; i < P; ++i) {
    const double* s = screen_losses_.data() + i * V;
    // Orthoplex: rank the axis pairs by |L(+e) - L(-e)| and keep both signs, so the kept set
    // stays antithetic. Otherwise rank vertices by how far their loss is from the row mean:
    // both extremes carry the transport signal.
    const int64_t units = antithetic ? V / 2 : V;
    const double mean = std::accumulate(s, s + V, 0.0) / static_cast<double>(V);
    score.resize(idx(units));
    for (int64_t u = 0; u < units; ++u)
      score[idx(u)] = antithetic ? std::abs(s[u] - s[u + units]) : std::abs(s[u] - mean);
    for (double& x : score)
      if (!std::isfinite(x)) x = std::numeric_limits<double>::infinity();
    order.resize(idx(units));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return score[idx(a)] > score[idx(b)]; });
    const auto kept = std::max<int64_t>(
        1,
        static_cast<int64_t>(std::llround(config_.screen_keep_ratio * static_cast<double>(units))));
    for (int64_t r = 0; r < kept; ++r) {
      const int64_t u = order[idx(r)];
      keep_[idx(i * V + u)] = 1;
      if (antithetic) keep_[idx(i * V + u + units)] = 1;
    }
  }
  screened_ = true;
  return keep_;
}

TransportResult StepEngine::solve_block(const BlockRange& block, double temperature,
                                        StepShard* shard) {
  const auto cost = cost_.middleRows(block.first, block.count);
  auto weights = weights_.middleRows(block.first, block.count);
  auto scaled = scaled_.middleRows(block.first, block.count);
  const RowChunks chunks(block.first, block.count, shard);
  TransportResult result;
  // The buffer is kept: no allocation per step.
  if (!penalise_and_scale(cost, scaled, config_.nonfinite_margin, config_.cost_scaling, chunks,
                          threads_)) {
    weights.setConstant(1.0 / static_cast<double>(vertices_));  // no information: stay put
    return result;
  }
  const bool lone = block.count == 1 && solver_ == TransportSolver::sinkhorn;
  switch (lone ? TransportSolver::softmax : solver_) {
    case TransportSolver::sinkhorn: {
      const SinkhornSettings settings{config_.sinkhorn_max_iterations, config_.sinkhorn_tolerance};
      const auto b = static_cast<std::size_t>(&block - blocks_.data());
      result = detail::solve_sinkhorn(scaled, temperature, settings, duals_[b], weights, chunks,
                                      threads_);
      break;
    }
    case TransportSolver::softmax:
      detail::solve_softmax(scaled, temperature, weights, chunks, threads_);
      break;
    case TransportSolver::greedy:
      detail::solve_top_k(scaled, 1, weights, chunks, threads_);
      break;
    case TransportSolver::top_k:
      detail::solve_top_k(scaled, config_.top_k, weights, chunks, threads_);
      break;
    case TransportSolver::automatic:
      break;
  }
  return result;
}

bool StepEngine::transport_offloadable() const {
  return planned_ && !screened_ && !config_.adaptive_probes &&
         config_.metric == MetricKind::identity &&
         std::none_of(reused_.begin(), reused_.end(), [](char r) { return r != 0; });
}

std::span<const double> StepEngine::check_finish(std::span<const double> incumbents,
                                                 std::span<const double> moves, bool& reviewed) {
  if (!planned_) throw Error("StepEngine::finish before plan()");
  if (static_cast<int64_t>(moves.size()) != particles_ * d_)
    throw Error("finish: the move buffer holds " + std::to_string(moves.size()) +
                " values, not P d = " + std::to_string(particles_ * d_));
  reviewed = reviewed_;
  reviewed_ = false;
  if (reviewed) {
    if (!incumbents.empty())
      throw Error("finish: the step was reviewed, so the engine already has f(X)");
    incumbents = std::span<const double>(&reviewed_incumbent_, 1);
  } else if (reviews_steps()) {
    throw Error("finish: trust_reject needs review() with f(X) before plan()");
  }
  if (radius_->needs_incumbent() && incumbents.size() != 1 &&
      static_cast<int64_t>(incumbents.size()) != particles_)
    throw Error("finish: the " + std::string(to_string(radius_->kind())) +
                " radius model needs f(X): one shared incumbent loss or one per particle");
  return incumbents;
}

double StepEngine::observe_incumbent(std::span<const double> incumbents, bool reviewed,
                                     StepInfo& info) {
  if (radius_->needs_incumbent()) {
    const double total = std::accumulate(incumbents.begin(), incumbents.end(), 0.0);
    const bool comparable = prediction_valid_ && prediction_key_ == key_;
    if (!reviewed) radius_->observe_incumbent(total, comparable);
    info.rejected = reviewed && radius_->rejected();
    info.trust_ratio = last_trust_ratio(*radius_);
    info.incumbent_loss =
        incumbents.size() == 1 ? incumbents[0] : total / static_cast<double>(particles_);
    info.incumbent_measured = true;
  }
  const double step_r = config_.step_radius * epsilon_ * radius_->multipliers().step;
  info.step_radius = step_r;
  return step_r;
}

StepInfo StepEngine::finish(std::span<const double> losses, std::span<const double> incumbents,
                            std::span<double> moves, StepShard* shard) {
  if (shard != nullptr && !transport_offloadable())
    throw Error(
        "finish: a step with screening, adaptive probes or a metric cannot be finished "
        "sharded");
  draw_left_rotations();  // the host's solve reads the directions
  bool reviewed = false;
  incumbents = check_finish(incumbents, moves, reviewed);
  const auto P = particles_, V = vertices_;
  const auto K = probes_;
  if (static_cast<int64_t>(losses.size()) != P * V * K)
    throw Error("finish: expected " + std::to_string(P * V * K) + " losses, got " +
                std::to_string(losses.size()));
  const bool quadratic = radius_->needs_incumbent();
  StepInfo info = scored_info();
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  auto start = Clock::now();
  // Cost matrix: mean over probes; reused rows from the cache; unscreened vertices from the
  // screen loss plus the particle's offset calibrated on its kept vertices. Per chunk of
  // particles (RowChunks: this process's, shared with the others) the sum, count and minimum of
  // the finite costs and the reused rows, added in chunk order.
  cost_.resize(P, V);
  weights_.resize(P, V);
  scaled_.resize(P, V);
  const RowChunks all(0, P, shard);
  std::vector<double> cost_partial(idx(all.count() * 4));  // sum, best, finite, reused
  all.for_own(threads_, [&](int64_t chunk, int64_t begin, int64_t end) {
    double sum = 0, best = std::numeric_limits<double>::infinity();
    int64_t finite = 0, reused = 0;
    for (int64_t i = begin; i < end; ++i) {
      if (reused_[idx(i)]) {
        for (int64_t v = 0; v < V; ++v) cost_(i, v) = cache_costs_[idx(i * V + v)];
        ++reused;
      } else {
        double offset = 0;
        int64_t kept = 0;
        for (int64_t v = 0; v < V; ++v) {
          if (screened_ && !keep_[idx(i * V + v)]) continue;
          double total = 0;
          for (int32_t k = 0; k < K; ++k) total += losses[idx((i * V + v) * K + k)];
          cost_(i, v) = total / K;
          if (screened_ && std::isfinite(cost_(i, v) - screen_losses_[idx(i * V + v)])) {
            offset += cost_(i, v) - screen_losses_[idx(i * V + v)];
            ++kept;
          }
        }
        if (screened_) {
          offset = kept > 0 ? offset / static_cast<double>(kept) : 0.0;
          for (int64_t v = 0; v < V; ++v)
            if (!keep_[idx(i * V + v)]) cost_(i, v) = screen_losses_[idx(i * V + v)] + offset;
        }
      }
      for (int64_t v = 0; v < V; ++v)
        if (std::isfinite(cost_(i, v))) {
          sum += cost_(i, v);
          best = std::min(best, cost_(i, v));
          ++finite;
        }
    }
    double* out = cost_partial.data() + 4 * chunk;
    out[0] = sum;
    out[1] = best;
    out[2] = static_cast<double>(finite);
    out[3] = static_cast<double>(reused);
  });
  all.share_chunks(cost_partial, 4, "the cost matrix's statistics");
  {
    double sum = 0, best = std::numeric_limits<double>::infinity(), finite = 0, reused = 0;
    for (int64_t c = 0; c < all.count(); ++c) {
      const double* part = cost_partial.data() + 4 * c;
      sum += part[0];
      best = std::min(best, part[1]);
      finite += part[2];
      reused += part[3];
    }
    info.reused = static_cast<int64_t>(reused) * V * K;
    info.mean_cost = finite > 0 ? sum / finite : kNaN;
    info.best_cost = finite > 0 ? best : kNaN;
  }

  // The incumbent closes the deferred trust-region comparison before the step radius is set.
  const double step_r = observe_incumbent(incumbents, reviewed, info);
  if (!quadratic) info.incumbent_loss = info.mean_cost;

  info.phase_ms.cost = since(start);
  start = Clock::now();
  // One transport problem per block; blocks run side by side (each also parallel over its
  // rows) and their results are combined in block order.
  const double temperature = config_.ent_epsilon > 0 ? config_.ent_epsilon : epsilon_;
  const auto n_blocks = static_cast<int64_t>(blocks_.size());
  // Sinkhorn's row duals of the last sharded step stay with the processes that finished them;
  // a step that cuts the particles otherwise needs them whole first.
  if (!spread_duals_.empty()) {
    if (shard == nullptr)
      throw Error(
          "finish: Sinkhorn's row duals are spread over the processes of the last sharded "
          "step, and this step is not sharded (call gather_duals with their shard first)");
    const std::span<const int64_t> now = shard->bounds();
    if (!std::equal(now.begin(), now.end(), spread_duals_.begin(), spread_duals_.end()))
      gather_duals(*shard);
  }
  std::vector<TransportResult> solved(blocks_.size());
  if (shard == nullptr) {
    threads_.for_chunks(n_blocks, 1, [&](int64_t b, int64_t, int64_t) {
      solved[idx(b)] = solve_block(blocks_[idx(b)], temperature, nullptr);
    });
  } else {
    // One block after another on this thread: their exchanges with the other processes are
    // collectives, called in the same order everywhere, from the thread that joined them.
    for (int64_t b = 0; b < n_blocks; ++b)
      solved[idx(b)] = solve_block(blocks_[idx(b)], temperature, shard);
    // Each process now holds the row duals of its own particles only: they cross only when
    // they are needed whole (gather_duals: a checkpoint, another cut), not every step.
    if (solver_ == TransportSolver::sinkhorn) {
      const std::span<const int64_t> now = shard->bounds();
      spread_duals_.assign(now.begin(), now.end());
    }
  }
  for (const TransportResult& r : solved) {
    info.transport_iterations = std::max(info.transport_iterations, r.iterations);
    info.transport_converged = info.transport_converged && r.converged;
  }
  schedule_.observe_solve(info.transport_converged);
  info.phase_ms.transport = since(start);
  start = Clock::now();

  // Barycentric move, in template space then rotated once: X_i + step_r R_i (W_i T). With a
  // quadratic radius model, each particle's fit in the same pass (it reads the move just
  // written): per block the step length along the transport move, whose slope and curvature
  // add chunk partials in order. Blocks tile the particles, so every particle moves.
  const auto move_particle = [&](Vector<double>& m, int64_t i) {
#if !defined(__FMA__)
    if (d_ == 2) {
      // The same arithmetic as the Eigen products below, written out (they were 70 % of the
      // move's time at d = 2): m = sum_v T_v w_v from zero in vertex order, then
      // 0 + step_r (R_j0 m_0 + R_j1 m_1). Only without FMA (the core's default build), where
      // Eigen's packet multiply-add is a multiply and an add, as here.
      const double* w = weights_.data() + i * vertices_;
      double m0 = 0, m1 = 0;
      for (int64_t v = 0; v < vertices_; ++v) {
        m0 += template_(v, 0) * w[v];
        m1 += template_(v, 1) * w[v];
      }
      const double* r = rotations_.data() + i * 4;
      moves[idx(i * 2)] = 0.0 + step_r * (r[0] * m0 + r[1] * m1);
      moves[idx(i * 2 + 1)] = 0.0 + step_r * (r[2] * m0 + r[3] * m1);
      return;
    }
#endif
    m.noalias() = template_.transpose() * weights_.row(i).transpose();
    Eigen::Map<const Matrix<double>> rot(rotations_.data() + i * d_ * d_, d_, d_);
    Eigen::Map<Vector<double>> out(moves.data() + i * d_, d_);
    out.noalias() = step_r * (rot * m);
  };
  std::vector<BlockModel> models;
  if (!quadratic) {
    all.for_own(threads_, [&](int64_t, int64_t begin, int64_t end) {
      Vector<double> m(d_);
      for (int64_t i = begin; i < end; ++i) move_particle(m, i);
    });
  } else {
    const double scaled_radius = probe_r_ * K / (K + 1.0);
    gradients_.resize(idx(P * d_));
    std::vector<double> partial;  // per chunk of the block: slope, curvature
    for (const BlockRange& block : blocks_) {
      const RowChunks chunks(block.first, block.count, shard);
      partial.assign(idx(2 * chunks.count()), 0.0);
      chunks.for_own(threads_, [&](int64_t chunk, int64_t b, int64_t e) {
        Vector<double> m(d_);
        std::vector<double> outer(idx(V));
        BlockModel model;
        for (int64_t i = block.first + b; i < block.first + e; ++i) {
          move_particle(m, i);
          for (int64_t v = 0; v < V; ++v) outer[idx(v)] = losses[idx((i * V + v) * K + (K - 1))];
          const double f = incumbents.size() == 1 ? incumbents[0] : incumbents[idx(i)];
          double* gradient = gradients_.data() + i * d_;
          const double curvature = fit_particle_quadratic_rows(
              outer.data(), V, f, directions_.data() + i * V * d_, d_, d_, scaled_radius, gradient);
          double slope = 0, norm2 = 0;
          for (int32_t j = 0; j < d_; ++j) {
            slope += gradient[j] * moves[idx(i * d_ + j)];
            norm2 += moves[idx(i * d_ + j)] * moves[idx(i * d_ + j)];
          }
          if (std::isfinite(slope) && std::isfinite(curvature)) {
            model.slope += slope;
            model.curvature += curvature * norm2;
          }
        }
        partial[idx(2 * chunk)] = model.slope;
        partial[idx(2 * chunk + 1)] = model.curvature;
      });
      chunks.share_chunks(partial, 2, "the quadratic model's sums");
      BlockModel model;
      for (int64_t c = 0; c < chunks.count(); ++c) {
        model.slope += partial[idx(2 * c)];
        model.curvature += partial[idx(2 * c + 1)];
      }
      models.push_back(model);
    }
  }
  info.phase_ms.move = since(start);
  start = Clock::now();
  // Every process's moves are shared inside (its rows of the plan, the fit and the move stay
  // its own).
  StepInfo done = finish_tail(info, models, moves, /*host_costs=*/true, &all);
  done.phase_ms.tail = since(start);
  return done;
}

StepInfo StepEngine::finish_on(Evaluator& backend, std::span<const double> incumbents,
                               std::span<double> moves) {
  if (!transport_offloadable())
    throw Error(
        "finish_on: this step needs the host's transport (screening, adaptive probes "
        "or a metric)");
  if (!spread_duals_.empty())
    throw Error("finish_on: Sinkhorn's row duals are spread over processes (gather_duals first)");
  bool reviewed = false;
  incumbents = check_finish(incumbents, moves, reviewed);
  const auto P = particles_;
  const bool quadratic = radius_->needs_incumbent();
  StepInfo info = scored_info();
  const double step_r = observe_incumbent(incumbents, reviewed, info);

  TransportStepRequest request;
  request.solver = solver_;
  request.top_k = config_.top_k;
  request.sinkhorn = {config_.sinkhorn_max_iterations, config_.sinkhorn_tolerance};
  request.temperature = config_.ent_epsilon > 0 ? config_.ent_epsilon : epsilon_;
  request.cost_scaling = config_.cost_scaling;
  request.nonfinite_margin = config_.nonfinite_margin;
  block_first_.clear();
  block_count_.clear();
  for (const BlockRange& block : blocks_) {
    block_first_.push_back(block.first);
    block_count_.push_back(block.count);
  }
  request.block_first = block_first_;
  request.block_count = block_count_;
  request.step_radius = step_r;
  request.duals = &duals_;
  if (quadratic) {
    request.incumbents = incumbents;
    request.scaled_radius = probe_r_ * probes_ / (probes_ + 1.0);
  }
  request.moves = moves;
  // weights() stays what it promises (the last step's plan) without a per-step download
  // unless asked for: the tests ask through keep_weights.
  if (keep_weights_) {
    weights_.resize(P, vertices_);
    request.weights = std::span<double>(weights_.data(), idx(weights_.size()));
  }
  std::vector<TransportBlockResult> results(blocks_.size());
  backend.solve_transport(request, results);

  double sum = 0, best = std::numeric_limits<double>::infinity();
  int64_t finite = 0;
  std::vector<BlockModel> models;
  for (const TransportBlockResult& r : results) {
    sum += r.cost_sum;
    finite += r.finite;
    if (r.finite > 0) best = std::min(best, r.best_cost);
    info.transport_iterations = std::max(info.transport_iterations, r.iterations);
    info.transport_converged = info.transport_converged && r.converged;
    if (quadratic) models.push_back(BlockModel{r.slope, r.curvature});
  }
  info.mean_cost = finite > 0 ? sum / static_cast<double>(finite) : kNaN;
  info.best_cost = finite > 0 ? best : kNaN;
  if (!quadratic) info.incumbent_loss = info.mean_cost;
  schedule_.observe_solve(info.transport_converged);
  return finish_tail(info, models, moves, /*host_costs=*/false);
}

StepInfo StepEngine::finish_tail(StepInfo& info, const std::vector<BlockModel>& models,
                                 std::span<double> moves, bool host_costs, const RowChunks* own) {
  const auto P = particles_, V = vertices_;
  // A shared step scales and carries the momentum of this process's rows only, then shares
  // them: the moves every process then holds are the ones one process computes.
  const bool shared = own != nullptr && own->sharded();
  const int64_t first = shared ? own->own_begin() : 0, last = shared ? own->own_end() : P;
  // [begin, end) of the moves (particles' coordinates) in both this process's rows and `range`.
  const auto for_own_coords = [&](int64_t range_first, int64_t range_count, auto&& body) {
    const int64_t b = std::max(first, range_first), e = std::min(last, range_first + range_count);
    if (b < e)
      threads_.for_chunks((e - b) * d_, kParticleGrain * d_,
                          [&](int64_t, int64_t cb, int64_t ce) { body(b * d_ + cb, b * d_ + ce); });
  };
  if (!models.empty()) {
    double predicted = 0;
    bool at_boundary = false;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const BlockRange& block = blocks_[b];
      const BlockModel& model = models[b];
      const double a = radius_->move_scale(model);
      at_boundary = at_boundary || a >= config_.radius.quadratic_max_scale;
      predicted += a * model.slope + 0.5 * a * a * model.curvature;
      for_own_coords(block.first, block.count, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) moves[idx(c)] *= a;
      });
    }
    info.predicted_change = predicted;
    radius_->record_prediction(predicted, at_boundary);
    prediction_valid_ = std::isfinite(predicted);
    prediction_key_ = key_;
    if (config_.metric == MetricKind::bfgs) apply_metric(moves);
  }
  const double mu = config_.momentum ? momentum_coefficient() : 0.0;
  if (config_.momentum)
    for_own_coords(0, P, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c)
        moves[idx(c)] = mu * velocity_[idx(c)] + config_.velocity_lr * moves[idx(c)];
    });
  if (shared) own->share_rows(moves, d_, "the step's moves");

  // The velocity (the move applied), the finiteness check and the move's norm (chunk partials
  // in order), in one pass.
  const auto n_moves = static_cast<int64_t>(moves.size());
  std::vector<double> norm_partial(idx(StepThreads::chunk_count(n_moves, kParticleGrain * d_)));
  std::vector<char> finite_partial(norm_partial.size(), 1);
  threads_.for_chunks(n_moves, kParticleGrain * d_, [&](int64_t chunk, int64_t b, int64_t e) {
    double norm2 = 0;
    bool finite = true;
    for (int64_t c = b; c < e; ++c) {
      velocity_[idx(c)] = moves[idx(c)];
      finite = finite && std::isfinite(moves[idx(c)]);
      norm2 += moves[idx(c)] * moves[idx(c)];
    }
    norm_partial[idx(chunk)] = norm2;
    finite_partial[idx(chunk)] = finite ? 1 : 0;
  });
  const bool finite =
      std::all_of(finite_partial.begin(), finite_partial.end(), [](char f) { return f != 0; });
  if (!finite) {
    // A NaN step is reverted: nothing moves and the history that produced it is dropped.
    std::fill(moves.begin(), moves.end(), 0.0);
    std::fill(velocity_.begin(), velocity_.end(), 0.0);
    info.reverted = true;
    radius_->invalidate();
    prediction_valid_ = false;
    info.move_norm = 0;
  } else {
    info.move_norm = std::sqrt(std::accumulate(norm_partial.begin(), norm_partial.end(), 0.0));
  }

  if (config_.adaptive_probes && host_costs) {
    threads_.for_chunks(P, kParticleGrain, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        for (int64_t v = 0; v < V; ++v) cache_costs_[idx(i * V + v)] = cost_(i, v);
        std::copy_n(rotations_.begin() + static_cast<std::ptrdiff_t>(i * d_ * d_), d_ * d_,
                    cache_rotations_.begin() + static_cast<std::ptrdiff_t>(i * d_ * d_));
        cache_valid_[idx(i)] = 1;
      }
    });
    cache_key_ = key_;
    cache_step_r_ = step_r_plan_;
    cache_probe_r_ = probe_r_;
  }
  radius_->observe_costs(info.mean_cost);
  planned_ = false;
  ++step_;
  return info;
}

void StepEngine::apply_metric(std::span<double> moves) {
  threads_.for_chunks(particles_, kParticleGrain, [&](int64_t, int64_t begin, int64_t end) {
    Vector<double> move(d_), gradient(d_), change(d_);
    for (int64_t i = begin; i < end; ++i) {
      Eigen::Map<Matrix<double>> factor(metric_factor_.data() + i * d_ * d_, d_, d_);
      Eigen::Map<Matrix<double>> inverse(metric_inverse_.data() + i * d_ * d_, d_, d_);
      Eigen::Map<Vector<double>> out(moves.data() + i * d_, d_);
      move = out;
      out.noalias() = factor.triangularView<Eigen::Lower>() * move;
      // The fit measured g_u = L^T g along the sheared probes: g = L^-T g_u.
      gradient = Eigen::Map<const Vector<double>>(gradients_.data() + i * d_, d_);
      factor.transpose().triangularView<Eigen::Upper>().solveInPlace(gradient);
      auto& valid = metric_gradient_valid_[idx(i)];
      Eigen::Map<Vector<double>> previous(metric_gradient_.data() + i * d_, d_);
      if (!gradient.allFinite()) {
        valid = 0;
        continue;
      }
      // A finite-difference gradient is off by about (probe radius) x (curvature), and the
      // gradient changes by about |s| x (curvature): a move much shorter than the probe radius
      // yields a pair that is mostly noise, so it teaches the metric nothing.
      const std::span<const double> s(velocity_.data() + i * d_, idx(d_));
      double s2 = 0;
      for (double x : s) s2 += x * x;
      if (valid && std::sqrt(s2) >= kMetricMinMove * probe_r_) {
        change = gradient - previous;
        auto& started = metric_started_[idx(i)];
        if (bfgs_update(inverse, s, {change.data(), idx(d_)}, started == 0)) {
          started = 1;
          if (!unit_determinant_factor(inverse, factor)) {
            inverse.setIdentity();  // lost: start again from the template's own shape
            started = 0;
          }
        }
      }
      previous = gradient;
      valid = 1;
    }
  });
}

StepInfo StepEngine::coast(std::span<double> moves) {
  if (next_is_scored()) throw Error("StepEngine::coast on a scored step; call plan()");
  StepInfo info = begin_info();
  info.momentum_only = true;
  info.epsilon = schedule_.at(step_, run_progress_);
  for (std::size_t c = 0; c < moves.size(); ++c)
    moves[c] = velocity_[c] = config_.amortize_ema * velocity_[c];
  double norm2 = 0;
  for (double x : moves) norm2 += x * x;
  info.move_norm = std::sqrt(norm2);
  // The next incumbent differs from the predicted one by this unmodelled move.
  prediction_valid_ = false;
  std::fill(metric_gradient_valid_.begin(), metric_gradient_valid_.end(), 0);
  radius_->invalidate();
  std::fill(cache_valid_.begin(), cache_valid_.end(), 0);
  ++step_;
  return info;
}

void StepEngine::forget_history() {
  std::fill(velocity_.begin(), velocity_.end(), 0.0);
  std::fill(cache_valid_.begin(), cache_valid_.end(), 0);
  std::fill(metric_gradient_valid_.begin(), metric_gradient_valid_.end(), 0);
  prediction_valid_ = false;
  radius_->invalidate();
  planned_ = false;
  reviewed_ = false;
}

void StepEngine::change_basis() {
  std::fill(velocity_.begin(), velocity_.end(), 0.0);
  std::fill(cache_valid_.begin(), cache_valid_.end(), 0);
  if (config_.metric == MetricKind::bfgs) {  // back to the template's own shape
    std::fill(metric_inverse_.begin(), metric_inverse_.end(), 0.0);
    for (int64_t i = 0; i < particles_; ++i)
      for (int32_t j = 0; j < d_; ++j) metric_inverse_[idx((i * d_ + j) * d_ + j)] = 1.0;
    metric_factor_ = metric_inverse_;
    std::fill(metric_gradient_valid_.begin(), metric_gradient_valid_.end(), 0);
    std::fill(metric_started_.begin(), metric_started_.end(), 0);
  }
}

void StepEngine::gather_duals(StepShard& shard) {
  if (spread_duals_.empty()) return;
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    std::vector<double>& f = duals_[b].f;
    if (static_cast<int64_t>(f.size()) != blocks_[b].count) continue;  // never solved
    const RowChunks chunks(blocks_[b].first, blocks_[b].count, &shard, spread_duals_);
    chunks.share_rows(f, 1, "Sinkhorn's row duals");
  }
  spread_duals_.clear();
}

void StepEngine::save(std::ostream& out) const {
  if (!spread_duals_.empty())
    throw Error(
        "saving the optimizer state: Sinkhorn's row duals are spread over the processes that "
        "share the steps; call PolytopeOptimizer::gather_state() on every process first");
  using namespace state_io;
  put(out, "engine.rotation_stream", kRotationStream);
  put(out, "engine.particles", particles_);
  put(out, "engine.d", d_);
  put(out, "engine.vertices", vertices_);
  put(out, "engine.blocks", static_cast<int64_t>(blocks_.size()));
  put(out, "engine.step", step_);
  // A step planned but not finished (ask/tell between ask and tell) is re-planned on load:
  // its rotations are a function of (seed, step), which reproduces it exactly.
  put(out, "engine.planned_key", planned_ ? key_ : uint64_t{0});
  for (const SinkhornDuals& d : duals_) {
    put(out, "duals.f", d.f);
    put(out, "duals.g", d.g);
  }
  put(out, "engine.velocity", velocity_);
  put(out, "engine.last_move", velocity_);  // its old twin, kept so the format stays
  put(out, "cache.costs", cache_costs_);
  put(out, "cache.rotations", cache_rotations_);
  put(out, "cache.valid", flags(cache_valid_));
  put(out, "cache.key", cache_key_);
  put(out, "cache.step_r", cache_step_r_);
  put(out, "cache.probe_r", cache_probe_r_);
  put(out, "prediction.key", prediction_key_);
  put(out, "prediction.valid", prediction_valid_ ? 1 : 0);
  if (config_.metric == MetricKind::bfgs) {
    put(out, "metric.inverse", metric_inverse_);
    put(out, "metric.factor", metric_factor_);
    put(out, "metric.gradient", metric_gradient_);
    put(out, "metric.gradient_valid", flags(metric_gradient_valid_));
    put(out, "metric.started", flags(metric_started_));
  }
  put(out, "engine.planned", planned_ ? 1 : 0);
  schedule_.save(out);
  radius_->save(out);
}

void StepEngine::load(std::istream& in) {
  spread_duals_.clear();
  using namespace state_io;
  int64_t particles = 0, vertices = 0, blocks = 0, stream = 0;
  int32_t d = 0;
  get(in, "engine.rotation_stream", stream);
  if (stream != kRotationStream)
    throw Error("optimizer checkpoint: written with rotation stream " + std::to_string(stream) +
                ", this build draws stream " + std::to_string(kRotationStream) +
                "; it cannot continue that trajectory (start the run again)");
  get(in, "engine.particles", particles);
  get(in, "engine.d", d);
  get(in, "engine.vertices", vertices);
  get(in, "engine.blocks", blocks);
  if (particles != particles_ || d != d_ || vertices != vertices_ ||
      blocks != static_cast<int64_t>(blocks_.size()))
    throw Error("optimizer checkpoint: written for " + std::to_string(particles) +
                " particles of d = " + std::to_string(d) + ", " + std::to_string(vertices) +
                " vertices, " + std::to_string(blocks) + " blocks; this optimizer has " +
                std::to_string(particles_) + ", " + std::to_string(d_) + ", " +
                std::to_string(vertices_) + ", " + std::to_string(blocks_.size()) +
                "; load it into an optimizer of the same configuration and model");
  get(in, "engine.step", step_);
  uint64_t planned_key = 0;
  get(in, "engine.planned_key", planned_key);
  for (SinkhornDuals& dl : duals_) {
    get(in, "duals.f", dl.f);
    get(in, "duals.g", dl.g);
  }
  get(in, "engine.velocity", velocity_);
  std::vector<double> last_move;  // velocity_'s old twin, always equal to it
  get(in, "engine.last_move", last_move);
  get(in, "cache.costs", cache_costs_);
  get(in, "cache.rotations", cache_rotations_);
  std::vector<double> valid;
  get(in, "cache.valid", valid);
  cache_valid_ = from_flags(valid);
  get(in, "cache.key", cache_key_);
  get(in, "cache.step_r", cache_step_r_);
  get(in, "cache.probe_r", cache_probe_r_);
  get(in, "prediction.key", prediction_key_);
  int flag = 0, planned = 0;
  get(in, "prediction.valid", flag);
  prediction_valid_ = flag != 0;
  if (config_.metric == MetricKind::bfgs) {
    get(in, "metric.inverse", metric_inverse_);
    get(in, "metric.factor", metric_factor_);
    get(in, "metric.gradient", metric_gradient_);
    std::vector<double> valid_flags, started_flags;
    get(in, "metric.gradient_valid", valid_flags);
    get(in, "metric.started", started_flags);
    metric_gradient_valid_ = from_flags(valid_flags);
    metric_started_ = from_flags(started_flags);
  }
  get(in, "engine.planned", planned);
  schedule_.load(in);
  radius_->load(in);
  reviewed_ = false;
  planned_ = false;
  if (planned != 0) plan(planned_key);
}

}  // namespace polyprobe::detail
