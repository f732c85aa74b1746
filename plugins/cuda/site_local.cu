// The site-local path's plans and kernels (site_local.cuh). Each kernel thread owns the
// values it writes; a candidate reads its particle's plan and moved parameters from the
// tables, so one launch serves a chunk of candidates of different particles.
#include "blas.cuh"
#include "candidate_source.cuh"
#include "common.cuh"
#include "device.hpp"
#include "formulas.cuh"
#include "site_local.cuh"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace polyprobe::cuda {
namespace {

constexpr double kCheriResidualScale = 0.15;
constexpr double kCheriEps = 1e-3;  // the block's layer-norm epsilon (docs/design.md section 6)

using launch::thread_index;
using launch::thread_stride;

// A candidate's moved parameters of the op: local index and new effective value.
template <class S>
struct Moves {
  int32_t n = 0;
  int64_t local[kSiteMax];
  S value[kSiteMax];

  __device__ Moves(const ParticleTable& t, int64_t c, int64_t p, int64_t offset, const S* q_new) {
    const int64_t begin = t.elem_begin[p];
    const int64_t count = t.elem_begin[p + 1] - begin;
    for (int64_t e = 0; e < count && n < kSiteMax; ++e, ++n) {
      local[n] = t.elem_raw[begin + e] - offset;
      value[n] = q_new[c * t.elem_max + e];
    }
  }
  // Parameter k of the op: the candidate's value where it moves it, else the incumbent's.
  __device__ S at(const S* params, int64_t k) const {
    S v = params[k];
    for (int32_t m = 0; m < n; ++m)
      if (local[m] == k) v = value[m];
    return v;
  }
};

__device__ bool has_site(const SiteTable& s, int64_t p, int32_t site) {
  for (int32_t m = 0; m < s.n[p]; ++m)
    if (s.sites[p * kSiteMax + m] == site) return true;
  return false;
}

// conv: a thread per (candidate, sample, output value); the moved channels recomputed with
// the candidate's filter and bias, the rest copied.
template <class S>
__global__ void site_conv_kernel(LayerOp op, CandidateSource src, ParticleTable t, SiteTable s,
                                 int64_t count, int64_t batch, const S* x_inc, const S* y_inc,
                                 const S* params, int64_t offset, const S* q_new, S* y) {
  const pp_conv_attrs& a = op.conv;
  const int64_t oh = a.out_size[0], ow = a.out_size[1];
  const int64_t patch = a.in_channels / a.groups * a.kernel[0] * a.kernel[1];
  const int64_t per = batch * op.out;
  for (int64_t i = thread_index(); i < count * per; i += thread_stride()) {
    const int64_t c = i / per, b = (i / op.out) % batch, o = i % op.out;
    const int64_t oc = o / (oh * ow), oi = (o / ow) % oh, oj = o % ow;
    const int64_t p = particle_of(src, c);
    if (!has_site(s, p, static_cast<int32_t>(oc))) {
      y[i] = y_inc[b * op.out + o];
      continue;
    }
    const Moves<S> moves(t, c, p, offset, q_new);
    S acc = conv_value<S>(a, x_inc + b * op.in, oc, oi, oj,
                          [&](int64_t k) { return moves.at(params, oc * patch + k); });
    if (a.bias) acc += moves.at(params, a.out_channels * patch + oc);
    y[i] = acc;
  }
}

// Attention, 1: the moved head's q|k|v rows of every (candidate, sample) into the buffer in
// the layout of a one-head layer of width hd ([L, 3 hd] then the mix [L, hd] per sample);
// the rows the candidate moves recomputed from the layer input, the others copied.
template <class S>
__global__ void site_head_project_kernel(LayerOp op, CandidateSource src, ParticleTable t,
                                         SiteTable s, int64_t count, int64_t batch, const S* x_inc,
                                         const S* inc_scratch, const S* params, int64_t offset,
                                         const S* q_new, S* buffer) {
  const int64_t L = op.attention.length, E = op.attention.embed, hd = E / op.attention.heads;
  const int64_t per = L * 3 * hd, inc_per = L * 4 * E;
  for (int64_t i = thread_index(); i < count * batch * per; i += thread_stride()) {
    const int64_t r = i / per, c = r / batch, b = r % batch;
    const int64_t l = (i / (3 * hd)) % L, j = i % (3 * hd);
    const int64_t p = particle_of(src, c);
    const int64_t f = (j / hd) * E + s.sites[p * kSiteMax] * hd + j % hd;  // row of in_proj
    S* out = buffer + r * (per + L * hd) + l * 3 * hd + j;
    const int64_t begin = t.elem_begin[p], n = t.elem_begin[p + 1] - begin;
    bool moved = false;
    for (int64_t e = 0; e < n && s.kind[p] == kSiteAttentionHead; ++e) {
      const int64_t k = t.elem_raw[begin + e] - offset;  // a weight of row k / E or bias k - 3E^2
      moved = moved || (k < 3 * E * E ? k / E : k - 3 * E * E) == f;
    }
    if (!moved) {
      *out = inc_scratch[b * inc_per + l * 3 * E + f];
      continue;
    }
    const Moves<S> moves(t, c, p, offset, q_new);
    const S* x = x_inc + b * op.in + l * E;
    S acc = 0;
    for (int64_t k = 0; k < E; ++k) acc += moves.at(params, f * E + k) * x[k];
    if (op.attention.bias) acc += moves.at(params, 3 * E * E + f);
    *out = acc;
  }
}

// Attention, 2: a thread per (candidate, sample, position, output feature): the incumbent's
// output plus the candidate's change, from its head's new mix (kSiteAttentionHead) or its
// moved out_proj entries (kSiteAttentionOut).
template <class S>
__global__ void site_attention_out_kernel(LayerOp op, CandidateSource src, ParticleTable t,
                                          SiteTable s, int64_t count, int64_t batch, const S* y_inc,
                                          const S* inc_scratch, const S* params, int64_t offset,
                                          const S* q_new, const S* buffer, S* y) {
  const int64_t L = op.attention.length, E = op.attention.embed, hd = E / op.attention.heads;
  const int64_t inc_per = L * 4 * E, per = L * 4 * hd;
  const int64_t out_w = 3 * E * E + (op.attention.bias ? 3 * E : 0);
  const int64_t sample = L * E;
  for (int64_t i = thread_index(); i < count * batch * sample; i += thread_stride()) {
    const int64_t r = i / sample, c = r / batch, b = r % batch;
    const int64_t l = (i / E) % L, f = i % E;
    const int64_t p = particle_of(src, c);
    const S* mixed = inc_scratch + b * inc_per + 3 * L * E + l * E;
    S change = 0;
    if (s.kind[p] == kSiteAttentionHead) {
      const int64_t h = s.sites[p * kSiteMax];
      const S* mix = buffer + r * per + 3 * L * hd + l * hd;
      for (int64_t k = 0; k < hd; ++k)
        change += params[out_w + f * E + h * hd + k] * (mix[k] - mixed[h * hd + k]);
    } else {
      const int64_t begin = t.elem_begin[p], n = t.elem_begin[p + 1] - begin;
      for (int64_t e = 0; e < n; ++e) {
        const int64_t k = t.elem_raw[begin + e] - offset - out_w;  // weight [f, k % E] or bias
        if ((k < E * E ? k / E : k - E * E) != f) continue;
        const S step = q_new[c * t.elem_max + e] - params[out_w + k];
        change += k < E * E ? step * mixed[k % E] : step;
      }
    }
    y[i] = y_inc[b * sample + l * E + f] + change;
  }
}

// Where sample b's incumbent values sit in the Cheri views (site_local.cuh): feature-major,
// so that the threads of a block, one position each, read them coalesced.
template <class S>
struct CheriViewsOf {
  const S* n_t;  // [batch, C, L]: the normalised conv
  const S* z_t;  // [batch, H, L]: fc1's output before GELU
  __device__ CheriViewsOf(const S* views, const pp_cheri_attrs& a, int64_t batch, int64_t b)
      : n_t(views + b * a.channels * a.length),
        z_t(views + batch * a.channels * a.length + b * a.expansion * a.channels * a.length) {}
};

template <class S>
__device__ inline S gelu(S v) {
  return activate<S>(PP_ACT_GELU_TANH, v, S(0));
}

// Cheri, 1 (kSiteCheriHidden): a block per (candidate, sample), a thread per position: each
// moved unit's GELU output minus the incumbent's, gelu(z + dz) - gelu(z), with dz the moved
// fc1 entries' change times the normalised conv; into the buffer [count, batch, kSiteMax, L].
template <class S>
__global__ void site_cheri_hidden_kernel(LayerOp op, CandidateSource src, ParticleTable t,
                                         SiteTable s, int64_t count, int64_t batch, const S* views,
                                         const S* params, int64_t offset, const S* q_new,
                                         S* buffer) {
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels;
  for (int64_t r = blockIdx.x; r < count * batch; r += gridDim.x) {
    const int64_t c = r / batch, b = r % batch;
    const int64_t p = particle_of(src, c);
    if (s.kind[p] != kSiteCheriHidden) continue;
    const CheriViewsOf<S> v(views, a, batch, b);
    const Moves<S> moves(t, c, p, offset, q_new);
    for (int32_t m = 0; m < s.n[p]; ++m) {
      const int64_t k = s.sites[p * kSiteMax + m];
      S* out = buffer + (r * kSiteMax + m) * L;
      for (int64_t pos = threadIdx.x; pos < L; pos += blockDim.x) {
        const S z = v.z_t[k * L + pos];
        S dz = 0;
        for (int32_t e = 0; e < moves.n; ++e) {
          const int64_t ch = moves.local[e] - 3 * C - k * C;
          if (ch >= 0 && ch < C)
            dz += (moves.value[e] - params[moves.local[e]]) * v.n_t[ch * L + pos];
        }
        out[pos] = gelu(z + dz) - gelu(z);
      }
    }
  }
}

// Cheri, 2: a thread per (candidate, sample, position, channel): the incumbent's output plus
// 0.15 times the MLP's change.
template <class S>
__global__ void site_cheri_out_kernel(LayerOp op, CandidateSource src, ParticleTable t, SiteTable s,
                                      int64_t count, int64_t batch, const S* y_inc,
                                      const S* inc_scratch, const S* params, int64_t offset,
                                      const S* q_new, const S* buffer, S* y) {
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels, H = a.expansion * C;
  const int64_t fc2 = 3 * C + H * C, sample = L * C;
  for (int64_t i = thread_index(); i < count * batch * sample; i += thread_stride()) {
    const int64_t r = i / sample, c = r / batch, b = r % batch;
    const int64_t pos = (i / C) % L, ch = i % C;
    const int64_t p = particle_of(src, c);
    S change = 0;
    if (s.kind[p] == kSiteCheriHidden) {
      for (int32_t m = 0; m < s.n[p]; ++m)
        change +=
            params[fc2 + ch * H + s.sites[p * kSiteMax + m]] * buffer[(r * kSiteMax + m) * L + pos];
    } else {
      const int64_t begin = t.elem_begin[p], n = t.elem_begin[p + 1] - begin;
      const S* g = inc_scratch + cheri_layout(a, batch, b).hidden + pos * H;
      for (int64_t e = 0; e < n; ++e) {
        const int64_t k = t.elem_raw[begin + e] - offset - fc2;
        if (k / H != ch) continue;
        change += (q_new[c * t.elem_max + e] - params[fc2 + k]) * g[k % H];
      }
    }
    y[i] = y_inc[b * sample + pos * C + ch] + static_cast<S>(kCheriResidualScale) * change;
  }
}

// The views of the incumbent: n_t by transposition of the scratch's normalised conv.
template <class S>
__global__ void cheri_transpose_kernel(LayerOp op, int64_t batch, const S* scratch, S* n_t) {
  const int64_t L = op.cheri.length, C = op.cheri.channels;
  for (int64_t i = thread_index(); i < batch * C * L; i += thread_stride()) {
    const int64_t b = i / (C * L), ch = (i / L) % C, pos = i % L;
    n_t[i] = scratch[cheri_layout(op.cheri, batch, b).conv + pos * C + ch];
  }
}

// u[o, q, k] = sum_c w_next[o, q C + c] fc2[c, k], a thread per value.
template <class S>
__global__ void cheri_carry_weights_kernel(LayerOp op, const S* params, CheriCarry<S> carry) {
  const int64_t C = op.cheri.channels, H = op.cheri.expansion * C, fc2 = 3 * C + H * C;
  const int64_t total = carry.outputs * carry.per_row * H;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t k = i % H, q = (i / H) % carry.per_row, o = i / (H * carry.per_row);
    const S* w = carry.w_next + o * carry.per_row * C + q * C;
    S acc = 0;
    for (int64_t c = 0; c < C; ++c) acc += w[c] * params[fc2 + c * H + k];
    carry.u[i] = acc;
  }
}

