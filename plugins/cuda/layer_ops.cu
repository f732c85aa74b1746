// Device forwards of the layer kinds beyond linear and activations (layer_ops.cuh). One
// thread owns each value it writes and sums in a fixed order, as the session's other
// kernels; float64 sums for the statistics, as the core's layer norm.
#include "blas.cuh"
#include "common.cuh"
#include "device.hpp"
#include "formulas.cuh"
#include "layer_ops.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace polyprobe::cuda {
namespace {

using launch::thread_index;
using launch::thread_stride;

template <class S>
__device__ const S* sample_x(const LayerIo<S>& io, int64_t r, int64_t in) {
  return io.x + (io.x_shared ? r % io.batch : r) * in;
}
template <class S>
__device__ const S* block_of(const LayerIo<S>& io, int64_t r) {
  return io.params + (r / io.batch) * io.param_stride;
}

// core/layers/ops.hpp layer_norm_groups: a thread per (sample, group).
template <class S>
__global__ void layer_norm_kernel(LayerOp op, LayerIo<S> io) {
  const int64_t n = op.norm.group_size, groups = op.in / n;
  for (int64_t t = thread_index(); t < io.rows * groups; t += thread_stride()) {
    const int64_t r = t / groups, g = t % groups;
    const S* x = sample_x(io, r, op.in) + g * n;
    S* y = io.y + r * op.out + g * n;
    const S* p = block_of(io, r);
    const S* gain = op.norm.affine ? p : nullptr;
    const S* shift = op.norm.bias ? p + n : nullptr;
    double mean = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += static_cast<double>(x[i]);
    mean /= static_cast<double>(n);
    double var = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(x[i]) - mean;
      var += d * d;
    }
    var /= static_cast<double>(n);
    const double inv = 1.0 / sqrt(var + op.norm.eps);
    for (int64_t i = 0; i < n; ++i) {
      S v = static_cast<S>((static_cast<double>(x[i]) - mean) * inv);
      if (gain != nullptr) v *= gain[i];
      if (shift != nullptr) v += shift[i];
      y[i] = v;
    }
  }
}

// nn.Conv1d/2d (a 1-D conv is 2-D of height 1): a thread per output value.
template <class S>
__global__ void conv_kernel(LayerOp op, LayerIo<S> io) {
  const pp_conv_attrs& a = op.conv;
  const int64_t oh = a.out_size[0], ow = a.out_size[1];
  const int64_t patch = a.in_channels / a.groups * a.kernel[0] * a.kernel[1];
  for (int64_t t = thread_index(); t < io.rows * op.out; t += thread_stride()) {
    const int64_t r = t / op.out, o = t % op.out;
    const int64_t oc = o / (oh * ow), oi = (o / ow) % oh, oj = o % ow;
    const S* w = block_of(io, r) + oc * patch;
    S acc = conv_value<S>(a, sample_x(io, r, op.in), oc, oi, oj, [w](int64_t k) { return w[k]; });
    if (a.bias) acc += block_of(io, r)[a.out_channels * patch + oc];
    io.y[t] = acc;
  }
}

// nn.MaxPool / nn.AvgPool (pool_window: count_include_pad, NaN propagates through max).
template <class S>
__global__ void pool_kernel(LayerOp op, LayerIo<S> io) {
  const pp_pool_attrs& a = op.pool;
  const int64_t oh = a.out_size[0], ow = a.out_size[1], ih = a.in_size[0], iw = a.in_size[1];
  for (int64_t t = thread_index(); t < io.rows * op.out; t += thread_stride()) {
    const int64_t r = t / op.out, o = t % op.out;
    const int64_t c = o / (oh * ow);
    const S* x = sample_x(io, r, op.in) + c * ih * iw;
    io.y[t] = pool_window<S>(a, (o / ow) % oh, o % ow, ih, iw,
                             [&](int64_t i, int64_t j) { return x[i * iw + j]; });
  }
}

// LIF: the firing rate of a neuron driven by each value as a constant current.
template <class S>
__global__ void lif_kernel(LayerOp op, LayerIo<S> io) {
  const S beta = static_cast<S>(op.lif.beta), threshold = static_cast<S>(op.lif.threshold);
  for (int64_t t = thread_index(); t < io.rows * op.out; t += thread_stride()) {
    const int64_t r = t / op.out, i = t % op.out;
    const S current = sample_x(io, r, op.in)[i];
    S v = 0;
    int64_t spikes = 0;
    for (int64_t s = 0; s < op.lif.steps; ++s) {
      v = beta * v + current;
      if (v >= threshold) {
        ++spikes;
        v = op.lif.reset_to_zero ? S(0) : v - threshold;
      }
    }
    io.y[t] = static_cast<S>(spikes) / static_cast<S>(op.lif.steps);
  }
}

