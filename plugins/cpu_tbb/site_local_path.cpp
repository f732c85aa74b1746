// The site-local path: a particle whose coordinates all lie in one convolution,
// self-attention or hard mixture-of-experts layer.
//
// The incumbent's activations before the layer are reused (prefix reuse). The layer's
// output for each candidate is the incumbent's with only what the moved parameters own
// recomputed:
//   - conv1d / conv2d: a moved weight W[o, c, ki, kj] adds delta * (the input of channel c
//     shifted by the tap) to output channel o, a moved bias delta to the whole channel; the
//     shifted inputs are gathered once per group;
//   - self_attention: a moved q/k/v row (weight or bias) changes one head: its q/k/v columns
//     are the incumbent's plus delta * x[:, i] (or + delta), its scores, weights (softmax or
//     argmax) and mix are recomputed, and out += (mix_new - mix_old) W_o[:, head]^T; a moved
//     out_proj weight W_o[e, j] adds delta * mix[:, j] to output column e (the new mix when
//     head(j) moved as well), an out_proj bias delta to the column. When the host offers the
//     "sdpa" operation (operations.h; the attention_sdpa plugin), a group's candidates go
//     through it together: per moved head, one fused call over (candidate, sample) in which
//     the q/k/v parts the particle does not move are the incumbent's, shared (stride 0).
//     Argmax attention needs no recomputed head for the common particles: one moved q or k
//     row changes the head's scores by a rank-one term, so each query's new key costs one
//     pass over the keys and only the queries whose key changes change; moved v rows keep
//     every key; out_proj moves are linear (attention_fast_apply);
//   - moe: a moved expert row changes that output column of the tokens the expert serves;
//     a moved router entry may send tokens to another expert, whose rows are then
//     recomputed with it.
// A conv with a channel-local tail (channel_tail.hpp: ReLU, pooling, flatten, then an affine
// layer) carries each moved channel alone through the tail, a few samples at a time, and adds
// (slice_new - slice_old) W[:, slice]^T to the affine layer's incumbent output, so the
// channels the particle does not move are never recomputed. A moe, and argmax attention's
// q/k rows, carry their changed values through the verified elementwise layers after them
// (ReLU, flatten, ...) into the next affine layer's output the same way (the feature tail).
// The rest of the model then runs once over the group's candidates stacked as
// [candidates * batch, features] rows (one GEMM per affine layer, host forwards otherwise),
// and each candidate's loss comes from its rows, plus the l2 term.
//
// The per-site computation is the plugin's reading of the layer's attributes, so it is
// probed once when the evaluator is built: on a random input and random parameters, for
// several random perturbations, it must agree with the layer's own forward. A layer that
// fails (or whose kind or attributes the plugin does not know) is declined with the reason.
#include "site_local_path.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