// A block per (candidate, sample), a thread per (row, output) of the linear op after the
// block: its incumbent value plus 0.15 times the change the candidate's MLP makes through it.
template <class S>
__global__ void site_cheri_carry_kernel(LayerOp op, CandidateSource src, ParticleTable t,
                                        SiteTable s, int64_t count, int64_t batch, const S* views,
                                        const S* params, int64_t offset, const S* q_new,
                                        const S* buffer, CheriCarry<S> carry, const S* z_inc,
                                        S* z) {
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels, H = a.expansion * C;
  const int64_t fc2 = 3 * C + H * C, O = carry.outputs, Q = carry.per_row;
  const int64_t sample = carry.rows * O;
  for (int64_t r = blockIdx.x; r < count * batch; r += gridDim.x) {
    const int64_t c = r / batch, b = r % batch;
    const int64_t p = particle_of(src, c);
    if (s.kind[p] == kSiteCheriTaps) continue;  // site_cheri_taps_kernel writes these
    const bool hidden = s.kind[p] == kSiteCheriHidden;
    const int32_t units = s.n[p];
    const CheriViewsOf<S> v(views, a, batch, b);
    const int64_t begin = t.elem_begin[p], n = t.elem_begin[p + 1] - begin;
    for (int64_t i = threadIdx.x; i < sample; i += blockDim.x) {
      const int64_t row = i / O, o = i % O;
      S change = 0;
      if (hidden) {
        const S* u = carry.u + o * Q * H;
        for (int32_t m = 0; m < units; ++m) {
          const int64_t k = s.sites[p * kSiteMax + m];
          const S* dg = buffer + (r * kSiteMax + m) * L + row * Q;
          for (int64_t q = 0; q < Q; ++q) change += u[q * H + k] * dg[q];
        }
      } else {
        const S* w = carry.w_next + o * Q * C;
        for (int64_t e = 0; e < n; ++e) {
          const int64_t k = t.elem_raw[begin + e] - offset - fc2;  // fc2 [k / H, k % H]
          const S step = q_new[c * t.elem_max + e] - params[fc2 + k];
          const S* zk = v.z_t + (k % H) * L + row * Q;
          S through = 0;
          for (int64_t q = 0; q < Q; ++q) through += w[q * C + k / H] * gelu(zk[q]);
          change += step * through;
        }
      }
      z[r * sample + i] = z_inc[b * sample + i] + static_cast<S>(kCheriResidualScale) * change;
    }
  }
}

