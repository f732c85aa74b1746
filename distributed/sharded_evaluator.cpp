// The sharding decorator: each rank scores its slice of the step's candidates on its own
// backend; then either the losses are all-gathered and every rank finishes the whole step, or
// (StepShard, the optimizer's sharded finish) each rank receives the losses of the particles it
// finishes.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/step_shard.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <string>
#include <vector>

namespace polyprobe::distributed {
namespace {

std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }

// The incumbent, the batch, the thread count (on which the optimizer runs its own share of each
// step) and the stateless calls are the wrapped evaluator's (DecoratingEvaluator).
class ShardedEvaluator final : public DecoratingEvaluator, public StepShard {
 public:
  ShardedEvaluator(std::unique_ptr<Evaluator> inner, Job& job, LossExchange& exchange,
                   const Subspace* subspace, BalanceClock clock)
      : DecoratingEvaluator(std::move(inner), "shard_evaluator", subspace),
        job_(job),
        exchange_(exchange),
        clock_(clock) {}

  StepShard* step_shard() override { return this; }

  // --- StepShard: the scoring cut stays the balancer's (by measured cost); the finishing cut
  // is an even share of the particles a rank (the finish costs the same per particle).
  void gather_losses(bool all) override { gather_losses_ = all; }
  std::span<const int64_t> bounds() const override { return finish_bounds_; }
  std::vector<ParticleRange> planned_particles(int64_t particles) override {
    // The step's plan begins: the rank's share of the step is timed from here, since planning
    // a slice's rotations costs in proportion to its particles, not to its scoring (at 16 ranks
    // of mlp256-full the last ranks hold 17-36 % of the particles each, the cheap last-layer
    // ones, and plan for up to about 0.6 ms against rank 0's 0.1, which the balancer, shown the
    // scoring alone, could not see).
    plan_start_ = Clock::now();
    plan_cpu_start_ = process_cpu_ms();
    planning_ = true;
    // The cut session_score will make (the balancer's state does not change in between) and
    // the share this rank will finish, merged where they overlap or touch.
    const std::vector<int64_t> slices = balancer_.slices(particles, {}, job_.size());
    cut_finish(particles);
    const auto rank = static_cast<std::size_t>(job_.rank());
    ParticleRange score{slices[rank], slices[rank + 1]};
    ParticleRange finish{finish_bounds_[rank], finish_bounds_[rank + 1]};
    if (finish.first < score.first) std::swap(score, finish);
    if (finish.first <= score.last) return {{score.first, std::max(score.last, finish.last)}};
    return {score, finish};
  }
  int processes() const override { return job_.size(); }
  int index() const override { return job_.rank(); }
  void share(std::span<double> values, std::span<const int64_t> offsets,
             const char* what) override {
    const auto start = Clock::now();
    job_.allgather(values, offsets, what);
    finish_exchange_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    ++finish_exchanges_;
  }

  // The inner evaluator's account (of this rank's slice) and the slicing.
  nlohmann::json explain() const override {
    nlohmann::json e = inner().explain();
    e["distributed"] = account();
    return e;
  }

  // The slicing's own account (shard_account).
  nlohmann::json account() const {
    return {{"ranks", job_.size()},
            {"rank", job_.rank()},
            {"exchange", exchange_.name()},
            {"last_slice", last_slice_},
            {"last_score_ms", last_score_ms_},
            {"last_exchange_ms", last_exchange_ms_},
            {"last_score_cpu_ms", last_score_cpu_ms_},
            // The step's plan on this rank before its scoring (sharded finish only), which the
            // balancer counts with the scoring.
            {"last_plan_ms", last_plan_ms_},
            // The last probe call's slowest and mean scoring wall time over the ranks: what that
            // step waited for, stragglers of the step and all.
            {"last_slowest_score_ms", last_slowest_ms_},
            {"last_mean_score_ms", last_mean_ms_},
            {"balanced_by", clock_ == BalanceClock::wall ? "wall time" : "CPU time"},
            // How this rank waits in the exchanges (Job::set_polling).
            {"waits", job_.polling() ? "poll" : "pause"},
            // The optimizer's exchanges since the last score call (the sharded finish's partial
            // sums, moves and row duals), waits for slower ranks included.
            {"finish_exchange_ms", finish_exchange_ms_},
            {"finish_exchanges", finish_exchanges_},
            {"last_losses", last_gathered_ ? "all-gathered"
                                           : "the particles this rank finishes (the optimizer "
                                             "finished the step sharded)"},
            {"note", "paths and counts are this rank's slice of the candidates"}};
  }

