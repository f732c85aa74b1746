// The Cheri block's kernels (cheri_block.hpp): the statistics pass, the fused tensor-core
// kernel and the float32 FMA kernel, with the weight casts.
//
// Tensor-core kernel. A persistent grid, one block per multiprocessor: fc1 [H, C] and fc2
// [C, H] are staged into shared memory once per block, then each team of 8 warps (two teams
// when shared memory holds two tiles' scratch, so that one team's loads overlap the other's
// matrix work) takes 64-row tiles of the examples in turn:
//   conv + normalisation of the tile (float32) -> A [64, C] in shared memory (operand type);
//   A fc1^T on tensor cores, warps 2 x 4, each 32 rows x 64 hidden units per pass, GELU in
//   registers -> G [64, H] in shared memory (operand type);
//   G fc2^T, each warp 32 rows x 32 channels per pass, and y = x + 0.15 MLP straight from
//   the accumulators.
// Shared-memory matrices are row-major with their 16-byte chunks XOR-swizzled by row (k
// multiple of 64), so that ldmatrix reads 8 rows without bank conflicts.
#include "cheri_block.hpp"
#include "common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>

namespace polyprobe::cuda {
namespace {

constexpr int kTileRows = 64;      // rows of one tensor-core tile
constexpr int kTeamThreads = 256;  // 8 warps
constexpr int kFmaRows = 16;       // rows of one float32 tile
constexpr int kMaxTeams = 2;
constexpr int kMaxSplits = 32;  // statistics blocks per example, at most
// The shared memory a block of the tensor-core and float32 kernels may opt in to, as the
// device reports it.
std::size_t shared_limit() { return device_properties().shared_per_block_optin; }
constexpr float kEps = 1e-3f;
constexpr float kResidual = 0.15f;

std::size_t sz(int64_t n) { return static_cast<std::size_t>(n); }

std::size_t weight_bytes(const CheriShape& s) { return sz(4 * s.channels * s.hidden); }
std::size_t team_bytes(const CheriShape& s) { return sz(2 * kTileRows * (s.channels + s.hidden)); }
std::size_t taps_bytes(const CheriShape& s) { return sz(12 * s.channels); }
std::size_t fma_bytes(const CheriShape& s) {
  return sz(4 * kFmaRows * (s.channels + s.hidden)) + taps_bytes(s);
}
// The tensor-core kernel's shared memory with `teams` teams.
std::size_t mma_bytes(const CheriShape& s, int teams) {
  return weight_bytes(s) + sz(teams) * team_bytes(s) + taps_bytes(s);
}

// --- Element types ------------------------------------------------------------------------

__device__ inline void load8(const float* p, float v[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ inline void load8(const __nv_bfloat16* p, float v[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
    v[2 * j] = f.x, v[2 * j + 1] = f.y;
  }
}
__device__ inline void load8(const __half* p, float v[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
    v[2 * j] = f.x, v[2 * j + 1] = f.y;
  }
}

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_float(__half v) { return __half2float(v); }
template <class T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// Two floats as one 32-bit operand register of type T.
template <class T>
__device__ inline uint32_t pack2(float a, float b);
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ inline uint32_t pack2<__half>(float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline void store8(float* p, const float v[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
template <class T>
__device__ inline void store8_packed(T* p, const float v[8]) {
  const uint4 u{pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]),
                pack2<T>(v[6], v[7])};
  *reinterpret_cast<uint4*>(p) = u;
}
__device__ inline void store8(__nv_bfloat16* p, const float v[8]) { store8_packed(p, v); }
__device__ inline void store8(__half* p, const float v[8]) { store8_packed(p, v); }

// The float (r, c) of the [64, width] float32 staging tile (width 64 or 128): 16-byte chunk
// c / 4 of row r sits at chunk (c / 4) ^ (r % 8), so that 8 rows written at one column spread
// over the banks.
__device__ inline int stage_index(int r, int c, int width) {
  return r * width + ((((c >> 2) ^ (r & 7)) << 2) | (c & 3));
}

__device__ inline float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ inline float2 load2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ inline float2 load2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ inline void store2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ inline void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ inline void store2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

// --- Tensor-core primitives -----------------------------------------------------------------

__device__ inline void ldmatrix_x4(uint32_t r[4], const void* smem) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// d += a b for one m16n8k16 tile, float32 accumulators.
template <class T>
__device__ inline void mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
template <>
__device__ inline void mma<__nv_bfloat16>(float d[4], const uint32_t a[4], uint32_t b0,
                                          uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ inline void mma<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The element (r, k) of a row-major [rows, K] matrix in shared memory, K a multiple of 64:
// 16-byte chunk k / 8 of row r sits at chunk (k / 8) ^ (r % 8).
__device__ inline int swizzle(int r, int k, int K) {
  return r * K + ((((k >> 3) ^ (r & 7)) << 3) | (k & 7));
}

// A barrier for the 256 threads of one team (ids 1 and 2; 0 is __syncthreads').
__device__ inline void team_barrier(int team) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(team + 1), "r"(kTeamThreads) : "memory");
}

// GELU, tanh form. The float32 path keeps the core's formula with an exact tanh; the tensor
// -core paths round their result to bf16 / fp16 anyway and use the hardware tanh (about 2^-11
// relative error).
__device__ inline float gelu_exact(float v) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}
__device__ inline float gelu_fast(float v) {
  const float c = 0.7978845608028654f;
  const float u = c * (v + 0.044715f * v * v * v);
  float t;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(t) : "f"(u));
  return 0.5f * v * (1.0f + t);
}

// --- Statistics -------------------------------------------------------------------------------

struct Moments {
  float count, mean, m2;
};

// Chan et al.'s pairwise update.
__device__ inline Moments merge(Moments a, Moments b) {
  const float n = a.count + b.count;
  if (n == 0.0f) return a;
  const float delta = b.mean - a.mean;
  const float w = b.count / n;
  return {n, a.mean + delta * w, a.m2 + b.m2 + delta * delta * a.count * w};
}

// W taps from shared memory (16-byte aligned when W = 8).
template <int W>
__device__ inline void taps_at(const float* p, float w[W]) {
  if constexpr (W == 8) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
    w[0] = p[0];
  }
}

// Copies the [3, C] taps into shared memory (all threads of the block; synchronises).
__device__ inline void stage_taps(const float* taps, int64_t C, float* shared_taps) {
  for (int64_t q = threadIdx.x; q < 3 * C; q += blockDim.x) shared_taps[q] = taps[q];
  __syncthreads();
}

// The conv at row i, channels c .. c + W - 1, of one example x [L, C]; taps in shared memory.
template <int W, class In>
__device__ inline void conv_at(const In* x, const float* taps, int64_t i, int64_t c, int64_t L,
                               int64_t C, int64_t d, float h[W]) {
  float v[W], w[W];
  const auto load = [&](int64_t row) {
    if constexpr (W == 8) {
      load8(x + row * C + c, v);
    } else {
      v[0] = to_float(x[row * C + c]);
    }
  };
  // The neighbours are loaded unconditionally (from row i where they fall outside the
  // sequence, then ignored), so that all three loads are in flight at once.
  const bool before = i - d >= 0, after = i + d < L;
  float vb[W], va[W];
  load(i);
#pragma unroll
  for (int j = 0; j < W; ++j) vb[j] = v[j];
  load(before ? i - d : i);
#pragma unroll
  for (int j = 0; j < W; ++j) va[j] = v[j];
  load(after ? i + d : i);
  taps_at<W>(taps + C + c, w);
#pragma unroll
  for (int j = 0; j < W; ++j) h[j] = w[j] * vb[j];
  taps_at<W>(taps + c, w);
#pragma unroll
  for (int j = 0; j < W; ++j)
    if (before) h[j] += w[j] * va[j];
  taps_at<W>(taps + 2 * C + c, w);
#pragma unroll
  for (int j = 0; j < W; ++j)
    if (after) h[j] += w[j] * v[j];
}

// partials[(e * splits + s) * 4 ..] = count, mean, M2 of the conv over rows [s L / splits,
// (s + 1) L / splits) of example e = blockIdx.y, then norm[e] = (mean, 1 / sqrt(var + eps))
// of the whole plane. W = 8: C is a multiple of 8 (16-byte loads). counters [n] start at 0.
template <int W, class In>
__global__ void __launch_bounds__(256)
    cheri_statistics(const In* x, const float* taps, int64_t L, int64_t C, int64_t d, int splits,
                     float* partials, unsigned* counters, float2* norm) {
  extern __shared__ float shared_taps[];
  stage_taps(taps, C, shared_taps);
  const int64_t e = blockIdx.y;
  const int s = static_cast<int>(blockIdx.x);
  const int64_t r0 = s * L / splits, r1 = (s + 1) * L / splits;
  const In* xe = x + e * L * C;
  // 32-bit index arithmetic: a plane has fewer than 2^31 values (CheriBlockKernel checks).
  const int per_row = static_cast<int>(C) / W;
  const int chunks = static_cast<int>(r1 - r0) * per_row;
  // Per thread: sums of (h - shift) and its square about the thread's first value, which
  // keeps the cancellation of M2 = s2 - s1^2 / n small; the threads' moments are then merged
  // pairwise (Chan et al.).
  float shift = 0.0f, s1 = 0.0f, s2 = 0.0f;
  int count = 0;
#pragma unroll 4
  for (int q = static_cast<int>(threadIdx.x); q < chunks; q += static_cast<int>(blockDim.x)) {
    const int64_t i = r0 + q / per_row, c = q % per_row * W;
    float h[W];
    conv_at<W>(xe, shared_taps, i, c, L, C, d, h);
    if (count == 0) shift = h[0];
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float u = h[j] - shift;
      s1 += u;
      s2 += u * u;
    }
    count += W;
  }
  Moments m{0.0f, 0.0f, 0.0f};
  if (count > 0) {
    const auto n = static_cast<float>(count);
    m = {n, shift + s1 / n, fmaxf(s2 - s1 * s1 / n, 0.0f)};
  }
  for (int off = 16; off > 0; off >>= 1) {
    const Moments o{__shfl_xor_sync(0xffffffffu, m.count, off),
                    __shfl_xor_sync(0xffffffffu, m.mean, off),
                    __shfl_xor_sync(0xffffffffu, m.m2, off)};
    m = merge(m, o);
  }
  __shared__ Moments warps[8];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) warps[warp] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  Moments total = warps[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / 32; ++w) total = merge(total, warps[w]);
  float* out = partials + (e * splits + s) * 4;
  out[0] = total.count, out[1] = total.mean, out[2] = total.m2, out[3] = 0.0f;
  // The last of the example's blocks to finish merges the splits into norm[e] and resets the
  // counter for the next forward (the fence publishes this block's partial first).
  __threadfence();
  if (atomicAdd(&counters[e], 1u) != static_cast<unsigned>(splits - 1)) return;
  __threadfence();
  const float* p = partials + e * splits * 4;
  Moments all{__ldcg(p), __ldcg(p + 1), __ldcg(p + 2)};
  for (int k = 1; k < splits; ++k)
    all = merge(all, {__ldcg(p + 4 * k), __ldcg(p + 4 * k + 1), __ldcg(p + 4 * k + 2)});
  norm[e] = make_float2(all.mean, 1.0f / sqrtf(all.m2 / all.count + kEps));
  counters[e] = 0;
}