// The conv tail, 1: a block per (candidate, sample), a thread per (moved channel, feature at
// the linear op's input): the feature recomputed through the tail's ops from the candidate's
// conv values, minus the incumbent's, into the buffer [count, batch, kSiteMax, per_channel].
template <class S>
__device__ inline S apply_chain(const ActivationChain& f, S v) {
  for (int32_t i = 0; i < f.n; ++i) v = activate<S>(f.fn[i], v, static_cast<S>(f.step[i]));
  return v;
}

template <class S>
__global__ void site_conv_tail_kernel(LayerOp op, ConvTail tail, CandidateSource src,
                                      ParticleTable t, SiteTable s, int64_t count, int64_t batch,
                                      const S* x_inc, const S* params, int64_t offset,
                                      const S* q_new, const S* tail_inc, S* buffer) {
  const pp_conv_attrs& a = op.conv;
  const int64_t oh = a.out_size[0], ow = a.out_size[1];
  const int64_t patch = a.in_channels / a.groups * a.kernel[0] * a.kernel[1];
  const int64_t P = tail.per_channel;
  for (int64_t r = blockIdx.x; r < count * batch; r += gridDim.x) {
    const int64_t c = r / batch, b = r % batch;
    const int64_t p = particle_of(src, c);
    const Moves<S> moves(t, c, p, offset, q_new);
    const S* x = x_inc + b * op.in;
    for (int64_t i = threadIdx.x; i < s.n[p] * P; i += blockDim.x) {
      const int64_t m = i / P, q = i % P;
      const int64_t oc = s.sites[p * kSiteMax + m];
      const auto conv_at = [&](int64_t oi, int64_t oj) {
        S v = conv_value<S>(a, x, oc, oi, oj,
                            [&](int64_t k) { return moves.at(params, oc * patch + k); });
        if (a.bias) v += moves.at(params, a.out_channels * patch + oc);
        return apply_chain(tail.before, v);
      };
      S v;
      if (tail.pooled != 0) {  // the pooling op's window (formulas.cuh)
        const int64_t pw = tail.pool.out_size[1];
        v = pool_window<S>(tail.pool, q / pw, q % pw, oh, ow, conv_at);
      } else {
        v = conv_at(q / ow, q % ow);
      }
      v = apply_chain(tail.after, v);
      buffer[(r * kSiteMax + m) * P + q] = v - tail_inc[b * a.out_channels * P + oc * P + q];
    }
  }
}

