// Fused attention on the CPU, a panel of query rows at a time: the rows of a panel are the
// lanes of one vector (16 floats or 8 doubles), so every per-row quantity (the running
// maximum, the softmax sum, the argmax and its index, the causal mask) is one vector and
// needs no horizontal reduction. K is transposed once per problem into a [head_dim, keys]
// panel and the panel's scaled queries into [head_dim, lanes]; a tile of 16 keys is scored
// as 16 independent vectors, each a chain of multiply-adds over the head dimension with the
// key element broadcast from memory (Q K^T as a register-blocked product). The scores of a
// chunk of keys stay in an L1 panel; then one vectorised exp per key over the panel, and
// P V as a second register-blocked product (16 of V's columns accumulated over the chunk's
// keys). Each chunk's maximum is exact, so with up to one chunk of keys (kChunk) there is no
// rescaling at all; beyond, the online softmax rescales the sum and the output once per
// chunk. No [q_len, kv_len] score matrix exists. Argmax weighting keeps each row's first
// largest score in key order instead (a later key replaces only a strictly larger one), the
// explicit attention's tie rule. Keys a row may not see weigh exactly 0 (exp(-inf)); a
// masked key's NaN or infinite score, which the explicit attention skips, can make a
// softmax row NaN here (finite inputs are unaffected).
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
constexpr int kLanes = 64 / static_cast<int>(sizeof(S));  // rows per panel: one 512-bit vector
constexpr int kTile = 16;        // keys scored at once: 16 independent chains of multiply-adds
constexpr int kColumns = 16;     // V's columns accumulated at once in P V
constexpr int64_t kChunk = 256;  // keys whose scores a panel holds (16 KiB), a multiple of kTile

template <class S>
using Vec = Eigen::Array<S, kLanes<S>, 1>;

template <class S>
struct Work {
  std::vector<S> qt;   // the panel's scaled queries, transposed [head_dim, lanes]
  std::vector<S> st;   // the panel's scores, then weights, of one chunk [kChunk, lanes]
  std::vector<S> acc;  // the panel's unnormalised outputs, transposed [v_dim, lanes]
  std::vector<S> kt;   // K^T [head_dim, kv_len padded to whole tiles], zero past kv_len
};

// Eigen 3.4 vectorises neither an array comparison nor select(), so the lane selections
// (the causal mask, the argmax update) go through its packet layer: its widest vector, any
// width, a scalar where there is none. (As lane loops, GCC 12 left them scalar: argmax at
// L = 128 21.4 ms instead of 18.2.)
namespace ei = Eigen::internal;
template <class S>
using Packet = typename ei::packet_traits<S>::type;
template <class S>
constexpr int kStep = ei::packet_traits<S>::size;  // lanes per packet
static_assert(kLanes<float> % kStep<float> == 0 && kLanes<double> % kStep<double> == 0);

// Rows i0 .. i0 + rows of q, scaled, transposed into w.qt; lanes past the last row are zero
// (their results are not written).
template <class S>
void load_queries(const pp_sdpa_args& a, const S* q, int64_t qr, int64_t i0, int64_t rows,
                  Work<S>& w) {
  constexpr int W = kLanes<S>;
  const S scale = static_cast<S>(a.scale);
  w.qt.assign(static_cast<std::size_t>(a.head_dim * W), S(0));
  S* __restrict qt = w.qt.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < a.head_dim; ++d) qt[d * W + r] = q[(i0 + r) * qr + d] * scale;
}

// K^T as a [head_dim, padded] panel, zero past kv_len: a tile's kTile elements of one head
// dimension lie in one or two cache lines, all addressed from one pointer, and the last
// partial tile reads zeros instead of past the last key.
template <class S>
int64_t transpose_keys(const pp_sdpa_args& a, const S* k, int64_t kr, Work<S>& w) {
  const int64_t padded = (a.kv_len + kTile - 1) / kTile * kTile;
  w.kt.assign(static_cast<std::size_t>(a.head_dim * padded), S(0));
  S* __restrict kt = w.kt.data();
  for (int64_t d = 0; d < a.head_dim; ++d)  // contiguous writes
    for (int64_t j = 0; j < a.kv_len; ++j) kt[d * padded + j] = k[j * kr + d];
  return padded;
}

