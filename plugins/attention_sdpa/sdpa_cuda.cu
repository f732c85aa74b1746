// Fused attention on the GPU. One thread block per (problem, tile of query rows), one thread
// per query row: the block stages tiles of keys and values in shared memory, and every
// thread scores its row against the tile and updates its online softmax (running maximum,
// running sum, unnormalised output in registers), so no [q_len, kv_len] matrix exists.
// Argmax keeps the first largest score in key order, as the CPU operation does.
#include "sdpa_cpu.hpp"
#include "sdpa_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace polyprobe::attention_sdpa {
namespace {

constexpr int kMaxDim = static_cast<int>(kCudaMaxDim);
constexpr int kRowsPerBlock = 64;
constexpr size_t kSharedBytes = 48 * 1024;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("sdpa (cuda): ") + what + ": " +
                             cudaGetErrorString(status));
}

struct Geometry {
  long long b1, heads, q_len, kv_len, head_dim, v_dim;
  long long qs[4], ks[4], vs[4], os[4];
  int argmax, causal, tile;
};

template <class S>
__global__ void sdpa_kernel(Geometry g, S scale, const S* __restrict__ q, const S* __restrict__ k,
                            const S* __restrict__ v, S* __restrict__ out) {
  extern __shared__ unsigned char shared_raw[];
  S* ktile = reinterpret_cast<S*>(shared_raw);
  S* vtile = ktile + g.tile * g.head_dim;
  const long long p = blockIdx.y;
  const long long h = p % g.heads, b1 = (p / g.heads) % g.b1, b0 = p / (g.heads * g.b1);
  const long long i = static_cast<long long>(blockIdx.x) * kRowsPerBlock + threadIdx.x;
  const S* qp = q + b0 * g.qs[0] + b1 * g.qs[1] + h * g.qs[2];
  const S* kp = k + b0 * g.ks[0] + b1 * g.ks[1] + h * g.ks[2];
  const S* vp = v + b0 * g.vs[0] + b1 * g.vs[1] + h * g.vs[2];
  S* op = out + b0 * g.os[0] + b1 * g.os[1] + h * g.os[2];
  const bool active = i < g.q_len;
  S qr[kMaxDim], acc[kMaxDim];
  for (int d = 0; d < g.head_dim; ++d) qr[d] = active ? qp[i * g.qs[3] + d] * scale : S(0);
  for (int c = 0; c < g.v_dim; ++c) acc[c] = S(0);
  S m = -INFINITY, l = S(0), best_score = S(0);
  long long best = -1;
  const long long block_last = min(g.q_len, static_cast<long long>(blockIdx.x + 1) * kRowsPerBlock);
  const long long end = g.causal ? min(g.kv_len, block_last) : g.kv_len;
  const long long visible = !active ? 0 : g.causal ? min(g.kv_len, i + 1) : g.kv_len;
  for (long long j0 = 0; j0 < end; j0 += g.tile) {
    const int tl = static_cast<int>(min(static_cast<long long>(g.tile), end - j0));
    __syncthreads();
    for (int e = threadIdx.x; e < tl * g.head_dim; e += blockDim.x)
      ktile[e] = kp[(j0 + e / g.head_dim) * g.ks[3] + e % g.head_dim];
    for (int e = threadIdx.x; e < tl * g.v_dim; e += blockDim.x)
      vtile[e] = vp[(j0 + e / g.v_dim) * g.vs[3] + e % g.v_dim];
    __syncthreads();
    const int n = static_cast<int>(max(0LL, min(static_cast<long long>(tl), visible - j0)));
    for (int j = 0; j < n; ++j) {
      S s = S(0);
      for (int d = 0; d < g.head_dim; ++d) s += qr[d] * ktile[j * g.head_dim + d];
      if (g.argmax) {
        if (best < 0 || s > best_score) best_score = s, best = j0 + j;
        continue;
      }
      const S top = max(m, s);
      const S rescale = exp(m - top);
      const S w = exp(s - top);
      l = l * rescale + w;
      for (int c = 0; c < g.v_dim; ++c) acc[c] = acc[c] * rescale + w * vtile[j * g.v_dim + c];
      m = top;
    }
  }
  if (!active) return;
  S* o = op + i * g.os[3];
  if (g.argmax) {
    for (int c = 0; c < g.v_dim; ++c) o[c] = vp[best * g.vs[3] + c];
  } else {
    const S inv = S(1) / l;
    for (int c = 0; c < g.v_dim; ++c) o[c] = acc[c] * inv;
  }
}

template <class S>
void launch(const pp_sdpa_args& a) {
  Geometry g{};
  g.b1 = a.b1, g.heads = a.heads, g.q_len = a.q_len, g.kv_len = a.kv_len;
  g.head_dim = a.head_dim, g.v_dim = a.v_dim, g.argmax = a.weighting == PP_SDPA_ARGMAX;
  g.causal = a.causal != 0;
  for (int d = 0; d < 4; ++d)
    g.qs[d] = a.q_strides[d], g.ks[d] = a.k_strides[d], g.vs[d] = a.v_strides[d],
    g.os[d] = a.out_strides[d];
  const size_t per_key = static_cast<size_t>(a.head_dim + a.v_dim) * sizeof(S);
  g.tile = static_cast<int>(std::clamp<size_t>(kSharedBytes / per_key, 1, 64));
  const long long problems = a.b0 * a.b1 * a.heads;
  if (problems > 65535) throw std::invalid_argument("sdpa (cuda): more than 65535 problems");
  const dim3 grid(static_cast<unsigned>((a.q_len + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(problems));
  sdpa_kernel<S><<<grid, kRowsPerBlock, static_cast<size_t>(g.tile) * per_key,
                   static_cast<cudaStream_t>(a.stream)>>>(
      g, static_cast<S>(a.scale), static_cast<const S*>(a.q), static_cast<const S*>(a.k),
      static_cast<const S*>(a.v), static_cast<S*>(a.out));
  check(cudaGetLastError(), "kernel launch");
}

}  // namespace

void run_cuda(const pp_sdpa_args& args) {
  if (std::string why = check_args(args, PP_DEVICE_TYPE_GPU); !why.empty())
    throw std::invalid_argument(why);
  if (args.head_dim > kMaxDim || args.v_dim > kMaxDim)
    throw std::invalid_argument("sdpa (cuda): head_dim and v_dim up to " + std::to_string(kMaxDim) +
                                " are served");
  if (args.dtype == PP_DTYPE_F32)
    launch<float>(args);
  else
    launch<double>(args);
}

}  // namespace polyprobe::attention_sdpa
