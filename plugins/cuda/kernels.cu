// Device kernels of the CUDA session. One thread owns each output value it writes, and
// every sum runs in a fixed order, so results do not depend on scheduling: candidates are
// compared by tiny loss differences.
#include "accumulate.cuh"
#include "candidate_source.cuh"
#include "common.cuh"
#include "device.hpp"
#include "formulas.cuh"
#include "kernels.cuh"

namespace polyprobe::cuda {
namespace {

using launch::thread_index;
using launch::thread_stride;

template <class S>
__global__ void effective_kernel(const double* theta, const int32_t* owner, const OpTransform* ops,
                                 int64_t n, S* eff) {
  for (int64_t p = thread_index(); p < n; p += thread_stride()) {
    const int32_t o = owner[p];
    if (o < 0) continue;
    const OpTransform t = ops[o];
    const int32_t q = p - t.offset < t.weights ? t.weight_transform : t.bias_transform;
    eff[p] = effective<S>(q, theta[p], t.quant_step);
  }
}

// The new raw value of parameter `raw` in candidate c: the incumbent plus, in coordinate
// order, each coordinate's share, with the arithmetic of the host (full space: +=
// displacement; subspace: kernels::apply_subspace_move).
__device__ double candidate_value(const CandidateSource& s, const ParticleTable& t, int64_t c,
                                  int64_t particle, int64_t raw, double value) {
  for (int32_t j = 0; j < t.d; ++j) {
    const int64_t k = t.coords[particle * t.d + j];
    if (k < 0) continue;
    if (t.subspace == nullptr) {
      if (k == raw) value += delta_of(s, c, j);
      continue;
    }
    const DeviceCoord q = t.subspace[k];
    const int64_t local = raw - q.offset;
    if (local < 0 || local >= q.rows * q.cols) continue;
    const int64_t r = local / q.cols, col = local % q.cols;
    const double ur = q.row >= 0 ? (r == q.row ? 1.0 : 0.0) : t.basis[q.u + r];
    if (ur == 0.0) continue;
    const double theta = delta_of(s, c, j);
    if (q.col >= 0) {
      if (col == q.col) value += theta * ur;
    } else {
      value += theta * ur * t.basis[q.v + col];
    }
  }
  return value;
}

template <class S>
__global__ void deltas_kernel(CandidateSource src, ParticleTable t, int64_t count,
                              const double* theta, const OpTransform* ops, const S* eff, S* dq,
                              S* q_new, double* l2_terms) {
  const int64_t total = count * t.elem_max;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t c = i / t.elem_max, e = i % t.elem_max;
    const int64_t p = particle_of(src, c);
    const int64_t begin = t.elem_begin[p];
    if (e >= t.elem_begin[p + 1] - begin) continue;
    const int64_t raw = t.elem_raw[begin + e];
    const double old = theta[raw];
    const double now = candidate_value(src, t, c, p, raw, old);
    const OpTransform o = ops[t.elem_op[begin + e]];
    const int32_t q = raw - o.offset < o.weights ? o.weight_transform : o.bias_transform;
    const S changed = effective<S>(q, now, o.quant_step);
    dq[i] = changed - eff[raw];
    if (q_new != nullptr) q_new[i] = changed;
    l2_terms[i] = now * now - old * old;
  }
}

// One warp per candidate, as the objective: a dense subspace direction moves thousands of
// parameters, which one thread would sum alone while the rest of the GPU waits.
__global__ void l2_kernel(CandidateSource src, ParticleTable t, int64_t count,
                          const double* l2_terms, double* l2) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t c = thread_index() / 32; c < count; c += warps) {
    const int64_t p = particle_of(src, c);
    const int64_t n = t.elem_begin[p + 1] - t.elem_begin[p];
    const double sum = owner_warp_sum(l2_terms + c * t.elem_max, n, lane);
    if (lane == 0) l2[c] = sum;
  }
}

template <class S>
__global__ void broadcast_kernel(const S* zinc, int64_t per, int64_t total, S* z) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) z[i] = zinc[i % per];
}

