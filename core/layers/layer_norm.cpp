// LayerNorm as nn.LayerNorm(normalized_shape): statistics over the last `normalized_dims`
// dimensions of each sample (1: per position of a [L, E] sequence; all: the whole sample),
// then an optional elementwise gain ("weight", ones) and shift ("bias", zeros) of the
// normalised shape.
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

namespace polyprobe {
namespace {

class LayerNorm final : public LayerBase<LayerNorm> {
 public:
  LayerNorm(const nlohmann::json& attrs, const Shape& input) : input_(input) {
    check_attribute_names(attrs, "layer_norm",
                          {"normalized_dims", "elementwise_affine", "bias", "eps"});
    const auto rank = static_cast<int64_t>(input.dims.size());
    normalized_dims_ = attr_or<int64_t>(attrs, "layer_norm", "normalized_dims", 1);
    affine_ = attr_or<bool>(attrs, "layer_norm", "elementwise_affine", true);
    bias_ = affine_ && attr_or<bool>(attrs, "layer_norm", "bias", true);
    eps_ = attr_or<double>(attrs, "layer_norm", "eps", 1e-5);
    if (normalized_dims_ < 1 || normalized_dims_ > rank)
      throw Error("layer 'layer_norm': normalized_dims must be between 1 and the sample rank (" +
                  std::to_string(rank) + "), got " + std::to_string(normalized_dims_));
    if (!(eps_ > 0.0) || !std::isfinite(eps_))
      throw Error("layer 'layer_norm': eps must be a positive finite number");
    normalized_.assign(input.dims.end() - normalized_dims_, input.dims.end());
    group_size_ = Shape{normalized_}.numel();
  }

  std::string kind() const override { return "layer_norm"; }
  nlohmann::json attributes() const override {
    return {{"normalized_dims", normalized_dims_},
            {"elementwise_affine", affine_},
            {"bias", bias_},
            {"eps", eps_}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return input_; }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> specs;
    if (affine_) specs.push_back({"weight", normalized_});
    if (bias_) specs.push_back({"bias", normalized_});
    return specs;
  }
  void initialize(std::span<double> params, std::mt19937_64&) const override {
    std::fill(params.begin(), params.end(), 0.0);
    if (affine_) std::fill_n(params.begin(), group_size_, 1.0);
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    const S* gain = affine_ ? params.data() : nullptr;
    const S* shift = bias_ ? params.data() + group_size_ : nullptr;
    const int64_t groups = input_.numel() / group_size_;
    for (Eigen::Index b = 0; b < x.rows(); ++b)
      layers::layer_norm_groups(layers::sample_in(x, b), layers::sample_out(y, b), groups,
                                group_size_, eps_, gain, shift);
  }

 private:
  Shape input_;
  std::vector<int64_t> normalized_;
  int64_t normalized_dims_ = 1, group_size_ = 1;
  bool affine_ = true, bias_ = true;
  double eps_ = 1e-5;
};

}  // namespace

void register_layer_norm(LayerFactory& factory) {
  factory.add("layer_norm",
              {[](const nlohmann::json& attrs, const Shape& input) {
                 return std::make_shared<const LayerNorm>(attrs, input);
               },
               "nn.LayerNorm over the last normalized_dims dims (default 1); attributes "
               "normalized_dims, elementwise_affine, bias, eps",
               "core"});
}

}  // namespace polyprobe