// The conv tail, 2: a block per (candidate, sample), a thread per output of the linear op.
template <class S>
__global__ void site_conv_tail_out_kernel(ConvTail tail, int64_t channels, CandidateSource src,
                                          SiteTable s, int64_t count, int64_t batch,
                                          const S* buffer, const S* w_next, const S* z_inc, S* z) {
  const int64_t P = tail.per_channel, O = tail.outputs;
  for (int64_t r = blockIdx.x; r < count * batch; r += gridDim.x) {
    const int64_t c = r / batch, b = r % batch;
    const int64_t p = particle_of(src, c);
    for (int64_t o = threadIdx.x; o < O; o += blockDim.x) {
      S change = 0;
      for (int32_t m = 0; m < s.n[p]; ++m) {
        const S* w = w_next + o * channels * P + s.sites[p * kSiteMax + m] * P;
        const S* d = buffer + (r * kSiteMax + m) * P;
        for (int64_t q = 0; q < P; ++q) change += w[q] * d[q];
      }
      z[r * O + o] = z_inc[b * O + o] + change;
    }
  }
}

// fc1's row sums s1[k] = sum_c fc1[k, c], a thread per row.
template <class S>
__global__ void cheri_row_sums_kernel(LayerOp op, const S* params, S* sums) {
  const int64_t C = op.cheri.channels, H = op.cheri.expansion * C;
  for (int64_t k = thread_index(); k < H; k += thread_stride()) {
    S acc = 0;
    for (int64_t c = 0; c < C; ++c) acc += params[3 * C + k * C + c];
    sums[k] = acc;
  }
}

