// The transport half of a step on the device (transport.cuh). One thread block solves one
// transport block: its rows are strided over the threads, and every sum, maximum and minimum
// over rows is a per-thread partial reduced in a fixed tree (warp shuffles, then the warps in
// order), so repeated runs give the same bits. Each formula follows its host counterpart in
// the core, named in the comments; the association of sums differs, so results agree with
// the host to rounding.
#include "common.cuh"
#include "transport.cuh"

#include <polyprobe/plugin/kernels/plane_rotation.hpp>

#include <cooperative_groups.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace polyprobe::cuda {
namespace {

constexpr int kTransportThreads = 256;
constexpr int kWarps = kTransportThreads / 32;
constexpr double kInf = __builtin_huge_val();

// A transport block of at least this many rows is solved by the whole grid (grid_transport_kernel),
// by at most kGridBlocks thread blocks (fixed, so the sums' order does not depend on the GPU),
// when its polytope has at most kGridMaxColumns vertices.
constexpr int64_t kGridRows = 2048;
constexpr int kGridBlocks = 128;
constexpr int32_t kGridMaxColumns = 32;
constexpr int kGridSlots = 2 * kGridMaxColumns;  // values one grid exchange combines

// The reductions: a sum, a maximum or a minimum.
constexpr int kAdd = 0, kMax = 1, kMin = 2;
__device__ double apply(int kind, double a, double b) {
  return kind == kAdd ? a + b : kind == kMax ? fmax(a, b) : fmin(a, b);
}

// The block-wide reduction of one value per thread; every thread gets the result. scratch
// holds kWarps + 1 doubles.
__device__ double block_reduce(double x, int kind, double* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1)
    x = apply(kind, x, __shfl_down_sync(0xffffffffu, x, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the previous reduction's readers are done with scratch
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    double r = scratch[0];
    for (int w = 1; w < kWarps; ++w) r = apply(kind, r, scratch[w]);
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

__global__ void plane_rotations_kernel(uint64_t seed, uint64_t step, int64_t particles,
                                       double* rotations) {
  for (int64_t i = launch::thread_index(); i < particles; i += launch::thread_stride())
    kernels::plane_rotation(seed, step, static_cast<uint64_t>(i), rotations + i * 4);
}

// Where one transport block is solved: by one thread block (BlockScope, the rows strided over
// its threads) or by the whole grid of a cooperative launch (GridScope, each thread block a
// contiguous slice of the rows). Every reduction first adds the thread's partials in a fixed
// tree inside its thread block; GridScope then combines the thread blocks' results in block
// order after a grid barrier. Every thread of every block gets the same totals, so all take
// the same branches and reach the same barriers.
struct BlockScope {
  int64_t lo, hi;   // the rows this thread block visits
  double* scratch;  // kWarps + 1 doubles of shared memory
  __device__ bool leader() const { return true; }
  __device__ void across(double*, const int*, int) {}  // one block: its totals are the block's
};

struct GridScope {
  int64_t lo, hi;
  double* scratch;
  double* out;       // shared: the combined values, kGridSlots
  double* partials;  // global: two buffers of kGridSlots x gridDim.x, used in turn
  int parity = 0;
  __device__ bool leader() const { return blockIdx.x == 0; }

  // The blocks' values v[i] (each already reduced in its block) written out, the grid
  // synchronised, then warp 0 of every block combines them in block order; every thread gets
  // the totals in v. Alternating buffers: a block rewrites one only after the next barrier,
  // which every block passes only once it has read it.
  template <class Combine>
  __device__ void exchange(double* v, int n, Combine combine) {
    double* buf = partials + parity * kGridSlots * gridDim.x;
    parity ^= 1;
    if (threadIdx.x == 0)
      for (int i = 0; i < n; ++i) buf[i * gridDim.x + blockIdx.x] = v[i];
    cooperative_groups::this_grid().sync();
    if (threadIdx.x < 32)
      for (int i = 0; i < n; ++i) combine(i, buf + i * gridDim.x);
    __syncthreads();
    for (int i = 0; i < n; ++i) v[i] = out[i];
    __syncthreads();
  }

  __device__ void across(double* v, const int* kinds, int n) {
    exchange(v, n, [&](int i, const double* blocks) {
      const int kind = kinds[i];
      double x = kind == kAdd ? 0.0 : kind == kMax ? -kInf : kInf;
      for (unsigned c = threadIdx.x; c < gridDim.x; c += 32) x = apply(kind, x, blocks[c]);
      for (int offset = 16; offset > 0; offset >>= 1)
        x = apply(kind, x, __shfl_down_sync(0xffffffffu, x, offset));
      if (threadIdx.x == 0) out[i] = x;
    });
  }

  // Column v's maximum m[v] and sum s[v] of exp((x - m[v]) / eps), per block, become the grid's:
  // the largest maximum, and the sums rescaled to it, added in block order.
  __device__ void across_columns(double* m, double* s, int32_t V, double eps) {
    double packed[2 * kGridMaxColumns];
    for (int32_t v = 0; v < V; ++v) packed[v] = m[v], packed[V + v] = s[v];
    exchange(packed, 2 * V, [&](int i, const double* blocks) {
      if (i >= V) return;  // the sums are combined with their maxima below
      const double* sums = blocks + static_cast<int64_t>(V) * gridDim.x;
      double bm = -kInf, bs = 0;
      for (unsigned c = threadIdx.x; c < gridDim.x; c += 32) merge(bm, bs, blocks[c], sums[c], eps);
      for (int offset = 16; offset > 0; offset >>= 1) {
        const double om = __shfl_down_sync(0xffffffffu, bm, offset);
        const double os = __shfl_down_sync(0xffffffffu, bs, offset);
        merge(bm, bs, om, os, eps);
      }
      if (threadIdx.x == 0) out[i] = bm, out[V + i] = bs;
    });
    for (int32_t v = 0; v < V; ++v) m[v] = packed[v], s[v] = packed[V + v];
  }

  // (m, s) <- (m, s) + (om, os) as sums of exponentials scaled by their maxima.
  __device__ static void merge(double& m, double& s, double om, double os, double eps) {
    if (os == 0) return;
    if (s == 0) {
      m = om, s = os;
      return;
    }
    const double top = fmax(m, om);
    s = s * exp((m - top) / eps) + os * exp((om - top) / eps);
    m = top;
  }
};

// f_i <- -eps log sum_v exp((g_v - C_iv) / eps) / V (transport.cpp, update_row_duals), for the
// rows [lo, hi) strided over the thread block; C and f indexed by the transport block's row.
__device__ void update_rows(const double* C, int64_t lo, int64_t hi, int32_t V, const double* g,
                            double eps, double* f) {
  const double log_cols = log(static_cast<double>(V));
  for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
    const double* c = C + r * V;
    double m = -kInf;
    for (int32_t v = 0; v < V; ++v) m = fmax(m, g[v] - c[v]);
    double s = 0;
    for (int32_t v = 0; v < V; ++v) s += exp((g[v] - c[v] - m) / eps);
    f[r] = -(m + eps * (log(s) - log_cols));
  }
}

// Transport block b of p, solved in scope sc; g and next_g are shared [V] column duals.
template <class Scope>
__device__ void solve_block(const TransportProblem& p, int64_t b, Scope& sc, double* g,
                            double* next_g) {
  const int32_t V = p.vertices, K = p.probes, d = p.d;
  double* scratch = sc.scratch;
  const int64_t first = p.block_first[b], rows = p.block_count[b];
  const int64_t lo = sc.lo, hi = sc.hi;
  double* C = p.cost + first * V;
  double* W = p.weights + first * V;

  // The cost matrix, mean over probes, and the block's finite statistics (step_engine.cpp).
  double stats[4] = {0, kInf, -kInf, 0};  // sum, best, worst, finite
  for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
    const double* loss = p.losses + (first + r) * V * K;
    for (int32_t v = 0; v < V; ++v) {
      double s = 0;
      for (int32_t k = 0; k < K; ++k) s += loss[v * K + k];
      const double c = s / K;
      C[r * V + v] = c;
      if (isfinite(c)) {
        stats[0] += c;
        stats[1] = fmin(stats[1], c);
        stats[2] = fmax(stats[2], c);
        stats[3] += 1;
      }
    }
  }
  const int kStatKinds[4] = {kAdd, kMin, kMax, kAdd};
  for (int i = 0; i < 4; ++i) stats[i] = block_reduce(stats[i], kStatKinds[i], scratch);
  sc.across(stats, kStatKinds, 4);
  const double sum = stats[0], best = stats[1], worst = stats[2], finite = stats[3];
  const bool informed = finite > 0;
  const double eps = p.temperature;
  int32_t iterations = 0;
  bool converged = true;

  if (informed) {
    // copy_penalised (step_engine.cpp), then scale_cost (transport.cpp) over the block's matrix.
    const double penalty = worst + p.nonfinite_margin * (1 + fabs(worst));
    double range[4] = {0, 0, kInf, -kInf};  // abs sum, abs max, lo, hi
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
      for (int32_t v = 0; v < V; ++v) {
        double c = C[r * V + v];
        if (!isfinite(c)) C[r * V + v] = c = penalty;
        range[0] += fabs(c);
        range[1] = fmax(range[1], fabs(c));
        range[2] = fmin(range[2], c);
        range[3] = fmax(range[3], c);
      }
    const int kRangeKinds[4] = {kAdd, kMax, kMin, kMax};
    for (int i = 0; i < 4; ++i) range[i] = block_reduce(range[i], kRangeKinds[i], scratch);
    sc.across(range, kRangeKinds, 4);
    double shift = 0, divisor = 0;
    if (p.cost_scaling == PP_COST_MEAN) divisor = range[0] / static_cast<double>(rows * V);
    if (p.cost_scaling == PP_COST_MAX) divisor = range[1];
    if (p.cost_scaling == PP_COST_MIN_MAX) {
      shift = range[2];
      divisor = range[3] - range[2];
    }
    if (shift != 0 || divisor > 0)
      for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
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
        update_rows(C, lo, hi, V, g, eps, f);
      } else {
        for (int32_t v = threadIdx.x; v < V; v += blockDim.x) g[v] = p.duals_g[b * V + v];
      }
      __syncthreads();
      converged = false;
      const double log_rows = log(static_cast<double>(rows));
      double col_max[kGridMaxColumns], col_sum[kGridMaxColumns];
      for (int32_t it = 0; it < p.sinkhorn_max_iterations; ++it) {
        // Each column's maximum and its sum of exponentials below it, over this scope's rows,
        // then over the grid's (a no-op in one block).
        for (int32_t v = 0; v < V; ++v) {
          double m = -kInf;
          for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
            m = fmax(m, f[r] - C[r * V + v]);
          m = block_reduce(m, kMax, scratch);
          double s = 0;
          for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
            s += exp((f[r] - C[r * V + v] - m) / eps);
          s = block_reduce(s, kAdd, scratch);
          if (v < kGridMaxColumns) col_max[v] = m, col_sum[v] = s;
          if (threadIdx.x == 0) next_g[v] = -(m + eps * (log(s) - log_rows));
        }
        if constexpr (!std::is_same_v<Scope, BlockScope>) {
          sc.across_columns(col_max, col_sum, V, eps);
          if (threadIdx.x == 0)
            for (int32_t v = 0; v < V; ++v)
              next_g[v] = -(col_max[v] + eps * (log(col_sum[v]) - log_rows));
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
        update_rows(C, lo, hi, V, g, eps, f);
        __syncthreads();
        iterations = it + 1;
      }
      for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
        double m = -kInf;
        for (int32_t v = 0; v < V; ++v) m = fmax(m, g[v] - C[r * V + v]);
        double s = 0;
        for (int32_t v = 0; v < V; ++v) s += W[r * V + v] = exp((g[v] - C[r * V + v] - m) / eps);
        for (int32_t v = 0; v < V; ++v) W[r * V + v] /= s;
      }
      if (sc.leader())
        for (int32_t v = threadIdx.x; v < V; v += blockDim.x) p.duals_g[b * V + v] = g[v];
    } else if (p.solver == PP_SOLVER_TOP_K) {
      // solve_top_k: equal weight on the k cheapest, ties to the earlier vertex.
      for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
        const double* c = C + r * V;
        for (int32_t v = 0; v < V; ++v) {
          int32_t rank = 0;
          for (int32_t u = 0; u < V; ++u) rank += (c[u] < c[v] || (c[u] == c[v] && u < v)) ? 1 : 0;
          W[r * V + v] = rank < p.top_k ? 1.0 / p.top_k : 0.0;
        }
      }
    } else {
      // solve_softmax (and a lone Sinkhorn row).
      for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
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
    for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
      for (int32_t v = 0; v < V; ++v) W[r * V + v] = 1.0 / V;
  }

  // The barycentric move step_r R_i (T^T w_i) = step_r sum_v w_iv (R_i t_v), then the
  // quadratic model's fit (radius_model.cpp, fit_particle_quadratic) along the same move.
  const bool quadratic = p.incumbents != nullptr;
  double fit[2] = {0, 0};  // slope and curvature sums
  for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x) {
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
      fit[0] += slope;
      fit[1] += curvature * norm2;
    }
  }
  if (quadratic) {
    const int kFitKinds[2] = {kAdd, kAdd};
    for (int i = 0; i < 2; ++i) fit[i] = block_reduce(fit[i], kAdd, scratch);
    sc.across(fit, kFitKinds, 2);
  }
  if (sc.leader() && threadIdx.x == 0) {
    pp_transport_block out{};
    out.cost_sum = sum;
    out.finite = static_cast<int64_t>(finite);
    out.best_cost = best;
    out.iterations = iterations;
    out.converged = converged ? 1 : 0;
    out.slope = fit[0];
    out.curvature = fit[1];
    p.blocks[b] = out;
  }
}

