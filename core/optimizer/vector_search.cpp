// One flat vector, particles, an evaluator: the step loop of PolytopeOptimizer and minimize().
#include "vector_search.hpp"

#include "state_io.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/plugin/kernels/coordinate_runs.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <string>

namespace polyprobe::detail {

namespace {
// Coordinates per chunk of the parallel move into the parameters.
constexpr int64_t kApplyGrain = 16384;
}  // namespace

TransportSolver resolve_solver(TransportSolver requested, bool subspace) {
  if (requested != TransportSolver::automatic) return requested;
  return subspace ? TransportSolver::softmax : TransportSolver::sinkhorn;
}

VectorSearch::VectorSearch(const OptimizerConfig& config, ParticleMap particles,
                           std::vector<BlockRange> blocks, const Subspace* subspace)
    : config_(config),
      particles_(std::move(particles)),
      subspace_(subspace),
      engine_(config, particles_.d, particles_.count(), std::move(blocks),
              resolve_solver(config.solver, subspace != nullptr)) {
  const auto& coords = particles_.coords;
  const int64_t top = coords.empty() ? -1 : *std::max_element(coords.begin(), coords.end());
  std::vector<bool> seen(static_cast<std::size_t>(top + 1), false);  // a bit per coordinate
  distinct_coords_ = std::all_of(coords.begin(), coords.end(), [&](int64_t c) {
    if (c < 0) return true;
    if (seen[static_cast<std::size_t>(c)]) return false;
    seen[static_cast<std::size_t>(c)] = true;
    return true;
  });
  runs_ = kernels::long_coordinate_runs(coords);
}

int64_t VectorSearch::next_step_cost() const {
  if (!engine_.next_is_scored()) return 0;
  return engine_.candidates_per_step() + (engine_.needs_incumbent() ? 1 : 0);
}

bool VectorSearch::holds_particles(const Evaluator& eval, int32_t probes) {
  const std::pair<uint64_t, int32_t> key{eval.binding(), probes};
  if (key.first != 0 && std::find(holding_.begin(), holding_.end(), key) != holding_.end())
    return true;
  if (!eval.has_particles(particles_, engine_.polytope(), probes)) return false;
  holding_[1] = holding_[0];
  holding_[0] = key;
  return true;
}

void VectorSearch::apply(std::span<double> params, std::span<const double> moves) const {
  if (subspace_ != nullptr) {
    subspace_->apply(particles_.coords, moves, params);
    return;
  }
  if (!runs_.empty()) {
    // Each run in plain loops; in parallel only where each coordinate is added to once.
    for (const kernels::CoordinateRun& run : runs_) {
      const auto add_run = [&](int64_t, int64_t begin, int64_t end) {
        kernels::add_run_moves(run, begin, end, moves.data(), params.data());
      };
      if (distinct_coords_)
        engine_.threads().for_chunks(run.count, kApplyGrain, add_run);
      else
        add_run(0, 0, run.count);
    }
    return;
  }
  const auto add = [&](int64_t, int64_t begin, int64_t end) {
    for (auto c = static_cast<std::size_t>(begin); c < static_cast<std::size_t>(end); ++c) {
      const int64_t coord = particles_.coords[c];
      if (coord >= 0) params[static_cast<std::size_t>(coord)] += moves[c];
    }
  };
  const auto n = static_cast<int64_t>(particles_.coords.size());
  // Each coordinate is added to once, so chunks in parallel give the serial loop's bits.
  if (distinct_coords_)
    engine_.threads().for_chunks(n, kApplyGrain, add);
  else
    add(0, 0, n);
}

StepInfo VectorSearch::step(std::span<double> params, Evaluator& evaluator, Evaluator* screen,
                            uint64_t objective_key) {
  const int32_t d = particles_.d;
  const int64_t P = engine_.particle_count(), V = engine_.vertex_count();
  const int32_t K = engine_.probes();
  moves_.resize(static_cast<std::size_t>(P * d));
  engine_.set_threads(evaluator.threads());  // one --threads for the whole step
  if (!engine_.next_is_scored()) {
    StepInfo info = engine_.coast(moves_);
    apply(params, moves_);
    return info;
  }
  // trust_reject: score the last step's trial point first; when the trust region rejects it,
  // go back to the point it left (kept exactly in previous_) and probe around that instead.
  const bool with_incumbent = engine_.needs_incumbent();
  const bool review = engine_.reviews_steps();
  if (review) {
    const double trial = evaluator.evaluate_base(params);
    ++evaluations_;
    if (engine_.review(trial, objective_key)) {
      if (previous_.size() != params.size())
        throw Error("trust_reject: no previous point to return to");
      std::copy(previous_.begin(), previous_.end(), params.begin());
    }
  }
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  // Processes that share the step (StepShard) each plan, receive the losses of and finish only
  // their own particles, where the step can be finished in pieces.
  StepShard* const processes = evaluator.step_shard();
  StepShard* shard = nullptr;
  if (processes != nullptr && config_.sharded_finish && !config_.multifidelity_screen &&
      !config_.adaptive_probes && config_.metric == MetricKind::identity &&
      !(config_.device_transport && evaluator.solves_transport()))
    shard = processes;
  // An evaluator that solves the transport and draws the rotations itself (the host's bits)
  // gets none: a whole step of plain rotations is left to it, and nothing per particle is sent.
  const bool leave_rotations = processes == nullptr && config_.device_rotations &&
                               config_.device_transport && !config_.multifidelity_screen &&
                               !config_.adaptive_probes && !config_.biased_rotation &&
                               config_.metric == MetricKind::identity &&
                               evaluator.solves_transport() && evaluator.draws_rotations(d);
  auto start = Clock::now();
  planned_.clear();
  if (shard != nullptr) planned_ = shard->planned_particles(P);
  engine_.plan(objective_key, planned_, leave_rotations);
  const double plan_ms = since(start);
  start = Clock::now();
  const auto& reused = engine_.reused();

  // The evaluator keeps the incumbent as a session: bound to these particles once, synced
  // with `params` (an exact comparison, so external changes are caught), moved by the step.
  std::array<const Evaluator*, 2> synced{};  // the sessions made equal to `params` this step
  auto open_session = [&](Evaluator& eval) {
    if (!holds_particles(eval, K)) eval.bind_particles(particles_, engine_.polytope(), K);
    eval.sync_incumbent(params);
    synced[&eval == &evaluator ? 0 : 1] = &eval;
  };

  // Gathers candidates (i, v, k) accepted by `take` into one described set and scores it.
  auto score_set = [&](Evaluator& eval, auto take, std::span<double> out, int64_t& counter) {
    candidate_particle_.clear();
    candidate_index_.clear();
    candidate_displacement_.clear();
    const auto displacement = engine_.displacements();  // expanded only for this form
    for (int64_t i = 0; i < P; ++i) {
      if (reused[static_cast<std::size_t>(i)]) continue;
      for (int64_t v = 0; v < V; ++v)
        for (int32_t k = 0; k < K; ++k) {
          if (!take(i, v, k)) continue;
          const int64_t c = (i * V + v) * K + k;
          candidate_particle_.push_back(i);
          candidate_index_.push_back(c);
          const auto first = displacement.begin() + static_cast<std::ptrdiff_t>(c * d);
          candidate_displacement_.insert(candidate_displacement_.end(), first, first + d);
        }
    }
    candidate_losses_.resize(candidate_particle_.size());
    if (!candidate_particle_.empty()) {
      open_session(eval);
      CandidateSet set{&particles_, candidate_particle_, candidate_displacement_};
      eval.score(set, candidate_losses_, nullptr);
    }
    counter += static_cast<int64_t>(candidate_particle_.size());
    for (std::size_t j = 0; j < candidate_index_.size(); ++j)
      out[static_cast<std::size_t>(candidate_index_[j])] = candidate_losses_[j];
    return static_cast<int64_t>(candidate_particle_.size());
  };

  const bool score_incumbent = with_incumbent && !review;
  double incumbent = 0;
  losses_.assign(static_cast<std::size_t>(P * V * K), 0.0);
  int64_t screened = 0, scored = 0;
  bool offload = false;  // the backend solves this step's transport
  if (config_.multifidelity_screen) {
    if (screen == nullptr)
      throw Error(
          "multifidelity_screen needs a screen evaluator: call "
          "PolytopeOptimizer::set_screen_evaluator() before register_evaluator()");
    // The screen scores the outer probe of every vertex on the cheap batch.
    std::vector<double> outer(static_cast<std::size_t>(P * V * K), 0.0);
    screened = score_set(
        *screen, [&](int64_t, int64_t, int32_t k) { return k == K - 1; }, outer,
        screen_evaluations_);
    std::vector<double> screen_losses(static_cast<std::size_t>(P * V));
    for (int64_t c = 0; c < P * V; ++c)
      screen_losses[static_cast<std::size_t>(c)] = outer[static_cast<std::size_t>(c * K + K - 1)];
    const auto& keep = engine_.screen(screen_losses);
    scored = score_set(
        evaluator,
        [&](int64_t i, int64_t v, int32_t) {
          return keep[static_cast<std::size_t>(i * V + v)] != 0;
        },
        losses_, evaluations_);
    if (score_incumbent) {
      open_session(evaluator);
      evaluator.score(CandidateSet{&particles_, {}, {}}, {}, &incumbent);
    }
  } else {
    // The whole step in one call: the backend generates the candidates from the directions
    // and scores the incumbent with them.
    active_.clear();
    if (std::find(reused.begin(), reused.end(), 1) != reused.end())
      for (char r : reused) active_.push_back(r != 0 ? 0 : 1);
    open_session(evaluator);
    // With the identity metric the directions are R_i t_v: a device backend builds them from
    // the rotations (per particle) rather than receiving [P V d].
    const bool rotated = config_.metric == MetricKind::identity;
    offload =
        config_.device_transport && evaluator.solves_transport() && engine_.transport_offloadable();
    if (processes != nullptr) processes->gather_losses(shard == nullptr);
    const bool from_stream = offload && engine_.rotations_left();
    const PolytopeProbe probe{
        from_stream ? std::span<const double>() : engine_.probe_directions(),
        engine_.planned_probe_radius(), active_,
        rotated && !from_stream ? engine_.rotations() : std::span<const double>(),
        from_stream ? &engine_.rotation_stream() : nullptr};
    // Offloaded, the losses stay with the backend for its transport solve.
    evaluator.score(probe, offload ? std::span<double>() : std::span<double>(losses_),
                    score_incumbent ? &incumbent : nullptr);
    scored = (P - static_cast<int64_t>(std::count(reused.begin(), reused.end(), 1))) * V * K;
    evaluations_ += scored;
  }
  if (score_incumbent) ++evaluations_;

  const double score_ms = since(start);
  const auto incumbents =
      score_incumbent ? std::span<const double>(&incumbent, 1) : std::span<const double>();
  StepInfo info = offload ? engine_.finish_on(evaluator, incumbents, moves_)
                          : engine_.finish(losses_, incumbents, moves_, shard);
  info.phase_ms.plan = plan_ms;
  info.phase_ms.score = score_ms;
  start = Clock::now();
  info.candidates = scored + (with_incumbent ? 1 : 0);
  info.screened = screened;
  if (!info.reverted) {
    if (review) previous_.assign(params.begin(), params.end());
    apply(params, moves_);
    // The sessions move with the optimizer's copy (the same arithmetic), so the next step's
    // sync finds them equal and nothing is sent again. A session synced this step held
    // `params` before the move, so its mirror takes the moved copy rather than redoing it.
    for (Evaluator* eval : {&evaluator, screen})
      if (eval != nullptr && holds_particles(*eval, K) && eval->incumbent().size() == params.size())
        eval->move_incumbent(moves_, std::find(synced.begin(), synced.end(), eval) != synced.end()
                                         ? std::span<const double>(params)
                                         : std::span<const double>());
  }
  info.phase_ms.apply = since(start);
  return info;
}

void VectorSearch::save(std::ostream& out) const {
  state_io::put(out, "search.evaluations", evaluations_);
  state_io::put(out, "search.screen_evaluations", screen_evaluations_);
  if (engine_.reviews_steps()) state_io::put(out, "search.previous", previous_);
  engine_.save(out);
}

void VectorSearch::load(std::istream& in) {
  state_io::get(in, "search.evaluations", evaluations_);
  state_io::get(in, "search.screen_evaluations", screen_evaluations_);
  if (engine_.reviews_steps()) state_io::get(in, "search.previous", previous_);
  engine_.load(in);
}

}  // namespace polyprobe::detail