namespace polyprobe::cpu_tbb {
namespace {

template <class S>
using MapMat = Eigen::Map<Mat<S>>;
template <class S>
using ConstMapMat = Eigen::Map<const Mat<S>>;

// --- conv

// The shifted input of every moved weight, for every sample: w.cols [moves, batch * P].
template <class S>
void conv_gather(const SiteLayer& L, const S* x, int64_t batch, SiteWork<S>& w) {
  const int64_t positions = L.positions(), patch = L.patch(), taps = L.kh * L.kw;
  const int64_t in_features = L.c_in * L.h * L.w, weights = L.c_out * patch;
  const int64_t group_out = L.c_out / L.groups, group_in = L.c_in / L.groups;
  w.cols.resize(static_cast<int64_t>(w.param.size()), batch * positions);
  for (std::size_t t = 0; t < w.param.size(); ++t) {
    const int64_t p = w.param[t];
    if (p >= weights) continue;  // a bias: no input
    const int64_t o = p / patch, rem = p % patch, c = rem / taps, k = rem % taps;
    const int64_t channel = (o / group_out) * group_in + c;
    const SiteLayer::TapRun* first = L.runs.data() + L.run_begin[static_cast<std::size_t>(k)];
    const SiteLayer::TapRun* last = L.runs.data() + L.run_begin[static_cast<std::size_t>(k) + 1];
    for (int64_t b = 0; b < batch; ++b) {
      const S* src = x + b * in_features + channel * L.h * L.w;
      S* dst = w.cols.row(static_cast<int64_t>(t)).data() + b * positions;
      for (const SiteLayer::TapRun* run = first; run != last; ++run) {
        S* out = dst + run->first;
        if (run->src < 0)
          std::fill_n(out, run->length, S(0));
        else if (L.sw == 1)
          std::copy_n(src + run->src, run->length, out);
        else
          for (int32_t j = 0; j < run->length; ++j) out[j] = src[run->src + j * L.sw];
      }
    }
  }
}

// The output channel a moved conv parameter (weight or bias) belongs to.
int64_t conv_channel(const SiteLayer& L, int64_t param) {
  const int64_t weights = L.c_out * L.patch();
  return param >= weights ? param - weights : param / L.patch();
}

// out [batch, c_out * P] holds the incumbent's output; adds the moved parameters' change.
// With `only` >= 0, out [count, P] holds channel `only` of samples [first, first + count)
// alone, and only that channel's parameters apply.
template <class S>
void conv_apply(const SiteLayer& L, int64_t batch, const SiteWork<S>& w, S* out, int64_t only = -1,
                int64_t first = 0) {
  const int64_t positions = L.positions(), weights = L.c_out * L.patch();
  const int64_t row = only < 0 ? L.c_out * positions : positions;
  for (std::size_t t = 0; t < w.param.size(); ++t) {
    const int64_t p = w.param[t];
    const S delta = w.delta[t];
    const int64_t o = conv_channel(L, p);
    if (delta == S(0) || (only >= 0 && o != only)) continue;
    const bool is_bias = p >= weights;
    for (int64_t b = 0; b < batch; ++b) {
      Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>> dst(
          out + b * row + (only < 0 ? o * positions : 0), positions);
      if (is_bias)
        dst += delta;
      else
        dst += delta *
               Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>(
                   w.cols.row(static_cast<int64_t>(t)).data() + (first + b) * positions, positions);
    }
  }
}

// --- self-attention

// Turns each row of scores into attention weights, as the layer does: over the keys the
// row sees (all, or j <= r when causal; the others get weight 0).
template <class S>
void weigh_rows(const SiteLayer& L, typename SiteWork<S>::M& scores) {
  for (Eigen::Index r = 0; r < scores.rows(); ++r) {
    const Eigen::Index visible = L.causal ? std::min(r + 1, scores.cols()) : scores.cols();
    auto row = scores.row(r).head(visible);
    Eigen::Index best = 0;
    for (Eigen::Index c = 1; c < visible; ++c)
      if (row(c) > row(best)) best = c;
    scores.row(r).tail(scores.cols() - visible).setZero();
    if (L.argmax) {
      row.setZero();
      row(best) = S(1);
    } else {
      const S top = row(best);
      row = (row.array() - top).exp().matrix();
      row /= row.sum();
    }
  }
}

template <class S>
S attention_scale(const SiteLayer& L) {
  return S(1) / std::sqrt(static_cast<S>(L.head_dim()));
}

// The incumbent's q|k|v [batch * L, 3E] and mix [batch * L, E] of every sample, and with
// `keys` (argmax attention) its keys.
template <class S>
void attention_base(const SiteLayer& L, const S* x, int64_t batch, const S* params, Mat<S>& qkv,
                    Mat<S>& mixed, SiteWork<S>& w, ArgmaxKeys<S>* keys = nullptr) {
  const int64_t len = L.length, e = L.embed, hd = L.head_dim();
  const S scale = attention_scale<S>(L);
  const ConstMapMat<S> in_weight(params, 3 * e, e);
  qkv.resize(batch * len, 3 * e);
  mixed.resize(batch * len, e);
  qkv.noalias() = ConstMapMat<S>(x, batch * len, e) * in_weight.transpose();
  if (L.bias)
    qkv.rowwise() +=
        Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(params + 3 * e * e, 3 * e);
  if (keys != nullptr) {
    const auto queries = static_cast<std::size_t>(batch * L.heads * len);
    keys->scores.resize(batch * L.heads * len, len);
    keys->picks.resize(queries);
    keys->margin.resize(queries);
    keys->magnitude.resize(queries);
    keys->key_range.resize(batch, 2 * e);
    for (int64_t b = 0; b < batch; ++b) {
      const auto columns = qkv.block(b * len, 0, len, 2 * e);
      keys->key_range.row(b) = columns.colwise().maxCoeff() - columns.colwise().minCoeff();
    }
  }
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < L.heads; ++h) {
      const auto rows = qkv.middleRows(b * len, len);
      w.scores.noalias() =
          (rows.middleCols(h * hd, hd) * scale) * rows.middleCols(e + h * hd, hd).transpose();
      if (keys != nullptr)
        for (int64_t r = 0; r < len; ++r) {
          const auto q = static_cast<std::size_t>((b * L.heads + h) * len + r);
          const int64_t visible = L.causal ? r + 1 : len;
          const auto row = w.scores.row(r).head(visible);
          int64_t best = 0;  // as weigh_rows picks
          for (int64_t c = 1; c < visible; ++c)
            if (row(c) > row(best)) best = c;
          S other = -std::numeric_limits<S>::infinity();
          for (int64_t c = 0; c < visible; ++c)
            if (c != best) other = std::max(other, row(c));
          keys->picks[q] = static_cast<int32_t>(best);
          keys->margin[q] = row(best) - other;
          keys->magnitude[q] = row.cwiseAbs().maxCoeff();
          keys->scores.row(static_cast<Eigen::Index>(q)) = w.scores.row(r);
        }
      weigh_rows<S>(L, w.scores);
      mixed.block(b * len, h * hd, len, hd).noalias() =
          w.scores * rows.middleCols(2 * e + h * hd, hd);
    }
}

// The heads whose q/k/v rows (weights or biases) move, from w.param.
template <class S>
void attention_setup(const SiteLayer& L, SiteWork<S>& w) {
  const int64_t e = L.embed, hd = L.head_dim(), in_end = 3 * e * e + (L.bias ? 3 * e : 0);
  w.head_moved.assign(static_cast<std::size_t>(L.heads), 0);
  for (const int64_t p : w.param) {
    if (p >= in_end) continue;
    const int64_t row = p < 3 * e * e ? p / e : p - 3 * e * e;
    w.head_moved[static_cast<std::size_t>((row % e) / hd)] = 1;
  }
  w.heads.clear();
  for (int64_t h = 0; h < L.heads; ++h)
    if (w.head_moved[static_cast<std::size_t>(h)] != 0) w.heads.push_back(h);
}

// out [batch, L * E] holds the incumbent's output; adds the moved parameters' change.
template <class S>
void attention_apply(const SiteLayer& L, const S* x, int64_t batch, const S* params,
                     const Mat<S>& qkv, const Mat<S>& mixed, SiteWork<S>& w, S* out) {
  const int64_t len = L.length, e = L.embed, hd = L.head_dim();
  const int64_t in_w_end = 3 * e * e, in_end = in_w_end + (L.bias ? 3 * e : 0);
  const int64_t out_w = L.out_weight_offset(), out_w_end = out_w + e * e;
  const S scale = attention_scale<S>(L);
  const ConstMapMat<S> out_weight(params + out_w, e, e);
  w.qkv.resize(len, 3 * hd);
  w.mix.resize(len, e);
  w.diff.resize(len, hd);
  for (int64_t b = 0; b < batch; ++b) {
    const ConstMapMat<S> tokens(x + b * len * e, len, e);
    MapMat<S> y(out + b * len * e, len, e);
    const auto base_qkv = qkv.middleRows(b * len, len);
    const auto base_mix = mixed.middleRows(b * len, len);
    for (const int64_t h : w.heads) {
      w.qkv.leftCols(hd) = base_qkv.middleCols(h * hd, hd);
      w.qkv.middleCols(hd, hd) = base_qkv.middleCols(e + h * hd, hd);
      w.qkv.rightCols(hd) = base_qkv.middleCols(2 * e + h * hd, hd);
      for (std::size_t t = 0; t < w.param.size(); ++t) {
        const int64_t p = w.param[t];
        if (p >= in_end) continue;
        const bool is_bias = p >= in_w_end;
        const int64_t row = is_bias ? p - in_w_end : p / e;
        if ((row % e) / hd != h) continue;
        const int64_t col = (row / e) * hd + row % hd;  // part (q, k, v) * hd + within the head
        if (is_bias)
          w.qkv.col(col).array() += w.delta[t];
        else
          w.qkv.col(col) += w.delta[t] * tokens.col(p % e);
      }
      w.scores.noalias() = (w.qkv.leftCols(hd) * scale) * w.qkv.middleCols(hd, hd).transpose();
      weigh_rows<S>(L, w.scores);
      w.mix.middleCols(h * hd, hd).noalias() = w.scores * w.qkv.rightCols(hd);
      w.diff = w.mix.middleCols(h * hd, hd) - base_mix.middleCols(h * hd, hd);
      y.noalias() += w.diff * out_weight.middleCols(h * hd, hd).transpose();
    }
    for (std::size_t t = 0; t < w.param.size(); ++t) {
      const int64_t p = w.param[t];
      if (p < out_w) continue;
      if (p < out_w_end) {
        const int64_t row = (p - out_w) / e, j = (p - out_w) % e;
        if (w.head_moved[static_cast<std::size_t>(j / hd)] != 0)
          y.col(row) += w.delta[t] * w.mix.col(j);
        else
          y.col(row) += w.delta[t] * base_mix.col(j);
      } else {
        y.col(p - out_w_end).array() += w.delta[t];
      }
    }
  }
}

// The forms of particle whose change argmax attention computes without recomputing a head
// (attention_fast_apply); anything else takes attention_apply.
enum class AttentionForm { general, qk_row, v_rows, out_proj };

template <class S>
AttentionForm attention_form(const SiteLayer& L, const SiteWork<S>& w) {
  if (!L.argmax) return AttentionForm::general;
  const int64_t e = L.embed, in_w_end = 3 * e * e, in_end = in_w_end + (L.bias ? 3 * e : 0);
  if (w.param.front() >= L.out_weight_offset()) return AttentionForm::out_proj;
  if (w.param.back() >= in_end) return AttentionForm::general;
  const auto row = [&](int64_t p) { return p < in_w_end ? p / e : p - in_w_end; };
  bool one_row = true, all_v = true;
  for (const int64_t p : w.param) {
    one_row = one_row && row(p) == row(w.param.front());
    all_v = all_v && row(p) >= 2 * e;
  }
  if (all_v) return AttentionForm::v_rows;
  return one_row ? AttentionForm::qk_row : AttentionForm::general;
}

// out [batch, L * E] holds the incumbent's output; adds the change of a particle of `form`
// (not general) of argmax attention (a q or k row with out null: appends each changed output
// row to w.changes instead), from the incumbent's q|k|v, mix, scores and picks
// (attention_base):
//   - one q (or k) row: the head's scores change by scale * dq k^T (or q dk^T), rank one, so
//     each query's new pick costs one pass over its keys, and only queries whose pick changes
//     change the mix: out_r += (v_new - v_old) W_o[:, head]^T;
//   - v rows: the picks stay; out_r += dv[pick_r] W_o[:, j] per moved row j;
//   - out_proj: out[:, e] += delta * mix[:, j] (or delta for the bias).
template <class S>
void attention_fast_apply(const SiteLayer& L, AttentionForm form, const S* x, int64_t batch,
                          const S* params, const Mat<S>& qkv, const Mat<S>& mixed,
                          const ArgmaxKeys<S>& keys, SiteWork<S>& w, S* out) {
  const int64_t len = L.length, e = L.embed, hd = L.head_dim(), in_w_end = 3 * e * e;
  const int64_t out_w = L.out_weight_offset(), out_w_end = out_w + e * e;
  const ConstMapMat<S> out_weight(params + out_w, e, e);
  const auto row_of = [&](int64_t p) { return p < in_w_end ? p / e : p - in_w_end; };
  w.changes.clear();
  // Moved in_proj parameter t's change of its q/k/v column for the L tokens, into (or, with
  // `add`, onto) w.column.
  const auto column_change = [&](const ConstMapMat<S>& tokens, std::size_t t, bool add) {
    const int64_t p = w.param[t];
    if (!add) w.column.setZero(len);
    if (p < in_w_end)
      w.column += w.delta[t] * tokens.col(p % e);
    else
      w.column.array() += w.delta[t];
  };
  for (int64_t b = 0; b < batch; ++b) {
    const ConstMapMat<S> tokens(x + b * len * e, len, e);
    MapMat<S> y(out != nullptr ? out + b * len * e : nullptr, len, e);
    const auto base_qkv = qkv.middleRows(b * len, len);
    if (form == AttentionForm::out_proj) {
      const auto base_mix = mixed.middleRows(b * len, len);
      for (std::size_t t = 0; t < w.param.size(); ++t) {
        const int64_t p = w.param[t];
        if (p < out_w_end)
          y.col((p - out_w) / e) += w.delta[t] * base_mix.col((p - out_w) % e);
        else
          y.col(p - out_w_end).array() += w.delta[t];
      }
      continue;
    }
    if (form == AttentionForm::v_rows) {
      for (std::size_t t = 0; t < w.param.size(); ++t) {
        const int64_t j = row_of(w.param[t]) - 2 * e, h = j / hd;
        column_change(tokens, t, false);
        w.row_change = out_weight.col(j).transpose();  // contiguous
        const int32_t* pick = keys.picks.data() + (b * L.heads + h) * len;
        for (int64_t r = 0; r < len; ++r) y.row(r) += w.column(pick[r]) * w.row_change;
      }
      continue;
    }
    // One q or k row: the change of that column, and the partner column it multiplies
    // (scaled, contiguous).
    const int64_t row = row_of(w.param.front()), within = row % e, h = within / hd;
    const bool is_query = row < e;
    for (std::size_t t = 0; t < w.param.size(); ++t) column_change(tokens, t, t > 0);
    const S scale = attention_scale<S>(L);
    w.partner = scale * base_qkv.col(is_query ? e + within : within);
    const std::size_t first = static_cast<std::size_t>((b * L.heads + h) * len);
    const auto head_scores = keys.scores.middleRows(static_cast<Eigen::Index>(first), len);
    const int32_t* pick = keys.picks.data() + first;
    // A query keeps its key when its margin exceeds what the rank-one term can change
    // between two keys: |dq_r| * (range of k's column) * scale for a q row, |q_r| * (range
    // of dk) * scale for a k row; the slack covers the rounding of the updated scores.
    const S spread = is_query ? scale * keys.key_range(b, e + within)
                              : (w.column.maxCoeff() - w.column.minCoeff()) * scale;
    constexpr S kSlack = 16 * std::numeric_limits<S>::epsilon();
    w.row_scores.resize(len);
    for (int64_t r = 0; r < len; ++r) {
      const S factor = is_query ? std::abs(w.column(r)) : std::abs(w.partner(r)) / scale;
      const S bound = factor * spread;
      if (bound * (1 + kSlack) + kSlack * (keys.magnitude[first + r] + bound) <
          keys.margin[first + r])
        continue;
      const int64_t visible = L.causal ? r + 1 : len;
      if (is_query)
        w.row_scores.head(visible) =
            head_scores.row(r).head(visible).transpose() + w.column(r) * w.partner.head(visible);
      else
        w.row_scores.head(visible) =
            head_scores.row(r).head(visible).transpose() + w.partner(r) * w.column.head(visible);
      int64_t best = 0;  // the first largest, as weigh_rows picks
      for (int64_t c = 1; c < visible; ++c)
        if (w.row_scores(c) > w.row_scores(best)) best = c;
      if (best == pick[r]) continue;
      const auto values = base_qkv.middleCols(2 * e + h * hd, hd);
      w.row_change.noalias() =
          (values.row(best) - values.row(pick[r])) * out_weight.middleCols(h * hd, hd).transpose();
      if (out != nullptr)
        y.row(r) += w.row_change;
      else
        w.changes.push_back({b, r, w.row_change});
    }
  }
}

// All n candidates of a group through the sdpa operation: per moved head, the q/k/v parts
// the particle moves are built per candidate (the incumbent's plus the change), the others
// are the incumbent's, shared across candidates (stride 0); one call scores every (candidate,
// sample); then each candidate's output [batch * L, E] block of `out` (holding the
// incumbent's output) gets the change, as in attention_apply. w.deltas is [n, moves].
template <class S>
void attention_apply_fused(const SiteLayer& L, const S* x, int64_t batch, const S* params,
                           const Mat<S>& qkv, const Mat<S>& mixed, int64_t n, SiteWork<S>& w,
                           S* out) {
  const int64_t len = L.length, e = L.embed, hd = L.head_dim(), rows = batch * len;
  const int64_t in_w_end = 3 * e * e, in_end = in_w_end + (L.bias ? 3 * e : 0);
  const int64_t out_w = L.out_weight_offset(), out_w_end = out_w + e * e;
  const auto moves = static_cast<int64_t>(w.param.size());
  const ConstMapMat<S> tokens(x, rows, e), out_weight(params + out_w, e, e);
  const std::size_t block = static_cast<std::size_t>(n * rows * hd);
  w.head_mix.resize(w.heads.size() * block);
  std::vector<int64_t> head_slot(static_cast<std::size_t>(L.heads), -1);
  for (std::size_t hi = 0; hi < w.heads.size(); ++hi) {
    const int64_t h = w.heads[hi];
    head_slot[static_cast<std::size_t>(h)] = static_cast<int64_t>(hi);
    pp_sdpa_args a{};
    a.struct_size = sizeof(a);
    a.dtype = pp::dtype_of<S>();
    a.weighting = L.argmax ? PP_SDPA_ARGMAX : PP_SDPA_SOFTMAX;
    a.causal = L.causal ? 1 : 0;
    a.b0 = n, a.b1 = batch, a.heads = 1;
    a.q_len = a.kv_len = len, a.head_dim = a.v_dim = hd;
    a.scale = 1.0 / std::sqrt(static_cast<double>(hd));
    a.threads = 1;  // already inside the evaluator's parallel loop over groups
    const int64_t own[4] = {rows * hd, len * hd, 0, hd}, shared[4] = {0, len * 3 * e, 0, 3 * e};
    // Which parts (q, k, v) of head h the particle moves.
    std::array<bool, 3> moved{};
    for (int64_t t = 0; t < moves; ++t) {
      const int64_t p = w.param[static_cast<std::size_t>(t)];
      if (p >= in_end) continue;
      const int64_t row = p < in_w_end ? p / e : p - in_w_end;
      if ((row % e) / hd == h) moved[static_cast<std::size_t>(row / e)] = true;
    }
    int slots = 0;
    for (const bool m : moved) slots += m ? 1 : 0;
    w.parts.resize(static_cast<std::size_t>(slots) * block);
    const S* part_data[3] = {};
    const int64_t* part_strides[3] = {};
    int next = 0;
    for (int part = 0; part < 3; ++part) {
      const int64_t base_col = part * e + h * hd;
      if (!moved[static_cast<std::size_t>(part)]) {
        part_data[part] = qkv.data() + base_col;
        part_strides[part] = shared;
        continue;
      }
      S* dst = w.parts.data() + static_cast<std::size_t>(next++) * block;
      for (int64_t c = 0; c < n; ++c) {
        MapMat<S> mine(dst + c * rows * hd, rows, hd);
        mine = qkv.middleCols(base_col, hd);
        for (int64_t t = 0; t < moves; ++t) {
          const int64_t p = w.param[static_cast<std::size_t>(t)];
          if (p >= in_end) continue;
          const bool is_bias = p >= in_w_end;
          const int64_t row = is_bias ? p - in_w_end : p / e;
          if (row / e != part || (row % e) / hd != h) continue;
          const S delta = w.deltas[static_cast<std::size_t>(c * moves + t)];
          if (is_bias)
            mine.col(row % hd).array() += delta;
          else
            mine.col(row % hd) += delta * tokens.col(p % e);
        }
      }
      part_data[part] = dst;
      part_strides[part] = own;
    }
    a.q = part_data[0], a.k = part_data[1], a.v = part_data[2];
    std::copy(part_strides[0], part_strides[0] + 4, a.q_strides);
    std::copy(part_strides[1], part_strides[1] + 4, a.k_strides);
    std::copy(part_strides[2], part_strides[2] + 4, a.v_strides);
    a.out = w.head_mix.data() + hi * block;
    std::copy(own, own + 4, a.out_strides);
    pp_error err{};
    if (L.sdpa->run(&a, &err) != PP_OK)
      throw std::runtime_error(std::string("the sdpa operation failed: ") + err.message);
  }
  for (int64_t c = 0; c < n; ++c) {
    MapMat<S> y(out + c * rows * e, rows, e);
    for (std::size_t hi = 0; hi < w.heads.size(); ++hi) {
      const int64_t h = w.heads[hi];
      const ConstMapMat<S> mix(w.head_mix.data() + hi * block + c * rows * hd, rows, hd);
      y.noalias() +=
          (mix - mixed.middleCols(h * hd, hd)) * out_weight.middleCols(h * hd, hd).transpose();
    }
    for (int64_t t = 0; t < moves; ++t) {
      const int64_t p = w.param[static_cast<std::size_t>(t)];
      if (p < out_w) continue;
      const S delta = w.deltas[static_cast<std::size_t>(c * moves + t)];
      if (p < out_w_end) {
        const int64_t row = (p - out_w) / e, j = (p - out_w) % e;
        const int64_t slot = head_slot[static_cast<std::size_t>(j / hd)];
        if (slot >= 0)
          y.col(row) +=
              delta * ConstMapMat<S>(w.head_mix.data() + static_cast<std::size_t>(slot) * block +
                                         c * rows * hd,
                                     rows, hd)
                          .col(j % hd);
        else
          y.col(row) += delta * mixed.col(j);
      } else {
        y.col(p - out_w_end).array() += delta;
      }
    }
  }
}

// --- hard mixture of experts

// The incumbent's router scores [batch * tokens, experts] and each token's expert (the first
// largest score, as the layer picks it), computed by the layer's own expression.
template <class S>
void moe_base(const SiteLayer& L, const S* x, int64_t batch, const S* params, Mat<S>& scores,
              std::vector<int32_t>& route, MoeServed& served) {
  const int64_t rows = batch * L.tokens, experts = L.experts, in = L.expert_in;
  scores.resize(rows, experts);
  scores.noalias() = ConstMapMat<S>(x, rows, in) * ConstMapMat<S>(params, experts, in).transpose();
  scores.rowwise() +=
      Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(params + experts * in, experts);
  route.resize(static_cast<std::size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int32_t best = 0;
    for (int32_t e = 1; e < experts; ++e)
      if (scores(r, e) > scores(r, best)) best = e;
    route[static_cast<std::size_t>(r)] = best;
  }
  // The tokens of each expert, in order: a counting sort.
  served.begin.assign(static_cast<std::size_t>(experts) + 1, 0);
  for (const int32_t e : route) ++served.begin[static_cast<std::size_t>(e) + 1];
  for (std::size_t e = 1; e < served.begin.size(); ++e) served.begin[e] += served.begin[e - 1];
  served.tokens.resize(route.size());
  std::vector<int64_t> next(served.begin.begin(), served.begin.end() - 1);
  for (int64_t r = 0; r < rows; ++r)
    served.tokens[static_cast<std::size_t>(
        next[static_cast<std::size_t>(route[static_cast<std::size_t>(r)])]++)] = r;
}

// Decodes the moved parameters (w.param): their expert, row and column, and the output rows
// the candidates change (all of them once the router moves: tokens may change expert).
template <class S>
void moe_setup(const SiteLayer& L, SiteWork<S>& w) {
  const int64_t in = L.expert_in, out = L.expert_out, router_end = L.experts * (in + 1);
  const int64_t per_expert = out * (in + 1);
  w.move_expert.clear();
  w.move_row.clear();
  w.move_col.clear();
  w.router_moved = false;
  w.row_slot.assign(static_cast<std::size_t>(out), -1);
  for (const int64_t p : w.param) {
    if (p < router_end) {
      w.router_moved = true;
      w.move_expert.push_back(p < L.experts * in ? p / in : p - L.experts * in);
      w.move_row.push_back(-1);
      w.move_col.push_back(p < L.experts * in ? p % in : -1);
      continue;
    }
    const int64_t q = (p - router_end) % per_expert;
    w.move_expert.push_back((p - router_end) / per_expert);
    w.move_row.push_back(q < out * in ? q / in : q - out * in);
    w.move_col.push_back(q < out * in ? q % in : -1);
    w.row_slot[static_cast<std::size_t>(w.move_row.back())] = 0;
  }
  w.rows.clear();
  for (int64_t o = 0; o < out; ++o)
    if (w.router_moved || w.row_slot[static_cast<std::size_t>(o)] == 0) {
      w.row_slot[static_cast<std::size_t>(o)] = static_cast<int64_t>(w.rows.size());
      w.rows.push_back(o);
    }
}

// values [batch, tokens * R] (R = w.rows.size()) holds the incumbent's output at the rows
// w.rows of every token; adds the moved parameters' change (w.delta): a token keeps its expert
// and takes its moved rows' change, or the moved router sends it to another expert and its
// rows are that expert's (with that expert's moved parameters).
template <class S>
void moe_apply(const SiteLayer& L, const S* x, int64_t batch, const S* params, const Mat<S>& scores,
               const std::vector<int32_t>& route, const MoeServed& served, SiteWork<S>& w,
               S* values) {
  const int64_t in = L.expert_in, out = L.expert_out, rows = static_cast<int64_t>(w.rows.size());
  const std::size_t moves = w.param.size();
  if (!w.router_moved) {
    // Every token keeps its expert: only the moved experts' tokens change.
    for (std::size_t m = 0; m < moves; ++m) {
      const auto e = static_cast<std::size_t>(w.move_expert[m]);
      const int64_t slot = w.row_slot[static_cast<std::size_t>(w.move_row[m])], col = w.move_col[m];
      const S delta = w.delta[m];
      for (int64_t k = served.begin[e]; k < served.begin[e + 1]; ++k) {
        const int64_t r = served.tokens[static_cast<std::size_t>(k)];
        values[r * rows + slot] += delta * (col < 0 ? S(1) : x[r * in + col]);
      }
    }
    return;
  }
  w.route_scores.resize(static_cast<std::size_t>(L.experts));
  for (int64_t r = 0; r < batch * L.tokens; ++r) {
    const S* token = x + r * in;
    S* y = values + r * rows;
    const int32_t was = route[static_cast<std::size_t>(r)];
    int32_t now = was;
    if (w.router_moved) {
      for (int64_t e = 0; e < L.experts; ++e)
        w.route_scores[static_cast<std::size_t>(e)] = scores(r, e);
      for (std::size_t m = 0; m < moves; ++m)
        if (w.move_row[m] < 0)
          w.route_scores[static_cast<std::size_t>(w.move_expert[m])] +=
              w.delta[m] * (w.move_col[m] < 0 ? S(1) : token[w.move_col[m]]);
      now = 0;  // the first largest score, as the layer picks it
      for (int32_t e = 1; e < L.experts; ++e)
        if (w.route_scores[static_cast<std::size_t>(e)] >
            w.route_scores[static_cast<std::size_t>(now)])
          now = e;
    }
    if (now != was) {
      // Rerouted: the new expert's rows from scratch (w.rows is every row here).
      const S* expert = params + L.expert_offset(now);
      const ConstMapMat<S> weight(expert, out, in);
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t o = w.rows[static_cast<std::size_t>(j)];
        y[j] = weight.row(o).dot(Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(token, in)) +
               expert[out * in + o];
      }
    }
    for (std::size_t m = 0; m < moves; ++m)
      if (w.move_row[m] >= 0 && w.move_expert[m] == now)
        y[w.row_slot[static_cast<std::size_t>(w.move_row[m])]] +=
            w.delta[m] * (w.move_col[m] < 0 ? S(1) : token[w.move_col[m]]);
  }
}

