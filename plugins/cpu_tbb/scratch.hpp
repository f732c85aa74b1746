// One worker's buffers for one group of candidates, for every path: sized on first use,
// then reused (enumerable_thread_specific in the evaluator), so the hot path allocates
// nothing per candidate. Never shared between threads.
#pragma once

#include "packets.hpp"
#include "site_local.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace polyprobe::cpu_tbb {

// The rank-one losses of a task's delta groups (DeltaPath::rank_one_losses): each sample's
// series loss in `lane_losses`, and the samples the series does not certify waiting here with
// their logits, computed a whole packet at a time (when kLanes have gathered, and at the end
// of the task) and written over their series loss. A group rarely has more than a few such
// samples, so computing them where they arise ran a packet's exponentials for one lane.
template <class S>
struct ExactLanes {
  static constexpr int kMaxClasses = 64;  // wider outputs are computed sample by sample
  Packet<S> logits[kMaxClasses];          // [class]: lane i is waiting sample i's logit
  Packet<S> picked;                       // the label's logit
  int64_t target[kLanes<S>];              // where each waiting sample's loss goes
  int count = 0;
  std::vector<S> lane_losses;         // per candidate, its whole packets of samples
  std::vector<uint32_t> exact_lanes;  // per candidate and packet: the lanes to compute exactly
  // A candidate whose mean loss is read off lane_losses at the end of the task.
  struct Pending {
    int64_t loss_index, offset;
    double tail;  // the loss sum of the samples past the last whole packet
    double l2;    // the regularisation term added to the mean
  };
  std::vector<Pending> pending;
};

template <class S>
struct WorkerScratch {
  // delta path: deltas are feature-major, [features, candidates * batch]
  Mat<S> delta, next, dense_in, room;
  Mat<S> sparse;  // [units, candidates * batch]
  std::vector<int64_t> units;
  std::vector<const S*> inputs;  // unit_relu_change: each term's input row (null: bias)
  std::vector<S> theta;          // [candidates * terms]
  Arr<S> src, tmp_b, max_b, sum_b;
  Eigen::Matrix<S, Eigen::Dynamic, 1> column, tmp_col;
  Mat<S> by_direction;  // [distinct dense u, candidates * batch]
  Mat<S> step;          // [candidates, batch]: the scalar move along one direction
  ExactLanes<S> exact;  // rank-one losses, completed at the end of each task
  std::vector<int32_t> directions;
  std::vector<S> buffer, buffer_out;  // host elementwise on padded flat buffers
  // materialised paths: sample-major
  std::vector<S> eff;         // effective parameters (transforms applied)
  std::vector<S> raw_params;  // fallback: parameters as the host layers take them
  uint64_t generation = 0, raw_generation = 0;
  std::vector<double> row_losses;
  std::vector<Mat<S>> hidden;
  Mat<S> stack;                  // a group's rows entering the suffix
  std::vector<Mat<S>> suffix;    // each later layer's output (forward_suffix)
  std::vector<int64_t> touched;  // parameters a group changes
  std::vector<double> coef;      // [touched * d]: d(param) / d(displacement component)
  std::vector<double> raw;       // [touched] per candidate
  std::vector<std::pair<int64_t, std::pair<int32_t, double>>> entries;  // collect_touched
  SiteWork<S> site;                                                     // site-local path
};
}  // namespace polyprobe::cpu_tbb