// --- The fused tensor-core kernel -------------------------------------------------------------

struct MmaArgs {
  const void* x;
  void* y;
  int64_t n, L, C, H, d;
  const float* taps;
  const uint16_t* w1;  // [H, C], operand type
  const uint16_t* w2;  // [C, H]
  const float2* norm;  // [n]: mean, 1 / sqrt(var + eps)
  int teams;
};

template <class In, class T>
__global__ void __launch_bounds__(kTeamThreads* kMaxTeams, 1) cheri_mma(MmaArgs a) {
  extern __shared__ uint4 shared[];
  const int C = static_cast<int>(a.C), H = static_cast<int>(a.H);
  T* w1s = reinterpret_cast<T*>(shared);
  T* w2s = w1s + H * C;
  const int team = static_cast<int>(threadIdx.x) / kTeamThreads;
  const int t = static_cast<int>(threadIdx.x) % kTeamThreads;
  T* as = w2s + C * H + team * kTileRows * (C + H);  // [64, C]
  T* gs = as + kTileRows * C;                        // [64, H]
  float* taps = reinterpret_cast<float*>(w2s + C * H + a.teams * kTileRows * (C + H));
  const In* x = static_cast<const In*>(a.x);
  In* y = static_cast<In*>(a.y);

  const auto* w1 = reinterpret_cast<const uint4*>(a.w1);
  const auto* w2 = reinterpret_cast<const uint4*>(a.w2);
  for (int q = static_cast<int>(threadIdx.x); q < H * C / 8; q += static_cast<int>(blockDim.x)) {
    const int e = q * 8;
    *reinterpret_cast<uint4*>(&w1s[swizzle(e / C, e % C, C)]) = w1[q];
    *reinterpret_cast<uint4*>(&w2s[swizzle(e / H, e % H, H)]) = w2[q];
  }
  stage_taps(a.taps, a.C, taps);

  const int warp = t / 32, lane = t % 32;
  const int wr = warp & 1, wc = warp >> 1;  // 2 x 4 warps
  const int64_t tiles_per_example = (a.L + kTileRows - 1) / kTileRows;
  const int64_t tiles = a.n * tiles_per_example;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(a.teams) + team; g < tiles;
       g += static_cast<int64_t>(gridDim.x) * a.teams) {
    const int64_t e = g / tiles_per_example;
    const int64_t i0 = (g % tiles_per_example) * kTileRows;
    const In* xe = x + e * a.L * a.C;
    In* ye = y + e * a.L * a.C;

    // Conv and normalisation of rows i0 .. i0 + 63 into A.
    const float2 norm = a.norm[e];
#pragma unroll 4
    for (int q = t; q < kTileRows * C / 8; q += kTeamThreads) {
      const int r = q / (C / 8), c = q % (C / 8) * 8;
      const int64_t i = i0 + r;
      float h[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (i < a.L) {
        conv_at<8>(xe, taps, i, c, a.L, a.C, a.d, h);
#pragma unroll
        for (float& v : h) v = (v - norm.x) * norm.y;
      }
      const uint4 packed{pack2<T>(h[0], h[1]), pack2<T>(h[2], h[3]), pack2<T>(h[4], h[5]),
                         pack2<T>(h[6], h[7])};
      *reinterpret_cast<uint4*>(&as[swizzle(r, c, C)]) = packed;
    }
    team_barrier(team);

    // G = GELU(A fc1^T): this warp's rows wr * 32 .., hidden units n0 .. n0 + 63 per pass.
    for (int n0 = wc * 64; n0 < H; n0 += 256) {
      float acc[2][8][4] = {};
      for (int k0 = 0; k0 < C; k0 += 16) {
        uint32_t af[2][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
          ldmatrix_x4(af[mi],
                      &as[swizzle(wr * 32 + mi * 16 + (lane & 15), k0 + (lane >> 4) * 8, C)]);
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          uint32_t bf[4];
          ldmatrix_x4(bf, &w1s[swizzle(n0 + nj * 16 + (lane >> 4) * 8 + (lane & 7),
                                       k0 + ((lane >> 3) & 1) * 8, C)]);
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            mma<T>(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
            mma<T>(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int row = wr * 32 + mi * 16 + (lane >> 2), col = n0 + nt * 8 + (lane & 3) * 2;
          const float* v = acc[mi][nt];
          *reinterpret_cast<uint32_t*>(&gs[swizzle(row, col, H)]) =
              pack2<T>(gelu_fast(v[0]), gelu_fast(v[1]));
          *reinterpret_cast<uint32_t*>(&gs[swizzle(row + 8, col, H)]) =
              pack2<T>(gelu_fast(v[2]), gelu_fast(v[3]));
        }
    }
    team_barrier(team);

    // y = x + 0.15 G fc2^T, 128 channels per pass: this warp's rows wr * 32 .., channels c0 ..
    // c0 + 31. With bf16 / fp16 inputs and C <= 128 (one pass) the accumulators go through
    // shared memory (float32, over A and G, free once every warp is past G: 64 (C + H) 2 >=
    // 64 C 4 bytes since H >= C), so that x is read and y written in 16-byte pieces. Float32
    // inputs are read and written straight from the accumulators' layout, which measured
    // faster for them (docs/benchmarks.md), and so is C > 128, whose later passes still read G.
    const bool stage = sizeof(In) == 2 && C <= 128;
    float* staged = reinterpret_cast<float*>(as);  // [64, width], 16-byte chunks swizzled
    for (int p0 = 0; p0 < C; p0 += 128) {
      const int width = C - p0 < 128 ? C - p0 : 128;
      const int c0 = p0 + wc * 32;
      const bool active = c0 < C;
      float acc[2][4][4] = {};
      if (active) {
#pragma unroll 2
        for (int k0 = 0; k0 < H; k0 += 16) {
          uint32_t af[2][4];
#pragma unroll
          for (int mi = 0; mi < 2; ++mi)
            ldmatrix_x4(af[mi],
                        &gs[swizzle(wr * 32 + mi * 16 + (lane & 15), k0 + (lane >> 4) * 8, H)]);
#pragma unroll
          for (int nj = 0; nj < 2; ++nj) {
            uint32_t bf[4];
            ldmatrix_x4(bf, &w2s[swizzle(c0 + nj * 16 + (lane >> 4) * 8 + (lane & 7),
                                         k0 + ((lane >> 3) & 1) * 8, H)]);
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
              mma<T>(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
              mma<T>(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
            }
          }
        }
      }
      if (!stage) {
        if (active) {
#pragma unroll
          for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
              for (int half = 0; half < 2; ++half) {
                const int64_t i = i0 + wr * 32 + mi * 16 + (lane >> 2) + half * 8;
                if (i >= a.L) continue;
                const int64_t at = i * a.C + c0 + nt * 8 + (lane & 3) * 2;
                const float2 in = load2(xe + at);
                const float* v = acc[mi][nt] + 2 * half;
                store2(ye + at, in.x + kResidual * v[0], in.y + kResidual * v[1]);
              }
        }
        continue;
      }
      team_barrier(team);  // every warp is done with G (and A) for this pass
      if (active) {
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int row = wr * 32 + mi * 16 + (lane >> 2) + half * 8;
              const int col = wc * 32 + nt * 8 + (lane & 3) * 2;
              const float* v = acc[mi][nt] + 2 * half;
              *reinterpret_cast<float2*>(&staged[stage_index(row, col, width)]) =
                  make_float2(v[0], v[1]);
            }
      }
      team_barrier(team);
      for (int q = t; q < kTileRows * width / 8; q += kTeamThreads) {
        const int r = q / (width / 8), c = q % (width / 8) * 8;
        const int64_t i = i0 + r;
        if (i >= a.L) continue;
        const float4 lo = *reinterpret_cast<const float4*>(&staged[stage_index(r, c, width)]);
        const float4 hi = *reinterpret_cast<const float4*>(&staged[stage_index(r, c + 4, width)]);
        const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const int64_t at = i * a.C + p0 + c;
        float in[8], out[8];
        load8(xe + at, in);
#pragma unroll
        for (int j = 0; j < 8; ++j) out[j] = in[j] + kResidual * v[j];
        store8(ye + at, out);
      }
      team_barrier(team);  // the staging is read before the next pass or tile writes over it
    }
  }
}

// --- The float32 FMA kernel -------------------------------------------------------------------

struct FmaArgs {
  const void* x;
  void* y;
  int64_t L, C, H, d;
  const float* taps;
  const float* w1_t;  // [C, H]
  const float* w2_t;  // [H, C]
  const float2* norm;
};

// Block (tile, example): 16 rows, the conv and normalisation into shared memory, then each
// thread one hidden unit (one channel) for all 16 rows, reading the transposed weights
// coalesced.
template <class In>
__global__ void __launch_bounds__(256) cheri_fma(FmaArgs a) {
  extern __shared__ uint4 shared[];
  const int64_t C = a.C, H = a.H;
  float* as = reinterpret_cast<float*>(shared);  // [16, C]
  float* gs = as + kFmaRows * C;                 // [16, H]
  float* taps = gs + kFmaRows * H;               // [3, C]
  stage_taps(a.taps, C, taps);
  const int64_t e = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kFmaRows;
  const In* xe = static_cast<const In*>(a.x) + e * a.L * C;
  In* ye = static_cast<In*>(a.y) + e * a.L * C;
  const int rows = static_cast<int>(a.L - i0 < kFmaRows ? a.L - i0 : kFmaRows);
  const float2 norm = a.norm[e];
  for (int64_t q = threadIdx.x; q < kFmaRows * C; q += blockDim.x) {
    const int64_t r = q / C, c = q % C;
    float h = 0.0f;
    if (r < rows) {
      conv_at<1>(xe, taps, i0 + r, c, a.L, C, a.d, &h);
      h = (h - norm.x) * norm.y;
    }
    as[q] = h;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < H; j += blockDim.x) {
    float acc[kFmaRows] = {};
    for (int64_t k = 0; k < C; ++k) {
      const float w = a.w1_t[k * H + j];
#pragma unroll
      for (int r = 0; r < kFmaRows; ++r) acc[r] += as[r * C + k] * w;
    }
#pragma unroll
    for (int r = 0; r < kFmaRows; ++r) gs[r * H + j] = gelu_exact(acc[r]);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc[kFmaRows] = {};
    for (int64_t k = 0; k < H; ++k) {
      const float w = a.w2_t[k * C + c];
#pragma unroll
      for (int r = 0; r < kFmaRows; ++r) acc[r] += gs[r * H + k] * w;
    }
#pragma unroll
    for (int r = 0; r < kFmaRows; ++r) {
      if (r >= rows) break;
      const int64_t at = (i0 + r) * C + c;
      ye[at] = from_float<In>(to_float(xe[at]) + kResidual * acc[r]);
    }
  }
}

// --- Weight casts -----------------------------------------------------------------------------

// dst = T(src) for a [rows, cols] matrix, transposed into [cols, rows] when `transpose`.
template <class T>
__global__ void cast_matrix(const double* src, int64_t rows, int64_t cols, bool transpose, T* dst) {
  const int64_t n = rows * cols;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = q / cols, c = q % cols;
    dst[transpose ? c * rows + r : q] = from_float<T>(static_cast<float>(src[q]));
  }
}

template <class T>
__global__ void widen(const T* src, int64_t n, double* dst) {
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < n;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[q] = static_cast<double>(to_float(src[q]));
}

template <class T>
void launch_cast(const double* src, int64_t rows, int64_t cols, bool transpose, T* dst,
                 cudaStream_t stream) {
  cast_matrix<T>
      <<<launch::blocks(rows * cols), kThreads, 0, stream>>>(src, rows, cols, transpose, dst);
  launch::check_last("cheri weight cast launch");
}

template <class In>
void launch_statistics(const CheriShape& s, const In* x, const float* taps, int64_t n, int splits,
                       float* partials, unsigned* counters, float2* norm, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(n));
  if (s.channels % 8 == 0)
    cheri_statistics<8, In><<<grid, 256, taps_bytes(s), stream>>>(
        x, taps, s.length, s.channels, s.dilation, splits, partials, counters, norm);
  else
    cheri_statistics<1, In><<<grid, 256, taps_bytes(s), stream>>>(
        x, taps, s.length, s.channels, s.dilation, splits, partials, counters, norm);
  launch::check_last("cheri statistics launch");
}

template <class In, class T>
void launch_mma(const MmaArgs& args, int max_teams, cudaStream_t stream) {
  static const bool configured = [] {
    check(cudaFuncSetAttribute(cheri_mma<In, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared_limit())),
          "cudaFuncSetAttribute (cheri tensor-core kernel)");
    return true;
  }();
  (void)configured;
  const CheriShape s{args.L, args.C, args.H, args.d};
  MmaArgs a = args;
  a.teams = mma_bytes(s, kMaxTeams) <= shared_limit() ? kMaxTeams : 1;
  if (max_teams > 0) a.teams = std::min(a.teams, max_teams);
  const int64_t tiles = a.n * ((a.L + kTileRows - 1) / kTileRows);
  const int64_t blocks =
      std::min<int64_t>(device_properties().multiprocessors, (tiles + a.teams - 1) / a.teams);
  const std::size_t bytes = mma_bytes(s, a.teams);
  cheri_mma<In, T><<<static_cast<unsigned>(blocks), static_cast<unsigned>(kTeamThreads * a.teams),
                     bytes, stream>>>(a);
  launch::check_last("cheri tensor-core kernel launch");
}

