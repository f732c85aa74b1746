// Fused attention on the CPU. For each problem (b0, b1, head), K is transposed once into a
// [head_dim, kv_len] panel so that a block of query rows scores a tile of keys with
// broadcast-multiply-adds along the keys (vectorised by the compiler); each row keeps an
// online softmax (running maximum m, running sum l, unnormalised output acc), rescaled
// when a later tile raises the maximum, so no [q_len, kv_len] score matrix exists: the
// scores of one tile of keys for one block of rows is all that is held. Argmax weighting
// keeps each row's first largest score over the tiles in key order instead, which is the
// explicit attention's tie rule (strictly larger replaces).
#include "sdpa_cpu.hpp"

#include <Eigen/Core>
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace polyprobe::attention_sdpa {
namespace {

constexpr int64_t kRows = 4;   // query rows scored together (they share the key panel loads)
constexpr int64_t kTile = 64;  // keys per tile: the scores held per row

template <class S>
struct Work {
  std::vector<S> kt;  // K^T [head_dim, kv_len]
  std::vector<S> qs;  // the block's scaled queries [kRows, head_dim]
  std::vector<S> acc; // [kRows, v_dim]
  alignas(64) std::array<S, kRows * kTile> scores{};
};

template <class S>
using Row = Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>;

// One problem: q [q_len, head_dim] with row stride qr, k [kv_len, head_dim] (kr), v
// [kv_len, v_dim] (vr), out [q_len, v_dim] (outr).
template <class S>
void attend(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr, const S* v,
            int64_t vr, S* out, int64_t outr, Work<S>& w) {
  const int64_t len = a.q_len, keys = a.kv_len, hd = a.head_dim, dv = a.v_dim;
  const bool argmax = a.weighting == PP_SDPA_ARGMAX, causal = a.causal != 0;
  const S scale = static_cast<S>(a.scale);
  w.kt.resize(static_cast<std::size_t>(hd * keys));
  w.qs.resize(static_cast<std::size_t>(kRows * hd));
  w.acc.resize(static_cast<std::size_t>(kRows * dv));
  S* kt = w.kt.data();
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t d = 0; d < hd; ++d) kt[d * keys + j] = k[j * kr + d];
  std::array<S, kRows> m{}, l{}, best_score{};
  std::array<int64_t, kRows> best{};
  for (int64_t i0 = 0; i0 < len; i0 += kRows) {
    const int64_t rows = std::min(kRows, len - i0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < hd; ++d) w.qs[r * hd + d] = q[(i0 + r) * qr + d] * scale;
    std::fill(w.acc.begin(), w.acc.end(), S(0));
    m.fill(-std::numeric_limits<S>::infinity());
    l.fill(S(0));
    best.fill(-1);
    // The keys any row of the block sees.
    const int64_t end = causal ? std::min(keys, i0 + rows) : keys;
    for (int64_t j0 = 0; j0 < end; j0 += kTile) {
      const int64_t tl = std::min(kTile, end - j0);
      S* s = w.scores.data();
      std::fill(s, s + kRows * kTile, S(0));
      for (int64_t d = 0; d < hd; ++d) {
        const S* kd = kt + d * keys + j0;
        for (int64_t r = 0; r < rows; ++r) {
          const S qd = w.qs[r * hd + d];
          S* sr = s + r * kTile;
          for (int64_t j = 0; j < tl; ++j) sr[j] += qd * kd[j];
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = causal ? std::min(tl, i0 + r + 1 - j0) : tl;
        if (n <= 0) continue;
        S* sr = s + r * kTile;
        if (argmax) {
          int64_t j = 0;
          if (best[r] < 0) best[r] = j0, best_score[r] = sr[0], j = 1;
          for (; j < n; ++j)
            if (sr[j] > best_score[r]) best_score[r] = sr[j], best[r] = j0 + j;
          continue;
        }
        Row<S> tile(sr, n);
        const S top = std::max(m[r], tile.maxCoeff());
        const S rescale = std::exp(m[r] - top);  // 0 on the first tile (m = -inf)
        tile = (tile - top).exp();
        l[r] = l[r] * rescale + tile.sum();
        m[r] = top;
        S* acc = w.acc.data() + r * dv;
        if (rescale != S(1))
          for (int64_t c = 0; c < dv; ++c) acc[c] *= rescale;
        for (int64_t j = 0; j < n; ++j) {
          const S p = sr[j];
          const S* vj = v + (j0 + j) * vr;
          for (int64_t c = 0; c < dv; ++c) acc[c] += p * vj[c];
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      S* o = out + (i0 + r) * outr;
      if (argmax) {
        const S* vb = v + best[r] * vr;
        std::copy(vb, vb + dv, o);
      } else {
        const S inv = S(1) / l[r];
        const S* acc = w.acc.data() + r * dv;
        for (int64_t c = 0; c < dv; ++c) o[c] = acc[c] * inv;
      }
    }
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
    attend<S>(a, q + at(a.q_strides), a.q_strides[3], k + at(a.k_strides), a.k_strides[3],
              v + at(a.v_strides), a.v_strides[3], out + at(a.out_strides), a.out_strides[3], w);
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
  if (a.q_strides[3] < a.head_dim && a.q_len > 1) return "sdpa: q rows overlap (row stride < head_dim)";
  if (a.k_strides[3] < a.head_dim && a.kv_len > 1) return "sdpa: k rows overlap (row stride < head_dim)";
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
