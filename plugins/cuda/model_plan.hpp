// What the CUDA session knows about a model: a chain of linear and activation operations
// with their shapes and parameter offsets, read once from the host's typed ops (ops.h).
// Pure host code, so that session_supports can answer without touching the device.
#pragma once

#include "layer_ops.cuh"

#include <polyprobe/plugin/abi.h>
#include <polyprobe/plugin/kernels/losses.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace polyprobe::cuda {

struct OpPlan {
  int32_t op = PP_OP_CUSTOM;  // PP_OP_LINEAR, PP_OP_ACTIVATION or a layer_ops.cuh kind
  // Features per sample; for a linear op the features of one position (it acts on each of
  // `positions` rows of the sample alike).
  int64_t in = 0, out = 0;
  int64_t positions = 1;
  int64_t param_offset = 0, param_count = 0;
  LayerOp layer{};  // the layer_ops.cuh kinds
  // Linear.
  bool bias = false;
  int32_t weight_transform = PP_TRANSFORM_IDENTITY, bias_transform = PP_TRANSFORM_IDENTITY;
  double quant_step = 1.0 / 64.0;
  // Activation.
  int32_t fn = PP_ACT_IDENTITY;
  double step = 0.25;
};

struct ModelPlan {
  std::vector<OpPlan> ops;
  int64_t n_params = 0;
  int64_t in_features = 0, out_features = 0, max_width = 0;
  kernels::LossKind loss = kernels::LossKind::unknown;
  double l2 = 0.0;
  // For every parameter index, the op that owns it (-1: none).
  std::vector<int32_t> owner;
  // Some op is a layer_ops.cuh kind or a linear op per position: only the dense and
  // materialised paths serve the model.
  bool layered_kinds = false;
  std::string layered_where;  // "layer i (kind)": the first such op
  // candidate_autocast: PP_DTYPE_BF16 or PP_DTYPE_F16, 0 = off (autocast.cuh).
  int32_t autocast = 0;
};

// The features an op writes per sample.
inline int64_t out_features(const OpPlan& op) { return op.out * op.positions; }

// Why the CUDA session cannot serve this model and loss; empty when it can.
std::string unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                               const pp_session_options& options);

// The plan of a supported model (throws std::invalid_argument with the reason otherwise).
ModelPlan make_plan(const pp_model_view& model, const pp_loss_view& loss,
                    const pp_session_options& options);

}  // namespace polyprobe::cuda
