// Scale-out over MPI ranks (optional library polyprobe_distributed; docs/design.md section 7,
// docs/scale.md).
//
// Every rank holds the whole, replicated optimizer (its state is deterministic: the same
// seed, data and options give the same rotations on every rank) and scores a disjoint slice
// of each step's candidates; the losses are all-gathered, so every rank runs the same
// StepEngine::finish on the same numbers and the trajectory is bit-identical for any rank
// count, including one and the build without MPI. Only losses cross (8 bytes a candidate).
//
// The core knows nothing of this: sharding is an Evaluator decorator (shard_evaluator), and
// train() takes the two hooks it needs from TrainOptions (write_files, agree_on_stop).
//
// Threading: MPI is initialised with MPI_THREAD_FUNNELED; call everything here from the
// thread that joined the job. Every collective below must be called by every rank in the same
// order; each is watched by the job's timeout, past which the rank that waits says so and ends
// the job on every rank (MPI_Abort), so a rank that died or hangs never leaves the others
// waiting forever.
#pragma once

#include <polyprobe/evaluator.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace polyprobe::distributed {

// True when an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx) started this process, read
// from the launcher's environment variables; without one no MPI call is ever made.
bool launched_by_mpi();

// This process's place in the job (MPI_COMM_WORLD). One per process: the Job that initialised
// MPI finalises it when it ends, and MPI cannot be joined again (a later Job throws saying so).
class Job {
 public:
  // Initialises MPI when launched_by_mpi(), else makes a job of one that never calls MPI.
  // `timeout_s` bounds every wait on other ranks (0: no bound).
  explicit Job(double timeout_s = 300);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool leader() const { return rank_ == 0; }
  double timeout_s() const { return timeout_s_; }
  // How a rank waits for the others: polling MPI without pause (true: for ranks with CPUs of
  // their own, where a wait takes no core from anyone, and a partner asleep in its wait would
  // delay every stage of a collective by its pause) or, after 200 us of polling, with pauses of
  // 50 to 200 us (false, the default: ranks that share cores leave them to those computing).
  void set_polling(bool poll) { polling_ = poll; }
  bool polling() const { return polling_; }

  // --- Collectives (every rank, same order, host memory)
  // In place: `values` is the same length on every rank; rank r owns
  // values[offsets[r], offsets[r + 1]) (offsets: size() + 1 ascending entries from 0 to
  // values.size()); afterwards every rank holds every rank's slice.
  void allgather(std::span<double> values, std::span<const int64_t> offsets, const char* what);
  // In place: rank r owns values[from[r], from[r + 1]) and wants values[to[r], to[r + 1]) (both
  // size() + 1 ascending bounds from 0 to values.size()); afterwards every rank holds what it
  // wants. Point to point: each value crosses once, to the rank that wants it.
  void redistribute(std::span<double> values, std::span<const int64_t> from,
                    std::span<const int64_t> to, const char* what);
  // values on every rank become rank `root`'s.
  void broadcast(std::span<double> values, int root, const char* what);
  void broadcast(std::span<uint32_t> values, int root, const char* what);
  // Every rank's `text`, in rank order, on every rank.
  std::vector<std::string> allgather_text(const std::string& text, const char* what);

  // Ends the job from this rank: writes "polyprobe: rank R of N: MESSAGE" to stderr (C stdio,
  // so a silenced std::cerr does not hide it) and aborts every rank. A rank other than the
  // leader waits `grace_s` first, so that an error every rank meets at once (bad data, a
  // non-finite loss) is printed once, by the leader, whose abort ends the others.
  [[noreturn]] void abort(const std::string& message, double grace_s = 0.5) const;

 private:
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_;
  bool owns_mpi_ = false;
  bool polling_ = false;
};

// Contiguous particle slices, one a rank: rank r scores particles [bounds[r], bounds[r + 1])
// of the P particles; `active` ([P], or empty for all) marks the ones scored this step.
// Without `weights` the slices balance the candidate count: each rank gets floor or ceil of
// (active / ranks) active particles. With `weights` ([P], positive: the expected cost of
// scoring each particle) rank r starts at the first particle where the active weight before it
// reaches r / ranks of the total. Returns ranks + 1 bounds from 0 to P; a pure function of its
// arguments, so every rank computes the same slices.
std::vector<int64_t> particle_slices(int64_t particles, std::span<const char> active, int ranks,
                                     std::span<const double> weights = {});