template <class In>
void launch_fma(const FmaArgs& args, int64_t n, cudaStream_t stream) {
  static const bool configured = [] {
    check(cudaFuncSetAttribute(cheri_fma<In>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared_limit())),
          "cudaFuncSetAttribute (cheri float32 kernel)");
    return true;
  }();
  (void)configured;
  const CheriShape s{args.L, args.C, args.H, args.d};
  const dim3 grid(static_cast<unsigned>((args.L + kFmaRows - 1) / kFmaRows),
                  static_cast<unsigned>(n));
  cheri_fma<In><<<grid, 256, fma_bytes(s), stream>>>(args);
  launch::check_last("cheri float32 kernel launch");
}

// The statistics pass's scratch: partials [n, splits, 4], counters [n] (zero between
// forwards), norm [n].
struct Statistics {
  float* partials;
  unsigned* counters;
  float2* norm;
  int splits;
};

template <class In>
void run_forward(const CheriShape& s, CheriMlp mlp, const void* x, void* y, int64_t n,
                 const float* taps, const void* w1, const void* w2, const Statistics& st,
                 int max_teams, cudaStream_t stream) {
  launch_statistics<In>(s, static_cast<const In*>(x), taps, n, st.splits, st.partials, st.counters,
                        st.norm, stream);
  if (mlp == CheriMlp::f32) {
    const FmaArgs a{x,
                    y,
                    s.length,
                    s.channels,
                    s.hidden,
                    s.dilation,
                    taps,
                    static_cast<const float*>(w1),
                    static_cast<const float*>(w2),
                    st.norm};
    launch_fma<In>(a, n, stream);
    return;
  }
  const MmaArgs a{x,
                  y,
                  n,
                  s.length,
                  s.channels,
                  s.hidden,
                  s.dilation,
                  taps,
                  static_cast<const uint16_t*>(w1),
                  static_cast<const uint16_t*>(w2),
                  st.norm,
                  1};
  if (mlp == CheriMlp::bf16)
    launch_mma<In, __nv_bfloat16>(a, max_teams, stream);
  else
    launch_mma<In, __half>(a, max_teams, stream);
}

}  // namespace