// The scores of the panel against the kTile keys of K^T from kt: s[t] holds key t's score
// for every row of the panel. Each multiply-add takes one key element broadcast from memory.
template <class S>
[[gnu::always_inline]] inline void score_tile(const S* kt, int64_t padded, int64_t hd, const S* qt,
                                              std::array<Vec<S>, kTile>& s) {
  constexpr int W = kLanes<S>;
  for (Vec<S>& t : s) t.setZero();
  for (int64_t d = 0; d < hd; ++d) {
    const Vec<S> qd = Eigen::Map<const Vec<S>>(qt + d * W);
    const S* kd = kt + d * padded;
    for (int t = 0; t < kTile; ++t) s[t] += qd * kd[t];
  }
}

// Scores keys j0 .. j0 + n of the panel at row i0 (K^T in w.kt) into st [n, lanes], a tile at
// a time, with the causal mask applied (-inf where a row may not see a key).
template <class S>
void score_keys(const pp_sdpa_args& a, int64_t padded, int64_t i0, int64_t j0, int64_t n,
                Work<S>& w, S* st) {
  constexpr int W = kLanes<S>;
  const int64_t hd = a.head_dim;
  const S minus_inf = -std::numeric_limits<S>::infinity();
  std::array<Vec<S>, kTile> s;
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int64_t count = std::min<int64_t>(kTile, n - t0);
    score_tile<S>(w.kt.data() + j0 + t0, padded, hd, w.qt.data(), s);
    for (int64_t t = 0; t < count; ++t) Eigen::Map<Vec<S>>(st + (t0 + t) * W) = s[t];
    // Row i0 + r sees keys up to i0 + r: lanes r < j - i0 of key j are masked.
    for (int64_t t = 0; a.causal != 0 && t < count; ++t) {
      const int64_t j = j0 + t0 + t;
      if (j <= i0) continue;
      const Packet<S> limit = ei::pset1<Packet<S>>(S(j - i0)),
                      hidden = ei::pset1<Packet<S>>(minus_inf);
      for (int p = 0; p < W; p += kStep<S>) {
        S* sp = st + (t0 + t) * W + p;
        const Packet<S> lane = ei::plset<Packet<S>>(S(p));
        ei::pstoreu(sp, ei::pselect(ei::pcmp_lt(lane, limit), hidden, ei::ploadu<Packet<S>>(sp)));
      }
    }
  }
}

// The keys the panel at row i0 sees: all, or under the causal mask up to its last row's.
inline int64_t panel_keys(const pp_sdpa_args& a, int64_t i0, int lanes) {
  return a.causal != 0 ? std::min<int64_t>(a.kv_len, i0 + lanes) : a.kv_len;
}