// values [batch, tokens * R] <- full [batch, tokens * expert_out] at the rows w.rows
// (scatter: the other way).
// A moe's or attention layer's output is [tokens, width] per sample (SiteLayer::sites):
// values [batch, tokens * R] <- full [batch, tokens * width] at the columns w.rows (R of
// them; scatter: the other way).
template <class S, class Full>
void gather_columns(const SiteLayer& L, const SiteWork<S>& w, const Full& full, int64_t batch,
                    typename SiteWork<S>::M& values) {
  const auto [tokens, width] = L.sites();
  const auto rows = static_cast<int64_t>(w.rows.size());
  values.resize(batch, tokens * rows);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < rows; ++j)
        values(b, t * rows + j) = full(b, t * width + w.rows[static_cast<std::size_t>(j)]);
}
template <class S, class Full>
void scatter_columns(const SiteLayer& L, const SiteWork<S>& w,
                     const typename SiteWork<S>::M& values, Full&& full) {
  const auto [tokens, width] = L.sites();
  const auto rows = static_cast<int64_t>(w.rows.size());
  for (int64_t b = 0; b < values.rows(); ++b)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < rows; ++j)
        full(b, t * width + w.rows[static_cast<std::size_t>(j)]) = values(b, t * rows + j);
}

// The feature tail's elementwise layers on values, in place.
template <class S>
void run_feature_tail(const std::vector<TailStage>& stages, typename SiteWork<S>::M& values) {
  for (const TailStage& st : stages) {
    if (st.op == TailStage::Op::relu) {
      values = values.cwiseMax(S(0));
      continue;
    }
    const pp_scalar_fn fn = st.layer->view->elementwise_fn;
    for (Eigen::Index i = 0; i < values.size(); ++i)
      values.data()[i] = static_cast<S>(fn(st.layer->ctx, static_cast<double>(values.data()[i])));
  }
}

