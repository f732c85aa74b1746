// Moving parameters along one rank-one subspace coordinate (pp_subspace_coord), header-only
// and shared by the core's RankOneSubspace and every backend's session, so that all of them
// move an incumbent with the same arithmetic in the same order: a session's copy of the
// incumbent and the host's stay bit-identical step after step. A backend compiled for FMA
// (-march=native) must compile its caller with -ffp-contract=off (the host has no FMA to
// contract to), as cpu_tbb's session.cpp is.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace polyprobe::kernels {

// params += theta * u v^T on the coordinate's rows x cols tensor (row-major at offset).
inline void apply_subspace_move(const pp_subspace_coord& c, double theta, double* params) {
  for (int64_t r = 0; r < c.rows; ++r) {
    const double ur = c.row >= 0 ? (r == c.row ? 1.0 : 0.0) : c.u[r];
    if (ur == 0.0) continue;
    double* dst = params + c.offset + r * c.cols;
    if (c.col >= 0)
      dst[c.col] += theta * ur;
    else
      for (int64_t i = 0; i < c.cols; ++i) dst[i] += theta * ur * c.v[i];
  }
}

// One coordinate's move of a step: theta along coord.
struct SubspaceMove {
  pp_subspace_coord coord;
  double theta;
};

// Every move in turn, with exactly the bits of apply_subspace_move called for each in order
// (each entry receives its moves' terms in that order, as the same products), but a tensor's
// rows are visited once, each move applying its part of the row. Move by move, a coordinate
// with a dense u and one column touched one entry per row, a row apart: the hybrid
// subspace's moves on mlp256-sub512 took 0.55 ms of a 2.8 ms step that way (perf), on
// the host and again in the session.
// (C++17: the cuda plugin's sources include this header too.)
inline void apply_subspace_moves(const std::vector<SubspaceMove>& moves, double* params) {
  // Moves grouped by tensor, in order within each group.
  std::vector<std::size_t> order(moves.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return moves[a].coord.offset < moves[b].coord.offset;
  });
  // Tensors that share entries without being the same tensor: keep the plain order.
  for (std::size_t i = 1; i < order.size(); ++i) {
    const pp_subspace_coord &a = moves[order[i - 1]].coord, &b = moves[order[i]].coord;
    const bool same = a.offset == b.offset && a.rows == b.rows && a.cols == b.cols;
    if (!same && a.offset + a.rows * a.cols > b.offset) {
      for (const SubspaceMove& m : moves) apply_subspace_move(m.coord, m.theta, params);
      return;
    }
  }
  std::vector<std::size_t> dense, by_row;  // a group's moves with a dense u; with u = e_row
  for (std::size_t first = 0; first < order.size();) {
    const pp_subspace_coord& tensor = moves[order[first]].coord;
    std::size_t last = first;
    dense.clear();
    by_row.clear();
    for (; last < order.size() && moves[order[last]].coord.offset == tensor.offset; ++last)
      (moves[order[last]].coord.row >= 0 ? by_row : dense).push_back(order[last]);
    std::stable_sort(by_row.begin(), by_row.end(), [&](std::size_t a, std::size_t b) {
      return moves[a].coord.row < moves[b].coord.row;
    });
    // Row r: the dense moves and those of row r, merged back into move order.
    std::size_t next_row = 0;
    for (int64_t r = 0; r < tensor.rows; ++r) {
      while (next_row < by_row.size() && moves[by_row[next_row]].coord.row < r) ++next_row;
      std::size_t end_row = next_row;
      while (end_row < by_row.size() && moves[by_row[end_row]].coord.row == r) ++end_row;
      std::size_t d = 0, e = next_row;
      double* dst = params + tensor.offset + r * tensor.cols;
      while (d < dense.size() || e < end_row) {
        const bool take_dense = e == end_row || (d < dense.size() && dense[d] < by_row[e]);
        const SubspaceMove& m = moves[take_dense ? dense[d++] : by_row[e++]];
        const double ur = m.coord.row >= 0 ? 1.0 : m.coord.u[r];
        if (ur == 0.0) continue;
        if (m.coord.col >= 0)
          dst[m.coord.col] += m.theta * ur;
        else
          for (int64_t i = 0; i < m.coord.cols; ++i) dst[i] += m.theta * ur * m.coord.v[i];
      }
      next_row = end_row;
    }
    first = last;
  }
}

}  // namespace polyprobe::kernels
