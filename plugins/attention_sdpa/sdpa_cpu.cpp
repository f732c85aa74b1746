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
  std::vector<S> qs;   // one scaled query [head_dim]
  std::vector<S> acc;  // one row's unnormalised output [v_dim]
  std::vector<S> p;    // short keys (kv_len <= one tile): every row's weights [q_len, T]
};

// One problem: q [q_len, head_dim] with row stride qr, k [kv_len, head_dim] (kr), v
// [kv_len, v_dim] (vr), out [q_len, v_dim] (outr). Keys go in tiles of T (a compile-time
// width, so a tile's scores stay in vector registers); the panel is zero-padded to a whole
// number of tiles, and the scores past the visible keys are masked.
template <class S, int T>
void attend(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr, const S* v,
            int64_t vr, S* out, int64_t outr, Work<S>& w) {
  using Tile = Eigen::Array<S, T, 1>;
  const int64_t len = a.q_len, keys = a.kv_len, hd = a.head_dim, dv = a.v_dim;
  const int64_t padded = (keys + T - 1) / T * T;
  const bool argmax = a.weighting == PP_SDPA_ARGMAX, causal = a.causal != 0;
  const S scale = static_cast<S>(a.scale);
  w.kt.assign(static_cast<std::size_t>(hd * padded), S(0));
  w.qs.resize(static_cast<std::size_t>(hd));
  w.acc.resize(static_cast<std::size_t>(dv));
  S* kt = w.kt.data();
  for (int64_t j = 0; j < keys; ++j)
    for (int64_t d = 0; d < hd; ++d) kt[d * padded + j] = k[j * kr + d];
  S* __restrict acc = w.acc.data();
  S* __restrict qs = w.qs.data();
  // With one tile of keys there is nothing to rescale: each row's weights are final once
  // scored, so they are kept ([q_len, T], not [q_len, kv_len] beyond one tile) and the mix is
  // one product for all rows instead of one per row.
  // (Measured: for a handful of keys, the product's dispatch costs more than it saves.)
  const bool short_softmax = keys <= T && keys > 16 && !argmax;
  if (short_softmax) w.p.resize(static_cast<std::size_t>(len * T));
  for (int64_t i = 0; i < len; ++i) {
    for (int64_t d = 0; d < hd; ++d) qs[d] = q[i * qr + d] * scale;
    const int64_t visible = causal ? std::min(keys, i + 1) : keys;
    S m = -std::numeric_limits<S>::infinity(), l = S(0), best_score = S(0);
    int64_t best = -1;
    std::fill(acc, acc + dv, S(0));
    for (int64_t j0 = 0; j0 < visible; j0 += T) {
      // Four partial sums over d, so that a narrow tile is not one serial chain of
      // multiply-adds (their latency, not their count, would bound it).
      Tile s0 = Tile::Zero(), s1 = Tile::Zero(), s2 = Tile::Zero(), s3 = Tile::Zero();
      int64_t d = 0;
      for (; d + 4 <= hd; d += 4) {
        s0 += qs[d] * Eigen::Map<const Tile>(kt + d * padded + j0);
        s1 += qs[d + 1] * Eigen::Map<const Tile>(kt + (d + 1) * padded + j0);
        s2 += qs[d + 2] * Eigen::Map<const Tile>(kt + (d + 2) * padded + j0);
        s3 += qs[d + 3] * Eigen::Map<const Tile>(kt + (d + 3) * padded + j0);
      }
      for (; d < hd; ++d) s0 += qs[d] * Eigen::Map<const Tile>(kt + d * padded + j0);
      Tile s = (s0 + s1) + (s2 + s3);
      const int64_t n = std::min<int64_t>(T, visible - j0);
      if (argmax) {
        for (int64_t j = 0; j < n; ++j)
          if (best < 0 || s(j) > best_score) best_score = s(j), best = j0 + j;
        continue;
      }
      for (int64_t j = n; j < T; ++j) s(j) = -std::numeric_limits<S>::infinity();
      if (short_softmax) {
        s = (s - s.maxCoeff()).exp();
        Eigen::Map<Tile>(w.p.data() + i * T) = s / s.sum();
        break;
      }
      const S top = j0 == 0 ? s.maxCoeff() : std::max(m, s.maxCoeff());
      s = (s - top).exp();
      if (j0 == 0) {
        l = s.sum();
      } else {  // a later tile: rescale what the earlier ones summed to the new maximum
        const S rescale = std::exp(m - top);
        l = l * rescale + s.sum();
        if (rescale != S(1))
          for (int64_t c = 0; c < dv; ++c) acc[c] *= rescale;
      }
      m = top;
      // acc += p V_tile: a [1, n] x [n, v_dim] product.
      using Rows = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<Eigen::Matrix<S, 1, Eigen::Dynamic>>(acc, dv).noalias() +=
          s.head(n).matrix().transpose() * Eigen::Map<const Rows, 0, Eigen::OuterStride<>>(
                                               v + j0 * vr, n, dv, Eigen::OuterStride<>(vr));
    }
    if (short_softmax) continue;
    S* o = out + i * outr;
    if (argmax) {
      const S* vb = v + best * vr;
      std::copy(vb, vb + dv, o);
    } else {
      const S inv = S(1) / l;
      for (int64_t c = 0; c < dv; ++c) o[c] = acc[c] * inv;
    }
  }
  if (short_softmax) {
    using Rows = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using Strided = Eigen::OuterStride<>;
    Eigen::Map<Rows, 0, Strided>(out, len, dv, Strided(outr)).noalias() =
        Eigen::Map<const Rows, 0, Strided>(w.p.data(), len, keys, Strided(T)) *
        Eigen::Map<const Rows, 0, Strided>(v, keys, dv, Strided(vr));
  }
}

// The tile width for kv_len keys: one vector of floats for short sequences (where a wide
// tile would be mostly masking), four beyond.
template <class S>
void attend_any(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr, const S* v,
                int64_t vr, S* out, int64_t outr, Work<S>& w) {
  if (a.kv_len <= 16)
    attend<S, 16>(a, q, qr, k, kr, v, vr, out, outr, w);
  else
    attend<S, 64>(a, q, qr, k, kr, v, vr, out, outr, w);
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