// The feature tail of site layer l over the columns w.rows, per group: the incumbent's
// values at the affine layer's input (w.tail_base) and that layer's W^T rows for them
// (w.tail_weights).
template <class S>
void feature_tail_setup(const SiteLayer& L, const IncumbentCache<S>& inc, int64_t out,
                        SiteWork<S>& w) {
  const std::size_t a = L.feature_affine;
  const auto [tokens, width] = L.sites();
  const auto rows = static_cast<int64_t>(w.rows.size());
  gather_columns(L, w, inc.acts[a], inc.batch, w.tail_base);
  w.tail_weights.resize(tokens * rows, out);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < rows; ++j)
      w.tail_weights.row(t * rows + j) =
          inc.weights_t[a].row(t * width + w.rows[static_cast<std::size_t>(j)]);
}

// One candidate's new values at the columns (w.values, overwritten) through the feature tail
// into the affine layer's output: stacked = y_incumbent + (f(values) - f(values_0)) W^T.
template <class S, class Rows>
void feature_tail_finish(const SiteLayer& L, const IncumbentCache<S>& inc, SiteWork<S>& w,
                         Rows&& stacked) {
  run_feature_tail<S>(L.feature_tail, w.values);
  w.values -= w.tail_base;
  stacked = inc.acts[L.feature_affine + 1];
  stacked.noalias() += w.values * w.tail_weights;
}

}  // namespace

