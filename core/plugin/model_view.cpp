#include "plugin/plugin_impl.hpp"

#include <polyprobe/subspaces.hpp>

#include <nlohmann/json.hpp>

namespace polyprobe::detail {
namespace {

// The host_forward of every layer view: runs the core's own Layer on ABI tensors.
template <class S>
void host_forward_typed(const Layer& layer, const pp_tensor& in, const pp_tensor& params,
                        pp_tensor& out) {
  const int64_t rows = in.shape[0];
  Eigen::Map<const Matrix<S>> x(static_cast<const S*>(in.data), rows, layer.input_shape().numel());
  Eigen::Map<Matrix<S>> y(static_cast<S*>(out.data), rows, layer.output_shape().numel());
  std::span<const S> p(static_cast<const S*>(params.data),
                       static_cast<std::size_t>(layer.parameter_count()));
  layer.forward(x, p, y);
}

int host_forward(const void* host_layer, const pp_tensor* in, const pp_tensor* params,
                 pp_tensor* out, pp_error* err) {
  const auto& layer = *static_cast<const Layer*>(host_layer);
  try {
    if (in->dtype != params->dtype || in->dtype != out->dtype)
      throw Error("host_forward: tensors of mixed dtypes");
    if (in->ndim != 2 || out->ndim != 2 || in->shape[0] != out->shape[0] ||
        in->shape[1] != layer.input_shape().numel() ||
        out->shape[1] != layer.output_shape().numel())
      throw Error("host_forward: shapes do not match layer '" + layer.kind() + "'");
    if (in->strides != nullptr || out->strides != nullptr)
      throw Error("host_forward: strided tensors are not supported");
    if (in->dtype == PP_DTYPE_F32)
      host_forward_typed<float>(layer, *in, *params, *out);
    else if (in->dtype == PP_DTYPE_F64)
      host_forward_typed<double>(layer, *in, *params, *out);
    else
      throw Error("host_forward: unsupported dtype " + dtype_label(in->dtype));
    return PP_OK;
  } catch (const std::exception& e) {
    if (err != nullptr) {
      std::snprintf(err->message, sizeof(err->message), "%s", e.what());
    }
    return PP_FAILED;
  }
}

}  // namespace

ModelView::ModelView(const Model& model) {
  auto keep_string = [&](std::string s) { return strings_.emplace_back(std::move(s)).c_str(); };
  auto keep_shape = [&](const Shape& s) { return shapes_.emplace_back(s.dims).data(); };
  layers_.reserve(model.num_layers());
  for (std::size_t i = 0; i < model.num_layers(); ++i) {
    const Layer& layer = model.layer(i);
    const LayerContract contract = layer.contract();
    pp_layer_view v{};
    v.kind = keep_string(layer.kind());
    v.attrs_json = keep_string(layer.attributes().dump());
    v.in_ndim = static_cast<int32_t>(layer.input_shape().dims.size());
    v.in_shape = keep_shape(layer.input_shape());
    v.out_ndim = static_cast<int32_t>(layer.output_shape().dims.size());
    v.out_shape = keep_shape(layer.output_shape());
    v.param_offset = model.layer_offset(i);
    v.param_count = layer.parameter_count();
    v.contract = contract.flags();
    v.elementwise_fn = contract.elementwise_fn.fn;
    v.weight_transform = contract.weight_transform.fn;
    v.bias_transform = contract.bias_transform.fn;
    // One context serves all three: each layer passes itself.
    v.fn_ctx = contract.elementwise_fn     ? contract.elementwise_fn.ctx
               : contract.weight_transform ? contract.weight_transform.ctx
                                           : contract.bias_transform.ctx;
    v.host_layer = &layer;
    v.host_forward = &host_forward;
    OpAttrs& attrs = attrs_.emplace_back();
    v.op = describe_op(layer, attrs);
    v.op_attrs = v.op == PP_OP_CUSTOM || v.op == PP_OP_FLATTEN ? nullptr : &attrs;
    layers_.push_back(v);
  }
  view_.struct_size = sizeof(pp_model_view);
  view_.n_layers = static_cast<int32_t>(layers_.size());
  view_.layers = layers_.data();
  view_.n_params = model.num_parameters();
  view_.in_ndim = static_cast<int32_t>(model.input_shape().dims.size());
  view_.in_shape = keep_shape(model.input_shape());
}

SubspaceView::SubspaceView(const Subspace* subspace) {
  if (subspace == nullptr) return;
  const auto* rank_one = dynamic_cast<const RankOneSubspace*>(subspace);
  if (rank_one == nullptr) {
    reason_ = "subspace '" + subspace->kind() + "' has no rank-one description for plugins";
    return;
  }
  kind_ = rank_one->kind();
  for (const RankOneCoordinate& c : rank_one->coordinates())
    coords_.push_back({c.offset, c.rows, c.cols, c.row, c.col, c.u, c.v});
  view_.struct_size = sizeof(pp_subspace_view);
  view_.kind = kind_.c_str();
  view_.dimension = rank_one->dimension();
  view_.n_params = rank_one->parameter_count();
  view_.coords = coords_.data();
  has_view_ = true;
}

LossView::LossView(const Loss& loss) : name(loss.name()) {
  view.struct_size = sizeof(pp_loss_view);
  view.name = name.c_str();
  view.l2 = loss.l2;
}

}  // namespace polyprobe::detail
