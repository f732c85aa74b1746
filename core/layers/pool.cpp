// Pooling (max and average, 1-D and 2-D) and flatten: the parameter-free reshaping layers of
// a convolutional network.
//
// Pooling runs over [C, L] or [C, H, W] samples as nn.MaxPool1d/2d and nn.AvgPool1d/2d do:
// stride defaults to kernel_size, max pooling pads with -infinity, average pooling counts
// the zero padding (count_include_pad = True, PyTorch's default). Flatten is nn.Flatten():
// the sample's values in the same order, shape [numel]; as y[i] = x[i] it is elementwise.
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

#include <limits>

namespace polyprobe {
namespace {

using layers::Window;

enum class PoolOp { max, average };

class Pool final : public LayerBase<Pool> {
 public:
  Pool(const char* kind, int dims, PoolOp op, const nlohmann::json& attrs, const Shape& input)
      : kind_(kind), dims_(dims), op_(op), input_(input) {
    check_attribute_names(attrs, kind, {"kernel_size", "stride", "padding"});
    const layers::SpatialInput in = layers::spatial_input(input, kind, dims);
    channels_ = in.channels;
    window_ = Window::parse(attrs, kind, dims, in.size, /*with_dilation=*/false,
                            /*stride_is_kernel=*/true);
    for (int axis = 0; axis < 2; ++axis)
      if (2 * window_.padding[axis] > window_.kernel[axis])
        throw Error(std::string("layer '") + kind + "': padding must be at most half of " +
                    "kernel_size (as in PyTorch)");
    output_ = layers::spatial_shape(channels_, window_.out, dims);
  }

  std::string kind() const override { return kind_; }
  nlohmann::json attributes() const override {
    const auto spatial = [&](const std::array<int64_t, 2>& v) {
      return dims_ == 1 ? nlohmann::json(v[1]) : nlohmann::json(v);
    };
    return {{"kernel_size", spatial(window_.kernel)},
            {"stride", spatial(window_.stride)},
            {"padding", spatial(window_.padding)}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    const Window& w = window_;
    const S window_size = static_cast<S>(w.kernel[0] * w.kernel[1]);
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      const S* in = layers::sample_in(x, b);
      S* out = layers::sample_out(y, b);
      for (int64_t c = 0; c < channels_; ++c)
        for (int64_t oi = 0; oi < w.out[0]; ++oi)
          for (int64_t oj = 0; oj < w.out[1]; ++oj) {
            S acc = op_ == PoolOp::max ? -std::numeric_limits<S>::infinity() : S(0);
            for (int64_t ki = 0; ki < w.kernel[0]; ++ki) {
              const int64_t i = oi * w.stride[0] + ki - w.padding[0];
              if (i < 0 || i >= w.in[0]) continue;
              for (int64_t kj = 0; kj < w.kernel[1]; ++kj) {
                const int64_t j = oj * w.stride[1] + kj - w.padding[1];
                if (j < 0 || j >= w.in[1]) continue;
                const S v = in[(c * w.in[0] + i) * w.in[1] + j];
                // NaN propagates through max pooling, as in PyTorch.
                if (op_ == PoolOp::average)
                  acc += v;
                else if (v > acc || std::isnan(v))
                  acc = v;
              }
            }
            *out++ = op_ == PoolOp::average ? acc / window_size : acc;
          }
    }
  }

 private:
  const char* kind_;
  int dims_;
  PoolOp op_;
  Shape input_, output_;
  int64_t channels_ = 0;
  Window window_;
};

class Flatten final : public LayerBase<Flatten> {
 public:
  Flatten(const nlohmann::json& attrs, const Shape& input)
      : input_(input), output_{{input.numel()}} {
    check_attribute_names(attrs, "flatten", {});
  }
  std::string kind() const override { return "flatten"; }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }
  LayerContract contract() const override {
    LayerContract c;
    c.elementwise = true;
    c.elementwise_fn = {&identity, nullptr};
    return c;
  }
  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    y = x;
  }

 private:
  static double identity(const void*, double v) { return v; }
  Shape input_, output_;
};

void add_pool(LayerFactory& factory, const char* kind, int dims, PoolOp op, const char* summary) {
  factory.add(kind, {[kind, dims, op](const nlohmann::json& attrs, const Shape& input) {
                       return std::make_shared<const Pool>(kind, dims, op, attrs, input);
                     },
                     summary, "core"});
}

}  // namespace

void register_pool(LayerFactory& factory) {
  add_pool(factory, "max_pool1d", 1, PoolOp::max,
           "nn.MaxPool1d on [C, L]; attributes kernel_size, stride (= kernel_size), padding");
  add_pool(factory, "max_pool2d", 2, PoolOp::max,
           "nn.MaxPool2d on [C, H, W]; attributes kernel_size, stride (= kernel_size), padding");
  add_pool(factory, "avg_pool1d", 1, PoolOp::average,
           "nn.AvgPool1d on [C, L]; attributes kernel_size, stride (= kernel_size), padding");
  add_pool(factory, "avg_pool2d", 2, PoolOp::average,
           "nn.AvgPool2d on [C, H, W]; attributes kernel_size, stride (= kernel_size), padding");
  factory.add("flatten", {[](const nlohmann::json& attrs, const Shape& input) {
                            return std::make_shared<const Flatten>(attrs, input);
                          },
                          "nn.Flatten(): any sample shape to [numel], values unchanged", "core"});
}

}  // namespace polyprobe
