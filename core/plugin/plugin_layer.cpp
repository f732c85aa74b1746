// A Layer backed by a plugin's pp_layer_kind.
#include "plugin/plugin_impl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

namespace polyprobe::detail {
namespace {

class PluginLayer final : public Layer {
 public:
  PluginLayer(const pp_layer_kind* kind, std::string plugin, const nlohmann::json& attrs,
              const Shape& input)
      : kind_(kind),
        plugin_(std::move(plugin)),
        attrs_(attrs.is_null() ? nlohmann::json::object() : attrs),
        input_(input) {
    pp_error err{};
    const std::string attrs_text = attrs_.dump();
    if (kind_->create(attrs_text.c_str(), static_cast<int32_t>(input_.dims.size()),
                      input_.dims.data(), &self_, &err) != PP_OK ||
        self_ == nullptr)
      throw Error(where() + ": cannot create: " + error_text(err));
    pp_layer_info info{};
    info.struct_size = sizeof(info);
    if (kind_->describe(self_, &info, &err) != PP_OK) {
      kind_->destroy(self_);
      throw Error(where() + ": cannot describe itself: " + error_text(err));
    }
    if (info.out_ndim < 1 || info.out_ndim > PP_MAX_DIMS || info.n_params < 0 ||
        info.n_params > PP_MAX_LAYER_PARAMS) {
      kind_->destroy(self_);
      throw Error(where() + ": describe() returned an invalid output rank or parameter count");
    }
    output_.dims.assign(info.out_shape, info.out_shape + info.out_ndim);
    for (int32_t i = 0; i < info.n_params; ++i) {
      const pp_param_spec& p = info.params[i];
      if (p.name == nullptr || p.ndim < 0 || p.ndim > PP_MAX_DIMS) {
        kind_->destroy(self_);
        throw Error(where() + ": parameter " + std::to_string(i) + " is malformed");
      }
      params_.push_back({p.name, std::vector<int64_t>(p.shape, p.shape + p.ndim)});
    }
    contract_.elementwise = (info.contract & PP_CONTRACT_ELEMENTWISE) != 0;
    contract_.affine = (info.contract & PP_CONTRACT_AFFINE) != 0;
    contract_.site_local = (info.contract & PP_CONTRACT_SITE_LOCAL) != 0;
    contract_.prefix_reusable = (info.contract & PP_CONTRACT_PREFIX_REUSABLE) != 0;
    contract_.affine_has_bias = contract_.affine && params_.size() > 1;
    contract_.elementwise_fn = {info.elementwise_fn, info.fn_ctx};
    contract_.weight_transform = {info.weight_transform, info.fn_ctx};
    contract_.bias_transform = {info.bias_transform, info.fn_ctx};
  }
  ~PluginLayer() override { kind_->destroy(self_); }
  PluginLayer(const PluginLayer&) = delete;
  PluginLayer& operator=(const PluginLayer&) = delete;

  std::string kind() const override { return kind_->kind; }
  nlohmann::json attributes() const override { return attrs_; }
  LayerContract contract() const override { return contract_; }
  std::vector<ParamSpec> parameters() const override { return params_; }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }

  void forward(ConstMatrixRef<float> x, std::span<const float> params,
               MatrixRef<float> y) const override {
    run<float>(x, params, y);
  }
  void forward(ConstMatrixRef<double> x, std::span<const double> params,
               MatrixRef<double> y) const override {
    run<double>(x, params, y);
  }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    std::fill(params.begin(), params.end(), 0.0);
    if (kind_->init_params == nullptr) return;
    pp_error err{};
    if (kind_->init_params(self_, rng(), params.data(), static_cast<int64_t>(params.size()),
                           &err) != PP_OK)
      throw Error(where() + ": cannot initialise parameters: " + error_text(err));
  }

 private:
  std::string where() const {
    return "layer '" + std::string(kind_->kind) + "' (plugin " + plugin_ + ")";
  }

  template <class S>
  void run(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    // The ABI passes contiguous row-major memory; copy only when the caller's is not.
    const bool x_contiguous = x.outerStride() == x.cols();
    const bool y_contiguous = y.outerStride() == y.cols();
    Matrix<S> x_copy, y_copy;
    if (!x_contiguous) x_copy = x;
    if (!y_contiguous) y_copy.resize(y.rows(), y.cols());
    const S* x_data = x_contiguous ? x.data() : x_copy.data();
    S* y_data = y_contiguous ? y.data() : y_copy.data();

    const int32_t dtype = std::is_same_v<S, float> ? PP_DTYPE_F32 : PP_DTYPE_F64;
    const int64_t in_shape[2] = {x.rows(), x.cols()};
    const int64_t out_shape[2] = {y.rows(), y.cols()};
    const int64_t p_shape[1] = {static_cast<int64_t>(params.size())};
    pp_tensor tin{const_cast<S*>(x_data), dtype, PP_DEVICE_TYPE_CPU, 0, 2, in_shape, nullptr};
    pp_tensor tp{const_cast<S*>(params.data()), dtype, PP_DEVICE_TYPE_CPU, 0, 1, p_shape, nullptr};
    pp_tensor tout{y_data, dtype, PP_DEVICE_TYPE_CPU, 0, 2, out_shape, nullptr};
    pp_error err{};
    if (kind_->forward(self_, &tin, &tp, &tout, &err) != PP_OK)
      throw Error(where() + ": forward failed: " + error_text(err));
    if (!y_contiguous) y = y_copy;
  }

  const pp_layer_kind* kind_;
  std::string plugin_;
  nlohmann::json attrs_;
  Shape input_, output_;
  void* self_ = nullptr;
  std::vector<ParamSpec> params_;
  LayerContract contract_;
};

}  // namespace

std::shared_ptr<const Layer> make_plugin_layer(const pp_layer_kind* kind, const std::string& plugin,
                                               const nlohmann::json& attrs, const Shape& input) {
  return std::make_shared<const PluginLayer>(kind, plugin, attrs, input);
}

}  // namespace polyprobe::detail
