// Fused attention on the CPU. For each problem (b0, b1, head), K is transposed once into a
// [head_dim, kv_len] panel so that a query row scores a tile of keys with broadcast
// multiply-adds along the keys (fixed-size Eigen arrays: vector registers); each row keeps
// an online softmax (running maximum m, running sum l, unnormalised output acc), rescaled
// when a later tile raises the maximum, so no [q_len, kv_len] score matrix exists: one
// tile of one row's scores is all that is held. Argmax weighting
// keeps each row's first largest score over the tiles in key order instead, which is the
// explicit attention's tie rule (strictly larger replaces).
#include "sdpa_cpu.hpp"

#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace polyprobe::attention_sdpa {
namespace {

template <class S>
struct Work {
  std::vector<S> kt;   // K^T [head_dim, padded kv_len], zero past kv_len
  std::vector<S> qs;   // R scaled queries [R, head_dim]
  std::vector<S> acc;  // R rows' unnormalised outputs [R, v_dim]
};

// K^T as a [head_dim, padded] panel, zero past kv_len, padded to a whole number of tiles.
template <class S>
S* transpose_keys(const S* k, int64_t kr, int64_t keys, int64_t hd, int64_t padded, Work<S>& w) {
  w.kt.assign(static_cast<std::size_t>(hd * padded), S(0));
  S* __restrict kt = w.kt.data();
  for (int64_t d = 0; d < hd; ++d)  // contiguous writes
    for (int64_t j = 0; j < keys; ++j) kt[d * padded + j] = k[j * kr + d];
  return kt;
}

// Rows i0 .. i0 + R of q, scaled, into qs [R, head_dim]; a block past the last row repeats
// it (its results are not written). Returns each row's visible keys (the causal mask) and
// their maximum.
template <class S, int R>
int64_t load_queries(const pp_sdpa_args& a, const S* q, int64_t qr, int64_t i0, S* qs,
                     std::array<int64_t, R>& visible) {
  const int64_t rows = std::min<int64_t>(R, a.q_len - i0);
  const S scale = static_cast<S>(a.scale);
  int64_t most = 0;
  for (int r = 0; r < R; ++r) {
    const int64_t i = i0 + std::min<int64_t>(r, rows - 1);
    visible[r] = a.causal != 0 ? std::min(a.kv_len, i + 1) : a.kv_len;
    most = std::max(most, visible[r]);
    for (int64_t d = 0; d < a.head_dim; ++d) qs[r * a.head_dim + d] = q[i * qr + d] * scale;
  }
  return most;
}

// The scores of R query rows against the tile of keys at j0: every load of the panel feeds R
// rows' multiply-adds. The R tiles are R T / (vector width) independent chains of
// multiply-adds; when that is under eight (short tiles, one row), the head dimension is
// split into partial sums as well, so the FMA latency, not their count, does not bound it.
template <class S, int T, int R>
[[gnu::always_inline]] inline void score_tile(const S* kt, int64_t padded, int64_t j0, int64_t hd,
                                              const S* qs,
                                              std::array<Eigen::Array<S, T, 1>, R>& s) {
  using Tile = Eigen::Array<S, T, 1>;
  constexpr int kChains = R * T * static_cast<int>(sizeof(S)) / 64;
  constexpr int kSplit = kChains >= 8 ? 1 : kChains >= 4 ? 2 : 4;
  std::array<std::array<Tile, R>, kSplit> part;
  for (auto& p : part)
    for (Tile& t : p) t.setZero();
  int64_t d = 0;
  for (; d + kSplit <= hd; d += kSplit)
    for (int h = 0; h < kSplit; ++h) {
      const Eigen::Map<const Tile> kd(kt + (d + h) * padded + j0);
      for (int r = 0; r < R; ++r) part[h][r] += qs[r * hd + d + h] * kd;
    }
  for (; d < hd; ++d) {
    const Eigen::Map<const Tile> kd(kt + d * padded + j0);
    for (int r = 0; r < R; ++r) part[0][r] += qs[r * hd + d] * kd;
  }
  for (int r = 0; r < R; ++r) {
    s[r] = part[0][r];
    for (int h = 1; h < kSplit; ++h) s[r] += part[h][r];
  }
}

// Argmax weighting, R rows at a time: each row's output is the V row of its first largest
// score (a later tile replaces only a strictly larger maximum; inside a tile the first index
// that holds the maximum), the explicit attention's tie rule.
template <class S, int T, int R>
void attend_argmax(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr,
                   const S* v, int64_t vr, S* out, int64_t outr, Work<S>& w) {
  const int64_t len = a.q_len, keys = a.kv_len, hd = a.head_dim, dv = a.v_dim;
  const int64_t padded = (keys + T - 1) / T * T;
  const S* kt = transpose_keys(k, kr, keys, hd, padded, w);
  const Eigen::Array<S, T, 1> lanes = Eigen::Array<S, T, 1>::LinSpaced(T, S(0), S(T - 1));
  w.qs.resize(static_cast<std::size_t>(R * hd));
  S* __restrict qs = w.qs.data();
  for (int64_t i0 = 0; i0 < len; i0 += R) {
    std::array<int64_t, R> visible{};
    const int64_t most = load_queries<S, R>(a, q, qr, i0, qs, visible);
    std::array<S, R> best_score{};
    std::array<int64_t, R> best;
    best.fill(-1);
    for (int64_t j0 = 0; j0 < most; j0 += T) {
      std::array<Eigen::Array<S, T, 1>, R> s;
      score_tile<S, T, R>(kt, padded, j0, hd, qs, s);
      for (int r = 0; r < R; ++r) {
        const int64_t n = std::min<int64_t>(T, visible[r] - j0);
        if (n <= 0) continue;
        // The explicit attention's scan (which also skips NaN scores) for a short tile or
        // one with NaN scores; else one vector maximum, then its first index.
        const bool scan = T <= 16 || (s[r] != s[r]).any();
        if (scan) {
          for (int64_t j = 0; j < n; ++j)
            if (best[r] < 0 || s[r](j) > best_score[r]) best_score[r] = s[r](j), best[r] = j0 + j;
          continue;
        }
        if (n < T) s[r] = (lanes < S(n)).select(s[r], -std::numeric_limits<S>::infinity());
        const S top = s[r].maxCoeff();
        if (best[r] < 0 || top > best_score[r]) {  // the first index of the maximum
          int64_t j = 0;
          while (s[r](j) != top) ++j;
          best_score[r] = top;
          best[r] = j0 + j;
        }
      }
    }
    const int64_t rows = std::min<int64_t>(R, len - i0);
    for (int64_t r = 0; r < rows; ++r) {
      const S* vb = v + best[static_cast<std::size_t>(r)] * vr;
      std::copy(vb, vb + dv, out + (i0 + r) * outr);
    }
  }
}

// Softmax weighting, R query rows at a time: every load of a key tile or of a row of V
// feeds R rows' multiply-adds, and p V accumulates in vector registers
// instead of through a general matrix-vector product per tile (whose dispatch cost about as
// much as the arithmetic at these sizes). Each row keeps its own online softmax, and its
// own visible keys under the causal mask.
template <class S, int T, int R>
void attend_softmax(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr,
                    const S* v, int64_t vr, S* out, int64_t outr, Work<S>& w) {
  using Tile = Eigen::Array<S, T, 1>;
  constexpr int W = 64 / static_cast<int>(sizeof(S));  // one 512-bit vector of S
  using Vec = Eigen::Array<S, W, 1>;
  const int64_t len = a.q_len, keys = a.kv_len, hd = a.head_dim, dv = a.v_dim;
  const int64_t padded = (keys + T - 1) / T * T;
  const S minus_inf = -std::numeric_limits<S>::infinity();
  const S* kt = transpose_keys(k, kr, keys, hd, padded, w);
  const Tile lanes = Tile::LinSpaced(T, S(0), S(T - 1));  // masks the keys past the visible
  w.qs.resize(static_cast<std::size_t>(R * hd));
  w.acc.resize(static_cast<std::size_t>(R * dv));
  S* __restrict qs = w.qs.data();
  S* __restrict acc = w.acc.data();
  for (int64_t i0 = 0; i0 < len; i0 += R) {
    const int rows = static_cast<int>(std::min<int64_t>(R, len - i0));
    std::array<int64_t, R> visible{};
    const int64_t most = load_queries<S, R>(a, q, qr, i0, qs, visible);
    std::array<S, R> m, l;
    m.fill(minus_inf);
    l.fill(S(0));
    std::fill(acc, acc + R * dv, S(0));
    for (int64_t j0 = 0; j0 < most; j0 += T) {
      std::array<Tile, R> s;
      score_tile<S, T, R>(kt, padded, j0, hd, qs, s);
      const int64_t n = std::min<int64_t>(T, most - j0);
      for (int r = 0; r < R; ++r) {
        if (visible[r] - j0 < T) s[r] = (lanes < S(visible[r] - j0)).select(s[r], minus_inf);
        if (visible[r] <= j0) {  // this row sees no key of the tile: weight 0 everywhere
          s[r].setZero();
          continue;
        }
        const S top = std::max(m[r], s[r].maxCoeff());
        s[r] = (s[r] - top).exp();
        const S rescale = j0 == 0 ? S(0) : std::exp(m[r] - top);
        l[r] = l[r] * rescale + s[r].sum();
        if (j0 > 0 && rescale != S(1))
          for (int64_t c = 0; c < dv; ++c) acc[r * dv + c] *= rescale;
        m[r] = top;
      }
      // acc_r += p_r V_tile, a vector of V's columns at a time.
      const S* vt = v + j0 * vr;
      int64_t c = 0;
      for (; c + W <= dv; c += W) {
        // Even and odd keys in separate sums: 2 R independent chains of multiply-adds.
        std::array<Vec, R> sum, odd;
        for (int r = 0; r < R; ++r) {
          sum[r] = Eigen::Map<const Vec>(acc + r * dv + c);
          odd[r].setZero();
        }
        int64_t j = 0;
        for (; j + 2 <= n; j += 2) {
          const Eigen::Map<const Vec> v0(vt + j * vr + c), v1(vt + (j + 1) * vr + c);
          for (int r = 0; r < R; ++r) {
            sum[r] += s[r](j) * v0;
            odd[r] += s[r](j + 1) * v1;
          }
        }
        if (j < n) {
          const Eigen::Map<const Vec> v0(vt + j * vr + c);
          for (int r = 0; r < R; ++r) sum[r] += s[r](j) * v0;
        }
        for (int r = 0; r < R; ++r) Eigen::Map<Vec>(acc + r * dv + c) = sum[r] + odd[r];
      }
      for (; c < dv; ++c)
        for (int r = 0; r < R; ++r) {
          S t = acc[r * dv + c];
          for (int64_t j = 0; j < n; ++j) t += s[r](j) * vt[j * vr + c];
          acc[r * dv + c] = t;
        }
    }
    for (int r = 0; r < rows; ++r) {
      S* o = out + (i0 + r) * outr;
      const S inv = S(1) / l[r];
      for (int64_t c = 0; c < dv; ++c) o[c] = acc[r * dv + c] * inv;
    }
  }
}

// The tile width for kv_len keys: one vector of floats for short sequences (where a wide
// tile would be mostly masking), four beyond. Softmax goes R rows at a time (as many as keep
// R tiles of scores in the 32 vector registers with a tile of keys).
template <class S>
void attend_any(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr, const S* v,
                int64_t vr, S* out, int64_t outr, Work<S>& w) {
  constexpr int kRows = sizeof(S) == 4 ? 4 : 2;
  constexpr int kShortRows = 1;  // short sequences: fewer rows lost to a partial last block
  if (a.weighting == PP_SDPA_ARGMAX) {
    if (a.kv_len <= 16)
      attend_argmax<S, 16, kShortRows>(a, q, qr, k, kr, v, vr, out, outr, w);
    else
      attend_argmax<S, 64, kRows>(a, q, qr, k, kr, v, vr, out, outr, w);
  } else if (a.kv_len <= 16) {
    attend_softmax<S, 16, kShortRows>(a, q, qr, k, kr, v, vr, out, outr, w);
  } else {
    attend_softmax<S, 64, kRows>(a, q, qr, k, kr, v, vr, out, outr, w);
  }
}

template <class S>
void run_typed(const pp_sdpa_args& a) {
  const auto* q = static_cast<const S*>(a.q);
  const auto* k = static_cast<const S*>(a.k);
  const auto* v = static_cast<const S*>(a.v);
  auto* out = static_cast<S*>(a.out);
  const int64_t problems = a.b0 * a.b1 * a.heads;
  auto one = [&](int64_t p, Work<S>& w) {
    const int64_t h = p % a.heads, b1 = (p / a.heads) % a.b1, b0 = p / (a.heads * a.b1);
    auto at = [&](const int64_t* st) { return b0 * st[0] + b1 * st[1] + h * st[2]; };
    attend_any<S>(a, q + at(a.q_strides), a.q_strides[3], k + at(a.k_strides), a.k_strides[3],
                  v + at(a.v_strides), a.v_strides[3], out + at(a.out_strides), a.out_strides[3],
                  w);
  };
  if (a.threads == 1 || problems == 1) {
    thread_local Work<S> w;
    for (int64_t p = 0; p < problems; ++p) one(p, w);
    return;
  }
  tbb::enumerable_thread_specific<Work<S>> works;
  auto all = [&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, problems), [&](const auto& range) {
      Work<S>& w = works.local();
      for (int64_t p = range.begin(); p < range.end(); ++p) one(p, w);
    });
  };
  if (a.threads > 1)
    tbb::task_arena(a.threads).execute(all);
  else
    all();
}

}  // namespace

