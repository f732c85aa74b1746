// The session's device kernels, as launchers: everything a chunk of candidates needs, from
// the raw parameter changes of each candidate to its objective value.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace polyprobe::cuda {

// The linear ops' transforms, one entry per op (zeros for activations).
struct OpTransform {
  int64_t offset;   // first parameter
  int64_t weights;  // out * in: parameters past it are the bias
  int32_t weight_transform, bias_transform;
  double quant_step;
};

// A rank-one subspace coordinate on the device (pp_subspace_coord, u and v into `basis`).
struct DeviceCoord {
  int64_t offset, rows, cols, row, col;
  int64_t u, v;  // offsets into the basis buffer, -1 when row / col >= 0
};

// Where candidate c of a chunk comes from: the optimizer's polytope form (particle
// active[c / (V K)] at vertex v, probe k) or an explicit list.
struct CandidateSource {
  int32_t polytope;  // 1: polytope form, 0: explicit
  int32_t d;
  int64_t first;  // index of the chunk's first candidate in the whole set
  // Polytope form.
  const int64_t* active;
  const double* directions;
  double probe_radius;
  int32_t vertices, probes;
  // Explicit form.
  const int64_t* particle;
  const double* displacement;
};

// The particle structure, fixed between set_particles calls.
struct ParticleTable {
  int32_t d;
  const int64_t* coords;      // [P d], -1 = padding
  const int64_t* elem_begin;  // [P + 1]: the raw parameters a particle can change (CSR)
  const int64_t* elem_raw;    // raw parameter index
  const int32_t* elem_op;     // owning op
  const int32_t* elem_row;    // output feature of the op
  const int32_t* elem_col;    // input feature, -1 for a bias
  int64_t elem_max;           // the largest count of one particle
  // Subspace (coords index these), or null in full space.
  const DeviceCoord* subspace;
  const double* basis;
};

// eff[p] = Q(theta[p]) in S for every parameter of a linear op (owner[p] >= 0).
template <class S>
void launch_effective(const double* theta, const int32_t* owner, const OpTransform* ops, int64_t n,
                      S* eff, cudaStream_t stream);

// For each candidate of the chunk and each parameter e it changes: the effective change
// dq[c, e] = Q(theta + delta) - Q(theta) in S, the new effective value q_new[c, e] =
// Q(theta + delta) (skipped when q_new is null) and the raw l2 change, then their sum per
// candidate into l2[c].
template <class S>
void launch_deltas(CandidateSource src, ParticleTable table, int64_t count, const double* theta,
                   const OpTransform* ops, const S* eff, S* dq, S* q_new, double* l2_terms,
                   double* l2, cudaStream_t stream);

// The dense path's weights: w[c] = op `op`'s effective block (`block` values from parameter
// `offset`, bias included) with the candidate's changed entries set to q_new[c, e].
template <class S>
void launch_materialise(CandidateSource src, ParticleTable table, int64_t count, int32_t op,
                        const S* block_eff, int64_t offset, int64_t block, const S* q_new, S* w,
                        cudaStream_t stream);

// y[c, b, :] += w[c, bias_at:] over `rows` samples: each candidate's own bias.
template <class S>
void launch_batched_bias(S* y, const S* w, int64_t block, int64_t bias_at, int64_t rows,
                         int64_t width, int64_t count, cudaStream_t stream);

// z[c, b, :] = zinc[b, :] for a chunk of `count` candidates.
template <class S>
void launch_broadcast(const S* zinc, int64_t rows, int64_t width, int64_t count, S* z,
                      cudaStream_t stream);

// z[c, b, row_e] += dq[c, e] * x[c, b, col_e] (1 for a bias) over the changed parameters of
// op `op`; x is shared by every candidate when x_stride == 0.
template <class S>
void launch_correct(CandidateSource src, ParticleTable table, int64_t count, int32_t op,
                    const S* dq, const S* x, int64_t x_stride, int64_t in, S* z, int64_t out,
                    int64_t rows, cudaStream_t stream);

// y[r, :] += b for r < rows.
template <class S>
void launch_add_bias(S* y, const S* bias, int64_t rows, int64_t width, cudaStream_t stream);

// y = f(x) elementwise (in place when y == x).
template <class S>
void launch_activation(const S* x, S* y, int64_t n, int32_t fn, double step, cudaStream_t stream);

// per[r] = the loss of output row r (rows = count * batch; sample r % batch).
template <class S>
void launch_sample_losses(const S* out, int64_t rows, int64_t width, int64_t batch, int32_t loss,
                          const int64_t* labels, const double* targets, S* per,
                          cudaStream_t stream);

// losses[target(c)] = mean_b per[c, b] + l2 * (sum_sq + l2_delta[c]) (l2_delta may be null).
template <class S>
void launch_objective(CandidateSource src, int64_t count, const S* per, int64_t batch, double l2,
                      double sum_sq, const double* l2_delta, double* losses, cudaStream_t stream);

// theta[coords[c]] += moves[c] for coords[c] >= 0: the host's full-space move, bit for bit.
void launch_move(const int64_t* coords, const double* moves, int64_t n, double* theta,
                 cudaStream_t stream);

}  // namespace polyprobe::cuda