// One thread block per transport block; the blocks that the grid solves are skipped.
__global__ void __launch_bounds__(kTransportThreads) transport_kernel(TransportProblem p) {
  extern __shared__ double shared[];
  const int64_t b = blockIdx.x;
  if (p.block_count[b] >= p.grid_rows) return;
  BlockScope sc{0, p.block_count[b], shared};
  double* g = shared + kWarps + 1;
  solve_block(p, b, sc, g, g + p.vertices);
}

// Transport block b solved by the whole grid (a cooperative launch), each thread block a
// contiguous slice of its rows: the many particles of one block (a monolithic full-space step)
// would leave all but one multiprocessor idle in transport_kernel.
__global__ void __launch_bounds__(kTransportThreads)
    grid_transport_kernel(TransportProblem p, int64_t b) {
  extern __shared__ double shared[];
  const int64_t rows = p.block_count[b];
  const int64_t per = (rows + gridDim.x - 1) / gridDim.x;
  const int64_t lo = min(rows, per * blockIdx.x), hi = min(rows, lo + per);
  double* g = shared + kWarps + 1;
  GridScope sc{lo, hi, shared, g + 2 * p.vertices, p.grid_partials};
  solve_block(p, b, sc, g, g + p.vertices);
}

// How many thread blocks of grid_transport_kernel one cooperative launch runs on the current
// device: kGridBlocks where they fit at once, else 0 (then every block runs in transport_kernel).
int grid_blocks() {
  const DeviceProperties& device = device_properties();
  if (!device.cooperative_launch) return 0;
  int per_multiprocessor = 0;
  const std::size_t shared = sizeof(double) * (kWarps + 1 + 2 * kGridMaxColumns + kGridSlots);
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, grid_transport_kernel,
                                                      kTransportThreads, shared),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return device.multiprocessors * per_multiprocessor >= kGridBlocks ? kGridBlocks : 0;
}

}  // namespace

