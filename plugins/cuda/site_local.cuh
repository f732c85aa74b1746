// The site-local path on the device (docs/design.md section 3): a particle whose parameters all lie
// in one conv, self-attention or Cheri-block op changes only the sites it owns there (conv
// output channels, one attention head or the output projection, Cheri hidden units or output
// rows), so its candidates recompute those sites from the incumbent's reused values, batched
// over the chunk, and copy or correct the rest of the op's output; the ops after it run
// densely over the chunk as on the dense path.
//
// What each kind recomputes and what it takes from the incumbent:
//   conv            the moved output channels, with the candidate's filter (the dense path's
//                   arithmetic: the same bits); other channels are the incumbent's values
//   attention head  the moved q/k/v rows of one head from the layer input, that head's mix
//                   (the host's sdpa operation or the plugin's kernel), then the output as the
//                   incumbent's plus out_proj's columns of the head times the mix's change
//   attention out   the incumbent's output plus the moved out_proj entries times the
//                   incumbent's mix
//   Cheri hidden    the moved hidden units' pre-activations as the incumbent's plus the moved
//                   fc1 entries' change times the normalised conv, GELU's change there, then
//                   the output as the incumbent's plus 0.15 fc2 times the units' change (the conv
//                   and its statistics are the incumbent's: fc1 cannot move them)
//   Cheri out       the incumbent's output plus 0.15 times the moved fc2 entries times the
//                   incumbent's hidden values
//   linear          (in a model with the kinds above) the incumbent's output plus the moved
//                   weights' change times the incumbent's input, as the sparse path's first op
//   Cheri taps      (with a carry) the moved channels' conv change, the plane statistics
//                   updated by it, fc1's output as the affine map of the incumbent's that the
//                   new statistics make plus the moved channels' term, GELU's change for
//                   every unit, straight into the linear op after the block
// Particles that move anything else (conv taps of the Cheri block, layer-norm gains, two
// ops, more than kSiteMax sites) run on the dense path.
#pragma once

#include "fused_tail.cuh"
#include "kernels.cuh"
#include "layer_ops.cuh"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace polyprobe::cuda {

// The most sites (and moved parameters) one site-local particle has.
constexpr int kSiteMax = 8;

enum SiteKind : int32_t {
  kSiteNone = -1,  // not site-local: the dense path
  kSiteConv = 0,
  kSiteAttentionHead = 1,
  kSiteAttentionOut = 2,
  kSiteCheriHidden = 3,
  kSiteCheriOut = 4,
  kSiteLinear = 5,
  kSiteCheriTaps = 6,  // conv taps of a Cheri block that carries (CheriCarry, per_row 1 or L)  // a
                       // linear op of such a model: the incumbent's output plus the sparse
                       // correction over the moved weights (launch_correct), as the sparse path
};

// How one particle's candidates run in a site-local op, from its moved parameters.
struct SitePlan {
  int32_t kind = kSiteNone;
  int32_t n = 0;              // sites used
  int32_t sites[kSiteMax]{};  // ascending: conv channels, the head, Cheri hidden units
};

// The plan of a particle that moves the parameters `local` (indices relative to the op's
// first parameter, any order) of `op`; kind kSiteNone when the op or the parameters do not
// allow the path. Pure host code.
// `cheri_taps`: a Cheri op's taps may be site-local (its carry allows them).
SitePlan plan_site(const LayerOp& op, const std::vector<int64_t>& local, bool cheri_taps = false);

// The per-particle plans on the device, [P] each.
struct SiteTable {
  const int32_t* kind;
  const int32_t* n;
  const int32_t* sites;  // [P kSiteMax]
};

// Values per sample of the site buffer a chunk needs for `op` (0 for kinds without one).
int64_t site_scratch_per_sample(const LayerOp& op);

// One chunk's site-local op: y [count, batch, op.out] from the incumbent's input x_inc and
// output y_inc [batch, ...], its scratch inc_scratch (layer_ops.cuh's layout, for attention
// and the Cheri block) and, for the Cheri block, its views (launch_cheri_views), its
// parameter block params (the effective values) that starts at raw
// parameter `offset`, and the candidates' new values q_new [count, elem_max] of the
// parameters they move (launch_deltas). `buffer` holds count * batch *
// site_scratch_per_sample(op) values. Every particle of the chunk has a site plan in `op`.
// The attention mix uses op.sdpa when set; when the operation declines, the plugin's kernel
// runs and *declined gets the reason.
template <class S>
void launch_site_op(const LayerOp& op, CandidateSource src, ParticleTable t, SiteTable sites,
                    int64_t count, int64_t batch, const S* x_inc, const S* y_inc,
                    const S* inc_scratch, const S* views, const S* params, int64_t offset,
                    const S* q_new, S* buffer, S* y, cudaStream_t stream, std::string* declined);