// Hard top-1 MoE: a thread per (sample, position) routes (the first maximum, as
// torch.argmax) and runs the chosen expert.
template <class S>
__global__ void moe_kernel(LayerOp op, LayerIo<S> io) {
  const int64_t d = op.moe.in_features, o = op.moe.out_features, e = op.moe.experts;
  const int64_t positions = op.in / d;
  for (int64_t t = thread_index(); t < io.rows * positions; t += thread_stride()) {
    const int64_t r = t / positions, pos = t % positions;
    const S* x = sample_x(io, r, op.in) + pos * d;
    const S* p = block_of(io, r);
    int64_t best = 0;
    S best_score = 0;
    for (int64_t k = 0; k < e; ++k) {
      S score = 0;
      for (int64_t i = 0; i < d; ++i) score += p[k * d + i] * x[i];
      score += p[e * d + k];
      if (k == 0 || score > best_score) best = k, best_score = score;
    }
    const S* expert = p + e * (d + 1) + best * o * (d + 1);
    S* y = io.y + r * op.out + pos * o;
    for (int64_t j = 0; j < o; ++j) {
      S acc = 0;
      for (int64_t i = 0; i < d; ++i) acc += expert[j * d + i] * x[i];
      y[j] = acc + expert[o * d + j];
    }
  }
}

// Self-attention, 1: q, k, v of every position (in_proj), a thread per value.
template <class S>
__global__ void attention_project_kernel(LayerOp op, LayerIo<S> io) {
  const int64_t L = op.attention.length, E = op.attention.embed;
  const int64_t per = L * 3 * E;
  for (int64_t t = thread_index(); t < io.rows * per; t += thread_stride()) {
    const int64_t r = t / per, l = (t / (3 * E)) % L, f = t % (3 * E);
    const S* x = sample_x(io, r, op.in) + l * E;
    const S* w = block_of(io, r) + f * E;
    S acc = 0;
    for (int64_t i = 0; i < E; ++i) acc += w[i] * x[i];
    if (op.attention.bias) acc += block_of(io, r)[3 * E * E + f];
    io.scratch[r * (per + L * E) + l * 3 * E + f] = acc;
  }
}

// 2: a thread per (sample, head, query): scores, softmax or the one-hot of the first largest
// (the core's weigh_rows), the weighted values; over the keys the query sees (all, or j <= i
// when causal).
template <class S>
__global__ void attention_mix_kernel(LayerOp op, LayerIo<S> io) {
  const int64_t L = op.attention.length, E = op.attention.embed, H = op.attention.heads;
  const int64_t hd = E / H, per = L * 3 * E;
  const S scale = S(1) / sqrt(static_cast<S>(hd));
  for (int64_t t = thread_index(); t < io.rows * H * L; t += thread_stride()) {
    const int64_t r = t / (H * L), h = (t / L) % H, i = t % L;
    const S* qkv = io.scratch + r * (per + L * E);
    S* mixed = io.scratch + r * (per + L * E) + per + i * E + h * hd;
    const S* q = qkv + i * 3 * E + h * hd;
    const int64_t visible = op.attention.causal ? i + 1 : L;
    // Pass 1: the row's largest score (first one wins).
    int64_t best = 0;
    S top = 0;
    for (int64_t j = 0; j < visible; ++j) {
      const S* k = qkv + j * 3 * E + E + h * hd;
      S s = 0;
      for (int64_t c = 0; c < hd; ++c) s += (q[c] * scale) * k[c];
      if (j == 0 || s > top) best = j, top = s;
    }
    for (int64_t c = 0; c < hd; ++c) mixed[c] = 0;
    if (op.attention.argmax) {
      const S* v = qkv + best * 3 * E + 2 * E + h * hd;
      for (int64_t c = 0; c < hd; ++c) mixed[c] = v[c];
      continue;
    }
    S total = 0;
    for (int64_t j = 0; j < visible; ++j) {
      const S* k = qkv + j * 3 * E + E + h * hd;
      S s = 0;
      for (int64_t c = 0; c < hd; ++c) s += (q[c] * scale) * k[c];
      total += exp(s - top);
    }
    for (int64_t j = 0; j < visible; ++j) {
      const S* k = qkv + j * 3 * E + E + h * hd;
      S s = 0;
      for (int64_t c = 0; c < hd; ++c) s += (q[c] * scale) * k[c];
      const S weight = exp(s - top) / total;
      const S* v = qkv + j * 3 * E + 2 * E + h * hd;
      for (int64_t c = 0; c < hd; ++c) mixed[c] += weight * v[c];
    }
  }
}

