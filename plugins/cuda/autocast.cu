// The kernels of candidate_autocast (autocast.cuh): elementwise, one thread per value.
#include "autocast.cuh"
#include "common.cuh"
#include "device.hpp"
#include "formulas.cuh"

#include <polyprobe/plugin/abi.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace polyprobe::cuda {
namespace {

using launch::thread_index;
using launch::thread_stride;

template <class R>
__device__ R round_to(float v);
template <>
__device__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __half round_to<__half>(float v) {
  return __float2half_rn(v);
}

template <class R>
__global__ void to_reduced_kernel(const float* x, R* y, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = round_to<R>(x[i]);
}

// out is float* (R = float) or the reduced type.
template <class R>
__global__ void activation_change_kernel(const float* dz, const float* z, const float* a,
                                         int64_t per, int64_t total, int32_t fn, float step,
                                         R* out) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t j = i % per;
    const float change = activate<float>(fn, z[j] + dz[i], step) - a[j];
    if constexpr (std::is_same_v<R, float>)
      out[i] = change;
    else
      out[i] = round_to<R>(change);
  }
}

__global__ void add_incumbent_kernel(float* y, const float* inc, int64_t per, int64_t total) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) y[i] += inc[i % per];
}

cudaDataType blas_type(int32_t dtype) { return dtype == PP_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF; }

}  // namespace

void launch_to_reduced(const float* x, void* y, int64_t n, int32_t dtype, cudaStream_t stream) {
  if (n <= 0) return;
  if (dtype == PP_DTYPE_F16)
    to_reduced_kernel<<<launch::blocks(n), kThreads, 0, stream>>>(x, static_cast<__half*>(y), n);
  else
    to_reduced_kernel<<<launch::blocks(n), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y),
                                                                  n);
  launch::check_last("to_reduced kernel");
}

void launch_activation_change(const float* dz, const float* z, const float* a, int64_t per,
                              int64_t count, int32_t fn, double step, float* da, void* reduced,
                              int32_t dtype, cudaStream_t stream) {
  const int64_t total = per * count;
  if (total <= 0) return;
  const auto s = static_cast<float>(step);
  if (reduced == nullptr)
    activation_change_kernel<float>
        <<<launch::blocks(total), kThreads, 0, stream>>>(dz, z, a, per, total, fn, s, da);
  else if (dtype == PP_DTYPE_F16)
    activation_change_kernel<__half><<<launch::blocks(total), kThreads, 0, stream>>>(
        dz, z, a, per, total, fn, s, static_cast<__half*>(reduced));
  else
    activation_change_kernel<__nv_bfloat16><<<launch::blocks(total), kThreads, 0, stream>>>(
        dz, z, a, per, total, fn, s, static_cast<__nv_bfloat16*>(reduced));
  launch::check_last("activation change kernel");
}

void launch_add_incumbent(float* y, const float* inc, int64_t per, int64_t count,
                          cudaStream_t stream) {
  const int64_t total = per * count;
  if (total <= 0) return;
  add_incumbent_kernel<<<launch::blocks(total), kThreads, 0, stream>>>(y, inc, per, total);
  launch::check_last("add incumbent kernel");
}

void gemm_reduced(cublasHandle_t handle, int out, int rows, int in, const void* w, const void* x,
                  int32_t dtype, float* y) {
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType t = blas_type(dtype);
  // Column-major view: y^T [out, rows] = W [out, in] (row-major = its transpose column-major)
  // times x^T [in, rows], as the session's float32 gemm().
  check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, t, in, x, t, in,
                     &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (candidate_autocast)");
}

}  // namespace polyprobe::cuda