// --- attribute helpers (site_local.hpp)

int64_t numel(int32_t ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

namespace {

// --- planning and the probe

// Fills the conv geometry from the typed op (ops.h: a 1-D conv is a 2-D one of height 1);
// empty or why not.
std::string parse_conv(const pp_layer_view& v, const pp_conv_attrs& c, SiteLayer& L) {
  const int dims = c.dims;
  if (dims != 1 && dims != 2) return "a convolution of " + std::to_string(dims) + " dimensions";
  if (v.in_ndim != dims + 1) return "an input of " + std::to_string(v.in_ndim) + " dimensions";
  L.c_in = v.in_shape[0];
  L.h = dims == 1 ? 1 : v.in_shape[1];
  L.w = v.in_shape[dims];
  L.c_out = c.out_channels;
  L.groups = c.groups;
  L.bias = c.bias != 0;
  L.kh = c.kernel[0], L.kw = c.kernel[1], L.sh = c.stride[0], L.sw = c.stride[1];
  L.ph = c.padding[0], L.pw = c.padding[1], L.dh = c.dilation[0], L.dw = c.dilation[1];
  if (L.groups <= 0 || L.c_out <= 0 || L.c_in % L.groups != 0 || L.c_out % L.groups != 0 ||
      L.kh <= 0 || L.kw <= 0 || L.sh <= 0 || L.sw <= 0 || L.ph < 0 || L.pw < 0 || L.dh <= 0 ||
      L.dw <= 0)
    return "attributes out of range";
  const int64_t span_h = L.dh * (L.kh - 1) + 1, span_w = L.dw * (L.kw - 1) + 1;
  if (L.h + 2 * L.ph < span_h || L.w + 2 * L.pw < span_w) return "a window larger than the input";
  L.oh = (L.h + 2 * L.ph - span_h) / L.sh + 1;
  L.ow = (L.w + 2 * L.pw - span_w) / L.sw + 1;
  if (numel(v.out_ndim, v.out_shape) != L.c_out * L.oh * L.ow || v.out_shape[0] != L.c_out)
    return "an output shape that differs from the attributes";
  if (v.param_count != L.c_out * L.patch() + (L.bias ? L.c_out : 0))
    return "a parameter count that differs from the attributes";
  if (L.h * L.w > INT32_MAX) return "too large an input";
  // tap[k * oh * ow + p]: the spatial input index that tap k reads for output position p, or
  // -1 in the padding; then cut into runs.
  std::vector<int32_t> tap(static_cast<std::size_t>(L.kh * L.kw * L.positions()));
  for (int64_t ki = 0; ki < L.kh; ++ki)
    for (int64_t kj = 0; kj < L.kw; ++kj)
      for (int64_t oi = 0; oi < L.oh; ++oi)
        for (int64_t oj = 0; oj < L.ow; ++oj) {
          const int64_t i = oi * L.sh + ki * L.dh - L.ph, j = oj * L.sw + kj * L.dw - L.pw;
          const bool inside = i >= 0 && i < L.h && j >= 0 && j < L.w;
          tap[static_cast<std::size_t>(((ki * L.kw + kj) * L.oh + oi) * L.ow + oj)] =
              inside ? static_cast<int32_t>(i * L.w + j) : -1;
        }
  const auto positions = static_cast<int32_t>(L.positions());
  const auto step = static_cast<int32_t>(L.sw);
  for (int64_t k = 0; k < L.kh * L.kw; ++k) {
    L.run_begin.push_back(L.runs.size());
    const int32_t* at = tap.data() + k * positions;
    for (int32_t q = 0; q < positions;) {
      int32_t end = q + 1;
      if (at[q] < 0)
        while (end < positions && at[end] < 0) ++end;
      else
        while (end < positions && at[end] >= 0 && at[end] == at[end - 1] + step) ++end;
      L.runs.push_back({q, end - q, at[q]});
      q = end;
    }
  }
  L.run_begin.push_back(L.runs.size());
  return {};
}

std::string parse_attention(const pp_layer_view& v, const pp_attention_attrs& a, SiteLayer& L) {
  if (v.in_ndim != 2) return "an input of " + std::to_string(v.in_ndim) + " dimensions";
  L.length = v.in_shape[0];
  L.embed = v.in_shape[1];
  L.heads = a.heads;
  L.bias = a.bias != 0;
  L.argmax = a.argmax != 0;
  L.causal = a.causal != 0;
  if (L.heads <= 0 || L.embed % L.heads != 0) return "attributes out of range";
  if (numel(v.out_ndim, v.out_shape) != L.length * L.embed)
    return "an output shape that differs from the input's";
  if (v.param_count != 4 * L.embed * L.embed + (L.bias ? 4 * L.embed : 0))
    return "a parameter count that differs from the attributes";
  return {};
}

std::string parse_moe(const pp_layer_view& v, const pp_moe_attrs& a, SiteLayer& L) {
  if (v.in_ndim < 1) return "an input without dimensions";
  L.expert_in = a.in_features;
  L.expert_out = a.out_features;
  L.experts = a.experts;
  if (L.expert_in <= 0 || L.expert_out <= 0 || L.experts <= 0 || L.experts > INT32_MAX ||
      v.in_shape[v.in_ndim - 1] != L.expert_in)
    return "attributes out of range";
  L.tokens = numel(v.in_ndim, v.in_shape) / L.expert_in;
  if (numel(v.out_ndim, v.out_shape) != L.tokens * L.expert_out)
    return "an output shape that differs from the attributes";
  if (v.param_count != L.expert_offset(L.experts))
    return "a parameter count that differs from the attributes";
  return {};
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * (1.0 + std::abs(b)); }

// Empty when the per-site computation agrees with the host forward on random inputs,
// parameters and perturbations (each tensor of the layer moved at least once), else why not.
// For attention with `sdpa` (float64; may be null) the fused computation is checked too, and
// sdpa_note says why it is not used when it disagrees (it then stays unused).
std::string probe_site(const LayerPlan& layer, const SiteLayer& L, const pp_sdpa_table* sdpa,
                       std::string& sdpa_note) {
  std::mt19937_64 rng(0x517e);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int64_t rows = 2;
  std::vector<double> x(static_cast<std::size_t>(rows * layer.in)),
      params(static_cast<std::size_t>(layer.count)), y0, y1;
  for (double& v : x) v = gauss(rng);
  for (double& v : params) v = 0.5 * gauss(rng);
  if (std::string why = host_forward(layer, x, rows, params, y0); !why.empty()) return why;
  // The tensors' ranges within the layer's parameters.
  std::vector<std::pair<int64_t, int64_t>> tensors;
  if (L.kind == SiteLayer::Kind::conv) {
    const int64_t weights = L.c_out * L.patch();
    tensors.emplace_back(0, weights);
    if (L.bias) tensors.emplace_back(weights, layer.count);
  } else if (L.kind == SiteLayer::Kind::moe) {
    tensors.emplace_back(0, L.experts * L.expert_in);                   // router weight
    tensors.emplace_back(L.experts * L.expert_in, L.expert_offset(0));  // router bias
    tensors.emplace_back(L.expert_offset(0), layer.count);              // the experts
    tensors.emplace_back(L.expert_offset(0), layer.count);
  } else {
    const int64_t e = L.embed, in_w = 3 * e * e, out_w = L.out_weight_offset();
    tensors.emplace_back(0, in_w);
    if (L.bias) tensors.emplace_back(in_w, out_w);
    tensors.emplace_back(out_w, out_w + e * e);
    if (L.bias) tensors.emplace_back(out_w + e * e, layer.count);
  }
  // Argmax attention's one-row forms (attention_form): a q, a k and a v row's first weights.
  std::vector<std::vector<int64_t>> rows_moved;
  if (L.kind == SiteLayer::Kind::attention && L.argmax)
    for (int64_t part = 0; part < 3; ++part) {
      const int64_t row =
          part * L.embed + static_cast<int64_t>(rng() % static_cast<uint64_t>(L.embed));
      rows_moved.push_back({row * L.embed, row * L.embed + 1});
    }
  tensors.emplace_back(0, layer.count);
  tensors.emplace_back(0, layer.count);
  SiteWork<double> w;
  Mat<double> qkv, mixed, scores;
  std::vector<int32_t> route;
  MoeServed served;
  ArgmaxKeys<double> keys;
  if (L.kind == SiteLayer::Kind::attention)
    attention_base(L, x.data(), rows, params.data(), qkv, mixed, w, L.argmax ? &keys : nullptr);
  if (L.kind == SiteLayer::Kind::moe)
    moe_base(L, x.data(), rows, params.data(), scores, route, served);
  for (std::size_t k = 0; k < tensors.size() + rows_moved.size(); ++k) {
    w.param.clear();
    if (k < tensors.size()) {
      // Two parameters of this tensor and one anywhere.
      const auto [first, end] = tensors[k];
      for (int i = 0; i < 3; ++i) {
        const int64_t lo = i < 2 ? first : 0, hi = i < 2 ? end : layer.count;
        const int64_t p = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo));
        if (std::find(w.param.begin(), w.param.end(), p) == w.param.end()) w.param.push_back(p);
      }
    } else {
      w.param = rows_moved[k - tensors.size()];
    }
    std::sort(w.param.begin(), w.param.end());
    w.delta.resize(w.param.size());
    std::vector<double> moved = params;
    for (std::size_t t = 0; t < w.param.size(); ++t) {
      w.delta[t] = 0.7 * gauss(rng);
      moved[static_cast<std::size_t>(w.param[t])] += w.delta[t];
    }
    if (std::string why = host_forward(layer, x, rows, moved, y1); !why.empty()) return why;
    std::vector<double> mine = y0, fused = y0;
    if (L.kind == SiteLayer::Kind::conv) {
      conv_gather(L, x.data(), rows, w);
      conv_apply(L, rows, w, mine.data());
    } else if (L.kind == SiteLayer::Kind::moe) {
      moe_setup(L, w);
      MapMat<double> full(mine.data(), rows, L.tokens * L.expert_out);
      gather_columns(L, w, full, rows, w.values);
      moe_apply(L, x.data(), rows, params.data(), scores, route, served, w, w.values.data());
      scatter_columns(L, w, w.values, full);
    } else {
      attention_setup(L, w);
      attention_apply(L, x.data(), rows, params.data(), qkv, mixed, w, mine.data());
      if (const AttentionForm form = attention_form(L, w); form != AttentionForm::general) {
        std::vector<double> fast = y0;
        attention_fast_apply(L, form, x.data(), rows, params.data(), qkv, mixed, keys, w,
                             fast.data());
        for (std::size_t i = 0; i < fast.size(); ++i)
          if (!close(fast[i], y1[i]))
            return "output " + std::to_string(i) + " is " + std::to_string(y1[i]) +
                   " where the argmax update gives " + std::to_string(fast[i]);
      }
      if (sdpa != nullptr) {
        SiteLayer with = L;
        with.sdpa = sdpa;
        w.deltas = w.delta;
        attention_apply_fused(with, x.data(), rows, params.data(), qkv, mixed, 1, w, fused.data());
        for (std::size_t i = 0; i < fused.size(); ++i)
          if (!close(fused[i], y1[i])) sdpa_note = "it disagreed with the layer's forward";
      }
    }
    for (std::size_t i = 0; i < mine.size(); ++i)
      if (!close(mine[i], y1[i]))
        return "output " + std::to_string(i) + " is " + std::to_string(y1[i]) +
               " where the per-site computation gives " + std::to_string(mine[i]) + " (parameter " +
               std::to_string(w.param.front()) + " moved)";
  }
  return {};
}

}  // namespace

