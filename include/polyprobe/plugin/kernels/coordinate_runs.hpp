// A particle layout's coordinates as runs of consecutive parameters, header-only and shared by
// the core (the optimizer's own copy of the incumbent) and every host backend's session, so
// both move an incumbent by a step's moves in plain loops over contiguous memory rather than
// one coordinate lookup a move (a layout built by the optimizer is a few runs: one a block,
// broken only by the padding of a block's last particle, -1).
//
// Each parameter a layout names once is added to once, so any order of the runs, and runs in
// parallel, give the bits of the coordinate loop `if (coords[c] >= 0) params[coords[c]] +=
// moves[c]`; a layout that names a parameter twice keeps that loop's order (one run after
// another, each in order).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace polyprobe::kernels {

// moves[first_move + k] moves parameter first_param + k, for k < count.
struct CoordinateRun {
  int64_t first_move = 0;
  int64_t first_param = 0;
  int64_t count = 0;
};

// The runs of `coords` ([P d], -1: padding that moves nothing), in move order.
inline std::vector<CoordinateRun> coordinate_runs(std::span<const int64_t> coords) {
  std::vector<CoordinateRun> runs;
  for (std::size_t c = 0; c < coords.size(); ++c) {
    if (coords[c] < 0) continue;
    const auto move = static_cast<int64_t>(c);
    if (!runs.empty() && runs.back().first_move + runs.back().count == move &&
        runs.back().first_param + runs.back().count == coords[c])
      ++runs.back().count;
    else
      runs.push_back({move, coords[c], 1});
  }
  return runs;
}

// The runs of `coords` when they are long enough to pay (64 coordinates a run or more on
// average: the optimizer's layouts), else none, and the caller keeps the coordinate loop.
inline std::vector<CoordinateRun> long_coordinate_runs(std::span<const int64_t> coords) {
  constexpr std::size_t kShortestMeanRun = 64;
  std::vector<CoordinateRun> runs = coordinate_runs(coords);
  if (runs.size() * kShortestMeanRun > coords.size()) runs.clear();
  return runs;
}

// params[first_param + k] += moves[first_move + k] for k in [begin, end) of `run`.
inline void add_run_moves(const CoordinateRun& run, int64_t begin, int64_t end, const double* moves,
                          double* params) {
  const double* from = moves + run.first_move;
  double* to = params + run.first_param;
  for (int64_t k = begin; k < end; ++k) to[k] += from[k];
}

}  // namespace polyprobe::kernels
