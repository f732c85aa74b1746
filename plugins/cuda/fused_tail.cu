// Kernels of the fused tail (fused_tail.cuh).
#include "candidate_source.cuh"
#include "common.cuh"
#include "device.hpp"
#include "formulas.cuh"
#include "fused_tail.cuh"

#include <algorithm>
#include <type_traits>

namespace polyprobe::cuda {
namespace {

// 128 threads: the tail kernels hold a candidate's logits in registers, so fewer threads per
// block keep more blocks resident.
constexpr int kTailThreads = 128;

unsigned grid_for(int64_t n) { return launch::blocks(n, kTailThreads); }

// The activations other than ReLU, out of line: inlined, every one of them (erf, tanh, a
// division) would be copied into each of the unrolled per-candidate loops below, which then
// no longer fit the instruction cache.
template <class S>
__device__ __noinline__ S activate_out_of_line(int32_t fn, S v, S step) {
  return activate<S>(fn, v, step);
}

template <class S>
__device__ __forceinline__ S chain(const ActivationChain& f, S v) {
  for (int32_t i = 0; i < f.n; ++i)
    v = f.fn[i] == PP_ACT_RELU ? (v > S(0) ? v : S(0))
                               : activate_out_of_line<S>(f.fn[i], v, static_cast<S>(f.step[i]));
  return v;
}

// theta_t s_t of a term for candidate c on sample b: the effective weight change (full
// space) or the coordinate's displacement (subspace), times the term's input.
template <class S>
__device__ S scaled_term(const CandidateSource& src, const FusedTail<S>& t, const FusedTerm& term,
                         int64_t c, int64_t b) {
  const double delta = delta_of(src, c, term.slot);
  const S theta =
      term.raw >= 0
          ? effective<S>(term.transform, t.theta[term.raw] + delta, t.quant_step) - t.eff[term.raw]
          : static_cast<S>(delta);
  S s = S(1);
  if (term.source >= 0)
    s = t.x_t[term.source * t.batch + b];
  else if (term.source <= -2)
    s = t.vx_t[(-term.source - 2) * t.batch + b];
  return theta * s;
}

// theta_t s_t of every term of candidate c's particle on sample b, zero past the last; the
// particle's first term and number of terms.
template <class S>
__device__ void scaled_terms(const CandidateSource& src, const FusedTail<S>& t, int64_t c,
                             int64_t b, S (&scaled)[kFusedMaxTerms], int64_t& first,
                             int64_t& n_terms) {
  const int64_t p = particle_of(src, c);
  first = t.term_begin[p];
  n_terms = t.term_begin[p + 1] - first;
#pragma unroll
  for (int e = 0; e < kFusedMaxTerms; ++e) {
    scaled[e] = S(0);
    if (e >= n_terms) continue;
    scaled[e] = scaled_term(src, t, t.terms[first + e], c, b);
  }
}

// dz at unit o of op l for a dense change: the terms in order.
template <class S>
__device__ S dense_change(const FusedTail<S>& t, int64_t first, int64_t n_terms, const S* scaled,
                          int64_t o) {
  S dz = S(0);
#pragma unroll
  for (int e = 0; e < kFusedMaxTerms; ++e) {
    if (e >= n_terms) break;
    const FusedTerm& term = t.terms[first + e];
    if (term.unit >= 0)
      dz += term.unit == o ? scaled[e] : S(0);
    else
      dz += scaled[e] * static_cast<S>(t.basis[term.u + o]);
  }
  return dz;
}

// logits[k] += w[k * stride] * dh for the outputs; kOut a compile-time bound so the
// logits stay in registers.
template <class S, int kOut>
__device__ void add_column(S* logits, const S* w, int64_t stride, S dh, int64_t outputs) {
#pragma unroll
  for (int k = 0; k < kOut; ++k)
    if (k < outputs) logits[k] += w[k * stride] * dh;
}

// The per-sample losses of formulas.cuh on register logits (same operations, same order).
template <class S, int kOut>
__device__ S register_loss(const FusedTail<S>& t, const S* x, int64_t b) {
  const int64_t n = t.outputs;
  const int64_t label = t.labels ? t.labels[b] : 0;
  switch (t.loss) {
    case 0: {  // cross_entropy
      S m = x[0], picked = x[0];
#pragma unroll
      for (int i = 1; i < kOut; ++i)
        if (i < n) m = x[i] > m ? x[i] : m;
      S sum = 0;
#pragma unroll
      for (int i = 0; i < kOut; ++i)
        if (i < n) {
          sum += exp(x[i] - m);
          if (i == label) picked = x[i];
        }
      return m + log(sum) - picked;
    }
    case 1: {  // mse
      const double* target = t.targets + b * n;
      S sum = 0;
#pragma unroll
      for (int i = 0; i < kOut; ++i)
        if (i < n) {
          const S diff = x[i] - static_cast<S>(target[i]);
          sum += diff * diff;
        }
      return sum / static_cast<S>(n);
    }
    case 2: {  // hinge
      S at = x[0];
#pragma unroll
      for (int i = 0; i < kOut; ++i)
        if (i == label) at = x[i];
      S sum = 0;
#pragma unroll
      for (int i = 0; i < kOut; ++i)
        if (i < n && i != label) {
          const S h = S(1) - at + x[i];
          sum += h > S(0) ? h : S(0);
        }
      return sum / static_cast<S>(n);
    }
    case 3: {  // zero_one: the first maximal output
      int best = 0;
      S top = x[0];
#pragma unroll
      for (int i = 1; i < kOut; ++i)
        if (i < n && x[i] > top) {
          top = x[i];
          best = i;
        }
      return best == label ? S(0) : S(1);
    }
    default:
      return S(0);
  }
}

// kMode 0: no hidden op after l (hidden <= 0); 1: a hidden op, sparse changes only.
// kOut >= outputs.
template <class S, int kMode, int kOut>
__global__ void __launch_bounds__(kTailThreads)
    fused_tail_kernel(CandidateSource src, FusedTail<S> t, int64_t count, S* per) {
  const int64_t total = count * t.batch;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i / t.batch, b = i % t.batch;
    const int64_t p = particle_of(src, c);
    S logits[kOut];
#pragma unroll
    for (int k = 0; k < kOut; ++k) logits[k] = k < t.outputs ? t.logits_t[k * t.batch + b] : S(0);

    // theta_t s_t for every term (full space: the effective weight change).
    S scaled[kFusedMaxTerms];
    int64_t first = 0, n_terms = 0;
    scaled_terms(src, t, c, b, scaled, first, n_terms);

    if constexpr (kMode == 0) {
      // A unit of op l changed by dz, then (through f1 and m1) the logits.
      auto propagate = [&](int64_t unit, S dz) {
        if (dz == S(0)) return;
        if (t.hidden < 0) {  // op l is the output
#pragma unroll
          for (int k = 0; k < kOut; ++k)
            if (k == unit) logits[k] += dz;
          return;
        }
        const S z = t.z_t[unit * t.batch + b];
        const S dh = chain(t.f1, z + dz) - chain(t.f1, z);
        if (dh != S(0)) add_column<S, kOut>(logits, t.w_m1 + unit, t.out_l, dh, t.outputs);
      };
      if (!t.dense[p]) {
        // Terms sorted by unit: one change per distinct unit.
        S dz = S(0);
#pragma unroll
        for (int e = 0; e < kFusedMaxTerms; ++e) {
          if (e >= n_terms) break;
          dz += scaled[e];
          if (e + 1 == n_terms || t.terms[first + e + 1].unit != t.terms[first + e].unit) {
            propagate(t.terms[first + e].unit, dz);
            dz = S(0);
          }
        }
      } else {
        for (int64_t o = 0; o < t.out_l; ++o)
          propagate(o, dense_change(t, first, n_terms, scaled, o));
      }
    } else {
      // A hidden op m1 between op l and the output: dh at op l's units, then m1's units
      // streamed, each added to the logits as soon as it is known.
      int64_t units[kFusedMaxTerms];
      S dh[kFusedMaxTerms];
      int n_units = 0;
      {
        S dz = S(0);
#pragma unroll
        for (int e = 0; e < kFusedMaxTerms; ++e) {
          if (e >= n_terms) break;
          dz += scaled[e];
          const int32_t unit = t.terms[first + e].unit;
          if (e + 1 == n_terms || t.terms[first + e + 1].unit != unit) {
            const S z = t.z_t[unit * t.batch + b];
            const S change = dz == S(0) ? S(0) : chain(t.f1, z + dz) - chain(t.f1, z);
            if (change != S(0)) {
              units[n_units] = unit;
              dh[n_units] = change;
              ++n_units;
            }
            dz = S(0);
          }
        }
        // m1's weights transposed ([out_l, width_m1]) and m2's ([width_m1, C]): both read
        // along contiguous memory as q and k advance.
        for (int64_t q = 0; n_units > 0 && q < t.width_m1; ++q) {
          S dz1 = S(0);
          for (int u = 0; u < n_units; ++u) dz1 += t.w_m1_t[units[u] * t.width_m1 + q] * dh[u];
          if (dz1 == S(0)) continue;
          const S z1 = t.z1_t[q * t.batch + b];
          const S dh1 = chain(t.f2, z1 + dz1) - chain(t.f2, z1);
          if (dh1 != S(0)) add_column<S, kOut>(logits, t.w_m2_t + q * t.outputs, 1, dh1, t.outputs);
        }
      }
    }
    per[i] = register_loss<S, kOut>(t, logits, b);
  }
}

// Modes 4 and 5: particles that change at most kHiddenUnits units of op l, each thread
// carrying kHiddenGroup consecutive candidates on one sample, so the candidates of a group
// share every read of the incumbent (its logits, m1's output, m2's or m1's weights) and
// interleave their independent chains of loads, which one candidate per thread leaves the
// SM waiting on. kHidden 1 (mode 4): m1 hidden and m2 the output, as mode 1; 0 (mode 5): m1
// the output, as mode 0; -1 (mode 5): op l the output. Each candidate's arithmetic is that
// of mode 1 or 0 in the same order, except that a unit whose change is zero adds w * 0, which
// leaves a finite logit as it was: branch-free, the group's updates pipeline.
template <class S, int kOut, int kHidden>
__global__ void __launch_bounds__(kTailThreads)
    fused_group_kernel(CandidateSource src, FusedTail<S> t, int64_t count, S* per) {
  constexpr int G = kHiddenGroup, U = kHiddenUnits;
  const int64_t groups = (count + G - 1) / G;
  const int64_t total = groups * t.batch;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i / t.batch) * G, b = i % t.batch;
    S logits[G][kOut];
    int32_t units[G][U];
    S dh[G][U];
    int n_units[G];
#pragma unroll
    for (int r = 0; r < G; ++r) {
#pragma unroll
      for (int k = 0; k < kOut; ++k)
        logits[r][k] = k < t.outputs ? t.logits_t[k * t.batch + b] : S(0);
      n_units[r] = 0;
#pragma unroll
      for (int u = 0; u < U; ++u) units[r][u] = 0, dh[r][u] = S(0);
      const int64_t c = c0 + r;
      if (c >= count) continue;
      const int64_t p = particle_of(src, c);
      const int64_t first = t.term_begin[p];
      const int64_t n_terms = t.term_begin[p + 1] - first;
      // Terms sorted by unit: one change per distinct unit, as modes 0 and 1.
      S dz = S(0);
      for (int64_t e = 0; e < n_terms; ++e) {
        const FusedTerm& term = t.terms[first + e];
        dz += scaled_term(src, t, term, c, b);
        if (e + 1 == n_terms || t.terms[first + e + 1].unit != term.unit) {
          S change = dz;  // op l is the output: its change is the logits'
          if constexpr (kHidden >= 0) {
            const S z = t.z_t[term.unit * t.batch + b];
            change = dz == S(0) ? S(0) : chain(t.f1, z + dz) - chain(t.f1, z);
          }
          if (change != S(0)) {
#pragma unroll
            for (int u = 0; u < U; ++u)
              if (u == n_units[r]) units[r][u] = term.unit, dh[r][u] = change;
            ++n_units[r];
          }
          dz = S(0);
        }
      }
    }
    if constexpr (kHidden < 1) {
      // Each changed unit's column of m1 (or, for op l the output, the unit itself).
#pragma unroll
      for (int r = 0; r < G; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (u >= n_units[r]) continue;
          if constexpr (kHidden == 0) {
            add_column<S, kOut>(logits[r], t.w_m1 + units[r][u], t.out_l, dh[r][u], t.outputs);
          } else {
#pragma unroll
            for (int k = 0; k < kOut; ++k)
              if (k == units[r][u]) logits[r][k] += dh[r][u];
          }
        }
    } else {
      bool any = false;
#pragma unroll
      for (int r = 0; r < G; ++r) any = any || n_units[r] > 0;
      for (int64_t q = 0; any && q < t.width_m1; ++q) {
        const S z1 = t.z1_t[q * t.batch + b];
        const S base = chain(t.f2, z1);
        S w2[kOut];
#pragma unroll
        for (int k = 0; k < kOut; ++k) w2[k] = k < t.outputs ? t.w_m2_t[q * t.outputs + k] : S(0);
#pragma unroll
        for (int r = 0; r < G; ++r) {
          S dz1 = S(0);
#pragma unroll
          for (int u = 0; u < U; ++u)
            if (u < n_units[r]) dz1 += t.w_m1_t[units[r][u] * t.width_m1 + q] * dh[r][u];
          // z1 + 0 is z1: a zero change gives dh1 = 0 exactly, with no branch.
          const S dh1 = chain(t.f2, z1 + dz1) - base;
#pragma unroll
          for (int k = 0; k < kOut; ++k) logits[r][k] += w2[k] * dh1;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < G; ++r)
      if (c0 + r < count) per[(c0 + r) * t.batch + b] = register_loss<S, kOut>(t, logits[r], b);
  }
}

// Mode 3: dense changes with no hidden op after l, one block per (candidate, tile of
// samples), so the particle's dense u vectors and m1's weights are staged once per block in
// shared memory (the per-unit loop reads them for every sample). Same arithmetic, in the
// same order, as mode 0's dense branch.
template <class S, int kOut>
__global__ void __launch_bounds__(kTailThreads)
    fused_dense_kernel(CandidateSource src, FusedTail<S> t, int64_t count, int64_t tiles, S* per) {
  extern __shared__ unsigned char shared_raw[];
  S* u_s = reinterpret_cast<S*>(shared_raw);  // [kFusedMaxTerms, out_l]
  S* w_s = u_s + kFusedMaxTerms * t.out_l;    // [out_l, C]: m1's weights transposed
  const int64_t out_l = t.out_l;
  for (int64_t block = blockIdx.x; block < count * tiles; block += gridDim.x) {
    const int64_t c = block / tiles, b = (block % tiles) * blockDim.x + threadIdx.x;
    const int64_t p = particle_of(src, c);
    const int64_t first = t.term_begin[p];
    const int64_t n_terms = t.term_begin[p + 1] - first;
    __syncthreads();  // the previous candidate's tables are no longer read
    for (int64_t i = threadIdx.x; i < n_terms * out_l; i += blockDim.x) {
      const FusedTerm& term = t.terms[first + i / out_l];
      u_s[i] = term.unit >= 0 ? S(0) : static_cast<S>(t.basis[term.u + i % out_l]);
    }
    if (t.hidden == 0)
      for (int64_t i = threadIdx.x; i < out_l * t.outputs; i += blockDim.x) {
        const int64_t o = i / t.outputs, k = i % t.outputs;
        w_s[i] = t.w_m1[k * out_l + o];
      }
    __syncthreads();
    if (b >= t.batch) continue;
    S logits[kOut];
#pragma unroll
    for (int k = 0; k < kOut; ++k) logits[k] = k < t.outputs ? t.logits_t[k * t.batch + b] : S(0);
    S scaled[kFusedMaxTerms];
    int32_t unit[kFusedMaxTerms];
#pragma unroll
    for (int e = 0; e < kFusedMaxTerms; ++e) {
      scaled[e] = S(0);
      unit[e] = -2;  // no term
      if (e >= n_terms) continue;
      const FusedTerm term = t.terms[first + e];
      scaled[e] = scaled_term(src, t, term, c, b);
      unit[e] = term.unit;
    }
    for (int64_t o = 0; o < out_l; ++o) {
      S dz = S(0);
#pragma unroll
      for (int e = 0; e < kFusedMaxTerms; ++e) {
        if (unit[e] == -2) break;
        if (unit[e] >= 0)
          dz += unit[e] == o ? scaled[e] : S(0);
        else
          dz += scaled[e] * u_s[e * out_l + o];
      }
      if (dz == S(0)) continue;
      if (t.hidden < 0) {
#pragma unroll
        for (int k = 0; k < kOut; ++k)
          if (k == o) logits[k] += dz;
        continue;
      }
      const S z = t.z_t[o * t.batch + b];
      const S dh = chain(t.f1, z + dz) - chain(t.f1, z);
      if (dh == S(0)) continue;
#pragma unroll
      for (int k = 0; k < kOut; ++k)
        if (k < t.outputs) logits[k] += w_s[o * t.outputs + k] * dh;
    }
    per[c * t.batch + b] = register_loss<S, kOut>(t, logits, b);
  }
}

// Mode 2, first launch: dh[c, b, o] = f1(z + dz) - f1(z) at every unit o of op l, a thread
// per value (a dense change moves all of them).
template <class S>
__global__ void dense_change_kernel(CandidateSource src, FusedTail<S> t, int64_t count, S* dh) {
  const int64_t total = count * t.batch * t.out_l;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i % t.out_l, row = i / t.out_l;
    const int64_t c = row / t.batch, b = row % t.batch;
    S scaled[kFusedMaxTerms];
    int64_t first = 0, n_terms = 0;
    scaled_terms(src, t, c, b, scaled, first, n_terms);
    const S dz = dense_change(t, first, n_terms, scaled, o);
    const S z = t.z_t[o * t.batch + b];
    dh[i] = dz == S(0) ? S(0) : chain(t.f1, z + dz) - chain(t.f1, z);
  }
}

