// The fused tail: a whole candidate, from its first changed linear op to its loss, in one
// thread per (candidate, sample), with nothing written to memory in between.
//
// A particle that changes only linear op l moves the pre-activation of l by a sum of
// rank-one terms, dz[b, :] = sum_t theta_t s_t[b] u_t: full space, one weight (u = e_row,
// s = x[b, col], or 1 for a bias, theta = Q(w + delta) - Q(w)); a subspace coordinate
// (u = e_row or a dense basis vector, s = x[b, col] or the precomputed v . x[b]). When all
// u are unit vectors the change lives on at most d units (sparse), else on all of them
// (dense). Then, exactly for any radius and any activation:
//   dh = f1(z + dz) - f1(z)                  on the changed units (f1: the ops between),
//   the output op m1 (when l is not last):   logits += W_m1 dh, or, with one more hidden
//   op m1 then the output m2: for each unit p of m1, dz1_p = W_m1[p, :] dh,
//   dh1_p = f2(z1_p + dz1_p) - f2(z1_p), logits += W_m2[:, p] dh1_p (streamed: no vector of
//   m1's width is ever stored),
// then the loss of the incumbent's logits plus their change. Units whose change is exactly
// zero are skipped, which is exact (f(z + 0) - f(z) = 0). Deeper tails, particles across two
// ops, subspace coordinates on transformed weights and wide outputs take the general path.
#pragma once

#include "kernels.cuh"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace polyprobe::cuda {

inline constexpr int kFusedMaxOutputs = 64;  // logits held per thread
inline constexpr int kFusedMaxChain = 4;     // activations between two linear ops
inline constexpr int kFusedMaxTerms = 16;    // rank-one terms of one particle
inline constexpr int kHiddenUnits = 2;       // modes 4, 5: units of op l one particle changes
inline constexpr int kHiddenGroup = 4;       // modes 4, 5: candidates one thread carries

// Activations applied in order (flatten and identity included as identity).
struct ActivationChain {
  int32_t n;
  int32_t fn[kFusedMaxChain];
  double step[kFusedMaxChain];
};

// One rank-one term of a particle (see above). Terms of one particle are sorted by unit.
struct FusedTerm {
  int32_t slot;       // the displacement component that drives it
  int32_t unit;       // output unit of op l, or -1 for a dense u
  int64_t u;          // dense u: offset into the basis buffer
  int32_t source;     // >= 0: input column of op l; -1: a bias (s = 1); <= -2: vx row -source - 2
  int32_t transform;  // full space: the weight transform of the raw parameter
  int64_t raw;        // full space: the raw parameter (theta = Q(w + delta) - Q(w)); else -1
};

// The tail of one chunk: every candidate's particle changes op l only.
template <class S>
struct FusedTail {
  const int64_t* term_begin;  // [P + 1]
  const FusedTerm* terms;
  const uint8_t* dense;  // [P]: 1 when a term has a dense u
  const double* basis;   // dense u vectors (subspace)
  const double* theta;   // the incumbent's raw parameters (full space)
  const S* eff;          // the incumbent's effective parameters
  double quant_step;     // op l's int8 step
  int64_t batch;
  int64_t out_l;       // units of op l
  const S* x_t;        // [in_l, B]: op l's input, transposed
  const S* vx_t;       // [n_vx, B]: v . x for the dense v of op l (subspace)
  const S* z_t;        // [out_l, B]: op l's output
  ActivationChain f1;  // between op l and m1
  int32_t hidden;      // 1: m1 is hidden and m2 the output; 0: m1 is the output; -1: l is
  int64_t width_m1;    // units of m1 (hidden == 1)
  const S* w_m1;       // effective W of m1 [width_m1 or C, out_l]
  const S* w_m1_t;     // the same transposed [out_l, width_m1] (hidden == 1)
  const S* z1_t;       // [width_m1, B]: m1's output (hidden == 1)
  ActivationChain f2;  // between m1 and m2
  const S* w_m2_t;     // effective W of m2 transposed [width_m1, C]
  const S* logits_t;   // [C, B]: the incumbent's output
  int64_t outputs;     // C
  int32_t loss;
  const int64_t* labels;
  const double* targets;
};

// The shared memory mode 3 stages per block: the dense u of a particle's terms and m1's
// weights; mode 3 serves a tail only when this fits the device's per-block shared memory
// (without opting in).
inline std::size_t fused_dense_shared_bytes(int64_t out_l, int64_t outputs, std::size_t scalar) {
  return static_cast<std::size_t>(kFusedMaxTerms * out_l + out_l * outputs) * scalar;
}

// per[c * batch + b] = the loss of candidate c of the chunk on sample b. mode 0: no hidden
// op after l; 1: a hidden op and sparse changes; 3: no hidden op and dense changes, staged
// in shared memory
// (subspace terms only: no weight transform); 4: mode 1 and 5: mode 0, for particles that
// change at most kHiddenUnits units, kHiddenGroup candidates per thread sharing the
// incumbent's reads (the same arithmetic; a zero change adds w * 0 instead of nothing).
template <class S>
void launch_fused_tail(CandidateSource src, FusedTail<S> tail, int64_t count, int32_t mode, S* per,
                       cudaStream_t stream);

// Mode 2, a hidden op and dense changes, runs as three launches, the dense product as a
// GEMM: launch_dense_change writes dh [count * batch, out_l] (op l's activation change);
// the caller computes dz1 = dh W_m1^T [count * batch, width_m1]; launch_hidden_change
// streams m1's units into the logits and writes per as launch_fused_tail does.
template <class S>
void launch_dense_change(CandidateSource src, FusedTail<S> tail, int64_t count, S* dh,
                         cudaStream_t stream);
template <class S>
void launch_hidden_change(FusedTail<S> tail, int64_t count, const S* dz1, S* per,
                          cudaStream_t stream);

// out[j * rows + r] = in[r * width + j]: a [rows, width] matrix transposed.
template <class S>
void launch_transpose(const S* in, int64_t rows, int64_t width, S* out, cudaStream_t stream);

// vx_t[j, b] = sum_i v_j[i] x[b, i] for the dense v vectors (offsets into basis) of one op.
template <class S>
void launch_dense_v(const double* basis, const int64_t* v_offsets, int64_t n_v, const S* x,
                    int64_t rows, int64_t in, S* vx_t, cudaStream_t stream);

}  // namespace polyprobe::cuda
