/* The core's built-in layer kinds as typed operations.
 *
 * Each built-in kind reaches evaluators as an op id (pp_layer_view.op) and one of the plain
 * attribute structs below (pp_layer_view.op_attrs), filled by the host from the layer it
 * built, so a backend never parses the model file's JSON and never calls back into the host
 * for a kind it implements. Shapes are per sample, without the batch dimension, as in
 * pp_layer_view; parameters are in PyTorch's order (the layer's pp_param_spec list).
 *
 * Versioning, as for the structs of abi.h: each struct starts with struct_size, which the
 * host sets to the size of the struct it sends. New kinds get new ids; new attributes are
 * only appended to a struct, and a plugin reads a field past those it was built with only
 * when struct_size covers it (PP_HAS_FIELD, abi.h), so a plugin built against an older
 * header of this API reads what it knows, and one built against a newer header can tell
 * what an older host did not send.
 */
#ifndef POLYPROBE_PLUGIN_OPS_H
#define POLYPROBE_PLUGIN_OPS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pp_op_kind {
  PP_OP_CUSTOM = 0,         /* a third-party kind: attrs_json and host_forward only */
  PP_OP_LINEAR = 1,         /* pp_linear_attrs */
  PP_OP_ACTIVATION = 2,     /* pp_activation_attrs */
  PP_OP_LAYER_NORM = 3,     /* pp_layer_norm_attrs */
  PP_OP_CONV = 4,           /* pp_conv_attrs (conv1d, conv2d) */
  PP_OP_POOL = 5,           /* pp_pool_attrs (max/avg pool 1d, 2d) */
  PP_OP_FLATTEN = 6,        /* no attributes */
  PP_OP_SELF_ATTENTION = 7, /* pp_attention_attrs */
  PP_OP_MOE = 8,            /* pp_moe_attrs */
  PP_OP_LIF = 9,            /* pp_lif_attrs */
  PP_OP_CHERI_BLOCK = 10    /* pp_cheri_attrs */
} pp_op_kind;

/* Elementwise weight transforms of a linear layer: Q(w). */
typedef enum pp_transform {
  PP_TRANSFORM_IDENTITY = 0,
  PP_TRANSFORM_SIGN = 1, /* sign(w) in {-1, 0, 1} */
  PP_TRANSFORM_INT8 = 2, /* clamp(nearbyint(w / step), -127, 127) * step */
  PP_TRANSFORM_INT4 = 3  /* clamp(nearbyint(w / step), -7, 7) * step */
} pp_transform;

/* y = x Q(W)^T + Qb(b) over the last dimension; params W [out, in] then b [out]. */
typedef struct pp_linear_attrs {
  uint32_t struct_size;
  int64_t in_features, out_features;
  int32_t bias;             /* 0 or 1 */
  int32_t weight_transform; /* pp_transform */
  int32_t bias_transform;   /* pp_transform */
  double quant_step;        /* PP_TRANSFORM_INT8 and PP_TRANSFORM_INT4 */
} pp_linear_attrs;

typedef enum pp_activation {
  PP_ACT_IDENTITY = 0,
  PP_ACT_RELU = 1,
  PP_ACT_GELU = 2,      /* exact, erf form */
  PP_ACT_GELU_TANH = 3, /* tanh approximation */
  PP_ACT_TANH = 4,
  PP_ACT_SIGN = 5,
  PP_ACT_STAIRCASE = 6 /* step * floor(x / step) */
} pp_activation;

/* y[i] = f(x[i]); the formulas are kernels/activations.hpp. */
typedef struct pp_activation_attrs {
  uint32_t struct_size;
  int32_t fn;  /* pp_activation */
  double step; /* PP_ACT_STAIRCASE */
} pp_activation_attrs;

/* Normalises each sample's last `normalized_dims` dimensions (group_size values). */
typedef struct pp_layer_norm_attrs {
  uint32_t struct_size;
  int64_t group_size;
  int32_t affine; /* weight [group_size] */
  int32_t bias;   /* bias [group_size] (only with affine) */
  double eps;
} pp_layer_norm_attrs;

/* nn.Conv1d/2d on [C, L] or [C, H, W]; a 1-D conv is a 2-D one of height 1 (index 0 of each
 * pair is the height). Weight [out, in / groups, (kh,) kw], then bias [out]. */
typedef struct pp_conv_attrs {
  uint32_t struct_size;
  int32_t dims; /* 1 or 2 */
  int64_t in_channels, out_channels, groups;
  int64_t in_size[2], out_size[2];
  int64_t kernel[2], stride[2], padding[2], dilation[2];
  int32_t bias;
} pp_conv_attrs;

/* nn.MaxPool / nn.AvgPool (count_include_pad) on [C, L] or [C, H, W]. */
typedef struct pp_pool_attrs {
  uint32_t struct_size;
  int32_t dims;    /* 1 or 2 */
  int32_t average; /* 0 = max, 1 = average */
  int64_t channels;
  int64_t in_size[2], out_size[2];
  int64_t kernel[2], stride[2], padding[2];
} pp_pool_attrs;

/* nn.MultiheadAttention(E, heads, batch_first) with q = k = v = x on [L, E]; params
 * in_proj_weight [3E, E], in_proj_bias [3E], out_proj.weight [E, E], out_proj.bias [E]. */
typedef struct pp_attention_attrs {
  uint32_t struct_size;
  int64_t length, embed, heads;
  int32_t bias;
  int32_t argmax; /* 1: one-hot of each row's first largest score instead of softmax */
  int32_t causal; /* 1: position i attends to positions j <= i only (is_causal); 0: to all */
} pp_attention_attrs;

/* Hard top-1 mixture over the last dimension: router [E, D] + [E], then per expert
 * weight [out, D] and bias [out]. */
typedef struct pp_moe_attrs {
  uint32_t struct_size;
  int64_t in_features, out_features, experts;
} pp_moe_attrs;

/* Leaky integrate-and-fire over `steps` steps, elementwise on the sample. */
typedef struct pp_lif_attrs {
  uint32_t struct_size;
  int64_t steps;
  double beta, threshold;
  int32_t reset_to_zero; /* 0 = subtract the threshold */
} pp_lif_attrs;

/* The Cheri block on [L, C] (docs/design.md section 6): depthwise 3-tap dilated conv weights
 * [3, C], LayerNorm over the (L, C) plane (eps 1e-3, no affine), Linear C -> e C, GELU
 * (tanh), Linear e C -> C, both without bias, residual x + 0.15 MLP. */
typedef struct pp_cheri_attrs {
  uint32_t struct_size;
  int64_t length, channels, expansion, dilation;
} pp_cheri_attrs;

#ifdef __cplusplus
}
#endif

#endif /* POLYPROBE_PLUGIN_OPS_H */