// Mode 2, last launch: from dz1 = dh W_m1^T ([count * B, width_m1], one GEMM), m1's units
// streamed into the logits as mode 1 does, then the loss.
template <class S, int kOut>
__global__ void __launch_bounds__(kTailThreads)
    hidden_change_kernel(FusedTail<S> t, int64_t count, const S* dz1, S* per) {
  const int64_t total = count * t.batch;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i % t.batch;
    S logits[kOut];
#pragma unroll
    for (int k = 0; k < kOut; ++k) logits[k] = k < t.outputs ? t.logits_t[k * t.batch + b] : S(0);
    const S* row = dz1 + i * t.width_m1;
    for (int64_t q = 0; q < t.width_m1; ++q) {
      const S z1 = t.z1_t[q * t.batch + b];
      const S dh1 = chain(t.f2, z1 + row[q]) - chain(t.f2, z1);
      add_column<S, kOut>(logits, t.w_m2_t + q * t.outputs, 1, dh1, t.outputs);
    }
    per[i] = register_loss<S, kOut>(t, logits, b);
  }
}

template <class S>
__global__ void transpose_kernel(const S* in, int64_t rows, int64_t width, S* out) {
  const int64_t total = rows * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / rows, r = i % rows;  // write-coalesced
    out[i] = in[r * width + j];
  }
}

