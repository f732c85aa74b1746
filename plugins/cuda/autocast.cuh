// candidate_autocast (pp_session_options::candidate_dtype): a float32 session runs its
// candidates' later layers on their *changes*, in bf16 or fp16 with float32 accumulation.
//
// A candidate's value at every op boundary is the incumbent's (float32, computed once per
// incumbent) plus a change. The changes flow through the ops: an activation turns the
// pre-activation change dz into da = f(z + dz) - f(z) in float32 (the incumbent's z and f(z)
// are kept), and a linear op maps da to W da in one tensor-core GEMM over the chunk, W and da
// rounded to the reduced type, the sum in float32 (the bias cancels). Rounding therefore
// costs a relative 2^-8 (bf16) or 2^-11 (fp16) of each *change*, not of the activations:
// candidates that differ by little still rank as in float32. The logits are the incumbent's
// plus the change, and the loss runs in float32.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace polyprobe::cuda {

// The bytes of one value of either reduced dtype (PP_DTYPE_BF16, PP_DTYPE_F16).
constexpr std::size_t kReducedBytes = 2;

// y[i] = x[i] rounded to `dtype` (PP_DTYPE_BF16 or PP_DTYPE_F16), n values.
void launch_to_reduced(const float* x, void* y, int64_t n, int32_t dtype, cudaStream_t stream);

// For the `count` candidates of a chunk, `per` = batch x width values each: the activation's
// change da = f(z + dz) - a, where z and a = f(z) are the incumbent's [batch, width] input
// and output of the op. Writes float32 into da (in place over dz allowed) or, when `reduced`
// is not null, the reduced dtype there instead (the next op is a GEMM).
void launch_activation_change(const float* dz, const float* z, const float* a, int64_t per,
                              int64_t count, int32_t fn, double step, float* da, void* reduced,
                              int32_t dtype, cudaStream_t stream);

// y[c, :] += inc[:] for the `count` candidates of `per` values each: a candidate's value from
// its change.
void launch_add_incumbent(float* y, const float* inc, int64_t per, int64_t count,
                          cudaStream_t stream);

// y[rows, out] = x[rows, in] W^T, W [out, in] row-major, both in the reduced `dtype`, y in
// float32 with float32 accumulation (cublasGemmEx on the tensor cores).
void gemm_reduced(cublasHandle_t handle, int out, int rows, int in, const void* w, const void* x,
                  int32_t dtype, float* y);

}  // namespace polyprobe::cuda
