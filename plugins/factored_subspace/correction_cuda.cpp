// The CUDA "factored_correction" operation (correction.hpp): out = dirs x^T as one cuBLAS
// GEMM on the caller's stream. Row-major [n_dirs, samples] `out` is column-major
// [samples, n_dirs] with leading dimension out_stride, so in cuBLAS's terms
//   out = x(row-major [samples, width])  *  dirs^T,
// that is C = op_T(A) * B with A the column-major [width, samples] view of x and B the
// column-major [width, n_dirs] view of dirs. No kernel of its own: the plugin links the
// shared CUDA runtime and cuBLAS.
#include "correction.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <limits>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace polyprobe::factored {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("factored_correction (cuda): ") + what + ": " +
                             cudaGetErrorString(status));
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("factored_correction (cuda): ") + what + " failed (" +
                             cublasGetStatusString(status) + ")");
}

// One cuBLAS handle per thread and device: a handle must not be used by two threads at once,
// and it binds the device current when it was made. The handles are never destroyed: they
// live as long as the process, and destroying one from a thread-exit or static destructor
// can run after the CUDA driver has shut down.
cublasHandle_t handle_for_current_device() {
  thread_local std::unordered_map<int, cublasHandle_t> handles;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  auto [it, added] = handles.try_emplace(device, nullptr);
  if (added) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t status = cublasCreate(&h);
    if (status != CUBLAS_STATUS_SUCCESS) handles.erase(it);
    check(status, "cublasCreate");
    it->second = h;
  }
  return it->second;
}

int as_int(int64_t v, const char* what) {
  if (v > std::numeric_limits<int>::max())
    throw std::runtime_error(std::string("factored_correction (cuda): ") + what +
                             " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

}  // namespace

std::string cuda_unusable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(status);
  if (count == 0) return "no CUDA device";
  return {};
}

void project_cuda(const pp_factored_project_args& a) {
  if (a.samples == 0 || a.n_dirs == 0) return;
  cublasHandle_t h = handle_for_current_device();
  check(cublasSetStream(h, static_cast<cudaStream_t>(a.stream)), "cublasSetStream");
  const int m = as_int(a.samples, "samples"), n = as_int(a.n_dirs, "directions"),
            k = as_int(a.width, "width"), lda = as_int(a.x_stride, "x's stride"),
            ldb = as_int(a.dirs_stride, "dirs' stride"), ldc = as_int(a.out_stride, "out's stride");
  if (a.dtype == PP_DTYPE_F32) {
    const float one = 1, zero = 0;
    check(
        cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, static_cast<const float*>(a.x), lda,
                    static_cast<const float*>(a.dirs), ldb, &zero, static_cast<float*>(a.out), ldc),
        "cublasSgemm");
  } else {
    const double one = 1, zero = 0;
    check(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, static_cast<const double*>(a.x),
                      lda, static_cast<const double*>(a.dirs), ldb, &zero,
                      static_cast<double*>(a.out), ldc),
          "cublasDgemm");
  }
}

}  // namespace polyprobe::factored
