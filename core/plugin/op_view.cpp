// The built-in layer kinds as typed operations (plugin/ops.h), read from each layer's own
// description: its kind, its normalised attributes and its shapes. One place knows both the
// core's attribute names and the ABI's structs, so no plugin has to parse the JSON.
#include "plugin/plugin_impl.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cstring>
#include <string_view>

namespace polyprobe::detail {
namespace {

// A spatial attribute as the layers write it: one value (1-D: the width, the height being
// `flat`, the identity for that attribute) or [h, w].
std::array<int64_t, 2> spatial(const nlohmann::json& attrs, const char* name, int dims,
                               int64_t fallback, int64_t flat) {
  if (!attrs.contains(name)) return {dims == 1 ? flat : fallback, fallback};
  const nlohmann::json& a = attrs.at(name);
  if (a.is_array() && a.size() == 2) return {a[0].get<int64_t>(), a[1].get<int64_t>()};
  const auto v = a.get<int64_t>();
  return {dims == 1 ? flat : v, v};
}

// [C, L] -> (1, L); [C, H, W] -> (H, W).
std::array<int64_t, 2> plane(const Shape& s) {
  if (s.dims.size() == 2) return {1, s.dims[1]};
  return {s.dims[1], s.dims[2]};
}

int32_t transform_id(const std::string& name) {
  if (name == "sign") return PP_TRANSFORM_SIGN;
  if (name == "int8") return PP_TRANSFORM_INT8;
  if (name == "int4") return PP_TRANSFORM_INT4;
  return PP_TRANSFORM_IDENTITY;
}

}  // namespace

// Each op's struct gets struct_size = the size this host sends (ops.h, "Versioning").
int32_t describe_op(const Layer& layer, OpAttrs& out) {
  std::memset(&out, 0, sizeof(out));
  const std::string kind = layer.kind();
  const nlohmann::json a = layer.attributes();
  const Shape& in = layer.input_shape();
  const Shape& o = layer.output_shape();
  if (kind == "linear") {
    pp_linear_attrs& l = out.linear;
    l.struct_size = sizeof(l);
    l.in_features = in.dims.back();
    l.out_features = o.dims.back();
    l.bias = a.value("bias", true) ? 1 : 0;
    l.weight_transform = transform_id(a.value("weight_transform", std::string("identity")));
    l.bias_transform = transform_id(a.value("bias_transform", std::string("identity")));
    l.quant_step = a.value("quant_step", 1.0 / 64.0);
    return PP_OP_LINEAR;
  }
  static constexpr std::pair<const char*, int32_t> kActivations[] = {
      {"identity", PP_ACT_IDENTITY}, {"relu", PP_ACT_RELU}, {"tanh", PP_ACT_TANH},
      {"sign", PP_ACT_SIGN},         {"gelu", PP_ACT_GELU}, {"staircase", PP_ACT_STAIRCASE}};
  for (const auto& [name, fn] : kActivations)
    if (kind == name) {
      out.activation.struct_size = sizeof(out.activation);
      out.activation.fn = fn;
      if (kind == "gelu" && a.value("approximate", std::string("none")) == "tanh")
        out.activation.fn = PP_ACT_GELU_TANH;
      out.activation.step = a.value("step", 0.25);
      return PP_OP_ACTIVATION;
    }
  if (kind == "layer_norm") {
    const auto dims = a.value("normalized_dims", int64_t{1});
    int64_t group = 1;
    for (auto it = in.dims.end() - dims; it != in.dims.end(); ++it) group *= *it;
    out.layer_norm.struct_size = sizeof(out.layer_norm);
    out.layer_norm.group_size = group;
    out.layer_norm.affine = a.value("elementwise_affine", true) ? 1 : 0;
    out.layer_norm.bias = a.value("bias", true) && out.layer_norm.affine ? 1 : 0;
    out.layer_norm.eps = a.value("eps", 1e-5);
    return PP_OP_LAYER_NORM;
  }
  if (kind == "conv1d" || kind == "conv2d") {
    const int dims = kind == "conv1d" ? 1 : 2;
    pp_conv_attrs& c = out.conv;
    c.struct_size = sizeof(c);
    c.dims = dims;
    c.in_channels = in.dims[0];
    c.out_channels = o.dims[0];
    c.groups = a.value("groups", int64_t{1});
    const auto si = plane(in), so = plane(o);
    const auto k = spatial(a, "kernel_size", dims, 1, 1), s = spatial(a, "stride", dims, 1, 1),
               p = spatial(a, "padding", dims, 0, 0), dl = spatial(a, "dilation", dims, 1, 1);
    for (int i = 0; i < 2; ++i) {
      c.in_size[i] = si[static_cast<std::size_t>(i)];
      c.out_size[i] = so[static_cast<std::size_t>(i)];
      c.kernel[i] = k[static_cast<std::size_t>(i)];
      c.stride[i] = s[static_cast<std::size_t>(i)];
      c.padding[i] = p[static_cast<std::size_t>(i)];
      c.dilation[i] = dl[static_cast<std::size_t>(i)];
    }
    c.bias = a.value("bias", true) ? 1 : 0;
    return PP_OP_CONV;
  }
  if (kind == "max_pool1d" || kind == "max_pool2d" || kind == "avg_pool1d" ||
      kind == "avg_pool2d") {
    const int dims = kind.ends_with("1d") ? 1 : 2;
    pp_pool_attrs& pl = out.pool;
    pl.struct_size = sizeof(pl);
    pl.dims = dims;
    pl.average = kind.starts_with("avg") ? 1 : 0;
    pl.channels = in.dims[0];
    const auto si = plane(in), so = plane(o);
    const auto k = spatial(a, "kernel_size", dims, 1, 1), s = spatial(a, "stride", dims, 1, 1),
               p = spatial(a, "padding", dims, 0, 0);
    for (int i = 0; i < 2; ++i) {
      pl.in_size[i] = si[static_cast<std::size_t>(i)];
      pl.out_size[i] = so[static_cast<std::size_t>(i)];
      pl.kernel[i] = k[static_cast<std::size_t>(i)];
      pl.stride[i] = s[static_cast<std::size_t>(i)];
      pl.padding[i] = p[static_cast<std::size_t>(i)];
    }
    return PP_OP_POOL;
  }
  if (kind == "flatten") return PP_OP_FLATTEN;
  if (kind == "self_attention") {
    out.attention.struct_size = sizeof(out.attention);
    out.attention.length = in.dims[0];
    out.attention.embed = in.dims[1];
    out.attention.heads = a.value("num_heads", int64_t{1});
    out.attention.bias = a.value("bias", true) ? 1 : 0;
    out.attention.argmax = a.value("attention", std::string("softmax")) == "argmax" ? 1 : 0;
    out.attention.causal = a.value("causal", false) ? 1 : 0;
    return PP_OP_SELF_ATTENTION;
  }
  if (kind == "moe") {
    out.moe.struct_size = sizeof(out.moe);
    out.moe.in_features = in.dims.back();
    out.moe.out_features = o.dims.back();
    out.moe.experts = a.value("num_experts", int64_t{1});
    return PP_OP_MOE;
  }
  if (kind == "lif") {
    out.lif.struct_size = sizeof(out.lif);
    out.lif.steps = a.value("steps", int64_t{8});
    out.lif.beta = a.value("beta", 0.9);
    out.lif.threshold = a.value("threshold", 1.0);
    out.lif.reset_to_zero = a.value("reset", std::string("subtract")) == "zero" ? 1 : 0;
    return PP_OP_LIF;
  }
  if (kind == "cheri_block") {
    out.cheri.struct_size = sizeof(out.cheri);
    out.cheri.length = in.dims[0];
    out.cheri.channels = in.dims[1];
    out.cheri.expansion = a.value("expansion", int64_t{2});
    out.cheri.dilation = a.value("dilation", int64_t{1});
    return PP_OP_CHERI_BLOCK;
  }
  return PP_OP_CUSTOM;
}

}  // namespace polyprobe::detail