// Cheri taps (kSiteCheriTaps), with a carry of per_row 1 or L: a block per (candidate,
// sample). The moved channels' conv changes by dh = sum of the moved taps' change times the
// shifted input; the plane's mean moves by sum dh / N and its variance to var + sum (2 (h -
// mean) dh + dh^2) / N - dmean^2 (h - mean = n / inv), in double as the statistics pass; then
// every normalised value is a n + b (a = inv' / inv, b = -dmean inv') except the moved
// channels' extra dh inv', so fc1's output is z' = a z + b s1 + inv' sum_ch fc1[:, ch] dh[ch],
// and GELU's change of every unit goes through u (w_next fc2) into the linear op.
template <class S>
__global__ void site_cheri_taps_kernel(LayerOp op, CandidateSource src, ParticleTable t,
                                       SiteTable s, int64_t count, int64_t batch, const S* x_inc,
                                       const S* inc_scratch, const S* views, const S* params,
                                       int64_t offset, const S* q_new, CheriCarry<S> carry,
                                       const S* z_inc, S* z) {
  __shared__ double part[2][kThreads];
  __shared__ S sums[kTapsMaxOutputs][kThreads / 32];
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels, H = a.expansion * C, dil = a.dilation;
  const int64_t O = carry.outputs;
  const S* s1 = views + batch * (C + H) * L;
  for (int64_t r = blockIdx.x; r < count * batch; r += gridDim.x) {
    const int64_t c = r / batch, b = r % batch;
    const int64_t p = particle_of(src, c);
    if (s.kind[p] != kSiteCheriTaps) continue;  // uniform in the block
    const int32_t n = s.n[p];
    const Moves<S> moves(t, c, p, offset, q_new);
    const CheriViewsOf<S> v(views, a, batch, b);
    const S* x = x_inc + b * L * C;
    const auto dh_at = [&](int64_t pos, int64_t ch) {
      S dh = 0;
      for (int32_t e = 0; e < moves.n; ++e) {
        if (moves.local[e] % C != ch) continue;
        const int64_t at = pos + (moves.local[e] / C - 1) * dil;
        if (at >= 0 && at < L) dh += (moves.value[e] - params[moves.local[e]]) * x[at * C + ch];
      }
      return dh;
    };
    const double inv = static_cast<double>(inc_scratch[cheri_layout(a, batch, b).inv]);
    double t1 = 0.0, t2 = 0.0;
    for (int64_t pos = threadIdx.x; pos < L; pos += blockDim.x)
      for (int32_t m = 0; m < n; ++m) {
        const int64_t ch = s.sites[p * kSiteMax + m];
        const double dh = static_cast<double>(dh_at(pos, ch));
        t1 += dh;
        t2 += 2.0 * static_cast<double>(v.n_t[ch * L + pos]) / inv * dh + dh * dh;
      }
    part[0][threadIdx.x] = t1;
    part[1][threadIdx.x] = t2;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
      if (threadIdx.x < w) {
        part[0][threadIdx.x] += part[0][threadIdx.x + w];
        part[1][threadIdx.x] += part[1][threadIdx.x + w];
      }
      __syncthreads();
    }
    const auto N = static_cast<double>(L * C);
    const double dmean = part[0][0] / N;
    const double var = 1.0 / (inv * inv) - kCheriEps + part[1][0] / N - dmean * dmean;
    const double inv2 = 1.0 / sqrt(var + kCheriEps);
    __syncthreads();  // part is read by every thread before the next row writes it
    const auto scale = static_cast<S>(inv2 / inv), shift = static_cast<S>(-dmean * inv2);
    S acc[kTapsMaxOutputs];
    for (int64_t o = 0; o < O; ++o) acc[o] = 0;
    const bool per_position = carry.per_row == 1;
    for (int64_t pos = threadIdx.x; pos < L; pos += blockDim.x) {
      S dh[kSiteMax];
      for (int32_t m = 0; m < n; ++m)
        dh[m] = dh_at(pos, s.sites[p * kSiteMax + m]) * static_cast<S>(inv2);
      for (int64_t k = 0; k < H; ++k) {
        const S zk = v.z_t[k * L + pos];
        S moved = scale * zk + shift * s1[k];
        for (int32_t m = 0; m < n; ++m)
          moved += params[3 * C + k * C + s.sites[p * kSiteMax + m]] * dh[m];
        const S dg = gelu(moved) - gelu(zk);
        const S* u = carry.u + (per_position ? k : pos * H + k);
        for (int64_t o = 0; o < O; ++o) acc[o] += u[o * carry.per_row * H] * dg;
      }
      if (per_position) {
        for (int64_t o = 0; o < O; ++o)
          z[(r * L + pos) * O + o] =
              z_inc[(b * L + pos) * O + o] + static_cast<S>(kCheriResidualScale) * acc[o];
        for (int64_t o = 0; o < O; ++o) acc[o] = 0;
      }
    }
    if (per_position) continue;
    // One row of L positions: the block's partial sums per output, warp by warp.
    for (int64_t o = 0; o < O; ++o) {
      S w = acc[o];
      for (int off = 16; off > 0; off >>= 1) w += __shfl_xor_sync(0xffffffffu, w, off);
      if (threadIdx.x % 32 == 0) sums[o][threadIdx.x / 32] = w;
    }
    __syncthreads();
    for (int64_t o = threadIdx.x; o < O; o += blockDim.x) {
      S total = 0;
      for (unsigned w = 0; w < blockDim.x / 32; ++w) total += sums[o][w];
      z[r * O + o] = z_inc[b * O + o] + static_cast<S>(kCheriResidualScale) * total;
    }
    __syncthreads();
  }
}

}  // namespace

