#include "model_plan.hpp"

#include <algorithm>
#include <stdexcept>

namespace polyprobe::cuda {
namespace {

int64_t features(int32_t ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool known_transform(int32_t t) {
  return t == PP_TRANSFORM_IDENTITY || t == PP_TRANSFORM_SIGN || t == PP_TRANSFORM_INT8;
}

bool known_activation(int32_t fn) { return fn >= PP_ACT_IDENTITY && fn <= PP_ACT_STAIRCASE; }

// Fills `plan` and returns "" or returns why the model is out of scope.
std::string build(const pp_model_view& model, const pp_loss_view& loss,
                  const pp_session_options& options, ModelPlan& plan) {
  if (options.dtype != PP_DTYPE_F32 && options.dtype != PP_DTYPE_F64)
    return "the CUDA session computes in float32 or float64 only";
  if (options.device != PP_DEVICE_CUDA) return "the CUDA session runs on device cuda only";
  plan.loss = kernels::loss_kind(loss.name);
  if (plan.loss == kernels::LossKind::unknown)
    return std::string("loss '") + (loss.name ? loss.name : "?") + "' has no CUDA implementation";
  plan.l2 = loss.l2;
  if (options.subspace != nullptr) {
    const pp_subspace_view& s = *options.subspace;
    if (s.n_params != model.n_params)
      return "the subspace maps into " + std::to_string(s.n_params) +
             " parameters, the model has " + std::to_string(model.n_params);
  }
  plan.n_params = model.n_params;
  plan.in_features = features(model.in_ndim, model.in_shape);
  plan.max_width = plan.in_features;
  plan.owner.assign(static_cast<std::size_t>(model.n_params), -1);
  int64_t width = plan.in_features;
  for (int32_t i = 0; i < model.n_layers; ++i) {
    const pp_layer_view& l = model.layers[i];
    const std::string where = "layer " + std::to_string(i) + " (" + (l.kind ? l.kind : "?") + ")";
    OpPlan op;
    op.op = l.op;
    op.in = features(l.in_ndim, l.in_shape);
    op.out = features(l.out_ndim, l.out_shape);
    if (op.in != width)
      return where + ": input has " + std::to_string(op.in) + " features, expected " +
             std::to_string(width);
    if (l.op == PP_OP_LINEAR && l.op_attrs != nullptr) {
      const auto& a = *static_cast<const pp_linear_attrs*>(l.op_attrs);
      if (l.in_ndim != 1)
        return where + " acts per position on a " + std::to_string(l.in_ndim) +
               "-D sample, which has no CUDA implementation yet";
      if (!known_transform(a.weight_transform) || !known_transform(a.bias_transform))
        return where + " has a weight transform with no CUDA implementation";
      if (a.in_features != op.in || a.out_features != op.out)
        return where + ": its attributes disagree with its shapes";
      const int64_t count = a.out_features * a.in_features + (a.bias ? a.out_features : 0);
      if (l.param_count != count || l.param_offset < 0 || l.param_offset + count > model.n_params)
        return where + ": its parameter range does not match out x in (+ out)";
      op.param_offset = l.param_offset;
      op.bias = a.bias != 0;
      op.weight_transform = a.weight_transform;
      op.bias_transform = a.bias_transform;
      op.quant_step = a.quant_step;
      for (int64_t p = 0; p < count; ++p)
        plan.owner[static_cast<std::size_t>(l.param_offset + p)] = i;
    } else if (l.op == PP_OP_ACTIVATION && l.op_attrs != nullptr) {
      const auto& a = *static_cast<const pp_activation_attrs*>(l.op_attrs);
      if (!known_activation(a.fn)) return where + " is an activation with no CUDA implementation";
      if (op.in != op.out || l.param_count != 0) return where + ": not elementwise";
      op.fn = a.fn;
      op.step = a.step;
    } else if (l.op == PP_OP_FLATTEN) {
      // A flatten of row-major samples changes no value: it is the identity on features.
      if (op.in != op.out || l.param_count != 0) return where + ": not a pure reshape";
      op.op = PP_OP_ACTIVATION;
      op.fn = PP_ACT_IDENTITY;
    } else {
      return where + " has no CUDA implementation yet";
    }
    plan.ops.push_back(op);
    width = op.out;
    plan.max_width = std::max(plan.max_width, width);
  }
  if (std::none_of(plan.ops.begin(), plan.ops.end(),
                   [](const OpPlan& op) { return op.op == PP_OP_LINEAR; }))
    return "the model has no linear layer: nothing to search";
  plan.out_features = width;
  return "";
}

}  // namespace

std::string unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                               const pp_session_options& options) {
  ModelPlan plan;
  return build(model, loss, options, plan);
}

ModelPlan make_plan(const pp_model_view& model, const pp_loss_view& loss,
                    const pp_session_options& options) {
  ModelPlan plan;
  const std::string reason = build(model, loss, options, plan);
  if (!reason.empty()) throw std::invalid_argument(reason);
  return plan;
}

}  // namespace polyprobe::cuda