// The cost model behind the sharded evaluator's cut: one relative cost estimate a particle
// (starting at 1, so the first cut balances the candidate count), cut by particle_slices' rule,
// and corrected from each step's measured times of the slices. Rank r's estimates are scaled by its
// share of the measured time over its share of the predicted cost: the first measurement whole
// (the starting guess knows nothing), later ones halfway, which averages out a single step's
// noise. Measured costs are not uniform (a particle of a model's first layer runs its candidates
// through more of the network than one of its last), and the cut follows them; it settles within
// about five steps. Once settled the cut holds still: the last measured cut is kept while its
// slowest slice is predicted within kHold of the best cut's, because a backend plans its work
// for a slice and re-plans when the slice moves (cpu_tbb: 0.37 ms of mnist64-full's 2.7 ms
// scoring at 2 ranks), which a cut chasing each step's noise would pay every step.
// Every rank runs this every step, so it costs what a rank cannot share: the estimates are kept
// as running sums, a cut of every particle is a binary search a rank (not a pass over the
// particles), and a measurement is one pass without a dependency chain. Only a cut of some
// particles (a non-empty active mask) pays one more pass.
// Deterministic: every rank feeding it the same all-gathered times cuts the same slices. Not
// thread-safe.
class SliceBalancer {
 public:
  static constexpr double kHold = 0.02;
  // The cut of this step (particles, active: as particle_slices). A new particle count resets
  // the estimates.
  std::vector<int64_t> slices(int64_t particles, std::span<const char> active, int ranks);
  // The measured cost of each rank's slice of the cut `slices` returned for the same `active`
  // (times[r] for slice r; any unit; a rank that measured nothing, 0, keeps its estimates).
  void observe(std::span<const int64_t> slices, std::span<const char> active,
               std::span<const double> times);

 private:
  // The running sums to cut by: the estimates' own, or over the active particles only.
  const std::vector<double>& sums_for(std::span<const char> active);

  std::vector<double> before_;     // [P + 1]: the estimates' sum over the particles before i
  std::vector<double> masked_;     // [P + 1]: the same over the last active mask's particles
  std::vector<double> predicted_;  // [ranks]: the estimates' sum over each slice
  std::vector<double> starts_;     // [ranks + 1]: before_ at the measured cut's bounds
  std::vector<int64_t> held_;      // [ranks + 1]: the last measured cut (empty: none)
  int64_t measurements_ = 0;       // taken into the estimates since the last reset
};

// Moves the losses of each step between ranks. The MPI job carries host buffers; a GPU job can
// carry them between device buffers (make_nccl_exchange). Same collective rules as Job's.
class LossExchange {
 public:
  virtual ~LossExchange() = default;
  // As Job::allgather: every rank's slice of `values` on every rank.
  virtual void allgather(std::span<double> values, std::span<const int64_t> offsets) = 0;
  // As Job::redistribute: rank r owns values[from[r], from[r + 1]) and afterwards holds
  // values[to[r], to[r + 1]); each value crosses once, to the rank that wants it.
  virtual void redistribute(std::span<double> values, std::span<const int64_t> from,
                            std::span<const int64_t> to) = 0;
  // `value` on every rank becomes rank 0's.
  virtual void broadcast_from_leader(double& value) = 0;
  virtual std::string name() const = 0;  // "mpi" or "nccl"
};

// The MPI exchange of `job` (which must outlive it).
std::unique_ptr<LossExchange> make_mpi_exchange(Job& job);

// NCCL between GPU ranks, one process per GPU, bootstrapped over `job` (rank 0's
// ncclUniqueId broadcast over MPI): the host losses are copied to a device buffer, all-gathered
// by NCCL and copied back. `device` is the CUDA device of this rank (-1: the rank's index
// among the ranks of its node, modulo the visible devices). Throws polyprobe::Error naming
// the reason (no GPU, NCCL failure) on the rank that meets it; call it on every rank at
// start-up, before agree_to_start, so that a failure is reported there. Only in builds with
// POLYPROBE_NCCL; elsewhere it throws saying so.
std::unique_ptr<LossExchange> make_nccl_exchange(Job& job, int device = -1);
bool nccl_built();
// Why this rank could not join an NCCL exchange ("" when it can): a build without NCCL, no
// visible CUDA device, or more ranks on this node than it has devices (NCCL refuses two ranks
// of one communicator on one GPU). Local: no MPI call, so each rank can state it at start-up.
std::string nccl_unusable();

// How `train` moves the losses between ranks: `asked` is "mpi", "nccl" or "auto" (NCCL when
// the backend runs on a GPU and every rank can use NCCL, else MPI). Every rank calls it in the
// same order; they exchange their nccl_unusable() verdicts, so they all choose alike. Returns
// the exchange and, in `why`, one line saying why it was chosen. Throws polyprobe::Error on
// every rank when "nccl" was asked for and a rank cannot use it, naming the rank and the reason.
std::unique_ptr<LossExchange> choose_exchange(Job& job, const std::string& asked, bool gpu_backend,
                                              std::string& why);

// What the slice balancer measures a slice's cost in (shard_evaluator): each rank's CPU time
// scoring it (the work of its slice, blind to time another process took its cores) or its
// wall time (what the step waits for, and so also a rank that runs slower than the others).
enum class BalanceClock { cpu, wall };