// 3: the output projection, a thread per value.
template <class S>
__global__ void attention_out_kernel(LayerOp op, LayerIo<S> io) {
  const int64_t L = op.attention.length, E = op.attention.embed, per = L * 3 * E;
  const int64_t out_w = 3 * E * E + (op.attention.bias ? 3 * E : 0);
  for (int64_t t = thread_index(); t < io.rows * L * E; t += thread_stride()) {
    const int64_t r = t / (L * E), l = (t / E) % L, f = t % E;
    const S* mixed = io.scratch + r * (per + L * E) + per + l * E;
    const S* p = block_of(io, r);
    S acc = 0;
    for (int64_t i = 0; i < E; ++i) acc += p[out_w + f * E + i] * mixed[i];
    if (op.attention.bias) acc += p[out_w + E * E + f];
    io.y[t] = acc;
  }
}

// The Cheri block (core/layers/cheri.cpp) over a chunk whose samples each carry their own
// weights: the conv, each sample's plane statistics and normalisation, then the two matrix
// products as cuBLAS GEMMs (strided batched over the candidates' weight blocks) with GELU and
// the residual between and after. The chunk's scratch holds every sample's conv [L, C]
// (normalised in place), then every sample's hidden rows [L, H] (cheri_layout).
constexpr double kCheriEps = 1e-3;
constexpr double kCheriResidualScale = 0.15;
constexpr int kStatsThreads = 256;

__host__ __device__ inline int64_t cheri_scratch(const pp_cheri_attrs& a) {
  return a.length * a.channels * (1 + a.expansion) + 1;
}

// 1: h[i, c] = w0[c] x[i-d, c] + w1[c] x[i, c] + w2[c] x[i+d, c] (zero padding), a thread
// per value, the terms added in the reference's order.
template <class S>
__global__ void cheri_conv_kernel(LayerOp op, LayerIo<S> io) {
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels, d = a.dilation;
  for (int64_t t = thread_index(); t < io.rows * L * C; t += thread_stride()) {
    const int64_t r = t / (L * C), i = (t / C) % L, c = t % C;
    const S* x = sample_x(io, r, op.in);
    const S* taps = block_of(io, r);
    S v = taps[C + c] * x[i * C + c];
    if (i - d >= 0) v += taps[c] * x[(i - d) * C + c];
    if (i + d < L) v += taps[2 * C + c] * x[(i + d) * C + c];
    io.scratch[t] = v;
  }
}

// 2: each sample's plane statistics in float64 (as layer_norm_groups), a block per sample;
// every thread sums a fixed stride of the plane and the block adds the partial sums in a
// fixed tree, so the result does not depend on scheduling.
template <class S>
__global__ void cheri_stats_kernel(LayerOp op, LayerIo<S> io) {
  __shared__ double part[kStatsThreads];
  const pp_cheri_attrs& a = op.cheri;
  const int64_t n = a.length * a.channels;
  for (int64_t r = blockIdx.x; r < io.rows; r += gridDim.x) {
    S* h = io.scratch + r * n;
    auto block_sum = [&](double v) {
      part[threadIdx.x] = v;
      __syncthreads();
      for (int w = kStatsThreads / 2; w > 0; w /= 2) {
        if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
      }
      const double total = part[0];
      __syncthreads();
      return total;
    };
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kStatsThreads) s += static_cast<double>(h[i]);
    const double mean = block_sum(s) / static_cast<double>(n);
    double q = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += kStatsThreads) {
      const double dv = static_cast<double>(h[i]) - mean;
      q += dv * dv;
    }
    const double var = block_sum(q) / static_cast<double>(n);
    // The normalised plane, rounded to S as the reference rounds it before the MLP.
    const double inv = 1.0 / sqrt(var + kCheriEps);
    for (int64_t i = threadIdx.x; i < n; i += kStatsThreads)
      h[i] = static_cast<S>((static_cast<double>(h[i]) - mean) * inv);
    if (threadIdx.x == 0) io.scratch[cheri_layout(a, io.rows, r).inv] = static_cast<S>(inv);
  }
}

