// The ranks of `train` and `bench scale`: a process alone, or one rank of an MPI job
// (`mpirun -np N polyprobe train ...`, docs/scale.md).
//
// With ranks, every rank builds the same run, the ranks agree at start-up that they did (or
// one message on every rank names the rank that differs or failed, and why), each scores its
// slice of every step's candidates and the losses are all-gathered, so the trajectory is the
// one a single process takes. Rank 0 alone prints and writes files: the other ranks' std::cout
// and std::cerr are silenced from the TrainRanks' construction to the end of the process. In builds
// without MPI a run launched by mpirun with more than one rank is refused (each rank would train
// the whole run alone).
#pragma once

#include <polyprobe/evaluator.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace polyprobe::app {

// Whether this process is rank 0 of its MPI job, or alone, read from the launcher's environment
// (no MPI call): the one that writes shared files such as `bench --json`.
bool leader_process();

class TrainRanks {
 public:
  // Joins the MPI job when mpirun started this process; `timeout_s` bounds every wait on the
  // other ranks (0: none).
  explicit TrainRanks(double timeout_s);
  ~TrainRanks();
  TrainRanks(const TrainRanks&) = delete;
  TrainRanks& operator=(const TrainRanks&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool leader() const { return rank_ == 0; }
  // Whether agree_to_start was called (it throws on every rank unless they agree), and whether
  // it returned.
  bool asked() const { return asked_; }
  bool agreed() const { return agreed_; }
  // How the losses travel, and why: "" alone or before shard(), else "mpi, why: REASON" or
  // "nccl, why: REASON".
  std::string exchange() const;

  // The start-up agreement (every rank once): `failure` is "" when this rank is ready, else why
  // not; `facts` are (name, value) pairs every rank states in the same order. Throws
  // polyprobe::Error on every rank unless all are ready and agree. Alone: returns.
  void agree_to_start(const std::string& failure,
                      const std::vector<std::pair<std::string, std::string>>& facts);
  // The evaluator that scores this rank's slice and exchanges the losses (alone: itself), over
  // `exchange`: "mpi", "nccl" or "auto" (NCCL when `gpu_backend` and every rank can use it;
  // distributed::choose_exchange), its slices balanced by the ranks' scoring times on the clock
  // `balance` names: "wall", "cpu" or "auto" (wall unless ranks oversubscribe a node's cores;
  // distributed::choose_balance_clock). Every rank, after agree_to_start; throws on every rank
  // when NCCL was asked for and a rank cannot use it.
  // `waits`: how the ranks wait for each other, "poll", "pause" or "auto" (poll where every
  // rank has CPUs of its own; distributed::choose_waits).
  std::unique_ptr<Evaluator> shard(std::unique_ptr<Evaluator> evaluator,
                                   const std::string& exchange = "mpi", bool gpu_backend = false,
                                   const std::string& balance = "auto",
                                   const std::string& waits = "auto");
  // What the slices are balanced by, and why: "" alone or before shard(), else e.g. "wall time:
  // every rank runs on CPUs of its own ...".
  const std::string& balance() const { return balance_why_; }
  // How the ranks wait, and why: "" alone or before shard(), else e.g. "poll (every rank has
  // CPUs of its own)".
  const std::string& waits() const { return waits_why_; }
  // What a shard()'s evaluator measured of its last step (distributed::shard_account: its
  // explain()'s "distributed" block without the backend's own account); {} alone.
  nlohmann::json shard_account(const Evaluator& evaluator) const;
  // TrainOptions::agree_on_stop: the leader's stop reasons (alone: null).
  std::function<uint32_t(uint32_t)> stop_agreement();
  // TrainOptions::agree_on_clock: the leader's seconds (alone: null).
  std::function<double(double)> clock_agreement();
  // A failure of this rank after the agreement: says so on stderr naming the rank, and ends the
  // job on every rank (alone: not to be called; the caller reports the error itself).
  [[noreturn]] void fail(const std::string& message);

  // Every rank waits here for every other (a barrier, watched by the timeout).
  void sync();
  // Every rank's `text`, in rank order, on every rank (alone: {text}).
  std::vector<std::string> gather(const std::string& text);

  // A digest of bytes (16 hex digits), for the facts ("" in builds without MPI, which state none).
  static std::string digest(const void* data, std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0;
  int size_ = 1;
  bool asked_ = false;
  bool agreed_ = false;
  std::string exchange_why_;
  std::string balance_why_;
  std::string waits_why_;
};

}  // namespace polyprobe::app