// w[c, e] = q_new[c, e] at each parameter e of op `op` the candidate changes (w[c] already
// holds the incumbent's effective block): the candidate's own Q(theta + delta), set, not
// added, so the materialised weights equal what the reference computes from theta + delta.
template <class S>
__global__ void materialise_kernel(CandidateSource src, ParticleTable t, int64_t count, int32_t op,
                                   int64_t offset, const S* q_new, S* w, int64_t block) {
  const int64_t total = count * t.elem_max;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t c = i / t.elem_max, e = i % t.elem_max;
    const int64_t p = particle_of(src, c);
    const int64_t begin = t.elem_begin[p];
    if (e >= t.elem_begin[p + 1] - begin || t.elem_op[begin + e] != op) continue;
    w[c * block + (t.elem_raw[begin + e] - offset)] = q_new[i];
  }
}

// y[c, b, :] += w[c, bias_at : bias_at + width]: each candidate's own bias.
template <class S>
__global__ void batched_bias_kernel(S* y, const S* w, int64_t block, int64_t bias_at, int64_t rows,
                                    int64_t width, int64_t total) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t c = i / (rows * width);
    y[i] += w[c * block + bias_at + i % width];
  }
}

// One thread per (candidate, sample) row: it alone writes z[c, b, :], in element order.
template <class S>
__global__ void correct_kernel(CandidateSource src, ParticleTable t, int64_t count, int32_t op,
                               const S* dq, const S* x, int64_t x_stride, int64_t in, S* z,
                               int64_t out, int64_t rows) {
  const int64_t total = count * rows;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t c = i / rows, b = i % rows;
    const int64_t p = particle_of(src, c);
    const int64_t begin = t.elem_begin[p], n = t.elem_begin[p + 1] - begin;
    const S* xr = x + c * x_stride + b * in;
    S* zr = z + i * out;
    for (int64_t e = 0; e < n; ++e) {
      if (t.elem_op[begin + e] != op) continue;
      const int32_t col = t.elem_col[begin + e];
      const S change = dq[c * t.elem_max + e];
      zr[t.elem_row[begin + e]] += col < 0 ? change : change * xr[col];
    }
  }
}

// The order of a particle's elements (session.cu keeps them sorted by raw parameter): by
// op, then an op's weights row-major, then its biases by row.
__device__ inline bool element_before(const ParticleTable& t, int64_t e, int32_t op, int32_t bias,
                                      int32_t row) {
  const int32_t eo = t.elem_op[e];
  if (eo != op) return eo < op;
  const int32_t eb = t.elem_col[e] < 0 ? 1 : 0;
  if (eb != bias) return eb < bias;
  return t.elem_row[e] < row;
}

// The first element of [lo, hi) not before (op, bias, row).
__device__ inline int64_t first_element(const ParticleTable& t, int64_t lo, int64_t hi, int32_t op,
                                        int32_t bias, int32_t row) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (element_before(t, mid, op, bias, row))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// correct_kernel for particles of many elements (a dense subspace direction moves a whole
// row or column): one thread per (candidate, sample, output) finds that output's elements
// by bisection and adds them in element order, so each z[c, b, o] gets the same additions in
// the same order as there, with all of the GPU at work.
template <class S>
__global__ void correct_rows_kernel(CandidateSource src, ParticleTable t, int64_t count, int32_t op,
                                    const S* dq, const S* x, int64_t x_stride, int64_t in, S* z,
                                    int64_t out, int64_t rows) {
  const int64_t total = count * rows * out;
  for (int64_t i = thread_index(); i < total; i += thread_stride()) {
    const int64_t o = i % out, row = i / out;
    const int64_t c = row / rows, b = row % rows;
    const int64_t p = particle_of(src, c);
    const int64_t begin = t.elem_begin[p], end = t.elem_begin[p + 1];
    const S* xr = x + c * x_stride + b * in;
    const auto unit = static_cast<int32_t>(o);
    S zo = z[i];
    for (int32_t bias = 0; bias < 2; ++bias)
      for (int64_t e = first_element(t, begin, end, op, bias, unit);
           e < end && t.elem_op[e] == op && (t.elem_col[e] < 0) == (bias == 1) &&
           t.elem_row[e] == unit;
           ++e) {
        const S change = dq[c * t.elem_max + (e - begin)];
        zo += bias == 1 ? change : change * xr[t.elem_col[e]];
      }
    z[i] = zo;
  }
}

template <class S>
__global__ void bias_kernel(S* y, const S* bias, int64_t width, int64_t total) {
  for (int64_t i = thread_index(); i < total; i += thread_stride()) y[i] += bias[i % width];
}

