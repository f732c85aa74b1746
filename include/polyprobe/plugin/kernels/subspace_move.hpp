// Moving parameters along one rank-one subspace coordinate (pp_subspace_coord), header-only
// and shared by the core's RankOneSubspace and every backend's session, so that all of them
// move an incumbent with the same arithmetic in the same order: a session's copy of the
// incumbent and the host's stay bit-identical step after step. A backend compiled for FMA
// (-march=native) must compile its caller with -ffp-contract=off (the host has no FMA to
// contract to), as cpu_tbb's session.cpp is.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <cstdint>

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

}  // namespace polyprobe::kernels