const char* to_string(CheriInput t) {
  switch (t) {
    case CheriInput::bf16:
      return "bf16";
    case CheriInput::f16:
      return "fp16";
    default:
      return "float32";
  }
}

const char* to_string(CheriMlp t) {
  switch (t) {
    case CheriMlp::bf16:
      return "bf16";
    case CheriMlp::f16:
      return "fp16";
    default:
      return "float32";
  }
}

std::size_t element_bytes(CheriInput t) { return t == CheriInput::f32 ? 4 : 2; }

void convert_from_f64(const double* src, CheriInput t, void* dst, int64_t n, cudaStream_t stream) {
  if (n < 1) return;
  if (t == CheriInput::f32)
    cast_matrix<<<launch::blocks(n), kThreads, 0, stream>>>(src, 1, n, false,
                                                            static_cast<float*>(dst));
  else if (t == CheriInput::bf16)
    cast_matrix<<<launch::blocks(n), kThreads, 0, stream>>>(src, 1, n, false,
                                                            static_cast<__nv_bfloat16*>(dst));
  else
    cast_matrix<<<launch::blocks(n), kThreads, 0, stream>>>(src, 1, n, false,
                                                            static_cast<__half*>(dst));
  launch::check_last("cheri input conversion launch");
}

void convert_to_f64(const void* src, CheriInput t, double* dst, int64_t n, cudaStream_t stream) {
  if (n < 1) return;
  if (t == CheriInput::f32)
    widen<<<launch::blocks(n), kThreads, 0, stream>>>(static_cast<const float*>(src), n, dst);
  else if (t == CheriInput::bf16)
    widen<<<launch::blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), n,
                                                      dst);
  else
    widen<<<launch::blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(src), n, dst);
  launch::check_last("cheri output conversion launch");
}