 protected:
  void session_score(const PolytopeProbe& probe, std::span<double> losses,
                     double* incumbent_loss) override {
    const int64_t P = bound_particles().count();
    const int64_t per_particle = bound_polytope().rows() * bound_probes();
    finish_exchange_ms_ = 0;
    finish_exchanges_ = 0;
    const std::vector<int64_t> slices = balancer_.slices(P, probe.active, job_.size());
    const auto rank = static_cast<std::size_t>(job_.rank());
    const int64_t first = slices[rank], last = slices[rank + 1];
    mine_.assign(idx(P), 0);
    for (int64_t i = first; i < last; ++i)
      mine_[idx(i)] = probe.active.empty() ? 1 : probe.active[idx(i)];
    last_slice_ = {first, last};
    const PolytopeProbe slice{probe.directions, probe.probe_radius, mine_, probe.rotations};
    const bool scores_incumbent = incumbent_loss != nullptr && job_.leader();
    const auto start = Clock::now();
    const double cpu_start = process_cpu_ms();
    inner().score(slice, losses, scores_incumbent ? incumbent_loss : nullptr);
    const auto scored = Clock::now();
    const double cpu_scored = process_cpu_ms();
    last_score_cpu_ms_ = cpu_scored - cpu_start;
    // What the balancer sees: the plan (when this step's began here) and the scoring.
    last_plan_ms_ = planning_ ? ms(start - plan_start_) : 0.0;
    last_share_ms_ = ms(scored - (planning_ ? plan_start_ : start));
    last_share_cpu_ms_ = cpu_scored - (planning_ ? plan_cpu_start_ : cpu_start);
    planning_ = false;
    last_gathered_ = gather_losses_;
    offsets_.resize(slices.size());
    for (std::size_t r = 0; r < slices.size(); ++r) offsets_[r] = slices[r] * per_particle;
    if (gather_losses_) {
      exchange_.allgather(losses, offsets_);
    } else {
      // Each rank finishes an even, chunk-aligned share of the particles (StepShard::bounds):
      // the losses scored elsewhere for its share come to it, and no others.
      cut_finish(P);
      wanted_.resize(slices.size());
      for (std::size_t r = 0; r < slices.size(); ++r) wanted_[r] = finish_bounds_[r] * per_particle;
      exchange_.redistribute(losses, offsets_, wanted_);
    }
    if (incumbent_loss != nullptr) exchange_.broadcast_from_leader(*incumbent_loss);
    record(start, scored);
    rebalance(slices, probe.active);
  }

  void session_score(const CandidateSet& set, std::span<double> losses,
                     double* incumbent_loss) override {
    // Slices of whole particles' runs are not needed here: any contiguous cut of the candidates
    // scores the same losses (each candidate's loss is its own), balanced by count.
    const int64_t n = set.size();
    const int ranks = job_.size();
    offsets_.resize(static_cast<std::size_t>(ranks) + 1);
    for (int r = 0; r <= ranks; ++r) offsets_[static_cast<std::size_t>(r)] = n * r / ranks;
    const auto rank = static_cast<std::size_t>(job_.rank());
    const int64_t first = offsets_[rank], count = offsets_[rank + 1] - first;
    const int32_t d = bound_particles().d;
    const CandidateSet slice{set.particles, set.particle.subspan(idx(first), idx(count)),
                             set.displacement.subspan(idx(first * d), idx(count * d))};
    last_slice_ = {first, first + count};
    const bool scores_incumbent = incumbent_loss != nullptr && job_.leader();
    const auto start = Clock::now();
    const double cpu_start = process_cpu_ms();
    inner().score(slice, losses.subspan(idx(first), idx(count)),
                  scores_incumbent ? incumbent_loss : nullptr);
    const auto scored = Clock::now();
    last_score_cpu_ms_ = process_cpu_ms() - cpu_start;
    planning_ = false;
    exchange_.allgather(losses, offsets_);
    last_gathered_ = true;
    if (incumbent_loss != nullptr) exchange_.broadcast_from_leader(*incumbent_loss);
    record(start, scored);
  }

 private:
  using Clock = std::chrono::steady_clock;
  // The last call's time in this rank's scoring and in the exchange (which includes waiting for
  // the slowest rank): what `bench scale` reports as compute, imbalance and all-gather.
  void record(Clock::time_point start, Clock::time_point scored) {
    last_score_ms_ = ms(scored - start);
    last_exchange_ms_ = ms(Clock::now() - scored);
  }
  static double ms(Clock::duration d) {
    return std::chrono::duration<double, std::milli>(d).count();
  }

