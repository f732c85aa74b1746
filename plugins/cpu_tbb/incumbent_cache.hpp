// The incumbent cache: the registered batch and everything the paths reuse from the
// incumbent's forward (prefix reuse), recomputed only when the incumbent's version changes
// or a batch is registered.
//
// It holds the batch (inputs in S, labels or targets), a view of the incumbent's raw
// parameters and its effective ones (transforms applied), each layer's input in both layouts
// (sample-major and feature-major), the affine layers' effective W^T, the dense subspace
// directions' v^T x, the incumbent's loss and, for the cross-entropy, its softmax and per-sample
// losses. Every path reads it during a call; only the in-place path writes (its effective
// parameters, put back after each candidate). One thread writes it at a time (between calls, or
// in-place).
#pragma once

#include "direction_projections.hpp"
#include "model_plan.hpp"
#include "packets.hpp"

#include <polyprobe/plugin/abi.h>
#include <polyprobe/plugin/kernels/losses.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace polyprobe::cpu_tbb {

// One layer on sample-major rows. `params` are effective ones (transforms applied) for
// native affine layers; with host_only every layer runs its host forward on raw params.
template <class S>
void forward_layer(const LayerPlan& layer, const Mat<S>& in, const S* params, Mat<S>& out,
                   bool host_only = false);

// Layers [from, plan.layers.size()) on sample-major rows `in`, on the incumbent's effective
// parameters; returns the last layer's output. Each layer writes its own matrix of
// `outputs` (one per layer of the plan, kept by the caller's scratch), so a group of the same
// size as the last one reuses every buffer: two matrices swapped between layers of different
// widths would reallocate (and fault in) megabytes per group.
template <class S>
const Mat<S>& forward_suffix(const ModelPlan& plan, std::size_t from, const Mat<S>& in,
                             const S* params, std::vector<Mat<S>>& outputs);

template <class S>
struct IncumbentCache {
  // The batch. Throws std::invalid_argument for an empty batch or a width other than
  // `in_features`; marks the incumbent stale.
  void set_batch(const pp_batch_view& view, int64_t in_features);
  // True when the cached forward is not of incumbent `version` on the current batch.
  bool stale(uint64_t incumbent_version) const { return !ready || incumbent_version != version; }
  // The incumbent `values` [n_params] of `version`: parameters, then the forward of every layer
  // and the loss (with l2 * |base|^2). `values` is viewed, not copied (base): it must stay
  // unchanged and alive while `version` stands (the session's incumbent, which changes only
  // with its version). Runs its forward on the calling task arena's threads, with the same
  // results for any thread count. `projections` computes v_src, the subspace's
  // dense directions on the layers' inputs (no rows in full space).
  void refresh(const ModelPlan& plan, const double* values, uint64_t incumbent_version,
               kernels::LossKind loss, double l2, DirectionProjections<S>& projections);
  // Fills acts_t[l] for every l >= first not yet filled since the refresh, which fills only
  // the last (the outputs). Call it, on the calling arena's threads, before anything reads
  // acts_t[first ..]: the delta path's layers (a cnn's conv and pool activations, which no
  // delta candidate reads, were most of the transposition's work).
  void transpose_from(std::size_t first);
  // The parameter `param` at raw value `raw` as the forward sees it (in S, transformed).
  S effective(const ModelPlan& plan, int64_t param, double raw) const;
  // Mean loss of the sample-major outputs rows [first_row, first_row + batch).
  double rows_loss(kernels::LossKind loss, const Mat<S>& out, int64_t first_row) const;

  // batch
  Mat<S> x;  // sample-major inputs
  std::vector<int64_t> labels;
  std::vector<double> targets;
  int64_t batch = 0;

  // the incumbent
  uint64_t version = 0;
  bool ready = false;
  std::span<const double> base;  // refresh's values, viewed (a copy was 8 n bytes a step)
  std::vector<S> eff;
  double base_sq = 0.0;
  uint64_t generation = 0;          // counts refreshes: workers' parameter copies follow it
  std::vector<Mat<S>> acts;         // sample-major [batch, width], acts[l] = input of layer l
  std::vector<Mat<S>> acts_t;       // feature-major [width, batch], from transposed_from on
  std::size_t transposed_from = 0;  // acts_t[l] below it is stale (an older incumbent's)
  std::vector<Mat<S>> weights_t;    // affine layers: effective W^T [in, out]
  Mat<S> v_src;                     // [dense v, batch]: v^T (input of its layer)
  double base_loss = 0.0;
  // Cross-entropy from a logit delta: the incumbent's softmax and per-sample losses
  // ([classes, batch] and [batch]) and the labels as one-hot rows.
  Mat<S> probs_t, one_hot_t;
  Arr<S> sample_loss;
  // [classes, batch], for at most kOthersClasses classes: the sum of every other class's p, in
  // class order (a change of one logit k moves the softmax's sum to others + p_k e^dl).
  static constexpr int64_t kOthersClasses = 64;
  Mat<S> others_t;

 private:
  void set_base(const ModelPlan& plan, const double* values);
};

}  // namespace polyprobe::cpu_tbb