std::string cheri_tensor_core_reason(const CheriShape& s) {
  if (s.channels % 64 != 0 || s.hidden % 64 != 0)
    return "the tensor-core Cheri kernel needs C and e C multiples of 64 (C = " +
           std::to_string(s.channels) + ", e C = " + std::to_string(s.hidden) + ")";
  if (mma_bytes(s, 1) > shared_limit())
    return "the tensor-core Cheri kernel keeps both weight matrices, a 64-row tile and the taps "
           "in shared memory: 4 C e C + 128 (C + e C) + 12 C = " +
           std::to_string(mma_bytes(s, 1)) + " bytes exceed the " + std::to_string(shared_limit()) +
           " a block may use on this device";
  return "";
}

CheriBlockKernel::CheriBlockKernel(const CheriShape& shape) : shape_(shape) {
  if (shape.length < 1 || shape.channels < 1 || shape.hidden < 1 || shape.dilation < 1)
    throw std::invalid_argument("Cheri block: L, C, e C and the dilation must be positive");
  if (shape.length * shape.channels >= (int64_t{1} << 31))
    throw std::invalid_argument("Cheri block: an (L, C) plane must hold fewer than 2^31 values");
  if (fma_bytes(shape) > shared_limit())
    throw std::invalid_argument(
        "Cheri block: C + e C = " + std::to_string(shape.channels + shape.hidden) +
        " is too wide for the float32 kernel's 16-row tile in shared memory (at most " +
        std::to_string(shared_limit() / (4 * kFmaRows)) + ")");
  tensor_cores_ = cheri_tensor_core_reason(shape).empty();
}