template <class S>
void launch_cheri_carry_weights(const LayerOp& op, const S* params, const CheriCarry<S>& carry,
                                cudaStream_t stream) {
  const int64_t H = op.cheri.expansion * op.cheri.channels;
  cheri_carry_weights_kernel<S>
      <<<launch::blocks(carry.outputs * carry.per_row * H), kThreads, 0, stream>>>(op, params,
                                                                                   carry);
  launch::check_last("Cheri carry weights kernel");
}

// Threads for a block that walks n items: a multiple of 32, at most kThreads.
unsigned block_threads(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>(kThreads, (n + 31) / 32 * 32));
}
unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>(rows, 1, int64_t{1} << 30));
}

bool cheri_taps_carry(const LayerOp& op, int64_t per_row, int64_t outputs) {
  return outputs <= kTapsMaxOutputs && (per_row == 1 || per_row == op.cheri.length);
}

template <class S>
void launch_site_cheri_carry(const LayerOp& op, CandidateSource src, ParticleTable t,
                             SiteTable sites, int64_t count, int64_t batch, const S* x_inc,
                             const S* inc_scratch, const S* views, const S* params, int64_t offset,
                             const S* q_new, S* buffer, const CheriCarry<S>& carry, const S* z_inc,
                             S* z, cudaStream_t stream) {
  const int64_t rows = count * batch;
  site_cheri_hidden_kernel<S><<<row_blocks(rows), block_threads(op.cheri.length), 0, stream>>>(
      op, src, t, sites, count, batch, views, params, offset, q_new, buffer);
  launch::check_last("site-local Cheri hidden kernel");
  site_cheri_carry_kernel<S>
      <<<row_blocks(rows), block_threads(carry.rows * carry.outputs), 0, stream>>>(
          op, src, t, sites, count, batch, views, params, offset, q_new, buffer, carry, z_inc, z);
  launch::check_last("site-local Cheri carry kernel");
  if (cheri_taps_carry(op, carry.per_row, carry.outputs)) {
    site_cheri_taps_kernel<S><<<row_blocks(rows), kThreads, 0, stream>>>(
        op, src, t, sites, count, batch, x_inc, inc_scratch, views, params, offset, q_new, carry,
        z_inc, z);
    launch::check_last("site-local Cheri taps kernel");
  }
}

template <class S>
void launch_site_conv_tail(const LayerOp& op, const ConvTail& tail, CandidateSource src,
                           ParticleTable t, SiteTable sites, int64_t count, int64_t batch,
                           const S* x_inc, const S* params, int64_t offset, const S* q_new,
                           const S* tail_inc, const S* w_next, const S* z_inc, S* buffer, S* z,
                           cudaStream_t stream) {
  const int64_t rows = count * batch;
  site_conv_tail_kernel<S><<<row_blocks(rows), block_threads(tail.per_channel), 0, stream>>>(
      op, tail, src, t, sites, count, batch, x_inc, params, offset, q_new, tail_inc, buffer);
  launch::check_last("site-local conv tail kernel");
  site_conv_tail_out_kernel<S><<<row_blocks(rows), block_threads(tail.outputs), 0, stream>>>(
      tail, op.conv.out_channels, src, sites, count, batch, buffer, w_next, z_inc, z);
  launch::check_last("site-local conv tail output kernel");
}

