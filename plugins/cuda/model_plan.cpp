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

// The attributes of a layer_ops.cuh kind, checked against the layer's shapes and parameter
// count; returns why they are not consistent, or "".
std::string layer_op(const pp_layer_view& l, OpPlan& op) {
  LayerOp& k = op.layer;
  k.kind = l.op;
  k.in = op.in;
  k.out = op.out;
  int64_t params = 0;
  switch (l.op) {
    case PP_OP_LAYER_NORM:
      k.norm = *static_cast<const pp_layer_norm_attrs*>(l.op_attrs);
      if (k.norm.group_size <= 0 || op.in % k.norm.group_size != 0 || op.in != op.out)
        return "its normalised group does not divide the sample";
      params = (k.norm.affine ? k.norm.group_size : 0) + (k.norm.bias ? k.norm.group_size : 0);
      if (k.norm.bias && !k.norm.affine) return "a bias without an affine weight";
      break;
    case PP_OP_CONV: {
      k.conv = *static_cast<const pp_conv_attrs*>(l.op_attrs);
      const pp_conv_attrs& a = k.conv;
      if (a.groups <= 0 || a.in_channels % a.groups != 0 || a.out_channels % a.groups != 0 ||
          op.in != a.in_channels * a.in_size[0] * a.in_size[1] ||
          op.out != a.out_channels * a.out_size[0] * a.out_size[1])
        return "its channels, groups and sizes disagree with its shapes";
      params = a.out_channels * (a.in_channels / a.groups) * a.kernel[0] * a.kernel[1] +
               (a.bias ? a.out_channels : 0);
      break;
    }
    case PP_OP_POOL: {
      k.pool = *static_cast<const pp_pool_attrs*>(l.op_attrs);
      const pp_pool_attrs& a = k.pool;
      if (op.in != a.channels * a.in_size[0] * a.in_size[1] ||
          op.out != a.channels * a.out_size[0] * a.out_size[1])
        return "its channels and sizes disagree with its shapes";
      break;
    }
    case PP_OP_LIF:
      k.lif = *static_cast<const pp_lif_attrs*>(l.op_attrs);
      if (op.in != op.out || k.lif.steps <= 0) return "not elementwise over a positive step count";
      break;
    case PP_OP_MOE: {
      k.moe = *static_cast<const pp_moe_attrs*>(l.op_attrs);
      const pp_moe_attrs& a = k.moe;
      if (a.in_features <= 0 || a.experts <= 0 || op.in % a.in_features != 0 ||
          op.out != op.in / a.in_features * a.out_features)
        return "its features disagree with its shapes";
      params = a.experts * (a.in_features + 1) + a.experts * a.out_features * (a.in_features + 1);
      break;
    }
    case PP_OP_SELF_ATTENTION: {
      k.attention = *static_cast<const pp_attention_attrs*>(l.op_attrs);
      const pp_attention_attrs& a = k.attention;
      if (a.heads <= 0 || a.embed % a.heads != 0 || op.in != a.length * a.embed || op.out != op.in)
        return "its length, embedding and heads disagree with its shapes";
      params = 4 * a.embed * a.embed + (a.bias ? 4 * a.embed : 0);
      break;
    }
    case PP_OP_CHERI_BLOCK: {
      k.cheri = *static_cast<const pp_cheri_attrs*>(l.op_attrs);
      const pp_cheri_attrs& a = k.cheri;
      if (a.length <= 0 || a.channels <= 0 || a.expansion <= 0 || a.dilation <= 0 ||
          op.in != a.length * a.channels || op.out != op.in)
        return "its length, channels, expansion and dilation disagree with its shapes";
      params = 3 * a.channels + 2 * a.expansion * a.channels * a.channels;
      break;
    }
    default:
      return "not a device layer kind";
  }
  if (l.param_count != params)
    return "it has " + std::to_string(l.param_count) + " parameters, its attributes say " +
           std::to_string(params);
  return "";
}

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
    const int64_t features_out = op.out;
    if (l.param_count < 0 || l.param_offset < 0 || l.param_offset + l.param_count > model.n_params)
      return where + ": its parameter range lies outside the model's parameters";
    op.param_offset = l.param_offset;
    op.param_count = l.param_count;
    if (l.op == PP_OP_LINEAR && l.op_attrs != nullptr) {
      const auto& a = *static_cast<const pp_linear_attrs*>(l.op_attrs);
      if (!known_transform(a.weight_transform) || !known_transform(a.bias_transform))
        return where + " has a weight transform with no CUDA implementation";
      if (a.in_features <= 0 || op.in % a.in_features != 0 ||
          op.out != op.in / a.in_features * a.out_features)
        return where + ": its attributes disagree with its shapes";
      // Per position on a multi-dimensional sample: each of its rows alike.
      op.positions = op.in / a.in_features;
      op.in = a.in_features;
      op.out = a.out_features;
      if (op.positions > 1 && !plan.layered_kinds) {
        plan.layered_kinds = true;
        plan.layered_where = where;
      }
      const int64_t count = a.out_features * a.in_features + (a.bias ? a.out_features : 0);
      if (l.param_count != count)
        return where + ": its parameter range does not match out x in (+ out)";
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
    } else if (l.op_attrs != nullptr &&
               (l.op == PP_OP_LAYER_NORM || l.op == PP_OP_CONV || l.op == PP_OP_POOL ||
                l.op == PP_OP_LIF || l.op == PP_OP_MOE || l.op == PP_OP_SELF_ATTENTION ||
                l.op == PP_OP_CHERI_BLOCK)) {
      const std::string why = layer_op(l, op);
      if (!why.empty()) return where + ": " + why;
      if (!plan.layered_kinds) plan.layered_where = where;
      plan.layered_kinds = true;
      for (int64_t p = 0; p < l.param_count; ++p)
        plan.owner[static_cast<std::size_t>(l.param_offset + p)] = i;
    } else {
      return where + " has no CUDA implementation yet";
    }
    plan.ops.push_back(op);
    width = features_out;
    plan.max_width = std::max(plan.max_width, width);
  }
  if (std::none_of(plan.ops.begin(), plan.ops.end(),
                   [](const OpPlan& op) { return op.op == PP_OP_LINEAR; }))
    return "the model has no linear layer: nothing to search";
  plan.out_features = width;
  plan.autocast =
      PP_HAS_FIELD(&options, pp_session_options, candidate_dtype) ? options.candidate_dtype : 0;
  if (plan.autocast != 0) {
    if (plan.autocast != PP_DTYPE_BF16 && plan.autocast != PP_DTYPE_F16)
      return "candidate dtype " + std::to_string(plan.autocast) +
             ": candidate_autocast runs bf16 or fp16";
    if (options.dtype != PP_DTYPE_F32)
      return "candidate_autocast runs a float32 session's candidates in bf16 or fp16: use "
             "--dtype float32";
    if (plan.layered_kinds)
      return "candidate_autocast runs the changes of linear + activation MLPs through "
             "tensor-core GEMMs; " +
             plan.layered_where +
             " runs on the dense path, whose layer kernels compute in float32 (drop "
             "--candidate-dtype)";
  }
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