void CheriBlockKernel::set_weights(const double* params, cudaStream_t stream) {
  const int64_t C = shape_.channels, H = shape_.hidden;
  params_.upload(params, sz(3 * C + 2 * H * C), stream);
  taps_.resize(sz(3 * C));
  launch_cast<float>(params_.data(), 3, C, false, taps_.data(), stream);
  // The host array may go away when we return.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  fresh_f32_ = fresh_bf16_ = fresh_f16_ = false;
}

void CheriBlockKernel::cast_weights(CheriMlp mlp, cudaStream_t stream) {
  const int64_t C = shape_.channels, H = shape_.hidden;
  const double* fc1 = params_.data() + 3 * C;
  const double* fc2 = fc1 + H * C;
  if (mlp == CheriMlp::f32 && !fresh_f32_) {
    w1_t_.resize(sz(H * C));
    w2_t_.resize(sz(H * C));
    launch_cast<float>(fc1, H, C, true, w1_t_.data(), stream);
    launch_cast<float>(fc2, C, H, true, w2_t_.data(), stream);
    fresh_f32_ = true;
  } else if (mlp == CheriMlp::bf16 && !fresh_bf16_) {
    w1_bf16_.resize(sz(H * C));
    w2_bf16_.resize(sz(H * C));
    launch_cast(fc1, H, C, false, reinterpret_cast<__nv_bfloat16*>(w1_bf16_.data()), stream);
    launch_cast(fc2, C, H, false, reinterpret_cast<__nv_bfloat16*>(w2_bf16_.data()), stream);
    fresh_bf16_ = true;
  } else if (mlp == CheriMlp::f16 && !fresh_f16_) {
    w1_f16_.resize(sz(H * C));
    w2_f16_.resize(sz(H * C));
    launch_cast(fc1, H, C, false, reinterpret_cast<__half*>(w1_f16_.data()), stream);
    launch_cast(fc2, C, H, false, reinterpret_cast<__half*>(w2_f16_.data()), stream);
    fresh_f16_ = true;
  }
}