template <class S>
__global__ void dense_v_kernel(const double* basis, const int64_t* v_offsets, int64_t n_v,
                               const S* x, int64_t rows, int64_t in, S* vx_t) {
  const int64_t total = n_v * rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i / rows, r = i % rows;
    const double* v = basis + v_offsets[j];
    S sum = S(0);
    for (int64_t k = 0; k < in; ++k) sum += static_cast<S>(v[k]) * x[r * in + k];
    vx_t[i] = sum;
  }
}

}  // namespace

template <class S>
void launch_fused_tail(CandidateSource src, FusedTail<S> tail, int64_t count, int32_t mode, S* per,
                       cudaStream_t stream) {
  const unsigned blocks = grid_for(count * tail.batch);
  auto run = [&](auto out) {
    constexpr int kOut = decltype(out)::value;
    if (mode == 4 || mode == 5) {
      const unsigned grid = grid_for((count + kHiddenGroup - 1) / kHiddenGroup * tail.batch);
      if (tail.hidden == 1)
        fused_group_kernel<S, kOut, 1><<<grid, kTailThreads, 0, stream>>>(src, tail, count, per);
      else if (tail.hidden == 0)
        fused_group_kernel<S, kOut, 0><<<grid, kTailThreads, 0, stream>>>(src, tail, count, per);
      else
        fused_group_kernel<S, kOut, -1><<<grid, kTailThreads, 0, stream>>>(src, tail, count, per);
    } else if (mode == 3) {
      const int threads =
          static_cast<int>(std::min<int64_t>(kTailThreads, (tail.batch + 31) / 32 * 32));
      const int64_t tiles = (tail.batch + threads - 1) / threads;
      const int64_t blocks3 = std::min<int64_t>(count * tiles, int64_t{1} << 20);
      const std::size_t shared = fused_dense_shared_bytes(tail.out_l, tail.outputs, sizeof(S));
      fused_dense_kernel<S, kOut><<<static_cast<unsigned>(blocks3), threads, shared, stream>>>(
          src, tail, count, tiles, per);
    } else if (mode == 0)
      fused_tail_kernel<S, 0, kOut><<<blocks, kTailThreads, 0, stream>>>(src, tail, count, per);
    else
      fused_tail_kernel<S, 1, kOut><<<blocks, kTailThreads, 0, stream>>>(src, tail, count, per);
  };
  if (tail.outputs <= 4)
    run(std::integral_constant<int, 4>{});
  else if (tail.outputs <= 10)  // ten classes: no padded logits
    run(std::integral_constant<int, 10>{});
  else if (tail.outputs <= 16)
    run(std::integral_constant<int, 16>{});
  else if (tail.outputs <= 32)
    run(std::integral_constant<int, 32>{});
  else
    run(std::integral_constant<int, kFusedMaxOutputs>{});
  launch::check_last("fused tail kernel");
}