template <class S>
__global__ void activation_kernel(const S* x, S* y, int64_t n, int32_t fn, S step) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = activate<S>(fn, x[i], step);
}

template <class S>
__global__ void sample_loss_kernel(const S* out, int64_t rows, int64_t width, int64_t batch,
                                   int32_t loss, const int64_t* labels, const double* targets,
                                   S* per) {
  for (int64_t r = thread_index(); r < rows; r += thread_stride()) {
    const int64_t b = r % batch;
    per[r] = loss_row<S>(loss, out + r * width, width, labels ? labels[b] : 0,
                         targets ? targets + b * width : nullptr);
  }
}

// One warp per candidate: lane-strided partial sums, then a fixed shuffle tree.
template <class S>
__global__ void objective_kernel(CandidateSource src, int64_t count, const S* per, int64_t batch,
                                 double l2, double sum_sq, const double* l2_delta, double* losses) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t c = thread_index() / 32; c < count; c += warps) {
    // The candidate's samples are one contiguous segment: its owner warp sums them.
    const double sum = owner_warp_sum(per + c * batch, batch, lane);
    if (lane == 0) {
      double value = sum / static_cast<double>(batch);
      if (l2 != 0.0) value += l2 * (sum_sq + (l2_delta ? l2_delta[c] : 0.0));
      losses[target_of(src, c)] = value;
    }
  }
}

__global__ void move_kernel(const int64_t* coords, const double* moves, int64_t n, double* theta) {
  for (int64_t c = thread_index(); c < n; c += thread_stride())
    if (coords[c] >= 0) theta[coords[c]] += moves[c];
}

}  // namespace

template <class S>
void launch_effective(const double* theta, const int32_t* owner, const OpTransform* ops, int64_t n,
                      S* eff, cudaStream_t stream) {
  effective_kernel<S><<<launch::blocks(n), kThreads, 0, stream>>>(theta, owner, ops, n, eff);
  launch::check_last("effective weights kernel");
}

template <class S>
void launch_deltas(CandidateSource src, ParticleTable table, int64_t count, const double* theta,
                   const OpTransform* ops, const S* eff, S* dq, S* q_new, double* l2_terms,
                   double* l2, cudaStream_t stream) {
  deltas_kernel<S><<<launch::blocks(count * table.elem_max), kThreads, 0, stream>>>(
      src, table, count, theta, ops, eff, dq, q_new, l2_terms);
  launch::check_last("candidate deltas kernel");
  l2_kernel<<<launch::blocks(count * 32), kThreads, 0, stream>>>(src, table, count, l2_terms, l2);
  launch::check_last("l2 kernel");
}

template <class S>
void launch_materialise(CandidateSource src, ParticleTable table, int64_t count, int32_t op,
                        const S* block_eff, int64_t offset, int64_t block, const S* q_new, S* w,
                        cudaStream_t stream) {
  launch_broadcast<S>(block_eff, 1, block, count, w, stream);
  materialise_kernel<S><<<launch::blocks(count * table.elem_max), kThreads, 0, stream>>>(
      src, table, count, op, offset, q_new, w, block);
  launch::check_last("materialise kernel");
}

template <class S>
void launch_batched_bias(S* y, const S* w, int64_t block, int64_t bias_at, int64_t rows,
                         int64_t width, int64_t count, cudaStream_t stream) {
  const int64_t total = count * rows * width;
  batched_bias_kernel<S>
      <<<launch::blocks(total), kThreads, 0, stream>>>(y, w, block, bias_at, rows, width, total);
  launch::check_last("batched bias kernel");
}

template <class S>
void launch_broadcast(const S* zinc, int64_t rows, int64_t width, int64_t count, S* z,
                      cudaStream_t stream) {
  const int64_t total = rows * width * count;
  broadcast_kernel<S><<<launch::blocks(total), kThreads, 0, stream>>>(zinc, rows * width, total, z);
  launch::check_last("broadcast kernel");
}

constexpr int64_t kRowsPerElementLoop = 32;