SiteLayer plan_site_layer(const LayerPlan& layer, const pp_host_api* host, int32_t dtype) {
  SiteLayer L;
  const pp_layer_view& v = *layer.view;
  L.declared = (v.contract & PP_CONTRACT_SITE_LOCAL) != 0;
  const std::string kind = v.kind != nullptr ? v.kind : "";
  // The built-in conv, attention and moe arrive typed (ops.h); nothing else has a per-site
  // form.
  std::string why;
  if (v.op == PP_OP_CONV && v.op_attrs != nullptr) {
    L.kind = SiteLayer::Kind::conv;
    why = parse_conv(v, *static_cast<const pp_conv_attrs*>(v.op_attrs), L);
  } else if (v.op == PP_OP_SELF_ATTENTION && v.op_attrs != nullptr) {
    L.kind = SiteLayer::Kind::attention;
    why = parse_attention(v, *static_cast<const pp_attention_attrs*>(v.op_attrs), L);
  } else if (v.op == PP_OP_MOE && v.op_attrs != nullptr) {
    L.kind = SiteLayer::Kind::moe;
    why = parse_moe(v, *static_cast<const pp_moe_attrs*>(v.op_attrs), L);
  } else {
    L.note = "site-local declined: the plugin has no per-site computation for kind '" + kind + "'";
    return L;
  }
  if (why.empty() && v.host_forward == nullptr) why = "it has no host forward to probe";
  // The sdpa operation of the host, for the evaluator's dtype and (for the probe) float64.
  const pp_sdpa_table *sdpa = nullptr, *sdpa_probe = nullptr;
  std::string provider, sdpa_note;
  if (why.empty() && L.kind == SiteLayer::Kind::attention && host != nullptr &&
      host->find_operation != nullptr) {
    const pp_operation* op =
        host->find_operation(host->ctx, PP_OPERATION_SDPA, PP_DEVICE_TYPE_CPU, dtype);
    const pp_operation* op64 =
        host->find_operation(host->ctx, PP_OPERATION_SDPA, PP_DEVICE_TYPE_CPU, PP_DTYPE_F64);
    if (op != nullptr && op64 != nullptr) {
      sdpa = static_cast<const pp_sdpa_table*>(op->table);
      sdpa_probe = static_cast<const pp_sdpa_table*>(op64->table);
      provider = host->operation_provider != nullptr ? host->operation_provider(host->ctx, op)
                                                     : "the host";
    } else {
      sdpa_note = "no sdpa operation loaded";
    }
  } else if (L.kind == SiteLayer::Kind::attention) {
    sdpa_note = "no sdpa operation loaded";
  }
  if (why.empty()) {
    try {
      why = probe_site(layer, L, sdpa_probe, sdpa_note);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      L.note = "site-local probe failed: " + why;
      return L;
    }
  }
  if (!why.empty()) {
    L.note = "site-local declined: the " + kind + " layer has " + why;
    L.kind = SiteLayer::Kind::none;
    return L;
  }
  L.probed = true;
  if (L.kind == SiteLayer::Kind::attention) {
    if (sdpa != nullptr && sdpa_note.empty()) {
      L.sdpa = sdpa;
      L.detail = std::string("; attention: sdpa (cpu, ") + pp::dtype_name(dtype) + ") from " +
                 provider + ", candidates batched";
    } else {
      L.detail = "; attention: explicit (" + sdpa_note + ")";
    }
  }
  return L;
}