// 3: g = GELU_tanh(g) in place (after the first GEMM).
template <class S>
__global__ void cheri_gelu_kernel(S* g, int64_t n) {
  for (int64_t t = thread_index(); t < n; t += thread_stride())
    g[t] = activate<S>(PP_ACT_GELU_TANH, g[t], S(0));
}

// 4: y = x + 0.15 y (y holds the second GEMM's product).
template <class S>
__global__ void cheri_residual_kernel(LayerOp op, LayerIo<S> io) {
  for (int64_t t = thread_index(); t < io.rows * op.out; t += thread_stride()) {
    const int64_t r = t / op.out, f = t % op.out;
    io.y[t] = sample_x(io, r, op.in)[f] + static_cast<S>(kCheriResidualScale) * io.y[t];
  }
}

template <class S>
void launch_cheri(const LayerOp& op, const LayerIo<S>& io, cublasHandle_t blas,
                  cudaStream_t stream) {
  const pp_cheri_attrs& a = op.cheri;
  const int64_t L = a.length, C = a.channels, H = a.expansion * C;
  const int64_t plane = io.rows * L * C;
  cheri_conv_kernel<S><<<launch::blocks(plane), kThreads, 0, stream>>>(op, io);
  launch::check_last("Cheri conv kernel");
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(io.rows, 65535));
  cheri_stats_kernel<S><<<blocks, kStatsThreads, 0, stream>>>(op, io);
  launch::check_last("Cheri statistics kernel");
  // One weight block per candidate (its `batch` samples' rows), or one for the whole chunk.
  S* g = io.scratch + plane;
  const S* fc1 = io.params + 3 * C;
  const S* fc2 = fc1 + H * C;
  const int64_t group = io.param_stride == 0 ? io.rows : io.batch;
  const auto problems = static_cast<int>(io.rows / group);
  const auto rows = static_cast<int>(group * L);
  gemm_batched<S>(blas, static_cast<int>(H), rows, static_cast<int>(C), fc1, io.param_stride,
                  io.scratch, group * L * C, g, group * L * H, problems);
  cheri_gelu_kernel<S>
      <<<launch::blocks(io.rows * L * H), kThreads, 0, stream>>>(g, io.rows * L * H);
  launch::check_last("Cheri GELU kernel");
  gemm_batched<S>(blas, static_cast<int>(C), rows, static_cast<int>(H), fc2, io.param_stride, g,
                  group * L * H, io.y, group * L * C, problems);
  cheri_residual_kernel<S><<<launch::blocks(plane), kThreads, 0, stream>>>(op, io);
}

// 2 with the "sdpa" operation: the scratch of sample r holds its q|k|v rows [L, 3E] and
// then its mixed rows [L, E], so every (sample, head) is one problem of the operation with
// b1 = samples (stride 4 L E) and the head's columns (stride hd). The operation serves at most
// kMaxProblems problems a call, so a large chunk goes in slices of samples. False (nothing
// queued) when the operation declines the arguments, with its reason in `why`.
constexpr int64_t kMaxProblems = 65535;

template <class S>
bool attention_mix_sdpa(const LayerOp& op, const LayerIo<S>& io, cudaStream_t stream,
                        std::string& why) {
  const int64_t L = op.attention.length, E = op.attention.embed, H = op.attention.heads;
  const int64_t hd = E / H, per_sample = 4 * L * E;
  const int64_t slice = std::max<int64_t>(1, kMaxProblems / H);
  for (int64_t first = 0; first < io.rows; first += slice) {
    S* base = io.scratch + first * per_sample;
    pp_sdpa_args a{};
    a.struct_size = sizeof(a);
    a.dtype = sizeof(S) == sizeof(float) ? PP_DTYPE_F32 : PP_DTYPE_F64;
    a.weighting = op.attention.argmax ? PP_SDPA_ARGMAX : PP_SDPA_SOFTMAX;
    a.causal = op.attention.causal ? 1 : 0;
    a.b0 = 1, a.b1 = std::min(slice, io.rows - first), a.heads = H;
    a.q_len = a.kv_len = L, a.head_dim = a.v_dim = hd;
    a.scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const int64_t in_strides[4] = {0, per_sample, hd, 3 * E},
                  out_strides[4] = {0, per_sample, hd, E};
    for (int d = 0; d < 4; ++d)
      a.q_strides[d] = a.k_strides[d] = a.v_strides[d] = in_strides[d],
      a.out_strides[d] = out_strides[d];
    a.q = base, a.k = base + E, a.v = base + 2 * E, a.out = base + 3 * L * E;
    a.stream = stream;
    pp_error err{};
    const int status = op.sdpa->run(&a, &err);
    if (status == PP_UNSUPPORTED && first == 0) {
      why = err.message[0] != '\0' ? err.message : "no reason given";
      return false;
    }
    if (status != PP_OK)
      throw std::runtime_error(std::string("the sdpa operation failed: ") + err.message);
  }
  return true;
}

}  // namespace

