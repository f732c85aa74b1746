// Fused attention on the CPU, a panel of query rows at a time: the rows of a panel are the
// lanes of one or two vectors (16 or 32 floats, 8 or 16 doubles), so every per-row quantity
// (the running maximum, the softmax sum, the argmax and its index, the causal mask) is one
// vector per vector of rows and needs no horizontal reduction. K is transposed once per
// problem into a [head_dim, keys] panel and the panel's scaled queries into [head_dim, rows]
// (square blocks through Eigen's in-register transpose); a tile of keys is scored as
// independent vectors (16 keys for one vector of rows, 8 keys x 2 vectors for two, each
// broadcast key element then feeding two multiply-adds), each a chain of multiply-adds over
// the head dimension (Q K^T as a register-blocked product). The scores of a chunk of keys
// stay in an L1 panel; then one vectorised exp per key over the panel, and P V as a second
// register-blocked product (16 of V's columns accumulated over the chunk's keys, or 8 x 2
// vectors). Panels are two vectors wide while more than one vector's rows remain (measured
// faster at L = 64 and 128), one otherwise (L = 6, and a last panel of up to 16 rows). Each
// chunk's maximum is exact, so with up to one chunk of keys (kChunk) there is no rescaling at
// all; beyond, the online softmax rescales the sum and the output once per chunk. No
// [q_len, kv_len] score matrix exists. Argmax weighting keeps each row's first largest score
// in key order instead (a later key replaces only a strictly larger one), the explicit
// attention's tie rule. Keys a row may not see weigh exactly 0 (exp(-inf)); a masked key's
// NaN or infinite score, which the explicit attention skips, can make a softmax row NaN here
// (finite inputs are unaffected).
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
constexpr int kLanes = 64 / static_cast<int>(sizeof(S));  // rows per 512-bit vector
// A panel is V vectors of query rows (V = 1 or 2). Per V: the keys scored at once (a tile:
// kTile x V independent chains of multiply-adds) and V's columns accumulated at once in P V
// (kColumns x V chains), within the 32 vector registers.
template <int V>
constexpr int kTile = V == 1 ? 16 : 8;
template <int V>
constexpr int kColumns = V == 1 ? 16 : 8;
constexpr int kPad = 16;         // K^T's keys padded to a multiple of this, of every kTile
constexpr int64_t kChunk = 256;  // keys whose scores a panel holds, a multiple of every kTile
static_assert(kPad % kTile<1> == 0 && kPad % kTile<2> == 0 && kChunk % kPad == 0);

template <class S>
using Vec = Eigen::Array<S, kLanes<S>, 1>;
template <class S, int N>
using Vecs = std::array<Vec<S>, static_cast<std::size_t>(N)>;  // N vectors, meant as registers