template void launch_site_conv_tail<float>(const LayerOp&, const ConvTail&, CandidateSource,
                                           ParticleTable, SiteTable, int64_t, int64_t, const float*,
                                           const float*, int64_t, const float*, const float*,
                                           const float*, const float*, float*, float*,
                                           cudaStream_t);
template void launch_site_conv_tail<double>(const LayerOp&, const ConvTail&, CandidateSource,
                                            ParticleTable, SiteTable, int64_t, int64_t,
                                            const double*, const double*, int64_t, const double*,
                                            const double*, const double*, const double*, double*,
                                            double*, cudaStream_t);

int64_t cheri_views_size(const LayerOp& op, int64_t batch) {
  return batch * op.cheri.length * op.cheri.channels * (1 + op.cheri.expansion) +
         op.cheri.expansion * op.cheri.channels;
}

template <class S>
void launch_cheri_views(const LayerOp& op, int64_t batch, const S* inc_scratch, const S* params,
                        S* views, cublasHandle_t blas, cudaStream_t stream) {
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels, H = a.expansion * C;
  cheri_transpose_kernel<S>
      <<<launch::blocks(batch * C * L), kThreads, 0, stream>>>(op, batch, inc_scratch, views);
  launch::check_last("Cheri transpose kernel");
  cheri_row_sums_kernel<S>
      <<<launch::blocks(H), kThreads, 0, stream>>>(op, params, views + batch * (C + H) * L);
  launch::check_last("Cheri row sums kernel");
  // z_t[b] [H, L] = fc1 [H, C] n_b^T, n_b the sample's normalised conv [L, C].
  gemm_batched<S>(blas, static_cast<int>(L), static_cast<int>(H), static_cast<int>(C), inc_scratch,
                  L * C, params + 3 * C, 0, views + batch * C * L, H * L, static_cast<int>(batch));
}

template void launch_cheri_views<float>(const LayerOp&, int64_t, const float*, const float*, float*,
                                        cublasHandle_t, cudaStream_t);
template void launch_cheri_views<double>(const LayerOp&, int64_t, const double*, const double*,
                                         double*, cublasHandle_t, cudaStream_t);
template void launch_cheri_carry_weights<float>(const LayerOp&, const float*,
                                                const CheriCarry<float>&, cudaStream_t);
template void launch_cheri_carry_weights<double>(const LayerOp&, const double*,
                                                 const CheriCarry<double>&, cudaStream_t);
template void launch_site_cheri_carry<float>(const LayerOp&, CandidateSource, ParticleTable,
                                             SiteTable, int64_t, int64_t, const float*,
                                             const float*, const float*, const float*, int64_t,
                                             const float*, float*, const CheriCarry<float>&,
                                             const float*, float*, cudaStream_t);
template void launch_site_cheri_carry<double>(const LayerOp&, CandidateSource, ParticleTable,
                                              SiteTable, int64_t, int64_t, const double*,
                                              const double*, const double*, const double*, int64_t,
                                              const double*, double*, const CheriCarry<double>&,
                                              const double*, double*, cudaStream_t);