int64_t scratch_per_sample(const LayerOp& op) {
  if (op.kind == PP_OP_SELF_ATTENTION)
    return op.attention.length * 4 * op.attention.embed;  // q, k, v, then the mixed rows
  if (op.kind == PP_OP_CHERI_BLOCK) return cheri_scratch(op.cheri);
  return 0;
}

template <class S>
void launch_layer_op(const LayerOp& op, const LayerIo<S>& io, cublasHandle_t blas,
                     cudaStream_t stream, std::string* declined) {
  switch (op.kind) {
    case PP_OP_LAYER_NORM:
      layer_norm_kernel<S>
          <<<launch::blocks(io.rows * (op.in / op.norm.group_size)), kThreads, 0, stream>>>(op, io);
      break;
    case PP_OP_CONV:
      conv_kernel<S><<<launch::blocks(io.rows * op.out), kThreads, 0, stream>>>(op, io);
      break;
    case PP_OP_POOL:
      pool_kernel<S><<<launch::blocks(io.rows * op.out), kThreads, 0, stream>>>(op, io);
      break;
    case PP_OP_LIF:
      lif_kernel<S><<<launch::blocks(io.rows * op.out), kThreads, 0, stream>>>(op, io);
      break;
    case PP_OP_MOE:
      moe_kernel<S>
          <<<launch::blocks(io.rows * (op.in / op.moe.in_features)), kThreads, 0, stream>>>(op, io);
      break;
    case PP_OP_SELF_ATTENTION: {
      const int64_t L = op.attention.length, E = op.attention.embed;
      attention_project_kernel<S>
          <<<launch::blocks(io.rows * L * 3 * E), kThreads, 0, stream>>>(op, io);
      launch::check_last("attention projection kernel");
      launch_attention_mix<S>(op, io.scratch, io.rows, stream, declined);
      attention_out_kernel<S><<<launch::blocks(io.rows * L * E), kThreads, 0, stream>>>(op, io);
      break;
    }
    case PP_OP_CHERI_BLOCK:
      launch_cheri<S>(op, io, blas, stream);
      break;
    default:
      throw std::logic_error("launch_layer_op: not a device layer kind");
  }
  launch::check_last("layer kernel");
}

template <class S>
void launch_attention_mix(const LayerOp& op, S* scratch, int64_t rows, cudaStream_t stream,
                          std::string* declined) {
  LayerIo<S> io{};
  io.rows = rows;
  io.batch = rows;
  io.scratch = scratch;
  std::string why;
  if (op.sdpa == nullptr || !attention_mix_sdpa<S>(op, io, stream, why)) {
    if (op.sdpa != nullptr && declined != nullptr) *declined = why;
    attention_mix_kernel<S>
        <<<launch::blocks(rows * op.attention.heads * op.attention.length), kThreads, 0, stream>>>(
            op, io);
    launch::check_last("attention kernel");
  }
}

template void launch_attention_mix<float>(const LayerOp&, float*, int64_t, cudaStream_t,
                                          std::string*);
template void launch_attention_mix<double>(const LayerOp&, double*, int64_t, cudaStream_t,
                                           std::string*);
template void launch_layer_op<float>(const LayerOp&, const LayerIo<float>&, cublasHandle_t,
                                     cudaStream_t, std::string*);
template void launch_layer_op<double>(const LayerOp&, const LayerIo<double>&, cublasHandle_t,
                                      cudaStream_t, std::string*);

}  // namespace polyprobe::cuda
