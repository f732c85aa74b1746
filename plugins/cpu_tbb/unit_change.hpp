// The change of one ReLU unit's activation when a group's candidates move only that unit's
// incoming weights and bias: the first step of the delta path for most full-space particles,
// run a packet of samples at a time. It rounds as the delta path's general route does, term
// by term (built without FMA contraction for that reason: unit_change.cpp), so the losses are
// the same bits whichever route computed them.
#pragma once

#include <cstdint>

namespace polyprobe::cpu_tbb {

// out[i * batch + b] = relu(z[b] + dz_ib) - relu_z[b] for the n candidates i and the batch's
// samples b, where dz_ib = sum_t theta[i * n_terms + t] x_t[b] summed in t order, each
// product rounded before it is added (x[t] == nullptr: a bias term, x_t = 1). relu(v) is
// v > 0 ? v : 0 (0 for NaN). All arrays are dense; out must not alias the inputs.
template <class S>
void unit_relu_change(const S* z, const S* relu_z, const S* const* x, const S* theta,
                      int64_t n_terms, int64_t n, int64_t batch, S* out);

}  // namespace polyprobe::cpu_tbb