// The incumbent's Cheri values as its site-local candidates read them, feature-major per
// sample so that a block's threads, one position each, read them coalesced: the normalised
// conv [batch, C, L], then fc1's output before GELU [batch, e C, L], then fc1's row sums
// [e C]. `views` holds
// cheri_views_size(op, batch) values; inc_scratch is the block's scratch, params its block.
int64_t cheri_views_size(const LayerOp& op, int64_t batch);
template <class S>
void launch_cheri_views(const LayerOp& op, int64_t batch, const S* inc_scratch, const S* params,
                        S* views, cublasHandle_t blas, cudaStream_t stream);

// A Cheri block whose output feeds a linear op directly (identity activations and flatten
// between): its site-local candidates carry their change into that op's output, rank one per
// moved unit, without writing the block's [L, C] output per candidate (the issue's sparse
// delta into the next affine layer). The linear op reads `per_row` positions per row (its
// input is per_row C features), `rows` = L / per_row rows per sample, `outputs` per row.
// The most outputs per row of a linear op that taps particles carry into.
constexpr int64_t kTapsMaxOutputs = 16;

template <class S>
struct CheriCarry {
  int64_t per_row = 0, rows = 0, outputs = 0;
  const S* w_next = nullptr;  // the linear op's effective weights [outputs, per_row C]
  S* u = nullptr;             // [outputs, per_row, H]: w_next through fc2, per position of a row
};

// Whether a carry into `outputs` per row of `per_row` positions serves the block's taps
// particles too (kSiteCheriTaps).
bool cheri_taps_carry(const LayerOp& op, int64_t per_row, int64_t outputs);

// carry.u from the incumbent's effective parameters (once per incumbent).
template <class S>
void launch_cheri_carry_weights(const LayerOp& op, const S* params, const CheriCarry<S>& carry,
                                cudaStream_t stream);

// A chunk's site-local Cheri candidates straight to the linear op's output z [count, batch,
// rows, outputs] = z_inc [batch, rows, outputs] + the change; the arguments as
// launch_site_op's (x_inc: the block's input, read by taps particles).
template <class S>
void launch_site_cheri_carry(const LayerOp& op, CandidateSource src, ParticleTable t,
                             SiteTable sites, int64_t count, int64_t batch, const S* x_inc,
                             const S* inc_scratch, const S* views, const S* params, int64_t offset,
                             const S* q_new, S* buffer, const CheriCarry<S>& carry, const S* z_inc,
                             S* z, cudaStream_t stream);

// A conv op whose output reaches a linear op through channel-local ops alone (activations,
// at most one pooling, flatten): its site-local candidates take their moved channels through
// those ops and into the linear op as a sparse change, z = z_inc + W[:, their features] (new -
// old), never writing the conv's output per candidate (cpu_tbb's channel tail, on the GPU).
struct ConvTail {
  ActivationChain before{};  // on the conv's values
  int32_t pooled = 0;        // 1: `pool` follows `before`
  pp_pool_attrs pool{};
  ActivationChain after{};  // on the pooled values (or after `before` when not pooled)
  int64_t per_channel = 0;  // features per channel at the linear op's input
  int64_t outputs = 0;      // the linear op's outputs
};

// Values per sample of the buffer launch_site_conv_tail needs.
inline int64_t conv_tail_scratch_per_sample(const ConvTail& tail) {
  return kSiteMax * tail.per_channel;
}

// A chunk's site-local conv candidates straight to the linear op's output z [count, batch,
// outputs]: from the incumbent's conv input x_inc, the linear op's input tail_inc [batch,
// C per_channel] and output z_inc [batch, outputs], its effective weights w_next; the other
// arguments as launch_site_op's.
template <class S>
void launch_site_conv_tail(const LayerOp& op, const ConvTail& tail, CandidateSource src,
                           ParticleTable t, SiteTable sites, int64_t count, int64_t batch,
                           const S* x_inc, const S* params, int64_t offset, const S* q_new,
                           const S* tail_inc, const S* w_next, const S* z_inc, S* buffer, S* z,
                           cudaStream_t stream);

}  // namespace polyprobe::cuda