// Argmax weighting: each row's output is the V row of its first largest score. Key 0 is
// taken unconditionally (as the explicit attention's scan, so a NaN first score stays), a
// later key only where its score is strictly larger.
template <class S>
void attend_argmax(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr,
                   const S* v, int64_t vr, S* out, int64_t outr, Work<S>& w) {
  constexpr int W = kLanes<S>;
  w.st.resize(static_cast<std::size_t>(kChunk * W));
  S* __restrict st = w.st.data();
  const int64_t padded = transpose_keys(a, k, kr, w);
  for (int64_t i0 = 0; i0 < a.q_len; i0 += W) {
    const int64_t rows = std::min<int64_t>(W, a.q_len - i0);
    load_queries(a, q, qr, i0, rows, w);
    const int64_t keys = panel_keys(a, i0, W);
    // Per packet of lanes: the best score so far and its index within the chunk (held as S,
    // exact below 2^24; whole indices per chunk in index), in two chains (even and odd keys;
    // one chain's compare and select per key measured slower than the tile's multiply-adds),
    // merged per chunk. The odd chain starts each chunk at -inf with an index past the chunk.
    constexpr int kPackets = W / kStep<S>;
    Packet<S> best[kPackets], at[kPackets], odd_best[kPackets], odd_at[kPackets];
    const Packet<S> one = ei::pset1<Packet<S>>(S(1)), two = ei::pset1<Packet<S>>(S(2));
    auto take = [](Packet<S>& b, Packet<S>& i, const Packet<S>& s, const Packet<S>& here) {
      const Packet<S> larger = ei::pcmp_lt(b, s);  // false for NaN either side
      b = ei::pselect(larger, s, b);
      i = ei::pselect(larger, here, i);
    };
    std::array<int64_t, W> index{};
    for (int64_t c0 = 0; c0 < keys; c0 += kChunk) {
      const int64_t n = std::min(kChunk, keys - c0);
      for (int p = 0; p < kPackets; ++p) {
        at[p] = ei::pset1<Packet<S>>(S(-1));
        odd_best[p] = ei::pset1<Packet<S>>(-std::numeric_limits<S>::infinity());
        odd_at[p] = ei::pset1<Packet<S>>(S(kChunk));
      }
      // A tile at a time, so that its compares overlap the next tile's multiply-adds.
      for (int64_t t0 = 0; t0 < n; t0 += kTile) {
        const int64_t count = std::min<int64_t>(kTile, n - t0);
        score_keys<S>(a, padded, i0, c0 + t0, count, w, st);
        int64_t t = 0;
        if (c0 + t0 == 0) {  // key 0
          for (int p = 0; p < kPackets; ++p) {
            best[p] = ei::ploadu<Packet<S>>(st + p * kStep<S>);
            at[p] = ei::pset1<Packet<S>>(S(0));
          }
          t = 1;
        }
        Packet<S> here = ei::pset1<Packet<S>>(S(t0 + t));
        for (; t + 2 <= count; t += 2, here = ei::padd(here, two))
          for (int p = 0; p < kPackets; ++p) {
            take(best[p], at[p], ei::ploadu<Packet<S>>(st + t * W + p * kStep<S>), here);
            take(odd_best[p], odd_at[p], ei::ploadu<Packet<S>>(st + (t + 1) * W + p * kStep<S>),
                 ei::padd(here, one));
          }
        if (t < count)
          for (int p = 0; p < kPackets; ++p)
            take(best[p], at[p], ei::ploadu<Packet<S>>(st + t * W + p * kStep<S>), here);
      }
      // The odd chain wins where larger, or equal at an earlier key of this chunk.
      for (int p = 0; p < kPackets; ++p) {
        const Packet<S> wins =
            ei::por(ei::pcmp_lt(best[p], odd_best[p]),
                    ei::pand(ei::pcmp_eq(best[p], odd_best[p]), ei::pcmp_lt(odd_at[p], at[p])));
        best[p] = ei::pselect(wins, odd_best[p], best[p]);
        at[p] = ei::pselect(wins, odd_at[p], at[p]);
      }
      std::array<S, W> at_lanes;
      for (int p = 0; p < kPackets; ++p) ei::pstoreu(at_lanes.data() + p * kStep<S>, at[p]);
      for (int r = 0; r < W; ++r)
        if (at_lanes[r] >= S(0))
          index[static_cast<std::size_t>(r)] = c0 + static_cast<int64_t>(at_lanes[r]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const S* vb = v + index[static_cast<std::size_t>(r)] * vr;
      std::copy(vb, vb + a.v_dim, out + (i0 + r) * outr);
    }
  }
}

// acc[c, :] += sum_j p[j, :] V[j, c] for C of V's columns from c: C independent chains of
// multiply-adds, each taking one element of V broadcast from memory.
template <class S, int C>
[[gnu::always_inline]] inline void weigh_values(const S* v, int64_t vr, int64_t c, int64_t n,
                                                const S* p, S* acc) {
  constexpr int W = kLanes<S>;
  std::array<Vec<S>, C> sum;
  for (int cc = 0; cc < C; ++cc) sum[cc] = Eigen::Map<const Vec<S>>(acc + (c + cc) * W);
  for (int64_t j = 0; j < n; ++j) {
    const Vec<S> pj = Eigen::Map<const Vec<S>>(p + j * W);
    const S* vj = v + j * vr + c;
    for (int cc = 0; cc < C; ++cc) sum[cc] += pj * vj[cc];
  }
  for (int cc = 0; cc < C; ++cc) Eigen::Map<Vec<S>>(acc + (c + cc) * W) = sum[cc];
}

// Softmax weighting, a chunk of keys at a time: scores into the panel (and their maximum),
// the rescale of what earlier chunks summed if the maximum rose, one exp per key, P V.
template <class S>
void attend_softmax(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr,
                    const S* v, int64_t vr, S* out, int64_t outr, Work<S>& w) {
  constexpr int W = kLanes<S>;
  const int64_t dv = a.v_dim;
  const S minus_inf = -std::numeric_limits<S>::infinity();
  w.st.resize(static_cast<std::size_t>(kChunk * W));
  w.acc.resize(static_cast<std::size_t>(dv * W));
  S* __restrict st = w.st.data();
  S* __restrict acc = w.acc.data();
  const int64_t padded = transpose_keys(a, k, kr, w);
  for (int64_t i0 = 0; i0 < a.q_len; i0 += W) {
    const int64_t rows = std::min<int64_t>(W, a.q_len - i0);
    load_queries(a, q, qr, i0, rows, w);
    const int64_t keys = panel_keys(a, i0, W);
    Vec<S> m = Vec<S>::Constant(minus_inf), l = Vec<S>::Zero();
    std::fill(acc, acc + dv * W, S(0));
    for (int64_t c0 = 0; c0 < keys; c0 += kChunk) {
      const int64_t n = std::min(kChunk, keys - c0);
      score_keys<S>(a, padded, i0, c0, n, w, st);
      std::array<Vec<S>, 4> tops;  // four chains of maxima, not one
      tops.fill(m);
      for (int64_t j = 0; j < n; ++j)
        tops[j & 3] = tops[j & 3].max(Eigen::Map<const Vec<S>>(st + j * W));
      const Vec<S> top = tops[0].max(tops[1]).max(tops[2].max(tops[3]));
      if (c0 > 0) {  // key 0 is seen by every row, so m is finite here
        const Vec<S> rescale = (m - top).exp();
        l *= rescale;
        for (int64_t c = 0; c < dv; ++c) Eigen::Map<Vec<S>>(acc + c * W) *= rescale;
      }
      m = top;
      for (int64_t j = 0; j < n; ++j) {
        Eigen::Map<Vec<S>> p(st + j * W);
        p = (p - m).exp();
        l += p;
      }
      const S* vc = v + c0 * vr;
      int64_t c = 0;
      for (; c + kColumns <= dv; c += kColumns) weigh_values<S, kColumns>(vc, vr, c, n, st, acc);
      if (c + 8 <= dv) weigh_values<S, 8>(vc, vr, c, n, st, acc), c += 8;
      if (c + 4 <= dv) weigh_values<S, 4>(vc, vr, c, n, st, acc), c += 4;
      if (c + 2 <= dv) weigh_values<S, 2>(vc, vr, c, n, st, acc), c += 2;
      if (c < dv) weigh_values<S, 1>(vc, vr, c, n, st, acc);
    }
    const Vec<S> inv = l.inverse();
    for (int64_t r = 0; r < rows; ++r) {
      S* o = out + (i0 + r) * outr;
      for (int64_t c = 0; c < dv; ++c) o[c] = acc[c * W + r] * inv(r);
    }
  }
}

template <class S>
void attend_any(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr, const S* v,
                int64_t vr, S* out, int64_t outr, Work<S>& w) {
  if (a.weighting == PP_SDPA_ARGMAX)
    attend_argmax<S>(a, q, qr, k, kr, v, vr, out, outr, w);
  else
    attend_softmax<S>(a, q, qr, k, kr, v, vr, out, outr, w);
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
