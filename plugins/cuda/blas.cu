// cuBLAS products (blas.cuh). Column-major cuBLAS sees the row-major [n, m] output as its
// [m, n]: c = a^T-major op applied to b.
#include "blas.cuh"
#include "device.hpp"

namespace polyprobe::cuda {

template <>
void gemm<float>(cublasHandle_t h, int m, int n, int k, const float* a, const float* b, float* c) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, k, b, k, &zero, c, m),
        "cublasSgemm");
}
template <>
void gemm<double>(cublasHandle_t h, int m, int n, int k, const double* a, const double* b,
                  double* c) {
  const double one = 1.0, zero = 0.0;
  check(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, k, b, k, &zero, c, m),
        "cublasDgemm");
}

template <>
void gemm_batched<float>(cublasHandle_t h, int m, int n, int k, const float* a, int64_t stride_a,
                         const float* b, int64_t stride_b, float* c, int64_t stride_c, int batch) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, k, stride_a, b, k,
                                  stride_b, &zero, c, m, stride_c, batch),
        "cublasSgemmStridedBatched");
}
template <>
void gemm_batched<double>(cublasHandle_t h, int m, int n, int k, const double* a, int64_t stride_a,
                          const double* b, int64_t stride_b, double* c, int64_t stride_c,
                          int batch) {
  const double one = 1.0, zero = 0.0;
  check(cublasDgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, k, stride_a, b, k,
                                  stride_b, &zero, c, m, stride_c, batch),
        "cublasDgemmStridedBatched");
}

}  // namespace polyprobe::cuda
