// The layers the site-local path knows (site_local_path.cpp): their geometry, parsed from
// the layer's typed op, and whether the plugin's per-site computation matched the layer's own
// forward on a probe.
#pragma once

#include "channel_tail.hpp"
#include "model_plan.hpp"

#include <Eigen/Core>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace polyprobe::cpu_tbb {

struct SiteLayer {
  enum class Kind { none, conv, attention, moe };
  Kind kind = Kind::none;
  bool declared = false;  // the layer declares PP_CONTRACT_SITE_LOCAL
  bool probed = false;    // the per-site computation matched host_forward on a probe
  std::string note;       // why the path cannot serve the layer (empty when it can)

  // conv1d / conv2d (a 1-D convolution is a 2-D one of height 1): input [c_in, h, w],
  // weight [c_out, c_in / groups, kh, kw], then bias [c_out].
  int64_t c_in = 0, h = 0, w = 0, c_out = 0, groups = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, oh = 0, ow = 0;
  bool bias = false;
  // Per kernel tap k = ki * kw + kj: runs[run_begin[k] .. run_begin[k + 1]) cover the output
  // positions in order; a run reads spatial input index src + j sw for position first + j
  // (j < length), or lies in the padding (src = -1). Gathering a tap's input copies runs.
  struct TapRun {
    int32_t first, length, src;
  };
  std::vector<TapRun> runs;
  std::vector<std::size_t> run_begin;
  ChannelTail tail;  // the layers after the conv that act per channel (usable or why not)
  int64_t patch() const { return c_in / groups * kh * kw; }
  int64_t positions() const { return oh * ow; }

  // self_attention on [length, embed]: in_proj_weight [3E, E], in_proj_bias [3E],
  // out_proj.weight [E, E], out_proj.bias [E] (biases when `bias`).
  int64_t length = 0, embed = 0, heads = 1;
  bool argmax = false;
  bool causal = false;  // position i attends to positions j <= i only
  int64_t head_dim() const { return embed / heads; }
  int64_t out_weight_offset() const { return 3 * embed * embed + (bias ? 3 * embed : 0); }

  // attention: the host's "sdpa" operation for this dtype (operations.h), or null for the
  // explicit attention.
  const pp_sdpa_table* sdpa = nullptr;

  // moe (hard top-1 mixture) on [tokens, expert_in]: router.weight [experts, expert_in],
  // router.bias [experts], then per expert weight [expert_out, expert_in] and bias
  // [expert_out]. A moved expert row changes that output column of the tokens routed to the
  // expert; a moved router entry may reroute tokens, whose whole rows are then recomputed.
  int64_t tokens = 0, expert_in = 0, expert_out = 0, experts = 0;
  int64_t expert_offset(int64_t e) const {
    return experts * (expert_in + 1) + e * expert_out * (expert_in + 1);
  }
  // The verified elementwise layers after the moe (flatten aside) up to the affine layer
  // they feed, when the moe's output reaches it value for value: a candidate's changed
  // values then go through them alone into that layer's output.
  std::vector<TailStage> feature_tail;
  std::size_t feature_affine = 0;  // 0: no usable tail (the suffix runs over every value)

  // moe and attention: the output's [tokens, width] per sample
  std::pair<int64_t, int64_t> sites() const {
    return kind == Kind::moe ? std::pair{tokens, expert_out} : std::pair{length, embed};
  }

  std::string detail;  // for explain: what the computation runs through (attention, moe)

  bool usable() const { return kind != Kind::none && probed; }
};

// The tokens of a moe's batch grouped by the expert that serves them: expert e's are
// tokens[begin[e] .. begin[e + 1]), ascending (token = sample * tokens + position).
struct MoeServed {
  std::vector<int64_t> begin, tokens;
};

// Argmax attention's incumbent keys, for attention_fast_apply (site_local_path.cpp): per
// query row (sample-major, then head, then row) the head's scores [batch * heads * L, L], the
// key it picks, its margin (the picked score minus the best other visible one; +inf with one
// key) and its largest |score|; per sample the range (max - min over the tokens) of each
// k column [batch, E] and of each q column.
template <class S>
struct ArgmaxKeys {
  Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> scores;
  std::vector<int32_t> picks;
  std::vector<S> margin, magnitude;
  Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> key_range;
};

// One worker's buffers for the site-local path, sized on first use and reused.
template <class S>
struct SiteWork {
  using M = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  std::vector<int64_t> param;  // the moved parameters, relative to the layer's first
  std::vector<S> delta;        // per moved parameter: one candidate's change
  std::vector<int64_t> heads;  // attention: the heads whose q/k/v rows move, ascending
  std::vector<char> head_moved;
  M cols;  // conv: per moved weight, its shifted input [moves, batch * positions]
  std::vector<int64_t> channels;  // conv: the output channels the particle moves, ascending
  M chan, chan_b;  // conv with a tail: one channel of a few samples [block, positions]
  M slice_diff;    // its change at the affine layer's input [batch, slice]
  M qkv;           // attention: one head's q | k | v [length, 3 head_dim]
  M scores;        // [length, length]
  M mix;           // the moved heads' new mix [length, embed] (other columns unused)
  M diff;          // [length, head_dim]
  // argmax attention: one q/k/v column's change, its partner column, one query's scores,
  // one output row's change and the changed rows (out of attention_fast_apply)
  Eigen::Matrix<S, Eigen::Dynamic, 1> column, partner, row_scores;
  Eigen::Matrix<S, 1, Eigen::Dynamic> row_change;
  struct RowChange {
    int64_t sample, row;
    Eigen::Matrix<S, 1, Eigen::Dynamic> change;
  };
  std::vector<RowChange> changes;
  // attention with the sdpa operation, all candidates of a group at once:
  std::vector<S> deltas;    // [candidates, moves]
  std::vector<S> parts;     // the moved q/k/v parts of one head [candidates, batch * L, hd]
  std::vector<S> head_mix;  // per moved head [candidates, batch * L, hd]
  // moe: per moved parameter its expert, output row (-1: a router entry) and input column
  // (-1: a bias); the output rows the candidates change (every row once the router moves)
  // and each row's slot among them (-1: unchanged)
  std::vector<int64_t> move_expert, move_row, move_col;
  std::vector<int64_t> rows, row_slot;
  bool router_moved = false;
  std::vector<S> route_scores;  // one token's router scores
  M values, value_base;         // the changed values [batch, tokens * rows], the incumbent's
  M tail_base, tail_weights;    // feature tail: the incumbent there, the affine W^T rows
};

// The number of values of a tensor shape.
int64_t numel(int32_t ndim, const int64_t* shape);

// Parses the layer (kind, attributes, shapes, parameter count) and probes the per-site
// computation against its host forward; never throws (a failure is a note). For attention,
// `host` (may be null) offers the sdpa operation, which is probed as well and used when it
// agrees.
SiteLayer plan_site_layer(const LayerPlan& layer, const pp_host_api* host, int32_t dtype);

}  // namespace polyprobe::cpu_tbb
