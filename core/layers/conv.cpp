// Conv1d and Conv2d as nn.Conv1d / nn.Conv2d: stride, zero padding, dilation and groups
// (groups = in_channels gives a depthwise convolution).
//
// Samples are [C, L] (1-D) or [C, H, W] (2-D), PyTorch's layout without the batch dim. A 1-D
// convolution runs as a 2-D one of height 1. Weights are [out, in / groups, k] or
// [out, in / groups, kh, kw], then the bias [out]: the shapes and names PyTorch uses.
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

namespace polyprobe {
namespace {

using layers::Window;

class Conv final : public LayerBase<Conv> {
 public:
  Conv(const char* kind, int dims, const nlohmann::json& attrs, const Shape& input)
      : kind_(kind), dims_(dims), input_(input) {
    check_attribute_names(
        attrs, kind,
        {"out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"});
    const layers::SpatialInput in = layers::spatial_input(input, kind, dims);
    in_channels_ = in.channels;
    out_channels_ = attr_required<int64_t>(attrs, kind, "out_channels");
    groups_ = attr_or<int64_t>(attrs, kind, "groups", 1);
    bias_ = attr_or<bool>(attrs, kind, "bias", true);
    if (out_channels_ <= 0)
      throw Error(std::string("layer '") + kind + "': out_channels must be positive");
    if (groups_ <= 0 || in_channels_ % groups_ != 0 || out_channels_ % groups_ != 0)
      throw Error(std::string("layer '") + kind + "': groups (" + std::to_string(groups_) +
                  ") must divide in_channels (" + std::to_string(in_channels_) +
                  ") and out_channels (" + std::to_string(out_channels_) + ")");
    window_ = Window::parse(attrs, kind, dims, in.size, /*with_dilation=*/true,
                            /*stride_is_kernel=*/false);
    output_ = layers::spatial_shape(out_channels_, window_.out, dims);
  }

  std::string kind() const override { return kind_; }
  nlohmann::json attributes() const override {
    const auto spatial = [&](const std::array<int64_t, 2>& v) {
      return dims_ == 1 ? nlohmann::json(v[1]) : nlohmann::json(v);
    };
    return {{"out_channels", out_channels_},
            {"kernel_size", spatial(window_.kernel)},
            {"stride", spatial(window_.stride)},
            {"padding", spatial(window_.padding)},
            {"dilation", spatial(window_.dilation)},
            {"groups", groups_},
            {"bias", bias_}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }
  std::vector<ParamSpec> parameters() const override {
    std::vector<int64_t> weight{out_channels_, in_channels_ / groups_};
    if (dims_ == 2) weight.push_back(window_.kernel[0]);
    weight.push_back(window_.kernel[1]);
    std::vector<ParamSpec> specs{{"weight", weight}};
    if (bias_) specs.push_back({"bias", {out_channels_}});
    return specs;
  }
  LayerContract contract() const override {
    LayerContract c;
    c.site_local = true;
    return c;
  }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    layers::fill_fan_in_uniform(params, patch_size(), rng);
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    const int64_t patch = patch_size();
    const int64_t group_in = in_channels_ / groups_, group_out = out_channels_ / groups_;
    const int64_t positions = window_.out_positions();
    const int64_t in_h = window_.in[0], in_w = window_.in[1];
    Matrix<S> columns(patch, positions);  // im2col of one group of one sample
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      const S* sample = layers::sample_in(x, b);
      Eigen::Map<Matrix<S>> out(layers::sample_out(y, b), out_channels_, positions);
      for (int64_t g = 0; g < groups_; ++g) {
        fill_columns(sample + g * group_in * in_h * in_w, group_in, columns);
        Eigen::Map<const Matrix<S>> weight(params.data() + g * group_out * patch, group_out, patch);
        out.middleRows(g * group_out, group_out).noalias() = weight * columns;
      }
      if (bias_) {
        Eigen::Map<const Vector<S>> bias(params.data() + out_channels_ * patch, out_channels_);
        out.colwise() += bias;
      }
    }
  }

 private:
  int64_t patch_size() const {
    return in_channels_ / groups_ * window_.kernel[0] * window_.kernel[1];
  }

  // columns[(c, ki, kj), (oi, oj)] = input[c, oi*s + ki*d - p, oj*s + kj*d - p] or 0 (padding).
  template <class S>
  void fill_columns(const S* input, int64_t channels, Matrix<S>& columns) const {
    const Window& w = window_;
    int64_t row = 0;
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t ki = 0; ki < w.kernel[0]; ++ki)
        for (int64_t kj = 0; kj < w.kernel[1]; ++kj, ++row) {
          S* dst = columns.row(row).data();
          for (int64_t oi = 0; oi < w.out[0]; ++oi) {
            const int64_t i = oi * w.stride[0] + ki * w.dilation[0] - w.padding[0];
            for (int64_t oj = 0; oj < w.out[1]; ++oj) {
              const int64_t j = oj * w.stride[1] + kj * w.dilation[1] - w.padding[1];
              const bool inside = i >= 0 && i < w.in[0] && j >= 0 && j < w.in[1];
              *dst++ = inside ? input[(c * w.in[0] + i) * w.in[1] + j] : S(0);
            }
          }
        }
  }

  const char* kind_;
  int dims_;
  Shape input_, output_;
  int64_t in_channels_ = 0, out_channels_ = 0, groups_ = 1;
  bool bias_ = true;
  Window window_;
};

void add_conv(LayerFactory& factory, const char* kind, int dims, const char* summary) {
  factory.add(kind, {[kind, dims](const nlohmann::json& attrs, const Shape& input) {
                       return std::make_shared<const Conv>(kind, dims, attrs, input);
                     },
                     summary, "core"});
}

}  // namespace

void register_conv(LayerFactory& factory) {
  add_conv(factory, "conv1d", 1,
           "nn.Conv1d on [C, L]; attributes out_channels, kernel_size, stride, padding, "
           "dilation, groups (= C for depthwise), bias");
  add_conv(factory, "conv2d", 2,
           "nn.Conv2d on [C, H, W]; attributes out_channels, kernel_size, stride, padding, "
           "dilation, groups (= C for depthwise), bias");
}

}  // namespace polyprobe
