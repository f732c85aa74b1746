// The delta paths, `sparse` (full space) and `subspace-delta` (rank-one subspace
// coordinates): a group's change carried forward as a delta of the incumbent's activations,
// with the tables that make it cheap (delta_path.cpp says how) and the losses from a delta
// (loss_kernels.cpp). Every loss is exact: where a table's shortcut is not certified for a
// sample, that sample is computed exactly.
//
// The tables are built from the incumbent cache, for the units a call reads, and kept for the
// later calls on the same incumbent (build_tables, one thread, parallel inside, each row
// written by one thread: the same bits for any thread count); evaluate()
// then runs on many workers at once, each with its own scratch, reading only.
#pragma once

#include "context.hpp"

#include <polyprobe/plugin/kernels/cgf_series.hpp>

#include <cstdint>
#include <vector>

namespace polyprobe::cpu_tbb {

template <class S>
class DeltaPath {
 public:
  using Scratch = WorkerScratch<S>;
  explicit DeltaPath(const EvaluationContext<S>& ctx) : ctx_(ctx), kink_(ctx.plan.layers.size()) {}

  // Kink, direction and cumulant tables for this call's groups (the planner's counts decide
  // which are worth building), keeping what earlier calls on the same incumbent built.
  void build_tables();
  // After an allocation failure: drop the tables (rebuilt on the next call).
  void drop_tables() {
    for (KinkTable& k : kink_) k = KinkTable{};
    tables_generation_ = 0;
  }
  bool kink_table_built(std::size_t layer) const { return kink_[layer].built; }
  double table_bytes() const;

