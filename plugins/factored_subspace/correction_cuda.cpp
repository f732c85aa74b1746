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
#include <utility>
#include <vector>

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

// A cuBLAS handle bound to one stream, with a workspace of its own. cublasSetStream resets a
// handle's workspace to cuBLAS's default pool, so a handle shared by several streams (or set
// to the caller's stream on every call) would re-acquire workspace each time; here each
// (thread, device, stream) keeps its handle, set up once: the caller's stream, this
// workspace, and the cuda plugin's modes (no TF32, no atomics: reproducible GEMMs).
struct BoundHandle {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

constexpr std::size_t kWorkspaceBytes = std::size_t{4} << 20;
// Streams remembered per thread: sessions make one stream each, and a long run makes new
// sessions (a rotating subspace), so the oldest handle goes beyond this many.
constexpr std::size_t kMaxHandles = 8;

BoundHandle bind(cudaStream_t stream) {
  BoundHandle b;
  check(cublasCreate(&b.handle), "cublasCreate");
  try {
    check(cublasSetStream(b.handle, stream), "cublasSetStream");
    check(cudaMalloc(&b.workspace, kWorkspaceBytes), "cudaMalloc (cuBLAS workspace)");
    check(cublasSetWorkspace(b.handle, b.workspace, kWorkspaceBytes), "cublasSetWorkspace");
    check(cublasSetMathMode(b.handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    check(cublasSetAtomicsMode(b.handle, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  } catch (...) {
    cublasDestroy(b.handle);
    cudaFree(b.workspace);
    throw;
  }
  return b;
}

// The handles of this thread, most recently made last. Those still held at thread or process
// exit are never destroyed: destroying one from a thread-exit or static destructor can run
// after the CUDA driver has shut down.
cublasHandle_t handle_for(cudaStream_t stream) {
  struct Key {
    int device;
    cudaStream_t stream;
  };
  thread_local std::vector<std::pair<Key, BoundHandle>> handles;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  for (const auto& [key, bound] : handles)
    if (key.device == device && key.stream == stream) return bound.handle;
  if (handles.size() == kMaxHandles) {
    // The oldest stream's session is the likeliest gone. Its work was queued on its own stream
    // and cublasDestroy waits for it, so freeing the workspace after is safe.
    cublasDestroy(handles.front().second.handle);
    cudaFree(handles.front().second.workspace);
    handles.erase(handles.begin());
  }
  handles.emplace_back(Key{device, stream}, bind(stream));
  return handles.back().second.handle;
}

int as_int(int64_t v, const char* what) {
  if (v > std::numeric_limits<int>::max())
    throw std::runtime_error(std::string("factored_correction (cuda): ") + what +
                             " exceeds cuBLAS's 32-bit sizes");
  return static_cast<int>(v);
}

}  // namespace

void project_cuda(const pp_factored_project_args& a) {
  if (a.samples == 0 || a.n_dirs == 0) return;
  cublasHandle_t h = handle_for(static_cast<cudaStream_t>(a.stream));
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
