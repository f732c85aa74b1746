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
#include <functional>
#include <memory>
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
                   const Subspace* subspace, BalanceClock clock, Schedule schedule)
      : DecoratingEvaluator(std::move(inner), "shard_evaluator", subspace),
        job_(job),
        exchange_(exchange),
        clock_(clock),
        schedule_(schedule) {
    if (schedule_ != Schedule::dynamic) return;
    // The same on every rank (choose_exchange decides on all alike), so all throw or none.
    if (exchange_.name() != "mpi")
      throw Error("the dynamic schedule moves the losses over MPI, not " + exchange_.name() +
                  ": with --rank-exchange " + exchange_.name() + " use --rank-schedule static");
    counter_ = std::make_unique<ChunkCounter>(job_);
  }

  StepShard* step_shard() override { return this; }

  // --- StepShard: the scoring cut stays the balancer's (by measured cost); the finishing cut
  // is an even share of the particles a rank (the finish costs the same per particle).
  void gather_losses(bool all) override { gather_losses_ = all; }
  std::span<const int64_t> bounds() const override { return finish_bounds_; }
  std::vector<ParticleRange> planned_particles(int64_t particles) override {
    // The cut session_score will make (the balancer's state does not change in between) and
    // the share this rank will finish, merged where they overlap or touch.
    // With the dynamic schedule, this rank's chunk of the first batch; the chunks it takes
    // later are planned as it takes them (plan_when_taken).
    const std::vector<int64_t> slices = schedule_ == Schedule::dynamic
                                            ? balancer_.chunks(particles, {}, job_.size())
                                            : balancer_.slices(particles, {}, job_.size());
    cut_finish(particles);
    const auto rank = static_cast<std::size_t>(job_.rank());
    ParticleRange score{slices[rank], slices[rank + 1]};
    ParticleRange finish{finish_bounds_[rank], finish_bounds_[rank + 1]};
    if (finish.first < score.first) std::swap(score, finish);
    if (finish.first <= score.last) return {{score.first, std::max(score.last, finish.last)}};
    return {score, finish};
  }
  void plan_when_taken(std::function<void(const ParticleRange&)> plan) override {
    plan_ = std::move(plan);
  }
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
    e["distributed"] = {
        {"ranks", job_.size()},
        {"rank", job_.rank()},
        {"exchange", exchange_.name()},
        {"last_slice", last_slice_},
        {"last_score_ms", last_score_ms_},
        {"last_exchange_ms", last_exchange_ms_},
        {"last_score_cpu_ms", last_score_cpu_ms_},
        // The last probe call's slowest and mean scoring wall time over the ranks: what that
        // step waited for, stragglers of the step and all.
        {"last_slowest_score_ms", last_slowest_ms_},
        {"last_mean_score_ms", last_mean_ms_},
        {"balanced_by", clock_ == BalanceClock::wall ? "wall time" : "CPU time"},
        {"schedule", schedule_ == Schedule::dynamic ? "dynamic" : "fixed"},
        // The dynamic schedule's last probe call: its chunks, and how many this rank scored.
        {"last_chunks", last_chunks_},
        {"last_chunks_scored", last_chunks_scored_},
        // The optimizer's exchanges since the last score call (the sharded finish's partial
        // sums, moves and row duals), waits for slower ranks included.
        {"finish_exchange_ms", finish_exchange_ms_},
        {"finish_exchanges", finish_exchanges_},
        {"last_losses", last_gathered_ ? "all-gathered"
                                       : "the particles this rank finishes (the optimizer "
                                         "finished the step sharded)"},
        {"note", "paths and counts are this rank's slice of the candidates"}};
    return e;
  }

 protected:
  void session_score(const PolytopeProbe& probe, std::span<double> losses,
                     double* incumbent_loss) override {
    if (schedule_ == Schedule::dynamic) {
      score_chunks(probe, losses, incumbent_loss);
      return;
    }
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
    last_score_cpu_ms_ = process_cpu_ms() - cpu_start;
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
    gather_clocks();
    balancer_.observe(slices, probe.active, times_);
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
    exchange_.allgather(losses, offsets_);
    last_gathered_ = true;
    if (incumbent_loss != nullptr) exchange_.broadcast_from_leader(*incumbent_loss);
    record(start, scored);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // The dynamic schedule: this rank scores its chunk of the first batch, then takes chunks from
  // the counter until none is left; the ranks then learn who scored which chunk, and how long
  // it took, in one all-reduce, and the losses move by chunk (Job's *_pieces).
  void score_chunks(const PolytopeProbe& probe, std::span<double> losses, double* incumbent_loss) {
    const int64_t P = bound_particles().count();
    const int64_t per_particle = bound_polytope().rows() * bound_probes();
    finish_exchange_ms_ = 0;
    finish_exchanges_ = 0;
    const int ranks = job_.size();
    const std::vector<int64_t> chunks = balancer_.chunks(P, probe.active, ranks);
    const std::size_t C = chunks.size() - 1;
    // [2 C]: chunk c's time (on the balance clock) and the rank that scored it, -1 elsewhere.
    chunk_facts_.assign(2 * C, -1.0);
    mine_.assign(idx(P), 0);
    bool incumbent_due = incumbent_loss != nullptr && job_.leader();
    const auto start = Clock::now();
    const double cpu_start = process_cpu_ms();
    const auto score_chunk = [&](std::size_t c) {
      const auto chunk_start = Clock::now();
      const double chunk_cpu_start = process_cpu_ms();
      bool any = false;
      for (int64_t i = chunks[c]; i < chunks[c + 1]; ++i) {
        mine_[idx(i)] = probe.active.empty() ? 1 : probe.active[idx(i)];
        any = any || mine_[idx(i)] != 0;
      }
      if (any || incumbent_due) {
        inner().score(PolytopeProbe{probe.directions, probe.probe_radius, mine_, probe.rotations},
                      losses, incumbent_due ? incumbent_loss : nullptr);
        incumbent_due = false;
      }
      std::fill(mine_.begin() + chunks[c], mine_.begin() + chunks[c + 1], char{0});
      chunk_facts_[2 * c] =
          clock_ == BalanceClock::wall
              ? std::chrono::duration<double, std::milli>(Clock::now() - chunk_start).count()
              : process_cpu_ms() - chunk_cpu_start;
      chunk_facts_[2 * c + 1] = job_.rank();
    };
    score_chunk(static_cast<std::size_t>(job_.rank()));
    last_chunks_scored_ = 1;
    // Tickets run on from step to step: this step's are [tickets_, tickets_ + C), the first
    // C - ranks naming the chunks after the first batch, and each rank takes one past them,
    // which tells it to stop.
    for (;;) {
      const int64_t ticket = counter_->take("taking a chunk of the step's candidates") - tickets_;
      if (ticket >= static_cast<int64_t>(C) - ranks) break;
      const auto c = static_cast<std::size_t>(ranks + ticket);
      if (plan_) plan_(ParticleRange{chunks[c], chunks[c + 1]});
      score_chunk(c);
      ++last_chunks_scored_;
    }
    tickets_ += static_cast<int64_t>(C);
    const auto scored = Clock::now();
    last_score_cpu_ms_ = process_cpu_ms() - cpu_start;
    last_chunks_ = static_cast<int64_t>(C);
    job_.allreduce_max(chunk_facts_, "which rank scored each chunk of the step");
    owners_.resize(C);
    chunk_times_.resize(C);
    bounds_.resize(C + 1);
    for (std::size_t c = 0; c < C; ++c) {
      owners_[c] = static_cast<int32_t>(chunk_facts_[2 * c + 1]);
      chunk_times_[c] = std::max(0.0, chunk_facts_[2 * c]);
      bounds_[c] = chunks[c] * per_particle;
    }
    bounds_[C] = P * per_particle;
    last_slice_ = {chunks[idx(job_.rank())], chunks[idx(job_.rank()) + 1]};
    last_gathered_ = gather_losses_;
    if (gather_losses_) {
      job_.allgather_pieces(losses, bounds_, owners_, "the step's loss exchange");
    } else {
      cut_finish(P);
      wanted_.resize(idx(ranks) + 1);
      for (std::size_t r = 0; r < wanted_.size(); ++r)
        wanted_[r] = finish_bounds_[r] * per_particle;
      job_.redistribute_pieces(losses, bounds_, owners_, wanted_,
                               "the step's losses, to the ranks finishing them");
    }
    if (incumbent_loss != nullptr) exchange_.broadcast_from_leader(*incumbent_loss);
    record(start, scored);
    balancer_.observe(chunks, probe.active, chunk_times_);
    gather_clocks();
  }

  // The last call's time in this rank's scoring and in the exchange (which includes waiting for
  // the slowest rank): what `bench scale` reports as compute, imbalance and all-gather.
  void record(Clock::time_point start, Clock::time_point scored) {
    const auto now = Clock::now();
    last_score_ms_ = std::chrono::duration<double, std::milli>(scored - start).count();
    last_exchange_ms_ = std::chrono::duration<double, std::milli>(now - scored).count();
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

  // Every rank's last scoring wall and CPU time (2 doubles a rank cross), so that every rank
  // knows the step's slowest wall time, and, in the fixed schedule, feeds the same times
  // (times_, on the balance clock) to its balancer, so all cut the same.
  void gather_clocks() {
    const auto ranks = static_cast<std::size_t>(job_.size());
    clocks_.assign(2 * ranks, 0.0);
    clocks_[2 * static_cast<std::size_t>(job_.rank())] = last_score_ms_;
    clocks_[2 * static_cast<std::size_t>(job_.rank()) + 1] = last_score_cpu_ms_;
    clock_offsets_.resize(ranks + 1);
    for (std::size_t r = 0; r <= ranks; ++r) clock_offsets_[r] = 2 * static_cast<int64_t>(r);
    job_.allgather(clocks_, clock_offsets_, "the ranks' scoring times");
    times_.resize(ranks);
    double wall_sum = 0;
    last_slowest_ms_ = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      times_[r] = clocks_[2 * r + (clock_ == BalanceClock::wall ? 0 : 1)];
      wall_sum += clocks_[2 * r];
      last_slowest_ms_ = std::max(last_slowest_ms_, clocks_[2 * r]);
    }
    last_mean_ms_ = wall_sum / static_cast<double>(ranks);
  }

  Job& job_;
  LossExchange& exchange_;
  BalanceClock clock_;
  Schedule schedule_;
  std::unique_ptr<ChunkCounter> counter_;           // the dynamic schedule's
  int64_t tickets_ = 0;                             // the counter's value at the next step's start
  std::function<void(const ParticleRange&)> plan_;  // StepShard::plan_when_taken
  std::vector<double> chunk_facts_;                 // [2 C]: see score_chunks
  std::vector<int32_t> owners_;                     // [C]: the rank that scored each chunk
  std::vector<int64_t> bounds_;                     // [C + 1]: the chunks in the loss buffer
  int64_t last_chunks_ = 0, last_chunks_scored_ = 0;
  std::vector<char> mine_;        // [P]: this rank's slice of the active particles
  std::vector<int64_t> offsets_;  // [ranks + 1] into the loss buffer
  std::vector<int64_t> last_slice_;
  double last_score_ms_ = 0, last_exchange_ms_ = 0, last_score_cpu_ms_ = 0;
  SliceBalancer balancer_;
  std::vector<int64_t> finish_bounds_;  // [ranks + 1]: the particles each rank finishes
  std::vector<int64_t> wanted_;         // [ranks + 1]: their losses' offsets
  bool gather_losses_ = true, last_gathered_ = true;
  double finish_exchange_ms_ = 0;  // in share() since the last probe call
  int64_t finish_exchanges_ = 0;
  std::vector<double> clocks_;  // [ranks 2]: the last call's scoring wall and CPU times
  std::vector<int64_t> clock_offsets_;
  std::vector<double> times_;        // [ranks]: those on the balance clock
  std::vector<double> chunk_times_;  // [C]: each chunk's scoring, on the balance clock
  double last_slowest_ms_ = 0, last_mean_ms_ = 0;  // of the ranks' wall times, last call
};

}  // namespace

std::unique_ptr<Evaluator> shard_evaluator(std::unique_ptr<Evaluator> inner, Job& job,
                                           LossExchange& exchange, const Subspace* subspace,
                                           BalanceClock clock, Schedule schedule) {
  return std::make_unique<ShardedEvaluator>(std::move(inner), job, exchange, subspace, clock,
                                            schedule);
}

}  // namespace polyprobe::distributed