  // The losses of group g's candidates into losses[g.begin .. g.end); those of rank-one
  // groups only once finish_task has run.
  void evaluate(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  // Completes the rank-one losses that the worker's evaluate calls since the last
  // finish_task left waiting in s.exact. Call it after each task's groups, on the same worker.
  void finish_task(Scratch& s, double* losses) const;

 private:
  void build_kink_tables();
  void build_direction_tables();
  void apply_elementwise(const LayerPlan& layer, const S* in, S* out, int64_t count,
                         Scratch& s) const;
  // Sparse units at the input of affine layer l through l, relu l+1 and affine l+2 into
  // s.delta ([out_{l+2}, n * batch]) with the kink tables.
  void apply_kink(std::size_t l, int64_t n, Scratch& s) const;
  // Terms along one dense u at layer l, through ReLU l+1 and affine l+2, into s.delta.
  void apply_direction(std::size_t l, int32_t u_index, int64_t n, Scratch& s) const;

  // --- loss_kernels.cpp
  // Mean loss of candidates whose outputs are the incumbent's plus `delta`
  // (feature-major [outputs, n * batch]); sums in double in sample order.
  void delta_losses(const Mat<S>& delta, int64_t n, double* mean_losses, Scratch& s) const;
  // The same for outputs that change only in the rows `units` (by sparse, [units, n * batch]),
  // with delta_losses' sums in its order: an unchanged row adds its p_k, as p_k exp(0) = p_k
  // does there, so one exponential per changed row instead of one per class, the same bits.
  // False, with nothing written, where delta_losses must take it (a loss other than
  // cross-entropy, more than 64 classes, a batch that is not whole packets, a logit past
  // exp's range).
  bool sparse_delta_losses(const std::vector<int64_t>& units, const Mat<S>& sparse, int64_t n,
                           double* mean_losses) const;
  // sparse_delta_losses for one changed logit u ([1, n * batch]; a whole number of packets):
  // the softmax's sum is the other classes' (IncumbentCache::others_t) plus p_u e^dl.
  bool one_logit_losses(int64_t u, const Mat<S>& sparse, int64_t n, double* mean_losses) const;
  // Cross-entropy of a rank-one logit change dl = s_b g_{u,b}: per direction u and sample
  // b, the cumulant series of kernels/cgf_series.hpp (coefficients of s^1 .. s^N, the label's
  // term folded in) and the spread M = max_k |g_k - mean| that bounds its range. Float32 only.
  struct Cumulants {
    bool built = false;
    Mat<S> coef;    // [directions * kernels::kCgfTerms, batch]: row u * N + t holds s^(t+1)'s
    Mat<S> spread;  // [directions, batch]
  };
  // g(u, k, b) = g[u * su + k * sk + b * sb]; only the directions u with used[u] != 0 (each
  // direction's rows are the same bits whichever others are built).
  void build_cumulants(Cumulants& table, int64_t directions, const S* g, int64_t su, int64_t sk,
                       int64_t sb, const std::vector<char>& used) const;
  // Flags over the `units` inputs of `layer`: the units this call's delta candidates change
  // there (a sparse change from the nearest affine layer before it through elementwise
  // layers), or every unit where that cannot be told (a dense direction, a host layer between).
  std::vector<char> changed_units(std::size_t layer, int64_t units) const;
  // The losses of n candidates whose logits change by s[i, b] g_{u,b}: g is column u of the
  // last layer's W (kink_layer < 0) or the kink response of layer kink_layer. Samples outside
  // the certified range, or whose ReLU units may cross a kink, are computed exactly: they wait
  // in q (with their logits) for a whole packet of such samples. Appends one q.pending entry
  // per candidate (its loss index and l2 term left for the caller to fill in).
  void rank_one_losses(const Cumulants& table, int64_t u, const Mat<S>& s_values, int64_t n,
                       int64_t kink_layer, ExactLanes<S>& q) const;
  // One sample's exact loss for the same change (b, s = the sample's scalar).
  S rank_one_exact(int64_t u, S s, int64_t b, int64_t kink_layer) const;
  // The logits x[k] (k < classes <= ExactLanes::kMaxClasses) of a packet of samples [b, b +
  // kLanes) for the same change, vectorised over the samples, in rank_one_exact's sums; the
  // lanes whose bit is set in `crossing` may have ReLU units that cross a kink (found by a
  // vectorised scan of the hidden units, confirmed one by one).
  void rank_one_logits(int64_t u, const Packet<S>& s, int64_t b, int64_t kink_layer,
                       uint32_t crossing, Packet<S>* x) const;
  // Computes the waiting samples' losses into q.lane_losses and empties the packet.
  void flush_exact(ExactLanes<S>& q) const;

  const EvaluationContext<S>& ctx_;
  Cumulants last_layer_cumulants_;     // g = columns of the last affine layer's W
  std::vector<char> last_layer_done_;  // [in]: its directions built this generation
  // The IncumbentCache::generation the tables' built parts belong to (0: none).
  uint64_t tables_generation_ = 0;

  // Kink tables of affine layer l (see delta_path.cpp), when built this call.
  struct KinkTable {
    bool built = false;
    Mat<S> response;  // [in_l * out_{l+2}, batch]
    Mat<S> inv_room;  // [in_l, batch]
    // One unit u moving by s > 0 makes a ReLU unit cross iff s * room_up(u, b) >= 1 (s < 0:
    // -s * room_down(u, b) >= 1): max_j of -W[j, u] / z_jb and of W[j, u] / z_jb.
    Mat<S> room_up, room_down;
    Mat<S> abs_weights;   // |W_l|^T [in_l, out_l], scratch of the build
    Cumulants cumulants;  // when layer l+2 is the last: g = response columns
    // This generation's built blocks of kUnitBlock units, and units of `cumulants` (empty:
    // none yet).
    std::vector<char> block_done, cumulant_done;
  };
  std::vector<KinkTable> kink_;
  // Direction tables: a dense subspace direction u at the output of affine layer l, then
  // ReLU l+1 and affine l+2: response[:, b] = W_{l+2} diag(mask_b) u and the exact crossing
  // bounds for a move s u (as in KinkTable). Indexed by dense u; built when the pattern holds.
  struct DirectionTable {
    bool built = false;
    int32_t layer = -1;
    Mat<S> response;            // [out_{l+2}, batch]
    Arr<S> room_up, room_down;  // [batch]
  };
  std::vector<DirectionTable> direction_;
};

}  // namespace polyprobe::cpu_tbb