namespace {

// The feature tail of a moe or attention layer (SiteLayer::feature_tail): what it runs
// through, or why there is none (feature_affine stays 0). Every stage is a layer the model
// plan verified elementwise, so the tail needs no probe of its own.
std::string plan_feature_tail(const ModelPlan& plan, std::size_t site, SiteLayer& L) {
  const int64_t values = plan.layers[site].out;
  std::string through;
  for (std::size_t m = site + 1; m < plan.layers.size(); ++m) {
    const LayerPlan& layer = plan.layers[m];
    const std::string kind = layer.view->kind != nullptr ? layer.view->kind : "";
    const std::string named = "layer " + std::to_string(m) + " (" + kind + ")";
    if (layer.op == LayerOp::affine) {
      if (layer.in != values) break;
      L.feature_affine = m;
      return "the changed values through " + through + "into " + named + "'s output";
    }
    const bool flatten = layer.view->op == PP_OP_FLATTEN;
    if (layer.op != LayerOp::elementwise || layer.in != layer.out ||
        !(layer.is_relu || flatten || layer.view->elementwise_fn != nullptr)) {
      L.feature_tail.clear();
      return named + " is not a verified elementwise layer";
    }
    through += kind + ", ";
    if (flatten) continue;  // the identity on the values
    TailStage st;
    st.op = layer.is_relu ? TailStage::Op::relu : TailStage::Op::scalar_fn;
    st.layer = &layer;
    L.feature_tail.push_back(st);
  }
  L.feature_tail.clear();
  return "no affine layer takes its values";
}

}  // namespace

// --- the evaluator's side

template <class S>
SiteLocalPath<S>::SiteLocalPath(const EvaluationContext<S>& ctx) : ctx_(ctx) {
  site_.resize(ctx_.plan.layers.size());
  for (std::size_t l = 0; l < ctx_.plan.layers.size(); ++l)
    if ((ctx_.plan.layers[l].view->contract & PP_CONTRACT_SITE_LOCAL) != 0) {
      SiteLayer& site = site_[l];
      site = plan_site_layer(ctx_.plan.layers[l], ctx_.host, pp::dtype_of<S>());
      if (site.kind == SiteLayer::Kind::conv && site.usable()) {
        site.tail = plan_channel_tail(ctx_.plan, l, site.c_out, site.oh, site.ow);
        site.detail = "; " + site.tail.note;
      }
      if (site.kind == SiteLayer::Kind::attention && site.usable() && site.argmax) {
        const std::string tail = plan_feature_tail(ctx_.plan, l, site);
        site.detail +=
            "; argmax: a moved q or k row updates the scores rank-one and changes "
            "only the queries whose key changes; v rows keep every key, out_proj moves are linear" +
            (site.feature_affine > 0 ? ", " + tail : "");
      }
      if (site.kind == SiteLayer::Kind::moe && site.usable()) {
        const std::string tail = plan_feature_tail(ctx_.plan, l, site);
        site.detail =
            "; moe: moved experts' rows of the tokens they serve, tokens rerouted by "
            "a moved router recomputed; " +
            (site.feature_affine > 0 ? tail : "no feature tail: " + tail);
      }
    }
}

template <class S>
Decline SiteLocalPath<S>::decline(const Group& g, bool other_forced) const {
  bool declared = false, one_layer = true;
  const int32_t layer = ctx_.planner->terms()[static_cast<std::size_t>(g.terms_begin)].layer;
  for (int64_t t = g.terms_begin; t < g.terms_end; ++t) {
    const int32_t l = ctx_.planner->terms()[static_cast<std::size_t>(t)].layer;
    declared = declared || site_[static_cast<std::size_t>(l)].declared;
    one_layer = one_layer && l == layer;
  }
  if (!declared) return Decline::site_not_declared;
  if (ctx_.subspace_mode) return Decline::site_subspace;
  if (!one_layer) return Decline::site_spans_layers;
  const SiteLayer& site = site_[static_cast<std::size_t>(layer)];
  if (site.kind == SiteLayer::Kind::none) return Decline::site_unknown_kind;
  if (!site.probed) return Decline::site_probe_failed;
  if (other_forced) return Decline::site_forced;
  return Decline::none;
}

template <class S>
void SiteLocalPath<S>::prepare() {
  site_qkv_.resize(ctx_.plan.layers.size());
  site_mixed_.resize(ctx_.plan.layers.size());
  site_scores_.resize(ctx_.plan.layers.size());
  site_route_.resize(ctx_.plan.layers.size());
  site_served_.resize(ctx_.plan.layers.size());
  site_keys_.resize(ctx_.plan.layers.size());
  SiteWork<S> w;
  for (std::size_t l = 0; l < ctx_.plan.layers.size(); ++l) {
    const SiteLayer& site = site_[l];
    if (ctx_.planner->layer_path_candidates()[l][static_cast<int>(Path::site_local)] == 0) continue;
    if (site.kind == SiteLayer::Kind::moe)
      moe_base(site, ctx_.inc.acts[l].data(), ctx_.inc.batch,
               ctx_.inc.eff.data() + ctx_.plan.layers[l].offset, site_scores_[l], site_route_[l],
               site_served_[l]);
    if (site.kind != SiteLayer::Kind::attention) continue;
    attention_base(site, ctx_.inc.acts[l].data(), ctx_.inc.batch,
                   ctx_.inc.eff.data() + ctx_.plan.layers[l].offset, site_qkv_[l], site_mixed_[l],
                   w, site.argmax ? &site_keys_[l] : nullptr);
  }
}

