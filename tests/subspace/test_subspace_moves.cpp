// kernels::apply_subspace_moves (a step's moves row by row, the host's and every session's
// way) against apply_subspace_move called move by move: the same bits, on random mixes of
// the coordinate forms that share entries.
#include <polyprobe/plugin/kernels/subspace_move.hpp>

#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

namespace {

using polyprobe::kernels::apply_subspace_move;
using polyprobe::kernels::apply_subspace_moves;
using polyprobe::kernels::SubspaceMove;

struct Tensor {
  int64_t offset, rows, cols;
};

}  // namespace

TEST_CASE("a step's subspace moves row by row have the bits of the moves one by one") {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal;
  const std::vector<Tensor> tensors{{0, 7, 5}, {35, 16, 9}, {179, 9, 1}, {188, 1, 4}};
  const int64_t n_params = 192;
  for (int trial = 0; trial < 200; ++trial) {
    // Dense directions, kept alive for the views.
    std::vector<std::vector<double>> dense;
    std::vector<SubspaceMove> moves;
    const int count = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < count; ++k) {
      const Tensor& t = tensors[rng() % tensors.size()];
      pp_subspace_coord c{t.offset, t.rows, t.cols, -1, -1, nullptr, nullptr};
      const auto form = rng() % 4;  // entry, row x dense v, dense u x column, dense u x dense v
      if (form == 0 || form == 1)
        c.row = static_cast<int64_t>(rng() % static_cast<uint64_t>(t.rows));
      if (form == 0 || form == 2)
        c.col = static_cast<int64_t>(rng() % static_cast<uint64_t>(t.cols));
      if (c.row < 0) {
        dense.emplace_back(static_cast<std::size_t>(t.rows));
        for (double& x : dense.back()) x = rng() % 5 == 0 ? 0.0 : normal(rng);  // zeros skip
        c.u = dense.back().data();
      }
      if (c.col < 0) {
        dense.emplace_back(static_cast<std::size_t>(t.cols));
        for (double& x : dense.back()) x = normal(rng);
        c.v = dense.back().data();
      }
      moves.push_back({c, normal(rng) * 1e-2});
    }
    std::vector<double> one_by_one(static_cast<std::size_t>(n_params));
    for (double& x : one_by_one) x = normal(rng);
    std::vector<double> by_rows = one_by_one;
    for (const SubspaceMove& m : moves) apply_subspace_move(m.coord, m.theta, one_by_one.data());
    apply_subspace_moves(moves, by_rows.data());
    CAPTURE(trial, count);
    REQUIRE(std::memcmp(one_by_one.data(), by_rows.data(), sizeof(double) * one_by_one.size()) ==
            0);
  }
}

TEST_CASE("subspace moves on overlapping tensors keep the plain order") {
  // Two views of overlapping entries (no built-in subspace makes them): the kernel falls back
  // to move-by-move order, so the result is still that of the plain loop.
  std::vector<double> u{1.0, 2.0, 3.0}, v{0.5, -1.0};
  std::vector<SubspaceMove> moves{
      {{0, 3, 2, -1, 1, u.data(), nullptr}, 0.25},
      {{2, 2, 2, 0, -1, nullptr, v.data()}, -0.75},
  };
  std::vector<double> a(6, 1.0), b(6, 1.0);
  for (const SubspaceMove& m : moves) apply_subspace_move(m.coord, m.theta, a.data());
  apply_subspace_moves(moves, b.data());
  REQUIRE(a == b);
  REQUIRE(b[1] == 1.25);  // entry (0, 1): 1 + 0.25 * 1
}
