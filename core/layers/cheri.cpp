// The Cheri block (docs/design.md section 6, after the cherimoya package), on [L, C] samples
// (channels last, as its (3, C) conv weights and its (L, C) normalisation plane are laid out):
//   h = depthwise dilated 3-tap conv: h[i, c] = w[0, c] x[i-d, c] + w[1, c] x[i, c]
//       + w[2, c] x[i+d, c], zero padding, no bias;
//   n = LayerNorm of h over the whole (L, C) plane, no affine parameters, eps 1e-3;
//   y = x + 0.15 * GELU_tanh(n W1^T) W2^T, W1 [e C, C], W2 [C, e C], no biases.
// Parameters: conv_weight [3, C], fc1.weight [e C, C], fc2.weight [C, e C].
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

#include <polyprobe/plugin/kernels/activations.hpp>

namespace polyprobe {
namespace {

constexpr double kCheriEps = 1e-3;
constexpr double kCheriResidualScale = 0.15;

class CheriBlock final : public LayerBase<CheriBlock> {
 public:
  CheriBlock(const nlohmann::json& attrs, const Shape& input) : input_(input) {
    check_attribute_names(attrs, "cheri_block", {"dilation", "expansion"});
    if (input.dims.size() != 2)
      throw Error("layer 'cheri_block' needs a per-sample input of shape [L, C], got " +
                  input.str());
    length_ = input.dims[0];
    channels_ = input.dims[1];
    dilation_ = attr_or<int64_t>(attrs, "cheri_block", "dilation", 1);
    expansion_ = attr_or<int64_t>(attrs, "cheri_block", "expansion", 2);
    if (dilation_ < 1 || dilation_ > (int64_t{1} << 24))
      throw Error("layer 'cheri_block': dilation must be a positive integer");
    if (expansion_ < 1 || expansion_ > 64)
      throw Error("layer 'cheri_block': expansion must be between 1 and 64");
    hidden_ = expansion_ * channels_;
  }

  std::string kind() const override { return "cheri_block"; }
  nlohmann::json attributes() const override {
    return {{"dilation", dilation_}, {"expansion", expansion_}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return input_; }
  std::vector<ParamSpec> parameters() const override {
    return {{"conv_weight", {3, channels_}},
            {"fc1.weight", {hidden_, channels_}},
            {"fc2.weight", {channels_, hidden_}}};
  }
  LayerContract contract() const override {
    LayerContract c;
    c.site_local = true;
    return c;
  }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    const auto conv = static_cast<std::size_t>(3 * channels_);
    const auto fc = static_cast<std::size_t>(hidden_ * channels_);
    layers::fill_fan_in_uniform(params.subspan(0, conv), 3, rng);
    layers::fill_fan_in_uniform(params.subspan(conv, fc), channels_, rng);
    layers::fill_fan_in_uniform(params.subspan(conv + fc, fc), hidden_, rng);
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    const S* taps = params.data();
    Eigen::Map<const Matrix<S>> fc1(params.data() + 3 * channels_, hidden_, channels_);
    Eigen::Map<const Matrix<S>> fc2(params.data() + 3 * channels_ + hidden_ * channels_, channels_,
                                    hidden_);
    Matrix<S> mixed(length_, channels_), hidden(length_, hidden_);
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      Eigen::Map<const Matrix<S>> in(layers::sample_in(x, b), length_, channels_);
      for (int64_t i = 0; i < length_; ++i)
        for (int64_t c = 0; c < channels_; ++c) {
          S v = taps[channels_ + c] * in(i, c);
          if (i - dilation_ >= 0) v += taps[c] * in(i - dilation_, c);
          if (i + dilation_ < length_) v += taps[2 * channels_ + c] * in(i + dilation_, c);
          mixed(i, c) = v;
        }
      layers::layer_norm_groups<S>(mixed.data(), mixed.data(), 1, length_ * channels_, kCheriEps,
                                   nullptr, nullptr);
      hidden.noalias() = mixed * fc1.transpose();
      hidden = hidden.unaryExpr([](S v) { return kernels::gelu_tanh(v); });
      Eigen::Map<Matrix<S>> out(layers::sample_out(y, b), length_, channels_);
      out.noalias() = hidden * fc2.transpose();
      out = in + static_cast<S>(kCheriResidualScale) * out;
    }
  }

 private:
  Shape input_;
  int64_t length_ = 0, channels_ = 0, dilation_ = 1, expansion_ = 2, hidden_ = 0;
};

}  // namespace

void register_cheri_block(LayerFactory& factory) {
  factory.add("cheri_block",
              {[](const nlohmann::json& attrs, const Shape& input) {
                 return std::make_shared<const CheriBlock>(attrs, input);
               },
               "Cheri block on [L, C]: depthwise dilated 3-tap conv, plane LayerNorm, "
               "GELU MLP (C -> e C -> C), residual x + 0.15 MLP; attributes dilation, expansion",
               "core"});
}

}  // namespace polyprobe
