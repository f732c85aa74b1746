// The transport half of a step on the device (transport.cuh). One thread block solves one
// transport block: its rows are strided over the threads, and every sum, maximum and minimum
// over rows is a per-thread partial reduced in a fixed tree (warp shuffles, then the warps in
// order), so repeated runs give the same bits. Each formula follows its host counterpart in
// the core, named in the comments; the association of sums differs, so results agree with
// the host to rounding.
#include "device.hpp"
#include "launch.cuh"
#include "transport.cuh"

#include <cmath>
#include <stdexcept>
#include <string>

namespace polyprobe::cuda {
namespace {

constexpr int kTransportThreads = 256;
constexpr int kWarps = kTransportThreads / 32;
constexpr double kInf = __builtin_huge_val();

struct Add {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct Max {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};
struct Min {
  __device__ double operator()(double a, double b) const { return fmin(a, b); }
};

// The block-wide reduction of one value per thread; every thread gets the result. scratch
// holds kWarps + 1 doubles.
template <class Op>
__device__ double block_reduce(double x, Op op, double* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = op(x, __shfl_down_sync(0xffffffffu, x, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the previous reduction's readers are done with scratch
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    double r = scratch[0];
    for (int w = 1; w < kWarps; ++w) r = op(r, scratch[w]);
    scratch[kWarps] = r;
  }
  __syncthreads();
  return scratch[kWarps];
}

__global__ void directions_kernel(const double* rotations, const double* polytope,
                                  int64_t particles, int32_t vertices, int32_t d,
                                  double* directions) {
  const int64_t n = particles * vertices;
  for (int64_t iv = launch::thread_index(); iv < n; iv += launch::thread_stride()) {
    const int64_t i = iv / vertices, v = iv % vertices;
    const double* rot = rotations + i * d * d;
    const double* t = polytope + v * d;
    for (int32_t j = 0; j < d; ++j) {
      double s = 0;
      for (int32_t c = 0; c < d; ++c) s += rot[j * d + c] * t[c];
      directions[iv * d + j] = s;
    }
  }
}

// f_i <- -eps log sum_v exp((g_v - C_iv) / eps) / V (transport.cpp, update_row_duals).
__device__ void update_rows(const double* C, int64_t rows, int32_t V, const double* g, double eps,
                            double* f) {
  const double log_cols = log(static_cast<double>(V));
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const double* c = C + r * V;
    double m = -kInf;
    for (int32_t v = 0; v < V; ++v) m = fmax(m, g[v] - c[v]);
    double s = 0;
    for (int32_t v = 0; v < V; ++v) s += exp((g[v] - c[v] - m) / eps);
    f[r] = -(m + eps * (log(s) - log_cols));
  }
}

__global__ void __launch_bounds__(kTransportThreads) transport_kernel(TransportProblem p) {
  extern __shared__ double shared[];
  const int32_t V = p.vertices, K = p.probes, d = p.d;
  double* scratch = shared;          // kWarps + 1
  double* g = scratch + kWarps + 1;  // [V] column duals
  double* next_g = g + V;            // [V]
  const int64_t b = blockIdx.x;
  const int64_t first = p.block_first[b], rows = p.block_count[b];
  double* C = p.cost + first * V;
  double* W = p.weights + first * V;

  // The cost matrix, mean over probes, and the block's finite statistics (step_engine.cpp).
  double sum = 0, best = kInf, worst = -kInf, finite = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const double* loss = p.losses + (first + r) * V * K;
    for (int32_t v = 0; v < V; ++v) {
      double s = 0;
      for (int32_t k = 0; k < K; ++k) s += loss[v * K + k];
      const double c = s / K;
      C[r * V + v] = c;
      if (isfinite(c)) {
        sum += c;
        best = fmin(best, c);
        worst = fmax(worst, c);
        finite += 1;
      }
    }
  }
  sum = block_reduce(sum, Add{}, scratch);
  best = block_reduce(best, Min{}, scratch);
  worst = block_reduce(worst, Max{}, scratch);
  finite = block_reduce(finite, Add{}, scratch);
  const bool informed = finite > 0;
  const double eps = p.temperature;
  int32_t iterations = 0;
  bool converged = true;

