// The Cheri block's forward on the GPU (docs/design.md section 6; core/layers/cheri.cpp is the
// reference): per example x [L, C] (channels last) -> 3-tap depthwise dilated conv -> LayerNorm
// over the whole (L, C) plane (statistics in float32, eps 1e-3, no affine) -> Linear C -> H
// -> GELU (tanh form) -> Linear H -> C -> y = x + 0.15 MLP, with H = e C.
//
// Two launches per forward: a statistics pass (the conv and each example's plane mean and
// variance, which every row's normalisation needs before any of its MLP can start), then one
// fused kernel that recomputes the conv of a tile of rows, normalises it and runs the whole MLP
// and the residual without leaving the multiprocessor. The MLP runs on
//   - tensor cores (mma.sync m16n8k16, bf16 or fp16 operands, float32 accumulation) when C and
//     H are multiples of 64 and both weight matrices fit in shared memory with a tile of rows:
//     the training path, weights cast once per incumbent (set_weights) and kept;
//   - float32 FMA otherwise, or on request (CheriMlp::f32): the stated slower path, also the
//     one whose results match the float32 reference to about 1e-5.
// Plain C++ interface (no CUDA types beyond the stream), so tests and the session include it.
#pragma once

#include "device.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace polyprobe::cuda {

// The element type of x and y in device memory.
enum class CheriInput { f32, bf16, f16 };
// The MLP's operands: float32 FMA, or bf16 / fp16 on tensor cores (float32 accumulation).
enum class CheriMlp { f32, bf16, f16 };

const char* to_string(CheriInput t);
const char* to_string(CheriMlp t);

// Bytes of one element of `t`.
std::size_t element_bytes(CheriInput t);

// dst[i] = src[i] rounded to nearest in `t` / widened back to float64: n elements, both device
// arrays. Asynchronous on `stream`.
void convert_from_f64(const double* src, CheriInput t, void* dst, int64_t n, cudaStream_t stream);
void convert_to_f64(const void* src, CheriInput t, double* dst, int64_t n, cudaStream_t stream);

struct CheriShape {
  int64_t length = 0, channels = 0, hidden = 0, dilation = 1;
};

// Why the tensor-core kernel cannot serve `shape` (C and H multiples of 64, both weight
// matrices and one tile of rows in an sm_90 block's shared memory); empty when it can.
// Host-only: it asks nothing of the device.
std::string cheri_tensor_core_reason(const CheriShape& shape);

// One Cheri block's weights on the device and the scratch of its forward. Owns its device
// memory; one host thread and one stream at a time.
class CheriBlockKernel {
 public:
  // Throws std::invalid_argument for a shape no path can run (non-positive sizes, or shared
  // memory too small even for the float32 path).
  explicit CheriBlockKernel(const CheriShape& shape);

  const CheriShape& shape() const { return shape_; }

  // Takes the block's float64 parameters in the core's order (conv_weight [3, C], fc1.weight
  // [H, C], fc2.weight [C, H]; 3C + 2HC values, host memory, read before return). The casts
  // to each MLP's operand type happen once, at the first forward that needs them.
  void set_weights(const double* params, cudaStream_t stream);

  // y = block(x) for `n` examples, x and y [n, L, C] device arrays of `input` (distinct).
  // `mlp` picks the MLP's operands; a tensor-core choice the shape cannot serve throws
  // std::invalid_argument with cheri_tensor_core_reason. Asynchronous on `stream`.
  void forward(CheriInput input, CheriMlp mlp, const void* x, void* y, int64_t n,
               cudaStream_t stream);

  // The path `mlp` takes for this shape, in words (for benchmarks and explain).
  std::string path(CheriMlp mlp) const;

  // (benchmarks) At most `teams` teams of 8 warps per block of the tensor-core kernel; 0, the
  // default, as many as shared memory holds (two at C = 128, e = 2).
  void set_max_teams(int teams) { max_teams_ = teams; }

 private:
  void cast_weights(CheriMlp mlp, cudaStream_t stream);

  CheriShape shape_;
  bool tensor_cores_ = false;
  int max_teams_ = 0;
  DeviceBuffer<double> params_;
  DeviceBuffer<float> taps_;         // [3, C]
  DeviceBuffer<float> w1_t_, w2_t_;  // float32 path: fc1^T [C, H], fc2^T [H, C]
  DeviceBuffer<uint16_t> w1_bf16_, w2_bf16_, w1_f16_, w2_f16_;  // [H, C], [C, H]
  bool fresh_f32_ = false, fresh_bf16_ = false, fresh_f16_ = false;
  DeviceBuffer<float> partials_;     // [n, splits, 4]: count, mean, M2 of each split
  DeviceBuffer<unsigned> counters_;  // [n]: finished splits (0 between forwards)
  DeviceBuffer<float> norm_;         // [n, 2]: mean, 1 / sqrt(var + eps)
};

}  // namespace polyprobe::cuda