template <class S>
void launch_correct(CandidateSource src, ParticleTable table, int64_t count, int32_t op,
                    const S* dq, const S* x, int64_t x_stride, int64_t in, S* z, int64_t out,
                    int64_t rows, cudaStream_t stream) {
  // A thread per row loops over a particle's elements; past a few dozen of them, a thread
  // per output (same sums, same order) keeps the GPU busy instead.
  if (table.elem_max > kRowsPerElementLoop)
    correct_rows_kernel<S><<<launch::blocks(count * rows * out), kThreads, 0, stream>>>(
        src, table, count, op, dq, x, x_stride, in, z, out, rows);
  else
    correct_kernel<S><<<launch::blocks(count * rows), kThreads, 0, stream>>>(
        src, table, count, op, dq, x, x_stride, in, z, out, rows);
  launch::check_last("delta correction kernel");
}

template <class S>
void launch_add_bias(S* y, const S* bias, int64_t rows, int64_t width, cudaStream_t stream) {
  bias_kernel<S>
      <<<launch::blocks(rows * width), kThreads, 0, stream>>>(y, bias, width, rows * width);
  launch::check_last("bias kernel");
}

template <class S>
void launch_activation(const S* x, S* y, int64_t n, int32_t fn, double step, cudaStream_t stream) {
  // The core's layer casts its step to S before use (kernels::staircase(v, S(step))).
  activation_kernel<S>
      <<<launch::blocks(n), kThreads, 0, stream>>>(x, y, n, fn, static_cast<S>(step));
  launch::check_last("activation kernel");
}

template <class S>
void launch_sample_losses(const S* out, int64_t rows, int64_t width, int64_t batch, int32_t loss,
                          const int64_t* labels, const double* targets, S* per,
                          cudaStream_t stream) {
  sample_loss_kernel<S><<<launch::blocks(rows), kThreads, 0, stream>>>(out, rows, width, batch,
                                                                       loss, labels, targets, per);
  launch::check_last("per-sample loss kernel");
}

template <class S>
void launch_objective(CandidateSource src, int64_t count, const S* per, int64_t batch, double l2,
                      double sum_sq, const double* l2_delta, double* losses, cudaStream_t stream) {
  objective_kernel<S><<<launch::blocks(count * 32), kThreads, 0, stream>>>(
      src, count, per, batch, l2, sum_sq, l2_delta, losses);
  launch::check_last("objective kernel");
}

void launch_move(const int64_t* coords, const double* moves, int64_t n, double* theta,
                 cudaStream_t stream) {
  move_kernel<<<launch::blocks(n), kThreads, 0, stream>>>(coords, moves, n, theta);
  launch::check_last("move kernel");
}

#define POLYPROBE_CUDA_INSTANTIATE(S)                                                              \
  template void launch_effective<S>(const double*, const int32_t*, const OpTransform*, int64_t,    \
                                    S*, cudaStream_t);                                             \
  template void launch_deltas<S>(CandidateSource, ParticleTable, int64_t, const double*,           \
                                 const OpTransform*, const S*, S*, S*, double*, double*,           \
                                 cudaStream_t);                                                    \
  template void launch_materialise<S>(CandidateSource, ParticleTable, int64_t, int32_t, const S*,  \
                                      int64_t, int64_t, const S*, S*, cudaStream_t);               \
  template void launch_batched_bias<S>(S*, const S*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                                       cudaStream_t);                                              \
  template void launch_broadcast<S>(const S*, int64_t, int64_t, int64_t, S*, cudaStream_t);        \
  template void launch_correct<S>(CandidateSource, ParticleTable, int64_t, int32_t, const S*,      \
                                  const S*, int64_t, int64_t, S*, int64_t, int64_t, cudaStream_t); \
  template void launch_add_bias<S>(S*, const S*, int64_t, int64_t, cudaStream_t);                  \
  template void launch_activation<S>(const S*, S*, int64_t, int32_t, double, cudaStream_t);        \
  template void launch_sample_losses<S>(const S*, int64_t, int64_t, int64_t, int32_t,              \
                                        const int64_t*, const double*, S*, cudaStream_t);          \
  template void launch_objective<S>(CandidateSource, int64_t, const S*, int64_t, double, double,   \
                                    const double*, double*, cudaStream_t);

POLYPROBE_CUDA_INSTANTIATE(float)
POLYPROBE_CUDA_INSTANTIATE(double)
#undef POLYPROBE_CUDA_INSTANTIATE

}  // namespace polyprobe::cuda