template <class S>
void launch_dense_change(CandidateSource src, FusedTail<S> tail, int64_t count, S* dh,
                         cudaStream_t stream) {
  dense_change_kernel<S><<<grid_for(count * tail.batch * tail.out_l), kTailThreads, 0, stream>>>(
      src, tail, count, dh);
  launch::check_last("dense change kernel");
}

template <class S>
void launch_hidden_change(FusedTail<S> tail, int64_t count, const S* dz1, S* per,
                          cudaStream_t stream) {
  auto run = [&](auto out) {
    constexpr int kOut = decltype(out)::value;
    hidden_change_kernel<S, kOut>
        <<<grid_for(count * tail.batch), kTailThreads, 0, stream>>>(tail, count, dz1, per);
  };
  if (tail.outputs <= 16)
    run(std::integral_constant<int, 16>{});
  else
    run(std::integral_constant<int, kFusedMaxOutputs>{});
  launch::check_last("hidden change kernel");
}

template <class S>
void launch_transpose(const S* in, int64_t rows, int64_t width, S* out, cudaStream_t stream) {
  transpose_kernel<S><<<grid_for(rows * width), kTailThreads, 0, stream>>>(in, rows, width, out);
  launch::check_last("transpose kernel");
}

template <class S>
void launch_dense_v(const double* basis, const int64_t* v_offsets, int64_t n_v, const S* x,
                    int64_t rows, int64_t in, S* vx_t, cudaStream_t stream) {
  dense_v_kernel<S>
      <<<grid_for(n_v * rows), kTailThreads, 0, stream>>>(basis, v_offsets, n_v, x, rows, in, vx_t);
  launch::check_last("dense v kernel");
}

#define POLYPROBE_CUDA_INSTANTIATE(S)                                                             \
  template void launch_fused_tail<S>(CandidateSource, FusedTail<S>, int64_t, int32_t, S*,         \
                                     cudaStream_t);                                               \
  template void launch_dense_change<S>(CandidateSource, FusedTail<S>, int64_t, S*, cudaStream_t); \
  template void launch_hidden_change<S>(FusedTail<S>, int64_t, const S*, S*, cudaStream_t);       \
  template void launch_transpose<S>(const S*, int64_t, int64_t, S*, cudaStream_t);                \
  template void launch_dense_v<S>(const double*, const int64_t*, int64_t, const S*, int64_t,      \
                                  int64_t, S*, cudaStream_t);
POLYPROBE_CUDA_INSTANTIATE(float)
POLYPROBE_CUDA_INSTANTIATE(double)
#undef POLYPROBE_CUDA_INSTANTIATE

}  // namespace polyprobe::cuda