template <class S>
struct Work {
  std::vector<S> qt;   // the panel's scaled queries, transposed [head_dim, rows]
  std::vector<S> st;   // the panel's scores, then weights, of one chunk [kChunk, rows]
  std::vector<S> acc;  // the panel's unnormalised outputs, transposed [v_dim, rows]
  std::vector<S> kt;   // K^T [head_dim, kv_len padded to kPad], zero past kv_len
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
static_assert(kPad % kStep<float> == 0 && kPad % kStep<double> == 0);

// Square blocks of one packet's lanes, transposed in registers (Eigen's ptranspose): the
// transposes of Q and K into panels and of the outputs out of them. (Element by element,
// they took a third of softmax at L = 64.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // a PacketBlock of a vector type
template <class S>
using Block = ei::PacketBlock<Packet<S>, kStep<S>>;

// Into a panel of `lanes` lanes (a multiple of kStep): dst[c * ds + r] = src[r * ss + c] *
// scale for c < cols and r < rows, and 0 for rows <= r < lanes. Rows past `rows` are not read.
template <class S>
void transpose_into(const S* src, int64_t ss, int64_t rows, int64_t cols, S scale, S* dst,
                    int64_t ds, int64_t lanes) {
  constexpr int P = kStep<S>;
  const Packet<S> factor = ei::pset1<Packet<S>>(scale), zero = ei::pset1<Packet<S>>(S(0));
  const int64_t whole = cols / P * P;
  for (int64_t r0 = 0; r0 < lanes; r0 += P) {
    const int64_t n = std::clamp<int64_t>(rows - r0, 0, P);  // rows of src in this block
    for (int64_t c0 = 0; c0 < whole; c0 += P) {
      Block<S> block;
      for (int i = 0; i < P; ++i)
        block.packet[i] =
            i < n ? ei::pmul(ei::ploadu<Packet<S>>(src + (r0 + i) * ss + c0), factor) : zero;
      ei::ptranspose(block);
      for (int i = 0; i < P; ++i) ei::pstoreu(dst + (c0 + i) * ds + r0, block.packet[i]);
    }
    for (int64_t c = whole; c < cols; ++c)
      for (int i = 0; i < P; ++i)
        dst[c * ds + r0 + i] = i < n ? src[(r0 + i) * ss + c] * scale : S(0);
  }
}

// Out of a panel: dst[r * ds + c] = src[c * ss + r] for r < rows and c < cols. Only those
// elements of dst are written; src's lanes are read up to rows rounded up to kStep.
template <class S>
void transpose_out(const S* src, int64_t ss, int64_t rows, int64_t cols, S* dst, int64_t ds) {
  constexpr int P = kStep<S>;
  const int64_t whole = cols / P * P;
  for (int64_t r0 = 0; r0 < rows; r0 += P) {
    const int64_t n = std::min<int64_t>(rows - r0, P);  // rows of dst in this block
    for (int64_t c0 = 0; c0 < whole; c0 += P) {
      Block<S> block;
      for (int i = 0; i < P; ++i) block.packet[i] = ei::ploadu<Packet<S>>(src + (c0 + i) * ss + r0);
      ei::ptranspose(block);
      for (int i = 0; i < n; ++i) ei::pstoreu(dst + (r0 + i) * ds + c0, block.packet[i]);
    }
    for (int64_t r = r0; r < r0 + n; ++r)
      for (int64_t c = whole; c < cols; ++c) dst[r * ds + c] = src[c * ss + r];
  }
}
#pragma GCC diagnostic pop

// Rows i0 .. i0 + rows of q, scaled, transposed into w.qt [head_dim, W]; lanes past the last
// row are zero (their results are not written).
template <class S, int W>
void load_queries(const pp_sdpa_args& a, const S* q, int64_t qr, int64_t i0, int64_t rows,
                  Work<S>& w) {
  w.qt.resize(static_cast<std::size_t>(a.head_dim * W));
  transpose_into(q + i0 * qr, qr, rows, a.head_dim, static_cast<S>(a.scale), w.qt.data(), W, W);
}

// K^T as a [head_dim, padded] panel, zero past kv_len: a tile's elements of one head
// dimension lie in one or two cache lines, all addressed from one pointer, and the last
// partial tile reads zeros instead of past the last key.
template <class S>
int64_t transpose_keys(const pp_sdpa_args& a, const S* k, int64_t kr, Work<S>& w) {
  const int64_t padded = (a.kv_len + kPad - 1) / kPad * kPad;
  w.kt.resize(static_cast<std::size_t>(a.head_dim * padded));
  transpose_into(k, kr, a.kv_len, a.head_dim, S(1), w.kt.data(), padded, padded);
  return padded;
}

// The scores of a panel of V vectors against the kTile<V> keys of K^T from kt: s[t * V + v]
// holds key t's score for vector v of the panel's rows. Each key element is broadcast once
// and feeds V multiply-adds.
template <class S, int V>
[[gnu::always_inline]] inline void score_tile(const S* kt, int64_t padded, int64_t hd, const S* qt,
                                              Vecs<S, kTile<V> * V>& s) {
  constexpr int L = kLanes<S>, W = V * L;
  for (Vec<S>& t : s) t.setZero();
  for (int64_t d = 0; d < hd; ++d) {
    Vecs<S, V> qd;
    for (int v = 0; v < V; ++v) qd[v] = Eigen::Map<const Vec<S>>(qt + d * W + v * L);
    const S* kd = kt + d * padded;
    for (int t = 0; t < kTile<V>; ++t) {
      const S key = kd[t];
      for (int v = 0; v < V; ++v) s[t * V + v] += qd[v] * key;
    }
  }
}

// Scores keys j0 .. j0 + n of the panel of V vectors at row i0 (K^T in w.kt) into st
// [n, V x lanes], a tile at a time, with the causal mask applied (-inf where a row may not
// see a key).
template <class S, int V>
void score_keys(const pp_sdpa_args& a, int64_t padded, int64_t i0, int64_t j0, int64_t n,
                Work<S>& w, S* st) {
  constexpr int L = kLanes<S>, W = V * L, T = kTile<V>;
  const int64_t hd = a.head_dim;
  const S minus_inf = -std::numeric_limits<S>::infinity();
  Vecs<S, T * V> s;
  for (int64_t t0 = 0; t0 < n; t0 += T) {
    const int64_t count = std::min<int64_t>(T, n - t0);
    score_tile<S, V>(w.kt.data() + j0 + t0, padded, hd, w.qt.data(), s);
    for (int64_t t = 0; t < count; ++t)
      for (int v = 0; v < V; ++v) Eigen::Map<Vec<S>>(st + (t0 + t) * W + v * L) = s[t * V + v];
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

// Calls panel(std::integral_constant<int, V>{}, i0, rows, keys) for each panel of query rows
// (rows from i0, the keys it sees: all, or under the causal mask up to its last row's) with
// its scaled queries in w.qt: two vectors of rows while more than one vector's rows remain,
// else one.
template <class S, class Panel>
void for_each_panel(const pp_sdpa_args& a, const S* q, int64_t qr, Work<S>& w, Panel&& panel) {
  constexpr int L = kLanes<S>;
  for (int64_t i0 = 0; i0 < a.q_len;) {
    auto one = [&](auto vectors) {
      constexpr int W = decltype(vectors)::value * L;
      const int64_t rows = std::min<int64_t>(W, a.q_len - i0);
      load_queries<S, W>(a, q, qr, i0, rows, w);
      const int64_t keys = a.causal != 0 ? std::min<int64_t>(a.kv_len, i0 + W) : a.kv_len;
      panel(vectors, i0, rows, keys);
      i0 += W;
    };
    if (a.q_len - i0 > L)
      one(std::integral_constant<int, 2>{});
    else
      one(std::integral_constant<int, 1>{});
  }
}

// Argmax weighting of the panel of V vectors at row i0: each row's output is the V row of
// its first largest score. Key 0 is taken unconditionally (as the explicit attention's scan,
// so a NaN first score stays), a later key only where its score is strictly larger.
template <class S, int V>
void argmax_panel(const pp_sdpa_args& a, int64_t padded, int64_t i0, int64_t rows, int64_t keys,
                  const S* v, int64_t vr, S* out, int64_t outr, Work<S>& w) {
  constexpr int W = V * kLanes<S>, T = kTile<V>;
  S* __restrict st = w.st.data();
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
    for (int64_t t0 = 0; t0 < n; t0 += T) {
      const int64_t count = std::min<int64_t>(T, n - t0);
      score_keys<S, V>(a, padded, i0, c0 + t0, count, w, st);
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

// acc[c, :] += sum_j p[j, :] V[j, c] for C of V's columns from c, over a panel of V vectors
// of rows: C x V independent chains of multiply-adds, each element of V broadcast once and
// feeding V of them.
template <class S, int V, int C>
[[gnu::always_inline]] inline void weigh_values(const S* v, int64_t vr, int64_t c, int64_t n,
                                                const S* p, S* acc) {
  constexpr int L = kLanes<S>, W = V * L;
  Vecs<S, C * V> sum;
  for (int cc = 0; cc < C; ++cc)
    for (int u = 0; u < V; ++u)
      sum[cc * V + u] = Eigen::Map<const Vec<S>>(acc + (c + cc) * W + u * L);
  for (int64_t j = 0; j < n; ++j) {
    Vecs<S, V> pj;
    for (int u = 0; u < V; ++u) pj[u] = Eigen::Map<const Vec<S>>(p + j * W + u * L);
    const S* vj = v + j * vr + c;
    for (int cc = 0; cc < C; ++cc) {
      const S value = vj[cc];
      for (int u = 0; u < V; ++u) sum[cc * V + u] += pj[u] * value;
    }
  }
  for (int cc = 0; cc < C; ++cc)
    for (int u = 0; u < V; ++u) Eigen::Map<Vec<S>>(acc + (c + cc) * W + u * L) = sum[cc * V + u];
}

// Softmax weighting of the panel of V vectors at row i0, a chunk of keys at a time: scores
// into the panel (and their maximum), the rescale of what earlier chunks summed if the
// maximum rose, one exp per key, P V.
template <class S, int V>
void softmax_panel(const pp_sdpa_args& a, int64_t padded, int64_t i0, int64_t rows, int64_t keys,
                   const S* v, int64_t vr, S* out, int64_t outr, Work<S>& w) {
  constexpr int L = kLanes<S>, W = V * L, C = kColumns<V>;
  const int64_t dv = a.v_dim;
  S* __restrict st = w.st.data();
  S* __restrict acc = w.acc.data();
  Vecs<S, V> m, l;
  for (int u = 0; u < V; ++u) {
    m[u].setConstant(-std::numeric_limits<S>::infinity());
    l[u].setZero();
  }
  std::fill(acc, acc + dv * W, S(0));
  for (int64_t c0 = 0; c0 < keys; c0 += kChunk) {
    const int64_t n = std::min(kChunk, keys - c0);
    score_keys<S, V>(a, padded, i0, c0, n, w, st);
    for (int u = 0; u < V; ++u) {
      Vecs<S, 4> tops;  // four chains of maxima, not one
      tops.fill(m[u]);
      for (int64_t j = 0; j < n; ++j)
        tops[j & 3] = tops[j & 3].max(Eigen::Map<const Vec<S>>(st + j * W + u * L));
      const Vec<S> top = tops[0].max(tops[1]).max(tops[2].max(tops[3]));
      if (c0 > 0) {  // key 0 is seen by every row, so m is finite here
        const Vec<S> rescale = (m[u] - top).exp();
        l[u] *= rescale;
        for (int64_t c = 0; c < dv; ++c) Eigen::Map<Vec<S>>(acc + c * W + u * L) *= rescale;
      }
      m[u] = top;
    }
    for (int64_t j = 0; j < n; ++j)
      for (int u = 0; u < V; ++u) {
        Eigen::Map<Vec<S>> p(st + j * W + u * L);
        p = (p - m[u]).exp();
        l[u] += p;
      }
    const S* vc = v + c0 * vr;
    int64_t c = 0;
    for (; c + C <= dv; c += C) weigh_values<S, V, C>(vc, vr, c, n, st, acc);
    if constexpr (C > 8) {
      if (c + 8 <= dv) weigh_values<S, V, 8>(vc, vr, c, n, st, acc), c += 8;
    }
    if (c + 4 <= dv) weigh_values<S, V, 4>(vc, vr, c, n, st, acc), c += 4;
    if (c + 2 <= dv) weigh_values<S, V, 2>(vc, vr, c, n, st, acc), c += 2;
    if (c < dv) weigh_values<S, V, 1>(vc, vr, c, n, st, acc);
  }
  for (int u = 0; u < V; ++u) {
    const Vec<S> inv = l[u].inverse();
    for (int64_t c = 0; c < dv; ++c) Eigen::Map<Vec<S>>(acc + c * W + u * L) *= inv;
  }
  transpose_out(acc, W, rows, dv, out + i0 * outr, outr);
}

// One problem: K transposed, then every panel of query rows weighted by argmax or softmax.
template <class S>
void attend(const pp_sdpa_args& a, const S* q, int64_t qr, const S* k, int64_t kr, const S* v,
            int64_t vr, S* out, int64_t outr, Work<S>& w) {
  w.st.resize(static_cast<std::size_t>(kChunk * 2 * kLanes<S>));
  w.acc.resize(static_cast<std::size_t>(a.v_dim * 2 * kLanes<S>));
  const int64_t padded = transpose_keys(a, k, kr, w);
  for_each_panel<S>(a, q, qr, w, [&](auto vectors, int64_t i0, int64_t rows, int64_t keys) {
    constexpr int V = decltype(vectors)::value;
    if (a.weighting == PP_SDPA_ARGMAX)
      argmax_panel<S, V>(a, padded, i0, rows, keys, v, vr, out, outr, w);
    else
      softmax_panel<S, V>(a, padded, i0, rows, keys, v, vr, out, outr, w);
  });
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
  if (std::string why = check_args(args, PP_DEVICE_TYPE_CPU); !why.empty())
    throw std::invalid_argument(why);
  if (args.dtype == PP_DTYPE_F32)
    run_typed<float>(args);
  else
    run_typed<double>(args);
}

}  // namespace polyprobe::attention_sdpa
