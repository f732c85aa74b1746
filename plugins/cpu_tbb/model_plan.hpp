// How the cpu_tbb plugin runs each layer of a model, after probing what the layer declares.
//
// A layer's contract (pp_layer_view.contract) is a claim; build_model_plan checks every
// claim a fast path would rely on against the layer's own forward on a sample input:
// an "affine" layer must compute x Q(W)^T + Qb(b) with its declared transforms, an
// "elementwise" layer must agree with its declared scalar function and commute with a
// permutation of its inputs. A claim that fails is dropped with the reason, so the layer
// runs through its host forward and the fast paths that needed the claim decline: slower,
// never wrong.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {

enum class LayerOp {
  affine,       // y = x Q(W)^T + Qb(b), verified
  elementwise,  // y[i] = f(x[i]), verified; evaluated natively (relu) or by host forward
  host          // anything else: the host's forward, on whole activations
};

struct LayerPlan {
  const pp_layer_view* view = nullptr;
  LayerOp op = LayerOp::host;
  int64_t in = 0, out = 0;  // features per sample
  int64_t offset = 0, count = 0;
  // affine
  int64_t weight_count = 0;  // out * in
  bool has_bias = false;
  pp_scalar_fn weight_q = nullptr, bias_q = nullptr;  // null = identity
  // elementwise
  bool is_relu = false;  // f(x) = max(x, 0) on every probe: native kernel, kink tables
  const void* ctx = nullptr;
  std::string probe_note;  // why a declared contract was not trusted (empty if none)
};

struct ModelPlan {
  std::vector<LayerPlan> layers;
  int64_t n_params = 0;
  int64_t in_features = 0, out_features = 0;
  // Set when prefix reuse is not allowed (a layer is not prefix-reusable): every
  // candidate then runs the whole forward.
  std::string no_prefix_reuse;
  // The layer that owns each parameter: (first parameter, layer), sorted.
  std::vector<std::pair<int64_t, int32_t>> owners;
  int32_t layer_of(int64_t param) const;
  int64_t max_width() const;
};

// Builds the plan and probes every declared contract; never throws for a false claim.
ModelPlan build_model_plan(const pp_model_view& model);

// Runs the host forward of `layer` in float64 on rows x layer.in values into y; returns ""
// or why it could not (contract probes use it as the ground truth).
std::string host_forward(const LayerPlan& layer, const std::vector<double>& x, int64_t rows,
                         const std::vector<double>& params, std::vector<double>& y);

// The one-word name of a layer op, for explain.
const char* op_name(LayerOp op);

}  // namespace polyprobe::cpu_tbb