std::string check_args(const pp_sdpa_args& a, int32_t device) {
  (void)device;
  if (a.struct_size < sizeof(pp_sdpa_args))
    return "sdpa: pp_sdpa_args.struct_size " + std::to_string(a.struct_size) +
           " is smaller than this plugin's " + std::to_string(sizeof(pp_sdpa_args)) +
           ": rebuild the caller against this polyprobe";
  if (a.dtype != PP_DTYPE_F32 && a.dtype != PP_DTYPE_F64)
    return "sdpa: dtype " + std::string(a.dtype == PP_DTYPE_BF16 ? "bfloat16" : "#") +
           std::to_string(a.dtype) + " (float32 and float64 are served)";
  if (a.weighting != PP_SDPA_SOFTMAX && a.weighting != PP_SDPA_ARGMAX)
    return "sdpa: weighting " + std::to_string(a.weighting) + " (0 softmax, 1 argmax)";
  if (a.b0 < 1 || a.b1 < 1 || a.heads < 1 || a.q_len < 1 || a.kv_len < 1 || a.head_dim < 1 ||
      a.v_dim < 1)
    return "sdpa: every size (b0 " + std::to_string(a.b0) + ", b1 " + std::to_string(a.b1) +
           ", heads " + std::to_string(a.heads) + ", q_len " + std::to_string(a.q_len) +
           ", kv_len " + std::to_string(a.kv_len) + ", head_dim " + std::to_string(a.head_dim) +
           ", v_dim " + std::to_string(a.v_dim) + ") must be at least 1";
  if (a.q == nullptr || a.k == nullptr || a.v == nullptr || a.out == nullptr)
    return "sdpa: q, k, v and out must all point to data";
  for (int i = 0; i < 4; ++i)
    if (a.q_strides[i] < 0 || a.k_strides[i] < 0 || a.v_strides[i] < 0 || a.out_strides[i] < 0)
      return "sdpa: strides must not be negative";
  if (a.q_strides[3] < a.head_dim && a.q_len > 1)
    return "sdpa: q rows overlap (row stride < head_dim)";
  if (a.k_strides[3] < a.head_dim && a.kv_len > 1)
    return "sdpa: k rows overlap (row stride < head_dim)";
  if (a.v_strides[3] < a.v_dim && a.kv_len > 1) return "sdpa: v rows overlap (row stride < v_dim)";
  if ((a.out_strides[3] < a.v_dim && a.q_len > 1) || (a.out_strides[2] == 0 && a.heads > 1) ||
      (a.out_strides[1] == 0 && a.b1 > 1) || (a.out_strides[0] == 0 && a.b0 > 1))
    return "sdpa: out must not broadcast (a zero stride) or overlap its rows";
  return {};
}

void run_cpu(const pp_sdpa_args& args) {
  if (std::string why = check_args(args, PP_DEVICE_CPU); !why.empty())
    throw std::invalid_argument(why);
  if (args.dtype == PP_DTYPE_F32)
    run_typed<float>(args);
  else
    run_typed<double>(args);
}

}  // namespace polyprobe::attention_sdpa