template <class S>
void SiteLocalPath<S>::evaluate(const Candidates& c, const Group& g, Scratch& s,
                                double* losses) const {
  ctx_.collect_touched(c, g.particle, s);
  const auto l = static_cast<std::size_t>(ctx_.plan.layer_of(s.touched.front()));
  const LayerPlan& layer = ctx_.plan.layers[l];
  const SiteLayer& site = site_[l];
  SiteWork<S>& w = s.site;
  const int32_t d = c.d;
  const int64_t n = g.end - g.begin, batch = ctx_.inc.batch,
                moves = static_cast<int64_t>(s.touched.size());
  w.param.resize(s.touched.size());
  w.delta.resize(s.touched.size());
  for (std::size_t t = 0; t < s.touched.size(); ++t) w.param[t] = s.touched[t] - layer.offset;
  const S* params = ctx_.inc.eff.data() + layer.offset;
  if (site.kind == SiteLayer::Kind::conv)
    conv_gather(site, ctx_.inc.acts[l].data(), batch, w);
  else if (site.kind == SiteLayer::Kind::attention)
    attention_setup(site, w);
  else
    moe_setup(site, w);
  // The group's rows are stacked as the input of layer suffix_from: the layer after this one,
  // or after the affine layer that the conv's channel-local tail or the feature tail (moe,
  // argmax attention's q/k rows) feeds.
  const bool through_tail = site.kind == SiteLayer::Kind::conv && site.tail.usable;
  const AttentionForm form =
      site.kind == SiteLayer::Kind::attention ? attention_form(site, w) : AttentionForm::general;
  const bool through_features =
      (site.kind == SiteLayer::Kind::moe || form != AttentionForm::general) &&
      site.feature_affine > 0;
  const std::size_t suffix_from = through_tail       ? site.tail.affine + 1
                                  : through_features ? site.feature_affine + 1
                                                     : l + 1;
  s.stack.resize(n * batch, ctx_.plan.layers[suffix_from - 1].out);
  // Candidate i's change of moved parameter t, as host layers see it: the raw parameter in S
  // (no transform) minus the incumbent's.
  auto change = [&](int64_t i, std::size_t t) {
    const double* delta = c.displacement + (g.begin + i) * d;
    double raw = ctx_.inc.base[static_cast<std::size_t>(s.touched[t])];
    for (int32_t k = 0; k < d; ++k)
      raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
    return static_cast<S>(raw) - ctx_.inc.eff[static_cast<std::size_t>(s.touched[t])];
  };
  if (form == AttentionForm::qk_row && through_features) {
    // Only the queries whose key changes change: each changed output row through the feature
    // tail into the affine layer's output, y += (f(row_new) - f(row)) W[:, row]^T.
    const std::size_t a = site.feature_affine;
    const int64_t e = site.embed;
    for (int64_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < s.touched.size(); ++t) w.delta[t] = change(i, t);
      attention_fast_apply(site, form, ctx_.inc.acts[l].data(), batch, params, site_qkv_[l],
                           site_mixed_[l], site_keys_[l], w, static_cast<S*>(nullptr));
      auto stacked = s.stack.middleRows(i * batch, batch);
      stacked = ctx_.inc.acts[a + 1];
      for (const auto& [b, r, row_change] : w.changes) {
        w.values = ctx_.inc.acts[l + 1].block(b, r * e, 1, e) + row_change;
        run_feature_tail<S>(site.feature_tail, w.values);
        w.values -= ctx_.inc.acts[a].block(b, r * e, 1, e);
        stacked.row(b).noalias() += w.values * ctx_.inc.weights_t[a].middleRows(r * e, e);
      }
    }
  } else if (form != AttentionForm::general && through_features) {
    // The changed columns (every column for v rows, the moved out_proj rows' columns) through
    // the feature tail.
    const int64_t e = site.embed, out_w = site.out_weight_offset(), out_w_end = out_w + e * e;
    const auto column_of = [&](int64_t p) {
      return p < out_w_end ? (p - out_w) / e : p - out_w_end;
    };
    w.rows.clear();
    w.row_slot.assign(static_cast<std::size_t>(e), -1);
    for (int64_t col = 0; col < e; ++col) {
      const bool moved = form == AttentionForm::v_rows ||
                         std::any_of(w.param.begin(), w.param.end(),
                                     [&](int64_t p) { return column_of(p) == col; });
      if (!moved) continue;
      w.row_slot[static_cast<std::size_t>(col)] = static_cast<int64_t>(w.rows.size());
      w.rows.push_back(col);
    }
    feature_tail_setup(site, ctx_.inc, ctx_.plan.layers[site.feature_affine].out, w);
    gather_columns(site, w, ctx_.inc.acts[l + 1], batch, w.value_base);
    const auto rows = static_cast<int64_t>(w.rows.size());
    const Mat<S>& mixed = site_mixed_[l];
    for (int64_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < s.touched.size(); ++t) w.delta[t] = change(i, t);
      w.values = w.value_base;
      if (form == AttentionForm::v_rows) {  // every column: the output's own layout
        attention_fast_apply(site, form, ctx_.inc.acts[l].data(), batch, params, site_qkv_[l],
                             site_mixed_[l], site_keys_[l], w, w.values.data());
      } else {
        for (std::size_t t = 0; t < w.param.size(); ++t) {
          const int64_t p = w.param[t], slot = w.row_slot[static_cast<std::size_t>(column_of(p))];
          for (int64_t r = 0; r < batch * site.length; ++r)
            w.values.data()[r * rows + slot] +=
                p < out_w_end ? w.delta[t] * mixed(r, (p - out_w) % e) : w.delta[t];
        }
      }
      feature_tail_finish(site, ctx_.inc, w, s.stack.middleRows(i * batch, batch));
    }
  } else if (form != AttentionForm::general) {
    for (int64_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < s.touched.size(); ++t) w.delta[t] = change(i, t);
      s.stack.middleRows(i * batch, batch) = ctx_.inc.acts[l + 1];
      attention_fast_apply(site, form, ctx_.inc.acts[l].data(), batch, params, site_qkv_[l],
                           site_mixed_[l], site_keys_[l], w,
                           s.stack.data() + i * batch * layer.out);
    }
  } else if (site.kind == SiteLayer::Kind::attention && site.sdpa != nullptr) {
    w.deltas.resize(static_cast<std::size_t>(n * moves));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t t = 0; t < moves; ++t)
        w.deltas[static_cast<std::size_t>(i * moves + t)] = change(i, static_cast<std::size_t>(t));
      s.stack.middleRows(i * batch, batch) = ctx_.inc.acts[l + 1];
    }
    attention_apply_fused(site, ctx_.inc.acts[l].data(), batch, params, site_qkv_[l],
                          site_mixed_[l], n, w, s.stack.data());
  } else if (through_tail) {
    // Each moved channel through the tail, into the affine layer's output:
    // y = y_incumbent + (slice_new - slice_incumbent) W[:, slice]^T.
    const ChannelTail& tail = site.tail;
    const std::size_t a = tail.affine;
    w.channels.clear();
    for (const int64_t p : w.param)
      if (w.channels.empty() || w.channels.back() != conv_channel(site, p))
        w.channels.push_back(conv_channel(site, p));  // w.param is ascending
    // A few samples at a time, so one channel's maps stay in the first-level cache from the
    // conv's change through the tail.
    const int64_t block = std::max<int64_t>(1, 4096 / tail.positions);
    w.slice_diff.resize(batch, tail.slice);
    for (int64_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < s.touched.size(); ++t) w.delta[t] = change(i, t);
      auto rows = s.stack.middleRows(i * batch, batch);
      rows = ctx_.inc.acts[a + 1];
      for (const int64_t o : w.channels) {
        for (int64_t b = 0; b < batch; b += block) {
          const int64_t count = std::min(block, batch - b);
          w.chan = ctx_.inc.acts[l + 1].block(b, o * tail.positions, count, tail.positions);
          conv_apply(site, count, w, w.chan.data(), o, b);
          w.slice_diff.middleRows(b, count) =
              run_channel_tail(tail, w.chan, w.chan_b) -
              ctx_.inc.acts[a].block(b, o * tail.slice, count, tail.slice);
        }
        rows.noalias() +=
            w.slice_diff * ctx_.inc.weights_t[a].middleRows(o * tail.slice, tail.slice);
      }
    }
  } else if (site.kind == SiteLayer::Kind::moe) {
    // The changed rows of every token, then (with the feature tail) through the elementwise
    // layers into the affine layer's output.
    const auto& base = ctx_.inc.acts[l + 1];
    if (through_features)
      feature_tail_setup(site, ctx_.inc, ctx_.plan.layers[site.feature_affine].out, w);
    gather_columns(site, w, base, batch, w.value_base);
    for (int64_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < s.touched.size(); ++t) w.delta[t] = change(i, t);
      w.values = w.value_base;
      moe_apply(site, ctx_.inc.acts[l].data(), batch, params, site_scores_[l], site_route_[l],
                site_served_[l], w, w.values.data());
      auto stacked = s.stack.middleRows(i * batch, batch);
      if (through_features) {
        feature_tail_finish(site, ctx_.inc, w, stacked);
      } else {
        stacked = base;
        scatter_columns(site, w, w.values, stacked);
      }
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < s.touched.size(); ++t) w.delta[t] = change(i, t);
      S* out = s.stack.data() + i * batch * layer.out;
      s.stack.middleRows(i * batch, batch) = ctx_.inc.acts[l + 1];
      if (site.kind == SiteLayer::Kind::conv)
        conv_apply(site, batch, w, out);
      else
        attention_apply(site, ctx_.inc.acts[l].data(), batch, params, site_qkv_[l], site_mixed_[l],
                        w, out);
    }
  }
  // The suffix shares the incumbent's weights: once over the whole group.
  const Mat<S>& out =
      forward_suffix(ctx_.plan, suffix_from, s.stack, ctx_.inc.eff.data(), s.suffix);
  for (int64_t i = 0; i < n; ++i)
    losses[g.begin + i] = ctx_.rows_loss(out, i * batch) + ctx_.l2_term(c, g, g.begin + i, s);
}

#define POLYPROBE_INSTANTIATE(S)                                                               \
  template SiteLocalPath<S>::SiteLocalPath(const EvaluationContext<S>&);                       \
  template Decline SiteLocalPath<S>::decline(const Group&, bool) const;                        \
  template void SiteLocalPath<S>::prepare();                                                   \
  template void SiteLocalPath<S>::evaluate(const Candidates&, const Group&, Scratch&, double*) \
      const;
POLYPROBE_INSTANTIATE(float)
POLYPROBE_INSTANTIATE(double)
#undef POLYPROBE_INSTANTIATE

}  // namespace polyprobe::cpu_tbb
