// The CPU "factored_correction" operation (correction.hpp): out = dirs x^T, one Eigen GEMM
// per fixed block of samples (a product per direction when there are fewer than kGemmFrom). The
// blocks are the same whatever the thread count, so every output value is summed in the same order
// on one thread or many.
#include "correction.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <Eigen/Core>

#include <algorithm>

namespace polyprobe::factored {
namespace {

// Samples per GEMM: one block's x rows (at most 64 x width) stay in cache while every
// direction reads them, and a layer of a few hundred samples still spreads over threads.
constexpr int64_t kBlock = 64;
// Directions from which one GEMM replaces a matrix-vector product per direction. Below 4,
// Eigen's GEMM kernel ran at 0.4-0.7x the products' speed (a one-off comparison); from 4
// `polyprobe bench factored` measures one call 0.68-1.40x as fast as a call per direction at 4
// directions (slower at 64 samples, faster at 512), 1.05-2.0x at 8 and 1.8-3.6x at 32 on an
// AVX-512 EPYC and Xeon. Callers with their own products pick their own threshold (cpu_tbb: 8).
constexpr int64_t kGemmFrom = 4;

template <class S>
using RowMat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using ConstRows = Eigen::Map<const RowMat<S>, 0, Eigen::OuterStride<>>;
template <class S>
using Rows = Eigen::Map<RowMat<S>, 0, Eigen::OuterStride<>>;

template <class S>
void project(const pp_factored_project_args& a) {
  const ConstRows<S> dirs(static_cast<const S*>(a.dirs), a.n_dirs, a.width,
                          Eigen::OuterStride<>(a.dirs_stride));
  const auto* x = static_cast<const S*>(a.x);
  auto* out = static_cast<S*>(a.out);
  auto block = [&](int64_t first) {
    const int64_t n = std::min(kBlock, a.samples - first);
    const ConstRows<S> xb(x + first * a.x_stride, n, a.width, Eigen::OuterStride<>(a.x_stride));
    Rows<S> ob(out + first, a.n_dirs, n, Eigen::OuterStride<>(a.out_stride));
    if (a.n_dirs < kGemmFrom) {
      for (int64_t j = 0; j < a.n_dirs; ++j)
        ob.row(j).noalias() = (xb * dirs.row(j).transpose()).transpose();
      return;
    }
    ob.noalias() = dirs * xb.transpose();
  };
  const int64_t blocks = (a.samples + kBlock - 1) / kBlock;
  if (a.threads == 1 || blocks == 1) {
    for (int64_t k = 0; k < blocks; ++k) block(k * kBlock);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, blocks, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t k = r.begin(); k < r.end(); ++k) block(k * kBlock);
                    });
}

}  // namespace

std::string cpu_unusable_reason() {
#if defined(__x86_64__)
  __builtin_cpu_init();
#if defined(__AVX512F__)
  if (!__builtin_cpu_supports("avx512f")) return "built for AVX-512 (-march), which this CPU lacks";
#endif
#if defined(__AVX2__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return "built for AVX2 and FMA (-march), which this CPU lacks";
#endif
#endif
  return {};
}

void project_cpu(const pp_factored_project_args& args) {
  if (args.samples == 0 || args.n_dirs == 0) return;
  if (args.dtype == PP_DTYPE_F32)
    project<float>(args);
  else
    project<double>(args);
}

}  // namespace polyprobe::factored
