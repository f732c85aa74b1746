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

template <class S>
struct WorkerScratch {
  // delta path: deltas are feature-major, [features, candidates * batch]
  Mat<S> delta, next, dense_in, room;
  Mat<S> sparse;  // [units, candidates * batch]
  std::vector<int64_t> units;
  std::vector<S> theta;  // [candidates * terms]
  Arr<S> src, tmp_b, max_b, sum_b;
  Eigen::Matrix<S, Eigen::Dynamic, 1> column, tmp_col;
  Mat<S> by_direction;  // [distinct dense u, candidates * batch]
  Mat<S> step;          // [candidates, batch]: the scalar move along one direction
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