SitePlan plan_site(const LayerOp& op, const std::vector<int64_t>& local, bool cheri_taps) {
  SitePlan plan;
  if (local.empty() || local.size() > static_cast<std::size_t>(kSiteMax)) return plan;
  std::set<int64_t> sites;
  int32_t kind = kSiteNone;
  const auto agree = [&](int32_t k) {
    if (kind != kSiteNone && kind != k) return false;
    kind = k;
    return true;
  };
  if (op.kind == PP_OP_CONV) {
    const pp_conv_attrs& a = op.conv;
    const int64_t weights = a.out_channels * (a.in_channels / a.groups) * a.kernel[0] * a.kernel[1];
    const int64_t patch = weights / a.out_channels;
    for (int64_t k : local) sites.insert(k < weights ? k / patch : k - weights);
    kind = kSiteConv;
  } else if (op.kind == PP_OP_SELF_ATTENTION) {
    const pp_attention_attrs& a = op.attention;
    const int64_t E = a.embed, hd = E / a.heads, in_w = 3 * E * E;
    const int64_t out_w = in_w + (a.bias ? 3 * E : 0);
    for (int64_t k : local) {
      if (k < out_w) {  // an in_proj weight or bias: its row's head
        const int64_t row = k < in_w ? k / E : k - in_w;
        if (!agree(kSiteAttentionHead)) return plan;
        sites.insert((row % E) / hd);
      } else if (!agree(kSiteAttentionOut)) {
        return plan;
      }
    }
    if (kind == kSiteAttentionHead && sites.size() != 1) return plan;
  } else if (op.kind == PP_OP_CHERI_BLOCK) {
    const pp_cheri_attrs& a = op.cheri;
    const int64_t C = a.channels, H = a.expansion * C, fc2 = 3 * C + H * C;
    for (int64_t k : local) {
      if (k < 3 * C) {  // a conv tap moves the plane statistics: only with a carry
        if (!cheri_taps || !agree(kSiteCheriTaps)) return plan;
        sites.insert(k % C);
      } else if (k < fc2) {
        if (!agree(kSiteCheriHidden)) return plan;
        sites.insert((k - 3 * C) / C);
      } else if (!agree(kSiteCheriOut)) {
        return plan;
      }
    }
  } else {
    return plan;
  }
  if (sites.size() > static_cast<std::size_t>(kSiteMax)) return plan;
  plan.kind = kind;
  for (int64_t site : sites) plan.sites[plan.n++] = static_cast<int32_t>(site);
  return plan;
}

int64_t site_scratch_per_sample(const LayerOp& op) {
  if (op.kind == PP_OP_SELF_ATTENTION)
    return op.attention.length * 4 * (op.attention.embed / op.attention.heads);
  if (op.kind == PP_OP_CHERI_BLOCK) return op.cheri.length * kSiteMax;
  return 0;
}

template <class S>
void launch_site_op(const LayerOp& op, CandidateSource src, ParticleTable t, SiteTable sites,
                    int64_t count, int64_t batch, const S* x_inc, const S* y_inc,
                    const S* inc_scratch, const S* views, const S* params, int64_t offset,
                    const S* q_new, S* buffer, S* y, cudaStream_t stream, std::string* declined) {
  const int64_t rows = count * batch;
  switch (op.kind) {
    case PP_OP_CONV:
      site_conv_kernel<S><<<launch::blocks(rows * op.out), kThreads, 0, stream>>>(
          op, src, t, sites, count, batch, x_inc, y_inc, params, offset, q_new, y);
      break;
    case PP_OP_SELF_ATTENTION: {
      const pp_attention_attrs& a = op.attention;
      const int64_t hd = a.embed / a.heads;
      site_head_project_kernel<S>
          <<<launch::blocks(rows * a.length * 3 * hd), kThreads, 0, stream>>>(
              op, src, t, sites, count, batch, x_inc, inc_scratch, params, offset, q_new, buffer);
      launch::check_last("site-local attention projection kernel");
      // The moved head of every (candidate, sample) as one problem of a one-head layer. The
      // out_proj particles of a mixed chunk mix their (unused) copy of head 0 too.
      LayerOp head = op;
      head.attention.embed = hd;
      head.attention.heads = 1;
      launch_attention_mix<S>(head, buffer, rows, stream, declined);
      site_attention_out_kernel<S>
          <<<launch::blocks(rows * a.length * a.embed), kThreads, 0, stream>>>(
              op, src, t, sites, count, batch, y_inc, inc_scratch, params, offset, q_new, buffer,
              y);
      break;
    }
    case PP_OP_CHERI_BLOCK: {
      site_cheri_hidden_kernel<S><<<row_blocks(rows), block_threads(op.cheri.length), 0, stream>>>(
          op, src, t, sites, count, batch, views, params, offset, q_new, buffer);
      launch::check_last("site-local Cheri hidden kernel");
      site_cheri_out_kernel<S><<<launch::blocks(rows * op.out), kThreads, 0, stream>>>(
          op, src, t, sites, count, batch, y_inc, inc_scratch, params, offset, q_new, buffer, y);
      break;
    }
    default:
      throw std::logic_error("launch_site_op: not a site-local kind");
  }
  launch::check_last("site-local kernel");
}

template void launch_site_op<float>(const LayerOp&, CandidateSource, ParticleTable, SiteTable,
                                    int64_t, int64_t, const float*, const float*, const float*,
                                    const float*, const float*, int64_t, const float*, float*,
                                    float*, cudaStream_t, std::string*);
template void launch_site_op<double>(const LayerOp&, CandidateSource, ParticleTable, SiteTable,
                                     int64_t, int64_t, const double*, const double*, const double*,
                                     const double*, const double*, int64_t, const double*, double*,
                                     double*, cudaStream_t, std::string*);

}  // namespace polyprobe::cuda
