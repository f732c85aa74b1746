// The plugin's cuBLAS products, in the layout its activations use: row-major [rows, in]
// inputs, [out, in] weights (PyTorch's), [rows, out] outputs.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace polyprobe::cuda {

// c [n, m] = b [n, k] a^T, a [m, k] (m outputs, n rows, k inputs), on the handle's stream.
template <class T>
void gemm(cublasHandle_t h, int m, int n, int k, const T* a, const T* b, T* c);

// As gemm() for `batch` problems at the given strides (a stride of 0 shares that operand
// across the batch).
template <class T>
void gemm_batched(cublasHandle_t h, int m, int n, int k, const T* a, int64_t stride_a, const T* b,
                  int64_t stride_b, T* c, int64_t stride_c, int batch);

}  // namespace polyprobe::cuda