// What this rank states about its cores, "HOST;THREADS;CPUS": its host name, the threads it
// scores on (`threads` <= 0: as many as its CPUs) and the CPUs it may run on (its affinity).
std::string core_facts(int threads);
// The clock for every rank's core_facts (rank order): CPU time where the ranks of some host run
// more threads than they have CPUs between them (their wall times would count each other), else
// wall time (on cores of its own a rank's wall time is its slice's cost, CPU time and all, and
// also a slower core, or one whose threads wait on each other: measured on the GPU machine's 16
// cores, 4 ranks x 4 threads balanced by CPU time left the slowest rank's scoring 1.37x the
// mean, by wall time 1.04x). `why` gets one line saying which and why. Pure: every rank gets the
// same answer from the same facts. Throws polyprobe::Error on facts not in that form.
BalanceClock balance_clock_for(const std::vector<std::string>& facts, std::string& why);
// `asked` is "auto" (balance_clock_for over every rank's facts), "wall" or "cpu". Every rank
// calls it in the same order (it all-gathers the facts whatever was asked).
BalanceClock choose_balance_clock(Job& job, const std::string& asked, int threads,
                                  std::string& why);
// How the job's ranks wait for each other (Job::set_polling): `asked` is "poll", "pause" or
// "auto" (poll where every rank has CPUs of its own, the facts balance_clock_for reads as wall
// time, else pause). `why` gets e.g. "poll (every rank has CPUs of its own)". Every rank calls
// it in the same order (it all-gathers the facts whatever was asked); throws polyprobe::Error
// for another `asked`. Measured on a 16-core Xeon, 16 one-thread ranks: polling took
// mlp256-full's step from 12.2-13.4 ms to 8.0-9.5 ms (docs/scale.md).
void choose_waits(Job& job, const std::string& asked, int threads, std::string& why);

// An evaluator whose session calls score only this rank's slice of each step's candidates
// (particle_slices, with the probe's active mask) on `inner`, and then all-gather the losses
// over `exchange`; or, when the optimizer finishes the step sharded (the result's
// step_shard(): StepShard::gather_losses(false)), send each rank only the losses of the even
// share of particles it finishes (Job::redistribute, point to point), the finish's exchanges
// going over `job`. The slices start balanced by candidate count and are then balanced by cost:
// after each call the ranks all-gather the times of their shares (the scoring, and with the
// sharded finish the step's plan before it: 3 doubles a rank over `job`, in `clock`) and every
// rank feeds them to the same SliceBalancer, so a slice whose candidates cost more (those of a
// model's first layers run through more of it) shrinks; the losses do not depend on the cut. The
// incumbent's loss, when asked for, is rank 0's, broadcast (one incumbent forward in the job, and
// every rank gets the same number even if its backend or thread count differs). Explicit candidate
// sets (multifidelity screens) are sliced by candidate count the same way. The stateless calls
// (evaluate, evaluate_base) run on `inner` unsharded. `subspace` must be the one `inner` was made
// for (null: raw parameters); `inner`, `job` and `exchange` are owned by the caller except `inner`,
// which is owned by the result. Every rank must make the same calls in the same order (the
// optimizer does).
// `clock`: what the balancer measures a slice's cost in (choose_balance_clock picks it).
std::unique_ptr<Evaluator> shard_evaluator(std::unique_ptr<Evaluator> inner, Job& job,
                                           LossExchange& exchange,
                                           const Subspace* subspace = nullptr,
                                           BalanceClock clock = BalanceClock::cpu);
// The "distributed" block of a shard_evaluator's explain() (its slice, times and exchanges of
// the last step) without the wrapped evaluator's own account, which a caller reading it every
// step (bench scale) would otherwise pay for; {} when `evaluator` is not one.
nlohmann::json shard_account(const Evaluator& evaluator);

// One fact each rank states about its run at start-up, compared across ranks: a name ("model",
// "data", "option --seed", "backend") and its value (a digest or the value itself).
struct StartupFact {
  std::string name;
  std::string value;
};

// The start-up agreement, on every rank: each rank gives `failure` ("" when it is ready to
// train, else why it cannot: a backend that failed to load, a missing file) and its facts
// (the same names in the same order on every rank). Returns when every rank is ready and
// agrees; else throws polyprobe::Error on every rank with one message naming the ranks that
// failed and why, or the first facts on which a rank differs from rank 0 and both values.
void agree_to_start(Job& job, const std::string& failure, const std::vector<StartupFact>& facts);

// A 64-bit FNV-1a digest of bytes, as 16 hex digits (for the model and data facts).
std::string digest(std::span<const unsigned char> bytes);
template <class T>
std::string digest_of(std::span<const T> values) {
  return digest({reinterpret_cast<const unsigned char*>(values.data()), values.size_bytes()});
}

}  // namespace polyprobe::distributed