std::size_t transport_grid_scratch() { return std::size_t{2} * kGridSlots * kGridBlocks; }

void launch_directions(const double* rotations, const double* polytope, int64_t particles,
                       int32_t vertices, int32_t d, double* directions, cudaStream_t stream) {
  const int64_t n = particles * vertices;
  if (n == 0) return;
  directions_kernel<<<launch::blocks(n, 256), 256, 0, stream>>>(rotations, polytope, particles,
                                                                vertices, d, directions);
  launch::check_last("directions kernel");
}

void launch_plane_rotations(uint64_t seed, uint64_t step, int64_t particles, double* rotations,
                            cudaStream_t stream) {
  if (particles == 0) return;
  plane_rotations_kernel<<<launch::blocks(particles, 256), 256, 0, stream>>>(seed, step, particles,
                                                                             rotations);
  launch::check_last("plane rotations kernel");
}

void launch_transport(const TransportProblem& problem, cudaStream_t stream) {
  if (problem.d > kTransportMaxDim)
    throw std::invalid_argument("transport: particles of dimension " + std::to_string(problem.d) +
                                " exceed the device kernel's " + std::to_string(kTransportMaxDim));
  if (problem.n_blocks == 0) return;
  TransportProblem p = problem;
  const int grid =
      p.grid_partials != nullptr && p.host_block_count != nullptr && p.vertices <= kGridMaxColumns
          ? grid_blocks()
          : 0;
  p.grid_rows = grid > 0 ? kGridRows : std::numeric_limits<int64_t>::max();
  const std::size_t shared =
      sizeof(double) * (kWarps + 1 + 2 * static_cast<std::size_t>(p.vertices) + kGridSlots);
  transport_kernel<<<static_cast<unsigned>(p.n_blocks), kTransportThreads, shared, stream>>>(p);
  launch::check_last("transport kernel");
  for (int64_t b = 0; b < p.n_blocks; ++b) {
    if (p.host_block_count == nullptr || p.host_block_count[b] < p.grid_rows) continue;
    void* args[] = {&p, &b};
    check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(grid_transport_kernel),
                                      dim3(static_cast<unsigned>(grid)), dim3(kTransportThreads),
                                      args, shared, stream),
          "grid transport kernel");
  }
}

}  // namespace polyprobe::cuda