  // The CPU time of this process's threads: the work of a slice, without the time other
  // processes took the cores from it (oversubscribed or shared machines).
  static double process_cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
  }

  // An even share of the particles a rank, cut at multiples of StepShard::kGrain.
  void cut_finish(int64_t P) {
    const auto ranks = static_cast<int64_t>(job_.size());
    finish_bounds_.resize(idx(ranks + 1));
    for (int64_t r = 0; r <= ranks; ++r) {
      const int64_t even = (P * r / ranks + kGrain / 2) / kGrain * kGrain;
      finish_bounds_[idx(r)] = r == ranks ? P : std::min(P, even);
    }
  }

  // Every rank feeds the same all-gathered times to its balancer, so all cut the same. Both
  // clocks of the share cross, and the scoring's own wall time (3 doubles a rank), so the
  // step's slowest scoring is known too.
  void rebalance(const std::vector<int64_t>& slices, std::span<const char> active) {
    const auto ranks = static_cast<std::size_t>(job_.size());
    const auto mine = static_cast<std::size_t>(job_.rank());
    clocks_.assign(3 * ranks, 0.0);
    clocks_[3 * mine] = last_share_ms_;
    clocks_[3 * mine + 1] = last_share_cpu_ms_;
    clocks_[3 * mine + 2] = last_score_ms_;
    clock_offsets_.resize(ranks + 1);
    for (std::size_t r = 0; r <= ranks; ++r) clock_offsets_[r] = 3 * static_cast<int64_t>(r);
    job_.allgather(clocks_, clock_offsets_, "the ranks' plan and scoring times");
    times_.resize(ranks);
    double wall_sum = 0;
    last_slowest_ms_ = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      times_[r] = clocks_[3 * r + (clock_ == BalanceClock::wall ? 0 : 1)];
      wall_sum += clocks_[3 * r + 2];
      last_slowest_ms_ = std::max(last_slowest_ms_, clocks_[3 * r + 2]);
    }
    last_mean_ms_ = wall_sum / static_cast<double>(ranks);
    balancer_.observe(slices, active, times_);
  }

  Job& job_;
  LossExchange& exchange_;
  BalanceClock clock_;
  std::vector<char> mine_;        // [P]: this rank's slice of the active particles
  std::vector<int64_t> offsets_;  // [ranks + 1] into the loss buffer
  std::vector<int64_t> last_slice_;
  double last_score_ms_ = 0, last_exchange_ms_ = 0, last_score_cpu_ms_ = 0;
  // The step's plan, when planned_particles began it (planning_ until the probe call), and
  // the plan with the scoring: the rank's share of the step on the balance clocks.
  Clock::time_point plan_start_{};
  double plan_cpu_start_ = 0;
  bool planning_ = false;
  double last_plan_ms_ = 0, last_share_ms_ = 0, last_share_cpu_ms_ = 0;
  SliceBalancer balancer_;
  std::vector<int64_t> finish_bounds_;  // [ranks + 1]: the particles each rank finishes
  std::vector<int64_t> wanted_;         // [ranks + 1]: their losses' offsets
  bool gather_losses_ = true, last_gathered_ = true;
  double finish_exchange_ms_ = 0;  // in share() since the last probe call
  int64_t finish_exchanges_ = 0;
  // [ranks 3]: the last call's share (plan and scoring) in wall and CPU time, and the scoring's
  // wall time.
  std::vector<double> clocks_;
  std::vector<int64_t> clock_offsets_;
  std::vector<double> times_;                      // [ranks]: those on the balance clock
  double last_slowest_ms_ = 0, last_mean_ms_ = 0;  // of the ranks' wall times, last call
};

}  // namespace

nlohmann::json shard_account(const Evaluator& evaluator) {
  const auto* sharded = dynamic_cast<const ShardedEvaluator*>(&evaluator);
  return sharded != nullptr ? sharded->account() : nlohmann::json::object();
}

std::unique_ptr<Evaluator> shard_evaluator(std::unique_ptr<Evaluator> inner, Job& job,
                                           LossExchange& exchange, const Subspace* subspace,
                                           BalanceClock clock) {
  return std::make_unique<ShardedEvaluator>(std::move(inner), job, exchange, subspace, clock);
}

}  // namespace polyprobe::distributed
