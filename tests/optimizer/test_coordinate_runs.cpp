// kernels::coordinate_runs and add_run_moves (how the optimizer and host sessions move an
// incumbent) against the coordinate loop they replace: the same bits, on the optimizer's
// layouts (one run a block, broken by padding), shuffled ones and ones naming a parameter twice.
#include <polyprobe/candidates.hpp>
#include <polyprobe/plugin/kernels/coordinate_runs.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

using polyprobe::ParticleMap;
using polyprobe::kernels::add_run_moves;
using polyprobe::kernels::coordinate_runs;
using polyprobe::kernels::CoordinateRun;

namespace {

// The loop the runs replace.
std::vector<double> by_coordinates(const std::vector<int64_t>& coords,
                                   const std::vector<double>& moves, std::vector<double> params) {
  for (std::size_t c = 0; c < coords.size(); ++c)
    if (coords[c] >= 0) params[static_cast<std::size_t>(coords[c])] += moves[c];
  return params;
}

std::vector<double> by_runs(const std::vector<CoordinateRun>& runs,
                            const std::vector<double>& moves, std::vector<double> params) {
  for (const CoordinateRun& run : runs) {
    // In two pieces, as threads would take a run.
    const int64_t half = run.count / 2;
    add_run_moves(run, half, run.count, moves.data(), params.data());
    add_run_moves(run, 0, half, moves.data(), params.data());
  }
  return params;
}

}  // namespace

TEST_CASE("coordinate runs move an incumbent with the coordinate loop's bits") {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  for (int trial = 0; trial < 60; ++trial) {
    const int32_t d = 2 + trial % 7;
    // Blocks as the optimizer cuts them (each its own particles, the last padded).
    std::vector<int64_t> coords;
    int64_t n = 0, blocks = 1 + trial % 4;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t size = 1 + static_cast<int64_t>(rng() % 300);
      const ParticleMap part = ParticleMap::contiguous(size, d, n);
      coords.insert(coords.end(), part.coords.begin(), part.coords.end());
      n += size;
    }
    const int form = trial % 3;
    if (form == 1) std::shuffle(coords.begin(), coords.end(), rng);
    if (form == 2) coords.insert(coords.end(), coords.begin(), coords.begin() + n / 2);
    std::vector<double> moves(coords.size()), params(static_cast<std::size_t>(n));
    for (double& m : moves) m = normal(rng);
    for (double& p : params) p = normal(rng);
    const std::vector<CoordinateRun> runs = coordinate_runs(coords);
    INFO("trial " << trial << ", d " << d << ", form " << form);
    CHECK(by_runs(runs, moves, params) == by_coordinates(coords, moves, params));
    int64_t covered = 0;
    for (const CoordinateRun& run : runs) covered += run.count;
    CHECK(covered == std::count_if(coords.begin(), coords.end(), [](int64_t c) { return c >= 0; }));
    // In order, one a block at most: the padding of a block's last particle breaks a run.
    if (form == 0) CHECK(static_cast<int64_t>(runs.size()) <= blocks);
  }
  // Long runs only where they pay: a block layout keeps its one run, a shuffled one has none.
  const ParticleMap block = ParticleMap::contiguous(1000, 2);
  CHECK(polyprobe::kernels::long_coordinate_runs(block.coords).size() == 1);
  std::vector<int64_t> shuffled = block.coords;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  CHECK(!coordinate_runs(shuffled).empty());
  CHECK(polyprobe::kernels::long_coordinate_runs(shuffled).empty());
  CHECK(coordinate_runs({}).empty());
  CHECK(coordinate_runs(std::vector<int64_t>{-1, -1}).empty());
}