void CheriBlockKernel::forward(CheriInput input, CheriMlp mlp, const void* x, void* y, int64_t n,
                               cudaStream_t stream) {
  if (params_.size() == 0) throw std::logic_error("Cheri block: forward before set_weights");
  if (n < 1) return;
  if (mlp != CheriMlp::f32 && !tensor_cores_)
    throw std::invalid_argument(cheri_tensor_core_reason(shape_));
  // The statistics and float32 kernels put examples on gridDim.y (at most 65,535).
  constexpr int64_t kMaxExamples = 65535;
  if (n > kMaxExamples) {
    const std::size_t bytes = sz(shape_.length * shape_.channels) * element_bytes(input);
    for (int64_t first = 0; first < n; first += kMaxExamples)
      forward(input, mlp, static_cast<const unsigned char*>(x) + sz(first) * bytes,
              static_cast<unsigned char*>(y) + sz(first) * bytes, std::min(kMaxExamples, n - first),
              stream);
    return;
  }
  cast_weights(mlp, stream);
  // Enough statistics blocks to fill the device twice at small n.
  const int splits = static_cast<int>(
      std::clamp<int64_t>(2048 / n, 1, std::min<int64_t>(kMaxSplits, shape_.length)));
  partials_.reserve(sz(n * splits * 4));
  norm_.reserve(sz(2 * n));
  if (counters_.size() < sz(n)) {
    counters_.resize(sz(n));
    check(cudaMemsetAsync(counters_.data(), 0, sz(n) * sizeof(unsigned), stream),
          "cudaMemsetAsync");
  }
  const Statistics st{partials_.data(), counters_.data(), reinterpret_cast<float2*>(norm_.data()),
                      splits};
  const void* w1 = mlp == CheriMlp::f32    ? static_cast<const void*>(w1_t_.data())
                   : mlp == CheriMlp::bf16 ? static_cast<const void*>(w1_bf16_.data())
                                           : static_cast<const void*>(w1_f16_.data());
  const void* w2 = mlp == CheriMlp::f32    ? static_cast<const void*>(w2_t_.data())
                   : mlp == CheriMlp::bf16 ? static_cast<const void*>(w2_bf16_.data())
                                           : static_cast<const void*>(w2_f16_.data());
  switch (input) {
    case CheriInput::f32:
      run_forward<float>(shape_, mlp, x, y, n, taps_.data(), w1, w2, st, max_teams_, stream);
      break;
    case CheriInput::bf16:
      run_forward<__nv_bfloat16>(shape_, mlp, x, y, n, taps_.data(), w1, w2, st, max_teams_,
                                 stream);
      break;
    case CheriInput::f16:
      run_forward<__half>(shape_, mlp, x, y, n, taps_.data(), w1, w2, st, max_teams_, stream);
      break;
  }
}

std::string CheriBlockKernel::path(CheriMlp mlp) const {
  if (mlp == CheriMlp::f32) return "float32 FMA (16-row tiles, exact tanh)";
  if (!tensor_cores_) return "unavailable: " + cheri_tensor_core_reason(shape_);
  const int fit = mma_bytes(shape_, kMaxTeams) <= shared_limit() ? kMaxTeams : 1;
  const int teams = max_teams_ > 0 ? std::min(fit, max_teams_) : fit;
  return std::string("tensor cores (mma.sync m16n8k16, ") + to_string(mlp) +
         " operands, float32 accumulation, persistent fused kernel, " + std::to_string(teams) +
         (teams == 1 ? " team" : " teams") + " of 8 warps per block)";
}

}  // namespace polyprobe::cuda