  if (informed) {
    // copy_penalised (step_engine.cpp), then scale_cost (transport.cpp) over the block's matrix.
    const double penalty = worst + p.nonfinite_margin * (1 + fabs(worst));
    double abs_sum = 0, abs_max = 0, lo = kInf, hi = -kInf;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
      for (int32_t v = 0; v < V; ++v) {
        double c = C[r * V + v];
        if (!isfinite(c)) C[r * V + v] = c = penalty;
        abs_sum += fabs(c);
        abs_max = fmax(abs_max, fabs(c));
        lo = fmin(lo, c);
        hi = fmax(hi, c);
      }
    abs_sum = block_reduce(abs_sum, Add{}, scratch);
    abs_max = block_reduce(abs_max, Max{}, scratch);
    lo = block_reduce(lo, Min{}, scratch);
    hi = block_reduce(hi, Max{}, scratch);
    double shift = 0, divisor = 0;
    if (p.cost_scaling == PP_COST_MEAN) divisor = abs_sum / static_cast<double>(rows * V);
    if (p.cost_scaling == PP_COST_MAX) divisor = abs_max;
    if (p.cost_scaling == PP_COST_MIN_MAX) {
      shift = lo;
      divisor = hi - lo;
    }
    if (shift != 0 || divisor > 0)
      for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        for (int32_t v = 0; v < V; ++v) {
          double c = C[r * V + v] - shift;
          if (divisor > 0) c /= divisor;
          C[r * V + v] = c;
        }
    __syncthreads();

    const bool lone = rows == 1 && p.solver == PP_SOLVER_SINKHORN;
    if (p.solver == PP_SOLVER_SINKHORN && !lone) {
      // solve_sinkhorn (transport.cpp): warm-started duals, the column update doubling as the
      // marginal check, then the row-normalised plan.
      double* f = p.duals_f + first;
      if (p.duals_fresh[b] != 0) {
        for (int32_t v = threadIdx.x; v < V; v += blockDim.x) g[v] = 0;
        __syncthreads();
        update_rows(C, rows, V, g, eps, f);
      } else {
        for (int32_t v = threadIdx.x; v < V; v += blockDim.x) g[v] = p.duals_g[b * V + v];
      }
      __syncthreads();
      converged = false;
      const double log_rows = log(static_cast<double>(rows));
      for (int32_t it = 0; it < p.sinkhorn_max_iterations; ++it) {
        for (int32_t v = 0; v < V; ++v) {
          double m = -kInf;
          for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) m = fmax(m, f[r] - C[r * V + v]);
          m = block_reduce(m, Max{}, scratch);
          double s = 0;
          for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
            s += exp((f[r] - C[r * V + v] - m) / eps);
          s = block_reduce(s, Add{}, scratch);
          if (threadIdx.x == 0) next_g[v] = -(m + eps * (log(s) - log_rows));
        }
        __syncthreads();
        double error = 0;
        for (int32_t v = 0; v < V; ++v) error = fmax(error, fabs(expm1((g[v] - next_g[v]) / eps)));
        iterations = it;
        if (error <= p.sinkhorn_tolerance) {
          converged = true;
          break;
        }
        __syncthreads();  // everyone has read g before it changes
        for (int32_t v = threadIdx.x; v < V; v += blockDim.x) g[v] = next_g[v];
        __syncthreads();
        update_rows(C, rows, V, g, eps, f);
        __syncthreads();
        iterations = it + 1;
      }
      for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        double m = -kInf;
        for (int32_t v = 0; v < V; ++v) m = fmax(m, g[v] - C[r * V + v]);
        double s = 0;
        for (int32_t v = 0; v < V; ++v) s += W[r * V + v] = exp((g[v] - C[r * V + v] - m) / eps);
        for (int32_t v = 0; v < V; ++v) W[r * V + v] /= s;
      }
      for (int32_t v = threadIdx.x; v < V; v += blockDim.x) p.duals_g[b * V + v] = g[v];
    } else if (p.solver == PP_SOLVER_TOP_K) {
      // solve_top_k: equal weight on the k cheapest, ties to the earlier vertex.
      for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        const double* c = C + r * V;
        for (int32_t v = 0; v < V; ++v) {
          int32_t rank = 0;
          for (int32_t u = 0; u < V; ++u) rank += (c[u] < c[v] || (c[u] == c[v] && u < v)) ? 1 : 0;
          W[r * V + v] = rank < p.top_k ? 1.0 / p.top_k : 0.0;
        }
      }
    } else {
      // solve_softmax (and a lone Sinkhorn row).
      for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        const double* c = C + r * V;
        double m = kInf;
        for (int32_t v = 0; v < V; ++v) m = fmin(m, c[v]);
        double s = 0;
        for (int32_t v = 0; v < V; ++v) s += W[r * V + v] = exp(-(c[v] - m) / eps);
        for (int32_t v = 0; v < V; ++v) W[r * V + v] /= s;
      }
    }
  } else {
    // No finite cost: no information, stay put (uniform weights).
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
      for (int32_t v = 0; v < V; ++v) W[r * V + v] = 1.0 / V;
  }

  // The barycentric move step_r R_i (T^T w_i) = step_r sum_v w_iv (R_i t_v), then the
  // quadratic model's fit (radius_model.cpp, fit_particle_quadratic) along the same move.
  const bool quadratic = p.incumbents != nullptr;
  double slope_sum = 0, curvature_sum = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t i = first + r;
    const double* dir = p.directions + i * V * d;
    double move[kTransportMaxDim];
    for (int32_t j = 0; j < d; ++j) {
      double s = 0;
      for (int32_t v = 0; v < V; ++v) s += W[r * V + v] * dir[v * d + j];
      move[j] = p.step_radius * s;
      p.moves[i * d + j] = move[j];
    }
    if (!quadratic) continue;
    const double* loss = p.losses + i * V * K;
    double mean = 0;
    for (int32_t v = 0; v < V; ++v) mean += loss[v * K + K - 1];
    mean /= V;
    const double scale = static_cast<double>(d) / (static_cast<double>(V) * p.scaled_radius);
    const double f = p.n_incumbents == 1 ? p.incumbents[0] : p.incumbents[i];
    const double curvature = 2 * (mean - f) / (p.scaled_radius * p.scaled_radius);
    double slope = 0, norm2 = 0;
    for (int32_t j = 0; j < d; ++j) {
      double gj = 0;
      for (int32_t v = 0; v < V; ++v) gj += (loss[v * K + K - 1] - mean) * dir[v * d + j];
      slope += gj * scale * move[j];
      norm2 += move[j] * move[j];
    }
    if (isfinite(slope) && isfinite(curvature)) {
      slope_sum += slope;
      curvature_sum += curvature * norm2;
    }
  }
  if (quadratic) {
    slope_sum = block_reduce(slope_sum, Add{}, scratch);
    curvature_sum = block_reduce(curvature_sum, Add{}, scratch);
  }
  if (threadIdx.x == 0) {
    pp_transport_block out{};
    out.cost_sum = sum;
    out.finite = static_cast<int64_t>(finite);
    out.best_cost = best;
    out.iterations = iterations;
    out.converged = converged ? 1 : 0;
    out.slope = slope_sum;
    out.curvature = curvature_sum;
    p.blocks[b] = out;
  }
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

}  // namespace

void launch_directions(const double* rotations, const double* polytope, int64_t particles,
                       int32_t vertices, int32_t d, double* directions, cudaStream_t stream) {
  const int64_t n = particles * vertices;
  if (n == 0) return;
  directions_kernel<<<launch::blocks(n, 256), 256, 0, stream>>>(rotations, polytope, particles,
                                                                vertices, d, directions);
  check_launch("directions kernel");
}

void launch_transport(const TransportProblem& problem, cudaStream_t stream) {
  if (problem.d > kTransportMaxDim)
    throw std::invalid_argument("transport: particles of dimension " + std::to_string(problem.d) +
                                " exceed the device kernel's " + std::to_string(kTransportMaxDim));
  if (problem.n_blocks == 0) return;
  const std::size_t shared =
      sizeof(double) * (kWarps + 1 + 2 * static_cast<std::size_t>(problem.vertices));
  transport_kernel<<<static_cast<unsigned>(problem.n_blocks), kTransportThreads, shared, stream>>>(
      problem);
  check_launch("transport kernel");
}

}  // namespace polyprobe::cuda
