// The layer kinds beyond linear and elementwise activations on the device: layer norm,
// conv (1-D and 2-D, stride, padding, dilation, groups), max/avg pooling, LIF, hard top-1
// MoE, multi-head self-attention (softmax or argmax, causal or not) and the Cheri block
// (its candidate form: each candidate's own weights, in S; the fused kernel of
// cheri_block.hpp serves one set of weights), each as the core's
// forward (core/layers/) computes it. They serve the session's dense and materialised paths:
// one launch runs a chunk of candidates, each with its own parameter block, or the incumbent.
// Attention mixes its values with the host's "sdpa" operation (operations.h) when the session
// was offered one for the GPU, else with this file's kernel.
#pragma once

#include <polyprobe/plugin/abi.h>
#include <polyprobe/plugin/operations.h>
#include <polyprobe/plugin/ops.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace polyprobe::cuda {

// One such op with its attributes (the member of its kind is the one read).
struct LayerOp {
  int32_t kind = PP_OP_CUSTOM;
  int64_t in = 0, out = 0;  // features per sample
  pp_layer_norm_attrs norm{};
  pp_conv_attrs conv{};
  pp_pool_attrs pool{};
  pp_attention_attrs attention{};
  pp_moe_attrs moe{};
  pp_lif_attrs lif{};
  pp_cheri_attrs cheri{};
  // Attention: the host's "sdpa" operation for the GPU and the session's dtype, or null for
  // this file's kernel. Not owned (it lives as long as the process).
  const pp_sdpa_table* sdpa = nullptr;
};

// A chunk: sample r of `rows` (count x batch, candidate-major) reads
// x + (x_shared ? r % batch : r) * in and writes y + r * out, with the parameter block
// params + (r / batch) * param_stride (0: one block for every sample). `scratch` holds
// scratch_per_sample(op) values per sample.
template <class S>
struct LayerIo {
  const S* x;
  int32_t x_shared;
  int64_t batch, rows;
  const S* params;
  int64_t param_stride;
  S* y;
  S* scratch;
};

// Scratch values per sample (attention: its q, k, v and mixed rows; the Cheri block: its
// normalised conv and hidden rows). Attention keeps each sample's together: q|k|v [L, 3E]
// then the mixed rows [L, E]; the Cheri block keeps a chunk's rows together: every sample's
// normalised conv [L, C] first, then every sample's hidden values [L, e C], then every
// sample's 1 / sqrt(var + eps) of its plane (cheri_layout).
int64_t scratch_per_sample(const LayerOp& op);

// Queues the op over the chunk on `stream`. Attention with op.sdpa set runs the operation,
// over every (sample, head) of the chunk; when the operation declines the arguments
// (PP_UNSUPPORTED), this file's kernel runs instead and *declined (when not null) gets the
// operation's reason, else it is left alone. Throws std::runtime_error when a launch or the
// operation fails.
template <class S>
void launch_layer_op(const LayerOp& op, const LayerIo<S>& io, cublasHandle_t blas,
                     cudaStream_t stream, std::string* declined = nullptr);

// Attention's mixing step alone, over `rows` samples whose scratch (scratch_per_sample(op)
// values each) holds their q|k|v rows and receives their mixed rows; the sdpa operation and
// *declined as for launch_layer_op.
template <class S>
void launch_attention_mix(const LayerOp& op, S* scratch, int64_t rows, cudaStream_t stream,
                          std::string* declined = nullptr);

// Where sample r of a chunk of `rows` keeps its Cheri scratch: the normalised conv at
// scratch + conv, the hidden values (after GELU) at scratch + hidden, the plane's
// 1 / sqrt(var + eps) at scratch + inv.
struct CheriLayout {
  int64_t conv, hidden, inv;
};
__host__ __device__ inline CheriLayout cheri_layout(const pp_cheri_attrs& a, int64_t rows,
                                                    int64_t r) {
  const int64_t plane = a.length * a.channels;
  return {r * plane, rows * plane + r * plane * a.expansion, rows * plane * (1 + a.expansion) + r};
}

#ifdef __CUDACC__
// One conv output value without the bias: channel oc at (oi, oj) of the sample x, its filter's
// taps read as weight(k), k < in_channels / groups * kh * kw. The dense and site-local paths
// both sum through here, so they agree bit for bit.
template <class S, class Weight>
__device__ S conv_value(const pp_conv_attrs& a, const S* x, int64_t oc, int64_t oi, int64_t oj,
                        Weight weight) {
  const int64_t ih = a.in_size[0], iw = a.in_size[1];
  const int64_t per_group_in = a.in_channels / a.groups, per_group_out = a.out_channels / a.groups;
  const int64_t kh = a.kernel[0], kw = a.kernel[1];
  const int64_t first_in = (oc / per_group_out) * per_group_in;
  S acc = 0;
  for (int64_t c = 0; c < per_group_in; ++c)
    for (int64_t ki = 0; ki < kh; ++ki) {
      const int64_t i = oi * a.stride[0] - a.padding[0] + ki * a.dilation[0];
      if (i < 0 || i >= ih) continue;
      for (int64_t kj = 0; kj < kw; ++kj) {
        const int64_t j = oj * a.stride[1] - a.padding[1] + kj * a.dilation[1];
        if (j < 0 || j >= iw) continue;
        acc += weight((c * kh + ki) * kw + kj) * x[((first_in + c) * ih + i) * iw + j];
      }
    }
  return acc;
}
#endif

}  // namespace polyprobe::cuda
